"""`drills scan --verify`: the prediction for the fixture fleet, judged by the real controller, recorded as lane
scan's rows in a run folder whose report shows the fleet summary and the verification rows."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drills.core import config
from drills.record.ledger import read_rows
from drills.scan.advice import WAVES


@pytest.mark.single_version
def test_verify_agrees_with_the_probe_on_every_shape_it_picks(cluster, controller_version, tmp_path):
    env = dict(os.environ, DRILLS_REPORTS=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "drills", "scan", "--fleet", str(config.fixtures_dir() / "fleet"),
                        "--env", "stage,prod", "--controller", controller_version, "--verify", "3", "--json",
                        "--fail-on", "none"],
                       capture_output=True, text=True, timeout=1800, cwd=config.project_root(), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    rows = out["verification"]
    probed_rules = {x["rule"]["id"] for x in out["rollouts"]
                    if x["predicted_peak_weight"] is not None and x["routing"] in ("subset", "host")}
    assert {row["rule"] for row in rows} == probed_rules and len(rows) == 3
    for row in rows:
        assert row["verdict"] == "pass", json.dumps(row, indent=1)
        assert row["controller_version"] == controller_version and Path(row["evidence"]).is_file()
    run_dir = Path(out["stats"]["verify_run"])
    assert run_dir.parent == tmp_path
    ledger = [x for x in read_rows(run_dir / "ledger.json") if x["lane"] == "scan"]
    verify = [x for x in ledger if x["step"] == "verify"]
    assert [(x["expected"], x["observed"], x["verdict"]) for x in verify] == \
        [(row["predicted"], row["observed"], "pass") for row in rows]
    assert all(x["details"]["rule"] and x["details"]["probe_replicas"] for x in verify)
    # the fleet summary: a row per fix wave, unverified (the scanned set is not the lane's own fixture)
    summary = {x["details"]["wave"]: x for x in ledger if x["step"] == "summary"}
    assert set(summary) == set(WAVES) and all(x["verdict"] == "unverified" and x["reason"] for x in summary.values())
    for wave, counts in out["summary"]["by_wave"].items():
        assert summary[wave]["observed"] == counts.get(controller_version, 0)
    assert sum(x["observed"] for x in summary.values()) == len(out["rollouts"])
    # the reports show both: the run's report, and the matrix's lane sections
    report = (run_dir / "report.md").read_text()
    assert all(x["assertion"].replace("|", "\\|") in report for x in ledger)
    matrix = (tmp_path / "matrix.md").read_text()
    assert "Rollouts per fix wave" in matrix and "Scan — prediction vs the real controller" in matrix
