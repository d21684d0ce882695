"""Local processes and ports: the project's own servers and children, on 127.0.0.1 only."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

from .wait import WaitTimeout, until


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """For ``preexec_fn``: the child gets SIGKILL when the process that started it exits (Linux prctl), so a
    helper the product started never outlives it, whatever way it ends (SIGKILL included)."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie counts as dead, but not before its last thread has exited: until then it still holds its sockets
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                if f.read().split(")")[-1].split()[0] not in ("Z", "X"):
                    return True
        except OSError:
            continue
    return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def listening_ports_of(pids: list[int]) -> list[int]:
    """TCP ports in LISTEN state owned by any of the pids (from /proc)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:
                ports.append(int(parts[1].rsplit(":", 1)[1], 16))
    return sorted(set(ports))


def terminate(pid: int, grace: float = 5.0, expect: str | None = None) -> None:
    """SIGTERM the process group of ``pid``, SIGKILL after ``grace``.  With ``expect``, only when its command
    line still contains that text (a reused pid belongs to someone else)."""
    if not pid_alive(pid):
        return
    if expect and expect not in cmdline(pid):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
    try:
        until(f"process {pid} to exit after SIGTERM", lambda: not pid_alive(pid), timeout=grace, interval=0.05)
    except WaitTimeout:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class ProcessExited(RuntimeError):
    """A child exited before it was ready."""


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Until ``url`` answers 200; ProcessExited when ``proc`` dies first (with the tail of its log)."""
    def ready() -> bool:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise ProcessExited(f"{url}: process exited with {proc.returncode} before ready\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False
    until(f"{url} to answer 200", ready, timeout=timeout, interval=0.1)


def run_bounded(cmd: list[str], timeout: float, env: dict | None = None, cwd: str | Path | None = None,
                input: str | None = None) -> subprocess.CompletedProcess:
    """Run a child to its end under ``timeout``: in a process group of its own (the product created it, so it may
    signal it), dying with its parent.  On a timeout or any exception while it runs (a signal included) its whole
    group is killed and reaped before the exception goes on: nothing it started is left behind.  TimeoutExpired
    propagates; the output is text."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True, preexec_fn=die_with_parent)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:
        kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group ``proc`` leads (started with start_new_session) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
