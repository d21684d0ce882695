"""Signals at named phases of a drill.

Live mode on the stand-in stage: the first SIGINT/SIGTERM stops the drill and restores (exit 3, the interrupted
step's rows never `pass`); a second one abandons the restore (the lease and the journal stay, and the console names
the journal), a third one is only noted; after SIGKILL the lease and the journal stay and `drills restore` finishes
the restore (those: test_fault_sigkill).  A probe stopped by a signal removes its namespace and holds.  Holds on the stage's pods make a phase
last until the case has acted (the stage's pods are slow to turn Ready), never a sleep."""
from __future__ import annotations

import os
import signal

import pytest
from checks import World
from faultkit import DrillProc
from riding import phase_holds

from drills.drill import safety
from drills.cluster.availability import Availability
from drills.core.wait import until

pytestmark = pytest.mark.single_version


def _reach(s, drill, phase: str) -> None:
    if phase == "after":                      # BEFORE runs freely; AFTER's revived pods are held
        s.reach("redeploy", drill)
        s.hold(s.d.hash_v1)
    s.reach(phase, drill)


@pytest.mark.parametrize("sig,phase,over", [
    pytest.param(signal.SIGINT, "before", {}, id="sigint-during-before"),
    pytest.param(signal.SIGTERM, "redeploy", {"scale_down_delay": 6}, id="sigterm-during-redeploy"),
    pytest.param(signal.SIGINT, "after", {}, id="sigint-during-after"),
    pytest.param(signal.SIGTERM, "exit", {}, id="sigterm-during-exit"),
])
def test_first_signal_stops_and_restores(stage, sig, phase, over):
    s = stage(**over)
    phase_holds(s, phase)
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
