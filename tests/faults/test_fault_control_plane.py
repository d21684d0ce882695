"""The stand-in stage's control plane failing under a live drill: the rollouts controller killed and started again,
the kube-apiserver restarted (every watch drops), etcd paused for longer than the drill's request timeout, and the
drill's watches resumed after etcd compacted their history (410 Gone, relist).

A drill rides these out or stops and restores; either way the target ends exactly as it was, nothing of the run is
left, the cluster is whole again, and a `pass` row stands only on a timeline that has every VirtualService write
the apiserver's audit log has (the recorder's completeness, checked independently here)."""
from __future__ import annotations

import pytest
from checks import unsupported_passes
from faultkit import (
    Paused,
    compact_etcd,
    kill_registered,
    restart_control_plane,
    restart_registered,
)
from kubernetes import client

from drills import timeline
from drills.wait import until

pytestmark = pytest.mark.single_version

REQUEST_TIMEOUT_S = 2       # the drill's DRILLS_REQUEST_TIMEOUT in these cases (the default is 15 s)


def _hold_for(s, drill, phase: str) -> None:
    """Hold the revived pods so that ``phase`` lasts until the case released them."""
    if phase == "before":
        s.hold(s.d.hash_v1)
        s.reach("before", drill)
    elif phase == "after":
        s.reach("redeploy", drill)
        s.hold(s.d.hash_v1)
        s.reach("after", drill)
    elif phase == "exit":
        s.reach("exit", drill)


def _timeline_events(s, step: str) -> list[dict]:
    path = next(s.reports.glob(f"*/live/{step}.timeline.jsonl"))
    return timeline.load(path)


def _ends_whole(s, drill, phase: str) -> list[dict]:
    """The drill's end, whatever it made of the fault: the target restored exactly, nothing left, no pass row on an
    incomplete record, and none from the faulted step on when the fault stopped the drill; returns the rows."""
    s.release()
    rc = drill.wait(900)
    assert rc in (0, 3), drill.tail()
    assert "Traceback" not in drill.console, drill.tail()
    s.assert_restored()
    rows = s.rows()
    if any(r["step"] in ("interrupted", "error") for r in rows):      # the fault stopped the drill
        s.assert_no_pass_from(phase)
    run_dir = next(s.reports.glob("*/ledger.json")).parent
    false = unsupported_passes(rows, run_dir, s.cluster.status()["audit_log"], s.ns)
    assert false == [], false
    s.assert_nothing_left()
    return rows


def _resumed(s, phase: str) -> dict:
    """The phase's recording saw its watches drop and went on: no watch of it failed for good."""
    recs = _timeline_events(s, phase)
    end = [r for r in recs if r["kind"] == "Recorder"][-1]["obj"]
    gaps = [r for r in recs if r["type"] == "GAP"]
    assert end["reconnects"] or gaps, f"the {phase} recording never saw its watches drop: {end}"
    failed = [r for r in end["reasons"] if " watch: " in r]
    assert failed == [], f"watches of the {phase} recording failed instead of resuming: {failed}"
    return {"end": end, "gaps": gaps}


@pytest.mark.parametrize("phase", [pytest.param("before", id="controller-restart-during-before"),
                                   pytest.param("after", id="controller-restart-during-after")])
def test_rollouts_controller_killed_and_restarted(stage, cluster, phase):
    s = stage()
    drill = s.live()
    _hold_for(s, drill, phase)
    image = kill_registered(cluster, "rollouts-controller")      # returns once the process is gone
    s.release()         # the revived pods may turn Ready while no controller reconciles
    restart_registered(cluster, image)
    _ends_whole(s, drill, phase)


@pytest.mark.parametrize("phase", [pytest.param("before", id="apiserver-restart-during-before"),
                                   pytest.param("after", id="apiserver-restart-during-after")])
def test_kube_apiserver_restarted(stage, cluster, phase):
    s = stage()
    drill = s.live()
    _hold_for(s, drill, phase)
    restart_control_plane(cluster, "kube-apiserver")
    _ends_whole(s, drill, phase)
    _resumed(s, phase)


def test_watch_resumed_after_compaction_relists(stage, cluster):
    """id compaction-410-during-after: the apiserver goes down, etcd compacts its history meanwhile, and every
    watch the drill resumes from an older resourceVersion is answered 410 Gone: the recorder relists."""
    s = stage()
    drill = s.live()
    _hold_for(s, drill, "after")
    pid = cluster._kwok_pids()["kube-apiserver"]
    restart = {}
    # etcd compacts its history while the apiserver is down (nothing can watch meanwhile)
    restart_control_plane(cluster, "kube-apiserver",
                          while_down=lambda: restart.setdefault("compacted_at", compact_etcd(cluster)))
    assert cluster._kwok_pids()["kube-apiserver"] != pid and restart["compacted_at"]
    _ends_whole(s, drill, "after")
    gaps = _resumed(s, "after")["gaps"]
    assert any("410" in r["obj"]["reason"] for r in gaps), "no watch of the AFTER recording was answered 410"


@pytest.mark.parametrize("phase", [pytest.param("before", id="etcd-pause-during-before"),
                                   pytest.param("exit", id="etcd-pause-during-exit")])
def test_etcd_paused_longer_than_a_request_timeout(stage, cluster, kube, phase):
    s = stage()
    if phase == "exit":
        s.hold(s.d.hash_v1, period=3)
    drill = s.live(env={"DRILLS_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S)})
    _hold_for(s, drill, phase)
    co = client.CustomObjectsApi(kube)
    timeouts = []

    def a_read_timed_out() -> bool:
        try:
            co.get_namespaced_custom_object("argoproj.io", "v1alpha1", s.ns, "rollouts", s.name,
                                            _request_timeout=(5, REQUEST_TIMEOUT_S))
        except Exception as e:      # the read the drill would send, with the drill's timeout, got no answer
            timeouts.append(type(e).__name__)
        return len(timeouts) >= 2
    with Paused(cluster, "etcd"):
        until("two reads with the drill's request timeout to go unanswered", a_read_timed_out,
              timeout=60, interval=0)
    _ends_whole(s, drill, phase)
