"""Signals: SIGINT/SIGTERM become ``Interrupted`` in the main thread, so a drill stops where it is and restores.

During a restore a second signal raises again (the restore is abandoned, what is left is said); after
``quiet()`` further signals are only noted.  A watchdog thread stops a drill the same way (``SignalGuard.stop``):
the main thread gets ``Interrupted`` carrying the watchdog's reason, even inside a blocking read.  Inside ``held()``
(a process started and recorded as ours) the ``Interrupted`` comes at the stretch's end, not in its middle.  One that
Python swallowed (its handler ran inside a finalizer) comes again a moment later.
"""
from __future__ import annotations

import _thread
import signal
import sys
import threading
import time
from contextlib import contextmanager

_held = [0]                             # the main thread's depth of held() stretches
_pending: list[BaseException] = []      # an Interrupted that came during one


@contextmanager
def held():
    """A stretch a signal must not cut in two (a child started but not yet recorded would be left running unknown):
    in the main thread, a guard's ``Interrupted`` is raised when the stretch ends.  Elsewhere it changes nothing (a
    signal's handler runs in the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _held[0] += 1
    try:
        yield
    finally:
        _held[0] -= 1
        if not _held[0] and _pending:
            exc = _pending[0]
            _pending.clear()
            raise exc


REDELIVER_S = 0.01     # how long after a swallowed Interrupted its signal comes again


def _send_later(guard: "SignalGuard", pending: "Interrupted") -> None:
    time.sleep(REDELIVER_S)
    with guard._lock:              # only while it is still pending: a guard that ended raised it itself
        if guard._again is pending and guard._main is not None:
            signal.pthread_kill(guard._main, pending.signum)


class Interrupted(BaseException):
    """A drill was interrupted by a signal, or stopped by a watchdog (``reason``)."""

    def __init__(self, signum: int, reason: str | None = None):
        super().__init__(reason or f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.reason = reason


# --- threads a command runs side by side (drills.scan.verify.run_shapes) --------------------------------------------
# A signal reaches the main thread only.  The threads it started are told to stop: each raises ``Interrupted`` once, at
# its next wait (drills.core.wait.until and hold_for, a watch loop: drills.kube.watching cuts their streams), so each
# unwinds through its own finally blocks (a probe's holds released, its recording stopped) while the cluster is up.
_cancel_lock = threading.Lock()
_cancelled: dict[int, Interrupted] = {}
_wakeups: dict[int, threading.Event] = {}


def cancel_threads(idents, cause: Interrupted) -> None:
    """The threads ``idents`` (``Thread.ident``) raise ``Interrupted`` like ``cause`` at their next wait."""
    with _cancel_lock:
        for ident in idents:
            _cancelled[ident] = cause
            if ident in _wakeups:
                _wakeups[ident].set()


def forget_threads(idents) -> None:
    """Threads that ended: their idents may be a new thread's next."""
    with _cancel_lock:
        for ident in idents:
            _cancelled.pop(ident, None)
            _wakeups.pop(ident, None)


def check_cancelled() -> None:
    """In a thread told to stop: raise its ``Interrupted``, once (the clean-up it unwinds through may wait in turn;
    elsewhere nothing)."""
    if not _cancelled:
        return
    with _cancel_lock:
        cause = _cancelled.pop(threading.get_ident(), None)
    if cause is not None:
        raise Interrupted(cause.signum, cause.reason)


def wakeup() -> threading.Event:
    """The calling thread's event, set while it is told to stop (a timed wait on it ends then)."""
    with _cancel_lock:
        ev = _wakeups.setdefault(threading.get_ident(), threading.Event())
        if threading.get_ident() in _cancelled:
            ev.set()
        else:
            ev.clear()
        return ev


class SignalGuard:
    """Turns SIGINT/SIGTERM into ``Interrupted`` in the main thread.  During restore a second signal raises
    again so restore can be abandoned; after ``quiet()`` further signals are only counted."""

    def __init__(self):
        self.count = 0
        self.received: int | None = None
        self._old = {}
        self._quiet = False
        self._main: int | None = None
        self._stop_reason: str | None = None
        self._stop_handled = threading.Event()
        self._again: Interrupted | None = None
        self._lock = threading.Lock()
        self._hook = None

    def _unraisable(self, u) -> None:
        """An Interrupted raised while the main thread ran a finalizer (``__del__``, a weakref callback, the GC's) is
        swallowed by Python (reported here, "Exception ignored"): the signal would be lost, the drill would go on.
        It is delivered again, until it lands outside one."""
        if isinstance(u.exc_value, Interrupted) and self._main is not None and not self._quiet:
            self._again = u.exc_value
            # from another thread, a moment later: sent from here, the handler would run at once, inside this hook
            _thread.start_new_thread(_send_later, (self, u.exc_value))
            return
        (self._hook or sys.__unraisablehook__)(u)

    def _handler(self, signum, frame):
        again, self._again = self._again, None
        if again is not None and not self._quiet:
            raise again               # the same Interrupted once more: the first was lost in a finalizer
        self.count += 1
        self.received = signum
        reason, self._stop_reason = self._stop_reason, None
        if reason is not None:
            self._stop_handled.set()
        if self._quiet:
            if reason is None:
                print(f"drills: {signal.Signals(signum).name} noted; finishing up", file=sys.stderr, flush=True)
            return
        if _held[0]:
            if not _pending:
                _pending.append(Interrupted(signum, reason))
            return
        raise Interrupted(signum, reason)

    def quiet(self) -> None:
        self._quiet = True

    def stop(self, reason: str) -> bool:
        """From another thread: interrupt the main thread as SIGTERM would, with ``reason`` (a blocking read
        there is interrupted too).  False when the guard does not hold the main thread or is already quiet."""
        if self._main is None or self._quiet:
            return False
        self._stop_handled.clear()
        self._stop_reason = reason
        signal.pthread_kill(self._main, signal.SIGTERM)
        return True

    def await_stop(self, timeout: float = 10.0) -> None:
        """In the main thread, after ``stop()`` was sent: until its handler ran (it raises ``Interrupted`` here
        unless the guard went quiet meanwhile)."""
        if self._stop_reason is not None:
            self._stop_handled.wait(timeout)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handler)
            self._main = threading.main_thread().ident
            self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._main, again, self._again = None, self._again, None
        if self._hook is not None:
            sys.unraisablehook, self._hook = self._hook, None
        if self._quiet and self._old:
            # a process that abandoned its restore is about to exit: later signals are ignored (SIG_IGN holds
            # through the interpreter's shutdown, which resets Python-level handlers to the default)
            for s in self._old:
                signal.signal(s, signal.SIG_IGN)
            return False
        for s, h in self._old.items():
            if signal.getsignal(s) is signal.SIG_IGN and h is not signal.SIG_IGN:
                continue        # a guard inside this one went quiet before the process exits: keep ignoring
            signal.signal(s, h)
        if again is not None and exc[0] is None:
            raise again           # swallowed in a finalizer, its re-delivery not yet come: never lost at the block's end
        return False
