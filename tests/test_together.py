"""Probes side by side (drills.drill.together): results by name, the points steps wait for, a slot limit, and the
stop that makes each probe in flight unwind through its own clean-up."""
from __future__ import annotations

import functools
import signal
import threading

import pytest

from drills.core.signals import Interrupted
from drills.core.wait import WaitTimeout, hold_for, until
from drills.drill.together import ProbeEnded, Together, raising


def quiet(_m: str) -> None:
    pass


def test_results_come_back_by_name_and_a_failure_is_raised_where_it_is_read():
    t = Together("test", quiet)
    gate = threading.Event()

    def ok(value, reached):
        reached("half way")
        until("the gate to open", gate.is_set, timeout=60)
        return value * 2

    def bad(reached):
        raise WaitTimeout("the rollback did not settle")

    t.start("ok", ok, 21)
    t.start("bad", bad)
    assert t.wait("ok", "half way") is None          # the point, while the probe is still running
    assert "ok" in t.in_flight()
    gate.set()
    assert t.wait("ok") == 42
    with pytest.raises(WaitTimeout, match="did not settle"):
        t.wait("bad")
    with pytest.raises(WaitTimeout, match="did not settle"):   # failed before the point: the failure, not a hang
        t.wait("bad", "half way")
    assert isinstance(t.outcome("bad"), WaitTimeout) and t.outcome("ok") == 42
    t.wait_all()
    assert t.in_flight() == []


def test_a_probe_that_ends_without_the_point_says_so():
    t = Together("test", quiet)
    t.start("short", lambda reached: "done")
    with pytest.raises(ProbeEnded, match="ended without reaching 'deployed'"):
        t.wait("short", "deployed")
    assert t.wait("short") == "done"
    with pytest.raises(ValueError, match="started twice"):
        t.start("short", lambda reached: None)
    with pytest.raises(ProbeEnded, match="never started"):
        t.wait("hazard")
    t.start("no namespace", raising(RuntimeError("namespace not made")))    # a set-up that failed: its own step
    with pytest.raises(RuntimeError, match="namespace not made"):
        t.wait("no namespace", "deployed")


def test_held_lines_are_written_by_the_step_that_reads_the_probe():
    """Under pytest's capture a test gets the lines written while it runs: a probe's lines wait for the step that
    reads it, so a failing step's report holds its own probe's lines; the ones no step read come out at the stop."""
    out: list[str] = []
    t = Together("abort", out.append, hold_lines=True)
    go = threading.Event()

    def probe(name, reached):
        log = t.lines_of(name, f"[{name}] ")
        log("deploy v1")
        reached("deployed")
        until("the go", go.is_set, timeout=60, interval=0.01)
        log("rollback")
        if name == "b":
            raise WaitTimeout("the rollback did not settle")
        return name

    for n in ("a", "b", "c"):
        t.start(n, functools.partial(probe, n))
    t.wait("a", "deployed")
    assert out == ["[a] deploy v1"]
    go.set()
    assert t.wait("a") == "a" and out == ["[a] deploy v1", "[a] rollback"]
    with pytest.raises(WaitTimeout):
        t.wait("b")
    assert out[2:] == ["[b] deploy v1", "[b] rollback"]
    until("c to end", lambda: t.in_flight() == [], timeout=60, interval=0.01)
    assert t.stop(Interrupted(signal.SIGINT)) == [] and out[4:] == ["[c] deploy v1", "[c] rollback"]
    passing = Together("verify", out.append)          # not held: written as they come (a command's progress)
    passing.lines_of("x", "[x] ")("now")
    assert out[-1] == "[x] now"


def test_at_once_bounds_the_probes_in_flight():
    t = Together("test", quiet, at_once=2)
    lock = threading.Lock()
    now, most = [0], [0]
    release = threading.Event()

    def probe(reached):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        until("the release", release.is_set, timeout=60, interval=0.01)
        with lock:
            now[0] -= 1

    def starts():
        for i in range(5):
            if i == 4:                # the caller's own slot (scan --verify takes it before making a namespace)
                t.slot()
                t.start(str(i), probe, slotted=True)
            else:
                t.start(str(i), probe)
    starter = threading.Thread(target=starts, daemon=True)
    starter.start()
    until("two probes in flight and the third waiting for a slot", lambda: now[0] == 2 and len(t.in_flight()) == 2,
          timeout=30, interval=0.01)
    assert starter.is_alive()                 # the third start waits for a slot
    release.set()
    until("every probe started", lambda: not starter.is_alive(), timeout=60)
    t.wait_all()
    assert most[0] == 2 and now[0] == 0


def test_stop_makes_each_probe_unwind_through_its_clean_up_and_names_one_that_does_not():
    lines: list[str] = []
    t = Together("order", lines.append, stop_s=5.0)
    cleaned: list[str] = []
    inside = {"wait": threading.Event(), "hold": threading.Event(), "deaf": threading.Event()}
    deaf_release = threading.Event()

    def waits(reached):
        try:
            inside["wait"].set()
            until("a condition that never holds", lambda: None, timeout=600)
        finally:
            cleaned.append(until("the clean-up's own wait", lambda: "wait", timeout=5))

    def holds(reached):
        try:
            inside["hold"].set()
            hold_for(600, "an evidence window")
        finally:
            cleaned.append("hold")

    def deaf(reached):       # waits where no stop reaches it (not through drills.core.wait)
        inside["deaf"].set()
        deaf_release.wait(120)

    t.start("wait", waits)
    t.start("hold", holds)
    t.start("deaf", deaf)
    for name, ev in inside.items():
        assert ev.wait(30), name
    stuck = t.stop(Interrupted(signal.SIGINT, "the lane ended with its probes in flight"))
    assert stuck == ["deaf"], (stuck, lines)
    assert sorted(cleaned) == ["hold", "wait"]
    for name in ("wait", "hold"):
        with pytest.raises(Interrupted, match="the lane ended"):
            t.wait(name)
    assert lines[0] == "order: stopping 3 probe(s) in flight (the lane ended with its probes in flight)", lines
    assert "order: 1 probe(s) did not stop within 5s (deaf)" in lines[-1], lines
    deaf_release.set()
    assert t.wait("deaf") is None
    assert t.stop(Interrupted(signal.SIGINT)) == []       # nothing in flight: nothing said
    assert len(lines) == 2
    until("the main thread's own wait, never told to stop", lambda: True, timeout=1)


def test_a_lane_closed_with_its_probes_in_flight_stops_them_and_each_cleans_up(tmp_path):
    """A leg stopped (the run's SIGINT) or ended early: the lane's close stops the probes it runs side by side, each
    unwinding through its own clean-up, before the lane removes what they made."""
    from drills.lanes.base import LaneContext, Runbook, step
    from drills.record.ledger import Ledger

    lines: list[str] = []
    cleaned: list[str] = []

    class TwoProbes(Runbook):
        key = "two-probes"
        title = "two probes side by side"

        def _probe(self, name, reached):
            reached("deployed")
            try:
                until(f"{name}'s rollback to settle", lambda: None, timeout=600)
            finally:
                cleaned.append(name)

        @step()
        def first_deployed(self):
            self.run_together({n: functools.partial(self._probe, n) for n in ("one", "two")})
            self.probes.wait("one", "deployed")

    ctx = LaneContext(api=None, namespace="ns", evidence_dir=tmp_path, ledger=Ledger(tmp_path, "r", "embedded",
                      "v1.8.2"), version="v1.8.2", log=lines.append)
    lane = TwoProbes(ctx)
    lane.first_deployed()
    assert sorted(lane.probes.in_flight()) == ["one", "two"]
    lane.close()
    assert sorted(cleaned) == ["one", "two"] and lane.probes.in_flight() == []
    assert lines == ["two-probes: stopping 2 probe(s) in flight (lane two-probes ended with its probes in flight)"]
    with pytest.raises(Interrupted):
        lane.probes.wait("two")


def test_after_the_stop_a_stuck_probes_lines_come_as_they_are_written():
    out: list[str] = []
    t = Together("order", out.append, stop_s=0.5, hold_lines=True)
    release = threading.Event()
    log = t.lines_of("deaf", "[deaf] ")

    def deaf(reached):          # waits where no stop reaches it
        log("before")
        release.wait(60)
        log("its clean-up")

    t.start("deaf", deaf)
    until("its first line, held", lambda: "[deaf] before" in t._lines.get("deaf", []), timeout=30, interval=0.01)
    assert out == []
    assert t.stop(Interrupted(signal.SIGINT)) == ["deaf"]
    assert "[deaf] before" in out                      # what no step read, written at the stop
    release.set()
    assert t.outcome("deaf") is None and out[-1] == "[deaf] its clean-up"
