"""Standard output whose reader may leave early (`drills ... | head`)."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager


class ReaderMayLeave:
    """A command's standard output that outlives its reader: once the reader has gone (``drills ... | head``, a
    broken pipe), what is still written goes to /dev/null and the command carries on to its own exit code, as
    `drills scan` always did: a drill is never cut short by it, and its cleanup and verdict stay what they were."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
        except OSError:
            return
        try:
            os.dup2(fd, self._stream.fileno())      # what is still buffered is flushed there, at exit too
        except (OSError, ValueError):
            pass
        finally:
            os.close(fd)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextmanager
def readers_may_leave():
    """sys.stdout and sys.stderr as ReaderMayLeave for the block (a stream that is None, a closed descriptor at the
    start, stays None), flushed and put back at its end."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (None if s is None else ReaderMayLeave(s) for s in saved)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        sys.stdout, sys.stderr = saved
