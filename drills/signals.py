"""Signals: SIGINT/SIGTERM become ``Interrupted`` in the main thread, so a drill stops where it is and restores.

During a restore a second signal raises again (the restore is abandoned, what is left is said); after
``quiet()`` further signals are only noted.
"""
from __future__ import annotations

import signal
import sys
import threading


class Interrupted(BaseException):
    """A drill was interrupted by a signal."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


class SignalGuard:
    """Turns SIGINT/SIGTERM into ``Interrupted`` in the main thread.  During restore a second signal raises
    again so restore can be abandoned; after ``quiet()`` further signals are only counted."""

    def __init__(self):
        self.count = 0
        self.received: int | None = None
        self._old = {}
        self._quiet = False

    def _handler(self, signum, frame):
        self.count += 1
        self.received = signum
        if self._quiet:
            print(f"drills: {signal.Signals(signum).name} noted; finishing up", file=sys.stderr, flush=True)
            return
        raise Interrupted(signum)

    def quiet(self) -> None:
        self._quiet = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        if self._quiet and self._old:
            # a process that abandoned its restore is about to exit: later signals are ignored (SIG_IGN holds
            # through the interpreter's shutdown, which resets Python-level handlers to the default)
            for s in self._old:
                signal.signal(s, signal.SIG_IGN)
            return False
        for s, h in self._old.items():
            signal.signal(s, h)
        return False
