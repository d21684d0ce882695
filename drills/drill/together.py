"""Probes side by side: each runs in a thread of its own (a Rollout in a namespace of its own, as one controller drives
many), its result read by name, and all of them stopped together.

A probe waits on pods turning Ready and on holds far more than it computes, so probes that need nothing from each
other take about the time of the longest when run together.  ``drills scan --verify`` runs its shapes so
(drills.scan.verify), and a lane runs its independent probes so (lane ``order``): each step reads its probe's
result, or a point the probe reached (``reached``), in the order the steps run.

A signal reaches the main thread only.  ``stop`` tells the probes still in flight to stop: each raises
``Interrupted`` at its next wait (drills.core.signals; their watch streams are cut) and unwinds through its own
clean-up (holds released, recording stopped) while the cluster is still up.  What did not end within the time given
is named, for the caller to remove what it made.

A lane's leg runs under pytest, whose capture gives a test the lines written while it runs: with ``hold_lines`` each
probe's lines (``lines_of``) are kept and written when a step reads that probe, so a failing step's report holds its
own probe's lines, not another's; what no step read is written when the probes are stopped (``stop``).
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from ..core.signals import Interrupted, cancel_threads, forget_threads
from ..kube.watching import cut_watches_of

STOP_S = 60.0          # how long the probes in flight may take to unwind (holds, recordings) once told to stop


class ProbeEnded(AssertionError):
    """A probe ended (with an error) before the point a step waits for."""


class _Probe:
    def __init__(self, name: str):
        self.name = name
        self.thread: threading.Thread | None = None
        self.ended = threading.Event()
        self.points: set[str] = set()
        self.result = None
        self.error: BaseException | None = None


def raising(error: BaseException) -> Callable:
    """A probe that could not be set up (its namespace not made): its failure, raised in the step that reads it."""
    def probe(reached):
        raise error
    probe.failed = error
    return probe


class Together:
    """Probes run side by side, up to ``at_once`` at a time (None: all), each by name.  ``label`` starts the lines it
    writes (``verify``, ``order``); ``hold_lines``: each probe's lines (``lines_of``) wait for the step that reads it."""

    def __init__(self, label: str, log: Callable[[str], None], at_once: int | None = None, stop_s: float = STOP_S,
                 hold_lines: bool = False):
        self.label, self.log, self.stop_s, self.hold_lines = label, log, stop_s, hold_lines
        self._slots = threading.Semaphore(max(1, int(at_once))) if at_once is not None else None
        self._probes: dict[str, _Probe] = {}
        self._changed = threading.Condition()
        self._lines: dict[str, list[str]] = {}

    def __contains__(self, name: str) -> bool:
        with self._changed:
            return name in self._probes

    # --- lines ----------------------------------------------------------------------------------------------
    def lines_of(self, name: str, prefix: str = "") -> Callable[[str], None]:
        """The probe's log: each line starts with ``prefix``; held until a step reads the probe (``hold_lines``)."""
        if not self.hold_lines:
            return lambda m: self.log(prefix + m)

        def log(m: str) -> None:
            with self._changed:
                if self.hold_lines:
                    self._lines.setdefault(name, []).append(prefix + m)
                    return
            self.log(prefix + m)
        return log

    def _write_lines(self, names) -> None:
        for name in names:
            with self._changed:
                lines = self._lines.pop(name, [])
            for line in lines:
                self.log(line)

    # --- start ----------------------------------------------------------------------------------------------
    def slot(self) -> None:
        """Wait for a free slot (``at_once``); ``start`` takes it, ``release_slot`` gives back one not used."""
        if self._slots is not None:
            self._slots.acquire()

    def release_slot(self) -> None:
        if self._slots is not None:
            self._slots.release()

    def start(self, name: str, fn: Callable, *args, slotted: bool = False, **kwargs) -> None:
        """``fn(*args, reached=..., **kwargs)`` in a thread: ``reached(point)`` says a step's point was reached; the
        return value (or the exception) is kept under ``name``.  ``slotted``: the caller took a slot (``slot()``);
        else one is taken here."""
        if name in self._probes:
            raise ValueError(f"probe {name!r} started twice")
        if not slotted:
            self.slot()
        p = _Probe(name)

        def reached(point: str) -> None:
            with self._changed:
                p.points.add(point)
                self._changed.notify_all()

        def run() -> None:
            try:
                p.result = fn(*args, reached=reached, **kwargs)
            except BaseException as e:          # handed to whoever reads the probe
                p.error = e
            finally:
                forget_threads([threading.get_ident()])     # its ident may be a later thread's
                self.release_slot()
                with self._changed:
                    p.ended.set()
                    self._changed.notify_all()

        p.thread = threading.Thread(target=run, daemon=True, name=f"probe-{name}")
        with self._changed:
            self._probes[name] = p      # recorded first: a signal during the start still tells it to stop
        p.thread.start()

    # --- read -----------------------------------------------------------------------------------------------
    def wait(self, name: str, point: str | None = None):
        """The probe's result (its exception raised here), or with ``point``: once the probe reached it (None), or
        its exception if it ended before (``ProbeEnded`` if it ended without reaching it)."""
        with self._changed:
            p = self._probes.get(name)
        if p is None:
            raise ProbeEnded(f"probe {name} was never started")
        # events and a condition only: a Thread.join a signal interrupts can leave a running thread taken for ended
        with self._changed:
            while not p.ended.is_set() and (point is None or point not in p.points):
                self._changed.wait()
        self._write_lines([name])       # interrupted, its lines wait for the stop (a test's capture drops them)
        if point is not None and point in p.points:
            return None
        if p.error is not None:
            raise p.error
        if point is not None:
            raise ProbeEnded(f"probe {name} ended without reaching {point!r}")
        return p.result

    def outcome(self, name: str):
        """The result, or the exception in its place (never raised)."""
        with self._changed:
            p = self._probes[name]
        p.ended.wait()
        self._write_lines([name])
        return p.error if p.error is not None else p.result

    def wait_all(self) -> None:
        with self._changed:
            probes = list(self._probes.values())
        for p in probes:
            p.ended.wait()
        self._write_lines([p.name for p in probes])

    def in_flight(self) -> list[str]:
        with self._changed:
            return [n for n, p in self._probes.items() if not p.ended.is_set() and p.thread is not None
                    and p.thread.ident is not None]

    # --- stop -----------------------------------------------------------------------------------------------
    def stop(self, cause: Interrupted, leftovers: str = "") -> list[str]:
        """Tell the probes in flight to stop and wait up to ``stop_s`` for them to unwind: the names of those that did
        not.  A second signal during the wait ends it at once, saying ``leftovers`` (what may be left).  The lines no
        step read are written then."""
        try:
            return self._stop(cause, leftovers)
        finally:
            with self._changed:
                names = list(self._lines)
                self.hold_lines = False     # a probe still running (stuck) writes its later lines as they come
            self._write_lines(names)

    def _stop(self, cause: Interrupted, leftovers: str) -> list[str]:
        with self._changed:
            alive = [self._probes[n] for n in self.in_flight()]
        if not alive:
            return []
        self.log(f"{self.label}: stopping {len(alive)} probe(s) in flight ({cause})")
        idents = [p.thread.ident for p in alive]
        cancel_threads(idents, cause)
        cut_watches_of(idents)
        end = time.monotonic() + self.stop_s
        try:
            for p in alive:
                p.ended.wait(max(0.0, end - time.monotonic()))
        except BaseException:               # a second signal: out at once, saying what may be left
            self.log(f"{self.label}: stopped again; what may be left of the probes: {leftovers or 'their namespaces'}")
            raise
        forget_threads([p.thread.ident for p in alive if p.ended.is_set()])   # one that ended as it was told
        stuck = [p.name for p in alive if not p.ended.is_set()]
        if stuck:
            self.log(f"{self.label}: {len(stuck)} probe(s) did not stop within {self.stop_s:g}s "
                     f"({', '.join(stuck)}); what they made is removed from here")
        return stuck
