"""The general rollback probe on the real controller."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from drills.kit import REASON_NO_PARTIAL, DrillRollout
from drills.probe import run_probe
from drills.shapes import RolloutSpec
from drills.steps import parse_steps, steps_text


def test_parse_steps_round_trip():
    steps = parse_steps("5, pause:10s,100,pause")
    assert steps == [{"setWeight": 5}, {"pause": {"duration": "10s"}}, {"setWeight": 100}, {"pause": {}}]
    assert steps_text(steps) == "5,pause:10s,100,pause"
    for bad in ("5,paws", "101", "pause:ten"):
        with pytest.raises(ValueError):
            parse_steps(bad)


@pytest.mark.parametrize("steps,expected", [("5,pause:2s,100", 100), ("5,pause:2s", 5)])
def test_probe_peak_is_last_setweight_while_partial(kube, cluster, namespace, tmp_path, controller_version,
                                                    steps, expected):
    spec = RolloutSpec(steps=parse_steps(steps), replicas=2, min_pods=1, hold_seconds=12)
    obs, _ = run_probe(kube, namespace, spec, tmp_path, controller_version,
                       audit_log=cluster.status()["audit_log"])
    assert obs.inconclusive_reason() is None, obs.inconclusive_reason()
    assert obs.peak_canary_weight_while_partial == expected, obs.describe()
    assert obs.complete and obs.partial_window_observed and obs.rollback_in_window


@pytest.mark.single_version
def test_rollback_onto_a_ready_replicaset_is_inconclusive(kube, cluster, namespace, tmp_path, controller_version):
    """No partial-availability window: a rollback before the old ReplicaSet was scaled down
    revives pods that are already Ready (DESIGN §3), so the drill cannot pass or fail."""
    spec = RolloutSpec(steps=parse_steps("5,pause:2s,100"), replicas=2, min_pods=1, scale_down_delay=600)
    d = DrillRollout(kube, namespace, spec, tmp_path, controller_version=controller_version,
                     audit_log=cluster.status()["audit_log"])
    try:
        d.deploy_v1()
        d.deploy_v2()
        rec = d.start_rollback("early")
        d.wait_settled()
        d.release_holds()
        obs = rec.finish()
    finally:
        d.cleanup()
    assert obs.inconclusive_reason() == REASON_NO_PARTIAL, obs.describe()
    assert obs.verdict(100)[0] == "inconclusive"


@pytest.mark.single_version
def test_probe_command_json_contract(cluster, controller_version):
    r = subprocess.run([sys.executable, "-m", "drills", "probe", "--steps", "5,pause:2s,100", "--replicas", "2",
                        "--min-pods", "1", "--controller", controller_version, "--hold", "12", "--json",
                        "--routing", "host"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["peak_canary_weight_while_partial"] == 100
    assert out["partial_window_observed"] is True
    assert isinstance(out["exposure_seconds"], float) and out["exposure_seconds"] > 0
    assert out["controller_version"] == controller_version and out["routing"] == "host"
    assert os.path.exists(out["timeline"])


def test_probe_bad_input_exits_2():
    r = subprocess.run([sys.executable, "-m", "drills", "probe", "--steps", "5,paws"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--steps" in r.stderr
