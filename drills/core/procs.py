"""Local processes and ports: the project's own servers and children, on 127.0.0.1 only."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from .signals import held
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


BACKGROUND_NICE = 10     # the CPU priority a background job (a toolchain build beside drills) runs at
GROUP_RETRY_S = 2.0      # how long a session's scheduling group is tried (the kernel takes one change per 100 ms)
GROUP_RETRY_INTERVAL_S = 0.02


def background_priority() -> None:
    """For ``preexec_fn`` of a child in a session of its own (``start_new_session``): it dies with its parent
    (die_with_parent) and runs below the drills beside it: nice BACKGROUND_NICE more than its parent and, where the
    kernel schedules each session as a group (autogroup; a nice value then counts only inside its session), its
    session's group at nice BACKGROUND_NICE.  Done in the child before it runs its program, so every process it
    starts is lowered from its first instruction.  Without CAP_SYS_ADMIN the kernel takes one group change a tenth
    of a second machine-wide (EAGAIN): retried for GROUP_RETRY_S; a group left as it was is said on stderr (the
    build's log)."""
    die_with_parent()
    try:
        os.nice(BACKGROUND_NICE)
    except OSError:
        pass
    if os.getsid(0) != os.getpid():
        return                  # not a session of its own: its group is its parent's, left alone

    def write() -> str | None:
        try:
            fd = os.open("/proc/self/autogroup", os.O_WRONLY)
        except FileNotFoundError:
            return ""           # no autogroup in this kernel: the nice value is the priority
        except OSError as e:
            return e.strerror or "error"
        try:
            os.write(fd, str(BACKGROUND_NICE).encode())
            return ""
        except BlockingIOError:
            return None         # another group changed within the last 100 ms: again
        except OSError as e:
            return e.strerror or "error"
        finally:
            os.close(fd)
    # a plain loop: this runs in the forked child, where only what needs no other thread's lock is safe
    deadline = time.monotonic() + GROUP_RETRY_S
    why = write()
    while why is None and time.monotonic() < deadline:
        time.sleep(GROUP_RETRY_INTERVAL_S)
        why = write()
    if why is None:
        why = f"the kernel refused every change for {GROUP_RETRY_S:g}s"
    if why:
        os.write(2, f"drills: this build's scheduling group keeps its priority ({why})\n".encode())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def pid_alive(pid: int) -> bool:
    if not is_pid(pid):          # a pid read from a file may be anything: 0 and -1 would mean a group
        return False
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


def process_age(pid: int) -> float:
    """Seconds since the process started (from /proc: its start time in clock ticks since boot); 0 if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return 0.0
    return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))


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


# --- processes the product can prove it started -----------------------------------------------------------
# A pid alone names a process only until it exits: after a reboot, or once the pid is reused, the same number is
# someone else's process.  So what the product records for a process it starts is its pid, its start time (field 22
# of /proc/<pid>/stat, clock ticks since boot) and the boot's id; it signals a recorded pid only when all three are
# still those of the running process and its command line names the product's own folder for it (the cluster
# folder or kubeconfig).  A process group is signalled only when the product created it (``start_new_session``)
# and the process still leads it.

def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), None when there is no such process."""
    if not is_pid(pid):
        return None
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return int(text[text.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def now_ticks() -> int:
    """Now, in the unit of ``start_time`` (clock ticks since boot)."""
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def identity(pid: int) -> dict:
    """What to record for a process the product just started (it is the product's child, not reaped yet)."""
    return {"pid": pid, "start_time": start_time(pid), "boot_id": boot_id()}


def is_pid(pid) -> bool:
    return isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid <= 1 << 22


def proven(record, marks) -> bool:
    """True when ``record`` (pid, start_time, boot_id as ``identity`` made them) is still the running process and
    its command line names one of ``marks`` (the product's own folder or kubeconfig for it)."""
    if not isinstance(record, dict):
        return False
    pid, started, boot = record.get("pid"), record.get("start_time"), record.get("boot_id")
    if not is_pid(pid) or pid == 1 or not isinstance(started, int) or isinstance(started, bool) or \
            not isinstance(boot, str):
        return False
    marks = [m for m in marks if isinstance(m, str) and len(m) > 1]
    if not marks or boot != boot_id() or start_time(pid) != started:
        return False
    cmd = cmdline(pid)
    return any(m in cmd for m in marks) and start_time(pid) == started


def _signal(record: dict, sig: int, group: bool) -> bool:
    pid = record["pid"]
    try:
        if group and os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def terminate_proven(record, marks, grace: float = 5.0) -> bool:
    """SIGTERM a process the product started (``proven``), SIGKILL after ``grace``; its group too when the record
    says the product created that group (``"group": true``).  Anything not proven is left alone: False."""
    if not proven(record, marks) or not pid_alive(record["pid"]):
        return False
    group = record.get("group") is True
    pid = record["pid"]
    if not _signal(record, signal.SIGTERM, group):
        return False
    try:
        until(f"process {pid} to exit after SIGTERM", lambda: not pid_alive(pid), timeout=grace, interval=0.05)
    except WaitTimeout:
        if proven(record, marks):          # still the same process (never a pid reused meanwhile)
            _signal(record, signal.SIGKILL, group)
    return True


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
    proc = None
    try:
        # a signal while the child starts comes once it is recorded (a slow parent can still be inside Popen while
        # the child has run and forked): its group is then killed with it, never left running unknown
        with held():
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                                    start_new_session=True, preexec_fn=die_with_parent)
            with _running_lock:
                _running[proc] = threading.get_ident()
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:
        if proc is not None:
            kill_group(proc)
        raise
    finally:
        with _running_lock:
            _running.pop(proc, None)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


_running: dict[subprocess.Popen, int] = {}     # run_bounded children not yet reaped -> the thread waiting
_running_lock = threading.Lock()


def kill_running(threads: set[int]) -> int:
    """SIGKILL the process group of every run_bounded child still running that one of ``threads`` waits for (a
    signal reaches the main thread only; a worker thread's child would run on).  The waiting thread then sees
    it end and reaps it.  Returns how many were signalled."""
    with _running_lock:
        procs = [p for p, t in _running.items() if t in threads and p.returncode is None]
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return len(procs)


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
