"""Signals at named phases of a drill.

Live mode on the stand-in stage: the first SIGINT/SIGTERM stops the drill and restores (exit 3, the interrupted
step's rows never `pass`); a second one abandons the restore (the lease and the journal stay, and the console names
the journal), a third one is only noted; after SIGKILL the lease and the journal stay and `drills restore` finishes
the restore.  A probe stopped by a signal removes its namespace and holds.  Holds on the stage's pods make a phase
last until the case has acted (the stage's pods are slow to turn Ready), never a sleep."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from checks import World, lease_of
from faultkit import DrillProc
from kubernetes import client

from drills import safety
from drills.cluster.availability import Availability
from drills.rollout import HASH_LABEL
from drills.wait import until

pytestmark = pytest.mark.single_version


def _phase_holds(s, phase: str) -> None:
    """Holds that make ``phase`` last until the case acts (placed before the drill reaches it)."""
    if phase == "before":
        s.hold(s.d.hash_v1)                   # the revived pods stay un-Ready: BEFORE waits for them
    elif phase == "exit":
        s.hold(s.d.hash_v1, period=3)         # one revived pod per 3 s: the exit's abort goes out at 1 of 2


def _reach(s, drill, phase: str) -> None:
    if phase == "after":                      # BEFORE runs freely; AFTER's revived pods are held
        s.reach("redeploy", drill)
        s.hold(s.d.hash_v1)
    s.reach(phase, drill)


def _slow_stable(s) -> None:
    """The stable revision's pods slow to return: one is deleted while held, so a restore (which waits for the
    stable ReplicaSet Healthy) lasts until the case releases it."""
    s.hold(s.d.hash_v2)
    core = client.CoreV1Api(s.kube)
    pod = core.list_namespaced_pod(s.ns, label_selector=f"{HASH_LABEL}={s.d.hash_v2}").items[0]
    core.delete_namespaced_pod(pod.metadata.name, s.ns, grace_period_seconds=0)


def _journal_named(drill) -> Path:
    """The journal path the console named for `drills restore --journal`."""
    line = next(x for x in drill.console.splitlines() if "drills restore --journal " in x)
    return Path(line.split("drills restore --journal ", 1)[1].split()[0].rstrip(".;,"))


@pytest.mark.parametrize("sig,phase,over", [
    pytest.param(signal.SIGINT, "before", {}, id="sigint-during-before"),
    pytest.param(signal.SIGTERM, "redeploy", {"scale_down_delay": 6}, id="sigterm-during-redeploy"),
    pytest.param(signal.SIGINT, "after", {}, id="sigint-during-after"),
    pytest.param(signal.SIGTERM, "exit", {}, id="sigterm-during-exit"),
])
def test_first_signal_stops_and_restores(stage, sig, phase, over):
    s = stage(**over)
    _phase_holds(s, phase)
    drill = s.live()
    _reach(s, drill, phase)
    drill.send(sig)
    s.release()
    assert drill.wait() == 3, drill.tail()
    assert "Traceback" not in drill.console, drill.tail()
    s.assert_restored()
    s.assert_no_pass_from(phase)
    assert any(r["verdict"] == "inconclusive" and sig.name in (r["reason"] or "") for r in s.rows()), s.rows()
    assert safety.Journal.load(next(s.reports.glob("*/journal.json"))).state == "restored"
    s.assert_nothing_left()


@pytest.mark.parametrize("third", [pytest.param(False, id="second-sigint-during-restore"),
                                   pytest.param(True, id="third-sigint-during-abandon")])
def test_second_signal_abandons_the_restore_third_is_noted(stage, third):
    s = stage()
    _phase_holds(s, "before")
    drill = s.live()
    s.reach("before", drill)
    _slow_stable(s)
    drill.send(signal.SIGINT)
    drill.wait_line("restore: ")
    drill.send(signal.SIGINT)
    if third:                   # as a user hammering Ctrl-C: the third lands while the abandon is handled
        drill.send(signal.SIGINT)
    drill.wait_line("restore abandoned")
    assert drill.wait() == 3, drill.tail()
    assert "Traceback" not in drill.console, drill.tail()
    lease = lease_of(s.kube, s.ns, s.name)
    journal = _journal_named(drill)
    assert lease.get("journal") == str(journal), (lease, drill.tail())
    assert safety.Journal.load(journal).state == "abandoned"
    s.assert_no_pass_from("before")
    s.release()
    r = s.restore(journal)
    assert r.returncode == 0, r.stderr
    s.assert_restored()
    s.assert_nothing_left()


@pytest.mark.parametrize("phase", [pytest.param("before", id="sigkill-during-before"),
                                   pytest.param("exit", id="sigkill-during-exit"),
                                   pytest.param("restore", id="sigkill-during-restore")])
def test_sigkill_leaves_lease_and_journal_for_drills_restore(stage, phase):
    s = stage()
    _phase_holds(s, "exit" if phase == "exit" else "before")
    drill = s.live()
    if phase == "restore":
        s.reach("before", drill)
        _slow_stable(s)
        drill.send(signal.SIGINT)
        drill.wait_line("restore: ")
    else:
        s.reach(phase, drill)
    drill.send(signal.SIGKILL)
    assert drill.wait() == -signal.SIGKILL
    lease = lease_of(s.kube, s.ns, s.name)
    assert lease.get("journal"), "after kill -9 the lease stays and names the journal"
    journal = Path(lease["journal"])
    assert safety.Journal.load(journal).state == "open"
    s.assert_no_pass_from("before" if phase == "restore" else phase)
    s.release()
    r = s.restore(journal)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    s.assert_restored()
    assert safety.Journal.load(journal).state == "restored"
    s.assert_nothing_left()


# --- the probe: its own namespace, its holds ---------------------------------------------------------------
def _probe_hold(kube, world) -> list:
    return [h for h in Availability(kube).config().get("holds", []) if h["namespace"] not in world.namespaces]


@pytest.mark.parametrize("sig,line", [
    pytest.param(signal.SIGINT, "probe: deploy v2", id="sigint-during-deploy"),
    pytest.param(signal.SIGTERM, "probe: roll back to v1", id="sigterm-during-rollback"),
])
def test_probe_stopped_by_a_signal_removes_namespace_and_holds(kube, cluster, controller_version, tmp_path, sig,
                                                                line):
    world = World(kube, cluster)
    drill = DrillProc(["probe", "--steps", "5,pause:2s,100", "--replicas", "2", "--hold", "30", "--controller",
                       controller_version], dict(os.environ, DRILLS_REPORTS=str(tmp_path)))
    try:
        drill.wait_line(line)
        if "roll back" in line:            # the revived pods held: the rollback is under way
            until("the probe's hold on its revived pods", lambda: _probe_hold(kube, world), timeout=60)
        drill.send(sig)
        assert drill.wait() == 3, drill.tail()
    finally:
        drill.stop()
    assert "Traceback" not in drill.console and sig.name in drill.console, drill.tail()
    assert world.leftovers(drill) == []
