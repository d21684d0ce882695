"""`drills report DIR` exits with the gate of the run it reports (no cluster): 0 all pass, 1 a fail, 3 inconclusive
(evidence missing, a leg stopped), 2 bad input; several folders the worst; an upgrade check's folder its exit.
Run folders as tests/test_upgrade_noise.py writes them (the lanes' rows, the real load thresholds)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from drills.core import config
from drills.record.ledger import PASS, read_rows

from test_upgrade_noise import as_release, drills, run_folder


def test_drills_report_exits_as_the_run_it_reports(tmp_path):
    reports = tmp_path / "reports"
    good = run_folder(reports, "run-good", after_load=(0.0, 45.0), before_load=(0.21, 60.0))
    # the good run's load rows pass by the real thresholds: every row passes
    assert {r["verdict"] for r in read_rows(good / "ledger.json")} - {PASS, "not_applicable"} == set()
    r = drills("report", good, reports=reports)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("prescription holds on v1.8.2: yes"), r.stdout
    doc = json.loads(drills("report", good, "--json", reports=reports).stdout)
    assert doc["exit"] == 0 and doc["incomplete"] == [] and list(doc)[:3] == ["headlines", "failing_or_hazard", "matrix"]

    failing = run_folder(reports, "run-fail", after=100)
    r = drills("report", failing, reports=reports)
    assert r.returncode == 1 and "prescription holds on v1.8.2: no" in r.stdout, r.stdout + r.stderr
    # several folders: the worst of them
    assert drills("report", good, failing, reports=reports).returncode == 1

    unsure = run_folder(reports, "run-unsure")
    (unsure / "after.timeline.jsonl").unlink()              # a pass whose evidence is gone
    r = drills("report", unsure, reports=reports)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.startswith("INCOMPLETE: v1.8.2 a/after/peak-weight: pass -> inconclusive, evidence missing"), \
        r.stdout
    assert json.loads(drills("report", unsure, "--json", reports=reports).stdout)["exit"] == 3
    # a leg of the run that did not finish: inconclusive, named
    stopped = run_folder(reports, "run-stopped")
    meta = json.loads((stopped / "run.json").read_text())
    meta["legs"][0].update(state="interrupted", rc=None)
    meta["interrupted"], meta["signal"] = True, "SIGTERM"
    (stopped / "run.json").write_text(json.dumps(meta))
    r = drills("report", stopped, reports=reports)
    assert r.returncode == 3 and "INCOMPLETE: the run was interrupted (SIGTERM)" in r.stdout, r.stdout
    assert drills("report", failing, unsure, reports=reports).returncode == 1       # 1 > 3

    # bad input: 2, one line
    (unsure / "run.json").write_text("{half")
    r = drills("report", unsure, reports=reports)
    assert r.returncode == 2 and "run.json" in r.stderr, r.stderr
    notes = tmp_path / "notes"
    notes.mkdir()
    r = drills("report", notes, reports=reports)
    assert r.returncode == 2 and "no run folder" in r.stderr, r.stderr

    # an upgrade check's folder: the exit its classification recorded
    cand = as_release(failing, "v1.8.5", tmp_path / "elsewhere" / "fail-as-v1.8.5")
    up = drills("upgrade-check", "--from", "v1.8.2", "--to", "v1.8.5", "--runs", good, cand, "--lanes", "a,order,abort",
                reports=tmp_path / "classified")
    assert up.returncode == 1, up.stdout + up.stderr
    folder = Path(up.stdout.split("run folder: ", 1)[1].split()[0])
    assert drills("report", folder, reports=tmp_path / "classified").returncode == 1


def test_drills_report_help_says_its_exit_codes():
    r = subprocess.run([sys.executable, "-m", "drills", "report", "--help"], capture_output=True, text=True,
                       timeout=120, cwd=str(config.project_root()))
    text = " ".join(r.stdout.split())
    assert r.returncode == 0
    for words in ("0 all pass", "1 a fail", "3 inconclusive", "2 bad input"):
        assert words in text, text
