"""Signals: SIGINT/SIGTERM become ``Interrupted`` in the main thread, so a drill stops where it is and restores.

During a restore a second signal raises again (the restore is abandoned, what is left is said); after
``quiet()`` further signals are only noted.  A watchdog thread stops a drill the same way (``SignalGuard.stop``):
the main thread gets ``Interrupted`` carrying the watchdog's reason, even inside a blocking read.
"""
from __future__ import annotations

import signal
import sys
import threading


class Interrupted(BaseException):
    """A drill was interrupted by a signal, or stopped by a watchdog (``reason``)."""

    def __init__(self, signum: int, reason: str | None = None):
        super().__init__(reason or f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.reason = reason


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

    def _handler(self, signum, frame):
        self.count += 1
        self.received = signum
        reason, self._stop_reason = self._stop_reason, None
        if reason is not None:
            self._stop_handled.set()
        if self._quiet:
            if reason is None:
                print(f"drills: {signal.Signals(signum).name} noted; finishing up", file=sys.stderr, flush=True)
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
        return self

    def __exit__(self, *exc):
        self._main = None
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
        return False
