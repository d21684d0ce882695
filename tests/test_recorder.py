"""The flight recorder sees every weight the controller writes, even across a dropped watch."""
from __future__ import annotations

import pytest

from drills.kube.k8s import client
from drills.record import recorder, timeline
from drills.routers import istio
from drills.kube.rollout import Predicate, healthy, paused
from drills.drill.shapes import RolloutSpec, install
from drills.core.wait import hold_for


def _deploy(kube, ns, spec):
    return install(kube, ns, spec)


@pytest.mark.single_version
def test_recorder_keeps_a_sub_second_weight_across_a_dropped_watch(kube, cluster, namespace, tmp_path):
    ro = _deploy(kube, namespace, RolloutSpec(steps=[{"setWeight": 25}, {"pause": {}}], replicas=2, name="rec"))
    ro.wait("rec", healthy(), 60)
    ro.set_image("rec", "registry.local/probe:v2")
    ro.wait("rec", Predicate("paused at 25", lambda o: paused()(o) and o["status"].get("currentStepIndex") == 1), 60)
    rec = recorder.Recorder(kube, namespace, "rec", tmp_path / "rec.timeline.jsonl",
                            audit_log=cluster.status()["audit_log"]).start()
    try:
        rec.wait_for("the VirtualService at canary 25", lambda rs: any(
            r["kind"] == "VirtualService" and r["obj"]["http"][0]["route"][1]["weight"] == 25 for r in rs), 30)
        ro.abort("rec")
        # the controller sends traffic back to stable; answer at once with a retry so 0 lasts only briefly
        rec.wait_for("the VirtualService at canary 0 after abort", lambda rs: any(
            r["kind"] == "VirtualService" and r["obj"]["http"][0]["route"][1]["weight"] == 0 for r in rs), 30)
        assert rec.cut_connections() >= 1
        ro.retry("rec")
        seen_before = len(rec.records)
        rec.wait_for("canary 25 again after the retry, across the dropped watch", lambda rs: [
            w for _, w in timeline.derive(rs, None).canary_weight][-2:] == [0, 25], 30)
    finally:
        result = rec.stop()
    d = timeline.derive(rec.records, None)
    weights = d.canary_weight
    assert [w for _, w in weights][-3:] == [25, 0, 25], weights
    held = weights[-1][0] - weights[-2][0]
    assert held <= 1.0, f"weight 0 held {held:.3f}s"
    assert sum(result["reconnects"].values()) >= 1, "the watch connections were cut and resumed"
    assert result["audit_writes_checked"] and result["audit_writes_checked"] >= 2
    assert result["complete"], result["reasons"]
    assert len(rec.records) > seen_before


@pytest.mark.single_version
def test_route_writes_superseded_before_the_first_list_are_no_gap(kube, cluster, namespace, tmp_path):
    """A recorder that lists late (a loaded machine): route writes after it began but before its first list are
    in the list's state or superseded by it; no watch could see them, and the recording is still whole."""
    ro = _deploy(kube, namespace, RolloutSpec(steps=[{"setWeight": 25}, {"pause": {}}], replicas=2, name="late"))
    ro.wait("late", healthy(), 60)
    audit_log = cluster.status()["audit_log"]
    rec = recorder.Recorder(kube, namespace, "late", tmp_path / "late.timeline.jsonl", audit_log=audit_log)
    co = client.CustomObjectsApi(kube)
    for n in ("1", "2"):
        co.patch_namespaced_custom_object(istio.GROUP, istio.VERSION, namespace, "virtualservices", "late",
                                          {"metadata": {"annotations": {"drills.dev/test-write": n}}})
    rec.start()
    result = rec.stop()
    written = recorder.audit_route_writes(audit_log, namespace, since_wall=rec.started_wall)
    assert len(written) >= 2, written          # both writes on the apiserver's record, after the recorder began
    assert result["complete"], result["reasons"]
    assert any("before its first list" in n for n in result["notes"]), result["notes"]
    listed = [r["rv"] for r in rec.records if r["kind"] == "VirtualService"]
    assert listed == [written[-1]["rv"]], (listed, written)


@pytest.mark.single_version
def test_route_writes_after_the_recording_ended_are_no_gap(kube, cluster, namespace, tmp_path):
    """The controller carries on while a recorder stops (its watches end, their threads are joined): a route write
    the apiserver completed after the recording ended is outside it, said in a note, and the recording is whole."""
    ro = _deploy(kube, namespace, RolloutSpec(steps=[{"setWeight": 25}, {"pause": {}}], replicas=2, name="after"))
    ro.wait("after", healthy(), 60)
    audit_log = cluster.status()["audit_log"]
    rec = recorder.Recorder(kube, namespace, "after", tmp_path / "after.timeline.jsonl", audit_log=audit_log).start()
    co = client.CustomObjectsApi(kube)

    class ControllerWritesWhileTheWatchesEnd:      # joined last, after the watches' own threads
        def join(self, timeout=None):
            co.patch_namespaced_custom_object(istio.GROUP, istio.VERSION, namespace, "virtualservices", "after",
                                              {"metadata": {"annotations": {"drills.dev/test-write": "after"}}})
            hold_for(1.0, "the audit log catching up")
    rec.threads.append(ControllerWritesWhileTheWatchesEnd())
    result = rec.stop()
    written = recorder.audit_route_writes(audit_log, namespace, since_wall=rec.started_wall)
    assert written and written[-1]["rv"] not in {r["rv"] for r in rec.records}, written    # the timeline lacks it
    assert result["complete"], result["reasons"]
    assert any("after the recording ended" in n for n in result["notes"]), result["notes"]


def test_derive_orders_by_resource_version_not_arrival():
    rec = lambda seq, t, kind, rv, obj, name="x": {"seq": seq, "t": t, "wall": t, "kind": kind, "type": "MODIFIED",  # noqa
                                                   "name": name, "rv": str(rv), "obj": obj}
    ro = {"replicas": 2, "steps": [{"setWeight": 5}], "virtualService": "x", "destinationRule": None,
          "canaryService": None, "stableService": None,
          "status": {"currentStepIndex": 1, "phase": "Progressing", "abort": False, "promoteFull": False,
                     "stableRS": "s", "currentPodHash": "c"}}
    vs = lambda w: {"http": [{"name": "p", "route": [{"host": "x", "subset": "stable", "weight": 100 - w},  # noqa
                                                      {"host": "x", "subset": "canary", "weight": w}]}]}
    rs = lambda a: {"hash": "c", "spec_replicas": 2, "available": a, "ready": a, "replicas": 2}  # noqa
    records = [
        {"seq": 1, "t": 0.0, "wall": 0.0, "kind": "Mark", "type": "MARK", "name": "rollback", "rv": "10", "obj": {}},
        rec(2, 0.1, "Rollout", 11, ro),
        rec(3, 0.2, "ReplicaSet", 12, rs(1)),
        # the VirtualService write (rv 14) arrives after the ReplicaSet turning 2/2 (rv 15) was delivered
        rec(5, 0.5, "ReplicaSet", 15, rs(2)),
        rec(4, 0.6, "VirtualService", 14, vs(100)),
    ]
    d = timeline.derive(records, "c", since_mark="rollback")
    assert d.peak_canary_weight_while_partial == 100
    assert d.partial_window_observed


@pytest.mark.single_version
def test_watch_command_records_a_rollout_driven_by_hand(kube, cluster, namespace, tmp_path):
    import json
    import subprocess
    import sys
    ro = _deploy(kube, namespace, RolloutSpec(steps=[{"setWeight": 50}, {"pause": {"duration": "2s"}}],
                                            replicas=2, name="byhand"))
    ro.wait("byhand", healthy(), 60)
    out = tmp_path / "byhand.timeline.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "drills", "watch", "-n", namespace, "byhand", "--kubeconfig",
                             str(cluster.kubeconfig), "--duration", "25s", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "recording" in proc.stderr.readline()      # every watch has listed
    ro.set_image("byhand", "registry.local/probe:v2")
    stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["complete"] is True
    assert 50 in [w for _, w in summary["canary_weights"]], summary["canary_weights"]
    assert out.exists() and any(json.loads(line)["kind"] == "VirtualService" for line in out.open())
