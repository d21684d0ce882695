"""A second and a third signal during a live drill's restore, and SIGKILL at named phases.

A second SIGINT abandons the restore (the lease and the journal stay, and the console names the journal), a third
one is only noted; after SIGKILL the lease and the journal stay and `drills restore` finishes the restore."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest
from checks import lease_of
from riding import journal_named, phase_holds, slow_stable

from drills.drill import safety

pytestmark = pytest.mark.single_version


@pytest.mark.parametrize("third", [pytest.param(False, id="second-sigint-during-restore"),
                                   pytest.param(True, id="third-sigint-during-abandon")])
def test_second_signal_abandons_the_restore_third_is_noted(stage, third):
    s = stage()
    phase_holds(s, "before")
    drill = s.live()
    s.reach("before", drill)
    slow_stable(s)
    drill.send(signal.SIGINT)
    drill.wait_line("restore: ")
    drill.send(signal.SIGINT)
    if third:                   # as a user hammering Ctrl-C: the third lands while the abandon is handled
        drill.send(signal.SIGINT)
    drill.wait_line("restore abandoned")
    assert drill.wait() == 3, drill.tail()
    assert "Traceback" not in drill.console, drill.tail()
    lease = lease_of(s.kube, s.ns, s.name)
    journal = journal_named(drill)
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
    phase_holds(s, "exit" if phase == "exit" else "before")
    drill = s.live()
    if phase == "restore":
        s.reach("before", drill)
        slow_stable(s)
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
