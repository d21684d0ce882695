"""upgrade-check gates on the rows that answer the question, on recorded run folders (no cluster): load figures are
informational whatever their noise, so two runs of one controller are a go, and a weight regression still gates.

Run folders are written with the project's own Ledger and load.record_phase_rows (the rows the lanes record, with
the real load thresholds), their evidence beside them and run.json as `drills run` writes it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from drills.core import config
from drills.traffic import load
from drills.reporting import upgrade
from drills.record.ledger import FAIL, Ledger, read_rows

from test_upgrade import record_abort, record_lane_a, record_order, write_evidence, write_run_json


def drills(*args, reports: Path):
    return subprocess.run([sys.executable, "-m", "drills", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=str(config.project_root()), env={**os.environ, "DRILLS_REPORTS": str(reports)})


def load_stats(exposure_failure: float, p95: float, steady_requests: int = 400) -> dict:
    """One load step's per-phase figures as drills.traffic.load computes them from Locust's per-request records."""
    def phase(requests, failure_ratio, p95_ms, window):
        return {"requests": requests, "failures": int(round(requests * failure_ratio)), "failure_ratio": failure_ratio,
                "p95_ms": p95_ms, "p50_ms": p95_ms / 3, "codes": {"200": requests}, "window": window}
    return {"steady": phase(steady_requests, 0.0, p95 / 3, [0, 30]), "exposure": phase(400, exposure_failure, p95, [30, 45]),
            "settled": phase(400, 0.0, p95 / 2, [45, 60])}


def run_folder(reports: Path, name: str, version: str = "v1.8.2", after: int = 5, before_load=(0.21, 60.0),
               after_load=(0.0, 45.0), steady_requests: int = 400) -> Path:
    """A run of lanes a, order and abort on one controller, its rows recorded as the lanes record them (load
    included, judged by the real thresholds), every row's evidence whole, run.json with each leg ended."""
    run = reports / name
    led = Ledger(run, name, "embedded", version)
    record_lane_a(led, after=after)
    thresholds = load.load_thresholds()
    load.record_phase_rows(led, "a", "before", load_stats(*before_load, steady_requests=steady_requests), thresholds,
                           evidence="before-load.json")
    load.record_phase_rows(led, "a", "after", load_stats(*after_load), thresholds, evidence="after-load.json")
    record_order(led, version, None)
    record_abort(led)
    for r in read_rows(run / "ledger.json"):
        if r.get("evidence"):
            write_evidence(run / r["evidence"])
    return write_run_json(run)


def as_release(run: Path, version: str, out: Path) -> Path:
    """Another run of the same controller, its rows named as another release (upgrade-check compares two releases):
    a candidate identical to the baseline but for what differs between two runs."""
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("ledger.json*"))
    rows = read_rows(run / "ledger.json")
    (out / "ledger.json").write_text(json.dumps([dict(r, controller_version=version, run_id=out.name) for r in rows]))
    return write_run_json(out)


# --- upgrade-check: load figures are informational ------------------------------------------------------------------
def test_two_runs_of_one_version_with_load_noise_are_a_go(tmp_path):
    reports = tmp_path / "reports"
    base = run_folder(reports, "run-1")
    # the second run of the same controller on a busier machine: latency up tenfold (past the 300 ms threshold,
    # so its load rows fail), fewer requests in the steady phase (inconclusive), and the BEFORE exposure's
    # failure ratio below the threshold that says the exposure showed (a load hazard the baseline showed now not,
    # and the other way round below)
    noisy = run_folder(reports, "run-2", before_load=(0.015, 600.0), after_load=(0.004, 450.0), steady_requests=9)
    rows_b, rows_c = read_rows(base / "ledger.json"), read_rows(noisy / "ledger.json")
    assert {r["verdict"] for r in rows_c if r["assertion"].startswith("load.")} >= {FAIL, "inconclusive"}
    changes = upgrade.classify(rows_b, rows_c)
    counts = upgrade.count_classes(changes)
    assert counts[upgrade.REGRESSED] == 0 and counts[upgrade.IMPROVED] == 0, upgrade.changes_table(changes)
    load_changes = [c for c in changes if c.assertion.startswith("load.")]
    assert load_changes and not any(c.gates for c in load_changes)
    assert all(c.gates for c in changes if not c.assertion.startswith("load."))
    p95 = next(c for c in changes if c.id == "a/before/load.exposure.p95_ms")
    assert p95.cls == upgrade.CHANGED and "worse by 540, outside the noise band ±50 ms or 50% of the larger" in p95.words
    assert "informational, never gates" in p95.words
    # within the band: same
    ratio = next(c for c in changes if c.id == "a/after/load.exposure.failure_ratio")
    assert ratio.cls == upgrade.SAME and "within the noise band ±0.01" in ratio.words
    assert upgrade.exit_code(changes) == upgrade.EXIT_OK
    # the other way round: the baseline's BEFORE exposure failure ratio under the hazard's threshold, the
    # candidate's over it -- a load hazard "new" on the candidate, informational: the weight row gates it
    assert upgrade.exit_code(upgrade.classify(rows_c, rows_b)) == upgrade.EXIT_OK

    # the command, on the two run folders (the second named as another release), exits 0 and says why
    candidate = as_release(noisy, "v1.8.5", tmp_path / "elsewhere" / "run-2-as-v1.8.5")
    r = drills("upgrade-check", "--from", "v1.8.2", "--to", "v1.8.5", "--runs", base, candidate,
               "--lanes", "a,order,abort", reports=tmp_path / "classified")
    assert r.returncode == 0, r.stdout + r.stderr
    head = next(line for line in r.stdout.splitlines() if line.startswith("v1.8.2 -> v1.8.5:"))
    assert not r.stdout.startswith("!!") and "0 regressed" in head, r.stdout
    assert "informational: load figures" in r.stdout and "never gate the exit" in r.stdout
    folder = Path(r.stdout.split("run folder: ", 1)[1].split()[0])
    doc = json.loads((folder / "upgrade.json").read_text())
    assert doc["exit"] == 0 and doc["counts"]["regressed"] == 0 and doc["new_hazards"] == []
    assert "a/before/load.exposure.p95_ms" in doc["informational"]["outside_noise_band"]
    assert "never gate" in doc["informational"]["rule"] and "±0.01" in doc["informational"]["rule"]
    assert {c["id"]: c["gates"] for c in doc["changes"]}["a/after/peak-weight"] is True
    assert all(c["gates"] is False for c in doc["changes"] if c["assertion"].startswith("load."))
    js = drills("upgrade-check", "--from", "v1.8.2", "--to", "v1.8.5", "--runs", base, candidate,
                "--lanes", "a,order,abort", "--json", reports=tmp_path / "classified")
    assert js.returncode == 0 and json.loads(js.stdout)["informational"]["rows"] == len(load_changes), js.stderr


def test_a_weight_regression_still_gates_whatever_the_load_says(tmp_path):
    reports = tmp_path / "reports"
    base = run_folder(reports, "run-1")
    # the prescription failing on the candidate: AFTER puts 100 on the partial ReplicaSet; its load figures
    # happen to look better than the baseline's
    broken = run_folder(reports, "run-2", after=100, before_load=(0.2, 30.0), after_load=(0.0, 20.0))
    changes = upgrade.classify(read_rows(base / "ledger.json"), read_rows(broken / "ledger.json"))
    after = next(c for c in changes if c.id == "a/after/peak-weight")
    assert after.cls == upgrade.REGRESSED and after.gates
    assert upgrade.exit_code(changes) == upgrade.EXIT_REGRESSED
    candidate = as_release(broken, "v1.8.5", tmp_path / "elsewhere" / "run-2-as-v1.8.5")
    r = drills("upgrade-check", "--from", "v1.8.2", "--to", "v1.8.5", "--runs", base, candidate,
               "--lanes", "a,order,abort", reports=tmp_path / "classified")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "prescription holds on v1.8.5: no" in r.stdout and "1 regressed" in r.stdout, r.stdout
