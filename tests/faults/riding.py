"""A live drill that meets a fault of its cluster and rides it out or stops: the phase held until the case acted,
and what every such case asserts at the drill's end."""
from __future__ import annotations

from pathlib import Path

from checks import unsupported_passes
from kubernetes import client

from drills.record import timeline
from drills.kube.rollout import HASH_LABEL


def hold_through(s, drill, phase: str) -> None:
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


def timeline_events(s, step: str) -> list[dict]:
    path = next(s.reports.glob(f"*/live/{step}.timeline.jsonl"))
    return timeline.load(path)


def ends_whole(s, drill, phase: str) -> list[dict]:
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


def resumed(s, phase: str) -> dict:
    """The phase's recording saw its watches drop and went on: no watch of it failed for good."""
    recs = timeline_events(s, phase)
    end = [r for r in recs if r["kind"] == "Recorder"][-1]["obj"]
    gaps = [r for r in recs if r["type"] == "GAP"]
    assert end["reconnects"] or gaps, f"the {phase} recording never saw its watches drop: {end}"
    failed = [r for r in end["reasons"] if " watch: " in r]
    assert failed == [], f"watches of the {phase} recording failed instead of resuming: {failed}"
    return {"end": end, "gaps": gaps}


def phase_holds(s, phase: str) -> None:
    """Holds that make ``phase`` last until the case acts (placed before the drill reaches it)."""
    if phase == "before":
        s.hold(s.d.hash_v1)                   # the revived pods stay un-Ready: BEFORE waits for them
    elif phase == "exit":
        s.hold(s.d.hash_v1, period=10)        # one revived pod per 10 s: the exit's abort goes out at 1 of 2, and a
        #                                       signal sent as the exit starts lands inside it on a loaded machine


def slow_stable(s) -> None:
    """The stable revision's pods slow to return: one is deleted while held, so a restore (which waits for the
    stable ReplicaSet Healthy) lasts until the case releases it."""
    s.hold(s.d.hash_v2)
    core = client.CoreV1Api(s.kube)
    pod = core.list_namespaced_pod(s.ns, label_selector=f"{HASH_LABEL}={s.d.hash_v2}").items[0]
    core.delete_namespaced_pod(pod.metadata.name, s.ns, grace_period_seconds=0)


def journal_named(drill) -> Path:
    """The journal path the console named for `drills restore --journal`."""
    line = next(x for x in drill.console.splitlines() if "drills restore --journal " in x)
    return Path(line.split("drills restore --journal ", 1)[1].split()[0].rstrip(".;,"))
