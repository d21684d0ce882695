"""Versions are ordered as releases, never as text (v1.10.2 after v1.8.2), by the one key every part uses."""
from __future__ import annotations

from drills.core import config
from drills import lanes
from drills.reporting import upgrade
from drills.record.ledger import PASS


def test_release_order_of_versions_and_labels():
    got = config.version_order(["v1.10.2", "weird", "v1.8.2+unknown", "v1.7.2", "v1.8.2", "v1.8.2 (abc123)"])
    assert got == ["v1.7.2", "v1.8.2", "v1.8.2 (abc123)", "v1.8.2+unknown", "v1.10.2", "weird"]


def _cell(version: str, step: str, assertion: str, observed=True) -> tuple[tuple, dict]:
    return (version, step, assertion), {"controller_version": version, "lane": "x", "step": step,
                                        "assertion": assertion, "verdict": PASS, "observed": observed,
                                        "expected": observed, "details": {}}


def test_a_lane_table_lists_v1_10_after_v1_8():
    cells = dict(_cell(v, "held", "fires-in-time") for v in ("v1.10.2", "v1.8.2", "v1.9.3"))
    (section,) = lanes.get("alert").report_sections(cells)
    assert [row[0] for row in section["rows"]] == ["v1.8.2", "v1.9.3", "v1.10.2"], section["rows"]


def test_neighbouring_releases_are_paired_in_release_order():
    rows = [{"controller_version": v, "lane": "a", "step": "s", "assertion": "x", "verdict": PASS, "observed": 1,
             "expected": 1, "id": "a/s/x"} for v in ("v1.10.2", "v1.7.2", "v1.8.2")]
    steps = upgrade.classify_neighbours(rows)
    assert [(s.from_column, s.to_column) for s in steps] == [("v1.7.2", "v1.8.2"), ("v1.8.2", "v1.10.2")]
