"""nginx on the real controller: the scan's prediction for nginx-routed Rollouts no lane deploys, judged by the
probe routed by nginx (`drills scan --verify`).  On the first controller version under test: lane A runs on nginx
on every version (tests/test_lanes.py), and these shapes take the rule that lane's BEFORE does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drills.core import config
from drills.record.ledger import read_rows
from drills.record.timeline import load

HELD_OUT = config.fixtures_dir() / "routers" / "nginx" / "held-out.yaml"


@pytest.mark.single_version
def test_the_scan_predicts_nginx_as_the_real_controller_routes_it(cluster, controller_version, tmp_path):
    env = dict(os.environ, DRILLS_REPORTS=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "drills", "scan", str(HELD_OUT), "--controller", controller_version,
                        "--verify", "2", "--json", "--fail-on", "none"],
                       capture_output=True, text=True, timeout=1800, cwd=config.project_root(), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert {(x["router"], x["routing"]) for x in out["rollouts"]} == {("nginx", "other")}
    rows = out["verification"]
    assert sorted(x["example"].rsplit(" ", 1)[1] for x in rows) == ["shop/checkout", "shop/search"]
    for row in rows:
        assert row["verdict"] == "pass" and row["observed"] == row["predicted"], json.dumps(row, indent=1)
        assert row["shape"].startswith("nginx ") and row["controller_version"] == controller_version
        # the weight the controller wrote is the canary Ingress's annotation, and it was written while partial
        records = load(Path(row["evidence"]))
        weights = [int(x["obj"]["annotations"].get("nginx.ingress.kubernetes.io/canary-weight", -1))
                   for x in records if x["kind"] == "Ingress" and x["name"].endswith("-canary") and x["obj"]]
        assert row["observed"] in weights, weights
        assert not [x for x in records if x["kind"] == "VirtualService"]
        end = records[-1]["obj"]
        assert end["complete"] and end["audit_log_checked"] and end["audit_writes_checked"] >= 1, end
    ledger = [x for x in read_rows(Path(out["stats"]["verify_run"]) / "ledger.json") if x["step"] == "verify"]
    assert [(x["verdict"], x["router"]) for x in ledger] == [("pass", "nginx"), ("pass", "nginx")]
