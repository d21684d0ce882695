"""Live mode runs the whole runbook against the embedded cluster used as a stand-in stage: lane A's exit under
a signal, and lane B's read-only watch of the next deploy (a deploy during the watch; none at all)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from drills.drill import safety
from drills.core.podtemplate import container_images
from drills.kube.rollout import Rollouts, healthy_at
from drills.core.wait import until

pytestmark = pytest.mark.single_version


def _ledger(reports) -> list[dict]:
    return json.loads(next(reports.glob("*/ledger.json")).read_text())


def test_sigint_during_the_live_exit_restores_and_no_exit_row_passes(kube, namespace, stage_rollout, live_cmd):
    d = stage_rollout()
    original = Rollouts(kube, namespace).get("svc")
    env = dict(os.environ, DRILLS_REPORTS=str(live_cmd.reports), DRILLS_CONFIG="/nonexistent/drills.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "drills", *live_cmd.args("svc")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    # the exit's recording exists once the exit's rollback is about to be sent
    until("the live exit to start", lambda: list(live_cmd.reports.glob("*/live/exit.timeline.jsonl")), bool, 600,
          interval=0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(600) == 3, "".join(err)
    rows = _ledger(live_cmd.reports)
    assert not any(r["verdict"] == "pass" for r in rows if r["step"] == "exit"), rows
    assert any(r["verdict"] == "inconclusive" and "SIGINT" in (r["reason"] or "") for r in rows), rows
    ro = Rollouts(kube, namespace).get("svc")
    assert ro["spec"]["template"] == original["spec"]["template"]
    assert ro["spec"]["strategy"]["canary"]["steps"] == original["spec"]["strategy"]["canary"]["steps"]
    assert healthy_at(d.hash_v2)(ro) and safety.LEASE_ANNOTATION not in (ro["metadata"].get("annotations") or {})


def test_live_lane_b_observes_a_deploy_started_during_the_watch(kube, namespace, stage_rollout, live_cmd):
    stage_rollout(steps=[{"setWeight": 5}, {"pause": {"duration": "2s"}}])    # the base bump's steps
    env = dict(os.environ, DRILLS_REPORTS=str(live_cmd.reports), DRILLS_CONFIG="/nonexistent/drills.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "drills", *live_cmd.args("svc", "--lanes", "b", "--duration",
                                                                            "300s")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()
    assert "watching" in first, first
    rl = Rollouts(kube, namespace)
    before = rl.get("svc")
    rl.set_image("svc", "registry.local/svc:v3", container="app")       # the next deploy, by someone else
    out, rest = proc.communicate(timeout=600)
    assert proc.returncode == 0, first + rest
    rows = {r["assertion"]: r for r in _ledger(live_cmd.reports)}
    assert {r["verdict"] for r in rows.values()} == {"pass"}, rows
    assert rows["the deploy reaches weight 100 through the controller's end-of-steps default"]["observed"] == 100
    after = rl.get("svc")
    assert container_images(after["spec"]["template"])["app"] == "registry.local/svc:v3"
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1, "the watch sent nothing"


def test_live_lane_b_without_a_deploy_is_inconclusive_at_the_duration(kube, namespace, stage_rollout, live_cmd):
    stage_rollout(steps=[{"setWeight": 5}, {"pause": {"duration": "2s"}}])
    r = live_cmd("--lanes", "b", "--duration", "5s")
    assert r.returncode == 3, r.stderr
    rows = _ledger(live_cmd.reports)
    assert rows and all(row["verdict"] == "inconclusive" and "no deploy" in row["reason"] for row in rows), rows
