"""How builders share one cache: lock files taken with flock (a component's lock, the cache's build slots), a
progress line naming the holder while another process has them, and how many builds run at a time."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from ..core.errors import BadInput
from .components import BuildError
from ..core.wait import until

WAIT_PROGRESS_S = 30.0             # a progress line this often while another process builds what is needed
LOCK_POLL_S = 0.5
LOCK_WAIT_TIMEOUT_S = 4 * 3600.0   # another process's build of every component, cold, on a slow machine
# go commands running in this process (any thread), so that a signal stops all of them
_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()
# (component, seconds) of every wait for another process's build in this process, for whoever reports them (the
# test session lists the tests that waited)
WAITS: list[tuple[str, float]] = []


MAX_JOBS = 8


def check_jobs(jobs, what: str = "-j") -> int:
    """A number of builds at a time, 1 to MAX_JOBS; BadInput otherwise."""
    text = str(jobs).strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 2 and 1 <= int(text) <= MAX_JOBS):
        raise BadInput(f"{what} {str(jobs)[:40]!r}: give a whole number of builds at a time, 1 to {MAX_JOBS}")
    return int(text)


def build_jobs() -> int:
    """Components built at a time (and build slots taken on the cache): DRILLS_BUILD_JOBS, else 2 on a machine of
    two cores or more.  A single go build leaves cores idle (its links, the packages every other one waits for,
    the downloads) and two builds fill them; each takes longer, the set finishes sooner (figures:
    benchmarks/bench_toolchain.py)."""
    raw = os.environ.get("DRILLS_BUILD_JOBS", "")
    if raw.strip():
        return check_jobs(raw, "DRILLS_BUILD_JOBS=")
    return 2 if (os.cpu_count() or 1) >= 2 else 1


BUILD_PRIORITIES = ("normal", "background")


def build_priority(default: str = "normal") -> str:
    """DRILLS_BUILD_PRIORITY: ``background`` (builds beside drills run their go commands below them, see
    drills.core.procs.background_priority) or ``normal``; unset, the caller's ``default``; BadInput otherwise.
    Normal unless said: a drill or test that waits for a component would otherwise wait for a build the drills
    beside it starve (measured: kube-state-metrics 25 min at the background priority beside five test workers)."""
    raw = os.environ.get("DRILLS_BUILD_PRIORITY", "").strip() or default
    if raw not in BUILD_PRIORITIES:
        raise BadInput(f"DRILLS_BUILD_PRIORITY={raw[:40]!r}: give {' or '.join(BUILD_PRIORITIES)}")
    return raw


def _open_lock(path: Path):
    """The lock file, opened without following a link (a link there is refused: the lock writes who holds it);
    a lock that is not a regular file, or a cache that cannot be written, is bad input."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        why = "a link (refused)" if e.errno == errno.ELOOP else e.strerror
        raise BadInput(f"the build lock {path} cannot be used: {why}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadInput(f"the build lock {path} cannot be used: not a regular file")
    return os.fdopen(fd, "r+")


@contextmanager
def hold_any(paths: list[Path], wait_name: str, what: str, log: Callable[[str], None],
             busy: Callable[[list[str]], str], count: bool = False, stop: threading.Event | None = None):
    """flock one of ``paths`` (the first free one) until the block ends.  While every one is held by another
    process, a progress line every WAIT_PROGRESS_S (``busy(holders)``: each lock file says who holds it: pid,
    what, since when); ``count``: the wait goes into WAITS under ``what``; ``stop`` set: the wait ends with
    BuildError (the build was stopped)."""
    handles = []
    try:
        for path in paths:
            handles.append(_open_lock(path))
        t0 = time.monotonic()
        said: list = [None]
        got: list = [None]

        def free() -> bool:
            if stop is not None and stop.is_set():
                raise BuildError(f"{what}: the build was stopped while it waited ({wait_name})")
            for fh in handles:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    got[0] = fh
                    return True
                except BlockingIOError:
                    continue
            now = time.monotonic()
            if said[0] is None or now - said[0] >= WAIT_PROGRESS_S:
                holders = []
                for fh in handles:
                    fh.seek(0)
                    holders.append(fh.read(400).strip())
                log(f"toolchain: {busy(holders)}" + (f"; waiting {now - t0:.0f}s" if said[0] is not None
                                                     else "; waiting for it"))
                said[0] = now
            return False
        until(wait_name, free, timeout=LOCK_WAIT_TIMEOUT_S, interval=LOCK_POLL_S)
        if said[0] is not None and count:
            WAITS.append((what, round(time.monotonic() - t0, 1)))
        fh = got[0]
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()}, {what}, since {time.strftime('%H:%M:%S', time.localtime())}")
            fh.flush()
            yield
        finally:
            fh.seek(0)
            fh.truncate()
            fh.flush()
            fcntl.flock(fh, fcntl.LOCK_UN)
    finally:
        for fh in handles:
            fh.close()
