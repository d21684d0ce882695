"""`drills scan --verify K` that could verify nothing (no Rollout of the scanned set is a shape the probe can run):
inconclusive (exit 3), naming why, never a clean exit 0.  No cluster starts: nothing is picked to probe."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from drills.core import config


def _basic_canary(name: str) -> dict:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"replicas": 4, "rollbackWindow": {"revisions": 3}, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "app", "image": "registry.local/x:1"}]}},
                     "strategy": {"canary": {"steps": [{"setWeight": 5}, {"pause": {}}]}}}}


def test_verify_that_could_verify_nothing_is_inconclusive_naming_why(tmp_path):
    manifests = tmp_path / "rollouts.yaml"
    manifests.write_text(yaml.safe_dump_all([_basic_canary("a"), _basic_canary("b")]))
    env = dict(os.environ, PYTHONPATH=str(config.project_root()), DRILLS_REPORTS=str(tmp_path / "reports"),
               DRILLS_CONFIG=str(tmp_path / "none.yaml"))
    r = subprocess.run([sys.executable, "-m", "drills", "scan", str(manifests), "--verify", "2", "--json",
                        "--fail-on", "none", "--controller", config.DEFAULT_CONTROLLER], capture_output=True,
                       text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert r.returncode == 3, (r.stdout[-2000:], r.stderr[-2000:])
    assert "could verify nothing" in r.stderr and "2 Rollout(s) not verifiable: not applicable (basic-canary)" \
        in r.stderr, r.stderr
    out = json.loads(r.stdout)
    assert out["verification"] == [] and out["stats"]["verify"].startswith("inconclusive")
    rows = json.loads((tmp_path / "reports").glob("*/ledger.json").__next__().read_text())
    (row,) = [x for x in rows if x["step"] == "verify"]
    assert row["verdict"] == "inconclusive" and "basic-canary" in row["reason"], row
