"""Who uses an embedded cluster, and one `up` or `down` of a name at a time.

A cluster in use is never replaced.  Every user of a cluster (a run and each of its legs, a probe, a pytest
session, `scan --verify`) holds a marker for as long as it uses it: a small file
``$DRILLS_CACHE/clusters/.<name>.holders/<pid>-<random>.json`` saying who (user, pid, command, since when),
kept under a shared ``flock`` by the holder's process.  The lock ends with that process, however it ends
(exit, SIGKILL, a reboot), so a marker whose lock is free is a leftover and is removed; a marker whose lock is
held is a user, provably.  The markers sit beside the cluster folder (which `up` and `down` remove).

`up` and `down` of one name hold ``clusters/.<name>.up.lock`` exclusively while they change the cluster; a
second one waits for the first (a named wait, saying whom it waits for), then reuses what the first made or
replaces it when nobody holds it.  So two `up` of one name never end with no cluster while one printed "up".
"""
from __future__ import annotations

import atexit
import fcntl
import getpass
import json
import os
import secrets
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ..core.procs import identity, start_time
from ..core.wait import WaitTimeout, until
from .errors import ClusterError

MAX_MARKER_BYTES = 4096
UP_LOCK_TIMEOUT_S = 900.0      # a cold `up` (no snapshot yet) on a loaded machine, with its one retry


def user() -> str:
    try:
        return getpass.getuser()
    except Exception:           # no login name and no passwd entry: the uid says who
        return f"uid {os.getuid()}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def describe(holder: dict) -> str:
    h = holder if isinstance(holder, dict) else {}
    text = f"{h.get('user') or 'someone'} (pid {h.get('pid')}"
    if h.get("purpose"):
        text += f", {h['purpose']}"
    if h.get("since"):
        text += f", since {h['since']}"
    return " ".join((text + ")").split())[:300]


class Holder:
    """One use of a cluster: its marker file, held under a shared lock until ``release``."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


class Usage:
    """The holders of cluster ``name`` and its `up`/`down` lock, in ``clusters_dir``."""

    def __init__(self, clusters_dir: Path, name: str):
        self.name = name
        self.dir = Path(clusters_dir) / f".{name}.holders"
        self.lock_path = Path(clusters_dir) / f".{name}.up.lock"

    # --- holders -------------------------------------------------------------------------------------------
    def hold(self, purpose: str) -> Holder:
        try:
            return self._hold(purpose)
        except FileNotFoundError:      # the folder of markers was tidied away at that moment: once more
            return self._hold(purpose)

    def tidy(self) -> None:
        """Remove the folder of markers when no marker is left (a `down`)."""
        try:
            self.dir.rmdir()
        except OSError:
            pass

    def _hold(self, purpose: str) -> Holder:
        self.dir.mkdir(parents=True, exist_ok=True)
        me = os.getpid()
        record = dict(identity(me), user=user(), purpose=purpose[:200], since=_now(),
                      command=" ".join(sys.argv)[:300])
        token = secrets.token_hex(6)
        tmp = self.dir / f"{me}-{token}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.write(fd, json.dumps(record).encode()[:MAX_MARKER_BYTES])
            final = self.dir / f"{me}-{token}.json"
            os.replace(tmp, final)        # the lock is held before the marker can be seen
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        holder = Holder(final, fd)
        atexit.register(holder.release)
        return holder

    def holders(self, exclude: tuple[Path, ...] = ()) -> list[dict]:
        """Every live holder but ``exclude`` (a caller's own markers); leftovers are removed on the way."""
        out = []
        try:
            entries = sorted(self.dir.iterdir())
        except OSError:
            return []
        for path in entries:
            if path.suffix != ".json" or path in exclude:
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:        # someone holds it: a user of the cluster
                    rec = self._record(fd, path)
                    if rec.pop("alive"):       # (not another look at a leftover, which also locks it a moment)
                        out.append(rec)
                    continue
                path.unlink(missing_ok=True)   # nobody holds it: the marker of a process that is gone
            finally:
                os.close(fd)
        return out

    @staticmethod
    def _record(fd: int, path: Path) -> dict:
        try:
            data = json.loads(os.read(fd, MAX_MARKER_BYTES) or b"{}")
        except (OSError, ValueError, RecursionError):
            data = None
        if not isinstance(data, dict):
            data = {}
        pid, started = data.get("pid"), data.get("start_time")
        alive = not (isinstance(pid, int) and isinstance(started, int)) or start_time(pid) == started
        return {k: data.get(k) for k in ("user", "pid", "purpose", "since", "command")} | {
            "marker": str(path), "alive": alive}

    # --- one up/down at a time -------------------------------------------------------------------------------
    @contextmanager
    def exclusive(self, what: str, log, timeout: float = UP_LOCK_TIMEOUT_S):
        """Hold the `up`/`down` lock of the cluster; waits (saying for whom) while another process holds it."""
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            if not self._try_lock(fd):
                who = os.pread(fd, 400, 0).decode(errors="replace").strip() or "another process"
                log(f"cluster: {self.name}: waiting for {who} to finish")
                try:
                    until(f"{who} to finish with cluster {self.name}", lambda: self._try_lock(fd), timeout=timeout,
                          interval=0.2)
                except WaitTimeout as e:
                    raise ClusterError(str(e)) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"`{what}` of {user()} (pid {os.getpid()}, since {_now()})".encode(), 0)
            yield
        finally:
            os.close(fd)

    @staticmethod
    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False


__all__ = ["Holder", "Usage", "UP_LOCK_TIMEOUT_S", "describe", "user"]
