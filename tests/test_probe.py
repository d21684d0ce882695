"""The general rollback probe on the real controller."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from drills.drill.kit import REASON_NO_PARTIAL, DrillRollout, pause_seconds
from drills.drill.probe import run_probe
from drills.drill.shapes import RolloutSpec
from drills.core.steps import parse_steps, steps_text


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


def _probe_cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "drills", "probe", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


@pytest.mark.single_version
def test_incident_shape_at_fleet_size_finishes_with_the_weight_on_the_partial_replicaset(cluster, controller_version):
    """The incident's shape at its real size (issue 16): 20 replicas, minPodsPerReplicaSet 2.  The revived pods
    are released one at a time until the weight decision is on record, then together; the probe ends pass or
    inconclusive, never in a traceback, with canary weight 100 recorded on the partly available ReplicaSet."""
    r = _probe_cli("--steps", "1,pause:5s,5,pause:5s,100", "--replicas", "20", "--min-pods", "2", "--controller",
                   controller_version, "--json")
    assert r.returncode in (0, 3) and "Traceback" not in r.stderr, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert [w for w in out["weights_while_partial"] if w[1] == 100 and 0 < w[2] < 20], out["weights_while_partial"]
    assert out["rollback_in_window"] and os.path.exists(out["timeline"])
    if r.returncode == 0:
        assert out["peak_canary_weight_while_partial"] == 100 and out["inconclusive_reason"] is None
    else:
        assert out["inconclusive_reason"], out


@pytest.mark.single_version
def test_probe_without_steps_runs_on_the_real_controller(cluster, controller_version):
    """`--steps none`: a Rollout with `steps: []`.  No step index can jump, so the evidence that the rollback was
    inside rollbackWindow is what the controller says: the promotion's reason in its RolloutCompleted event, or
    its log line (the event broadcaster may drop the event once the Rollout had 25 events)."""
    r = _probe_cli("--steps", "none", "--replicas", "3", "--min-pods", "1", "--controller", controller_version,
                   "--json", "--expect", "0")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["steps_list"] == [] and out["peak_canary_weight_while_partial"] == 0
    assert out["partial_window_observed"] and out["rollback_in_window"]
    assert out["window_evidence"] and all(
        ("RolloutCompleted" in e and "Rollback within window" in e) or
        (e.startswith("controller log:") and "Rollback within the window" in e and "rollout=probe" in e)
        for e in out["window_evidence"]), out


@pytest.mark.single_version
def test_a_rollback_wait_that_runs_out_is_inconclusive_with_its_evidence(cluster, controller_version):
    r = _probe_cli("--steps", "5,pause:2s,100", "--replicas", "3", "--controller", controller_version,
                   "--rollback-timeout", "5")
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr[-3000:])
    assert "Traceback" not in r.stderr
    said = dict(line.strip().split(": ", 1) for line in r.stdout.splitlines()[1:] if ": " in line)
    assert said["INCONCLUSIVE"].startswith("the rollback did not settle within 5s: timed out after 5s waiting for")
    assert os.path.isfile(said["timeline"]) and "weights written while partial [t, weight, available, target]" in said


@pytest.mark.parametrize("text", ["none", "", " [] "])
def test_steps_none_or_empty_is_a_rollout_without_steps(text):
    from drills.cli import build_parser
    from drills.commands.main import _probe_spec
    spec = _probe_spec(build_parser().parse_args(["probe", "--steps", text]))
    assert spec.steps == []


def test_waits_scale_with_the_shape(tmp_path):
    small = DrillRollout(None, "ns", RolloutSpec(steps=parse_steps("5,pause:10s,100"), replicas=2), tmp_path)
    steps = [{"setWeight": 1}, {"pause": {"duration": "10m"}}, {"setWeight": 5}, {"pause": {"duration": "1h30m"}},
             {"setWeight": 100}]
    big = DrillRollout(None, "ns", RolloutSpec(steps=steps, replicas=20, hold_seconds=30, scale_down_delay=600),
                       tmp_path)
    assert pause_seconds(big.spec.steps) == 600 + 5400 and pause_seconds(parse_steps("pause,5")) == 0
    assert big.settle_timeout() >= 20 * 30 > small.settle_timeout()
    assert big.deploy_timeout() > 6000 > small.deploy_timeout() > 10
    assert big.scale_down_timeout() > 600 > small.scale_down_timeout()
