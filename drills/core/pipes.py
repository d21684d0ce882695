"""Standard output whose reader may leave early (`drills ... | head`)."""
from __future__ import annotations

import os


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
            os.dup2(fd, self._stream.fileno())      # what is still buffered is flushed there, at exit too
            os.close(fd)
        except (OSError, ValueError):
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)
