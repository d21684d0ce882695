"""Fault injection for the fault suite: a drill under test as a child process (its console, its process tree),
the embedded cluster's own processes killed, restarted and paused, etcd compacted, a TCP proxy in front of the
apiserver that a case cuts or silences, and a watch of the drilled Rollout that names the drill's phases.

Every wait is a named condition (drills.core.wait.until, tenacity); nothing here sleeps for a fixed time.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import yaml

from drills.core.procs import cmdline, listening_ports_of, pid_alive
from drills.kube.rollout import GROUP, PLURAL, VERSION
from drills.core.wait import until
from drills.kube.watching import ListWatch

PROJECT = Path(__file__).resolve().parents[2]


# --- the drill under test -----------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, start time in clock ticks) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[19])


def _children_of(pid: int) -> list[int]:
    """The live children of ``pid``: what each of its threads forked (``/proc/PID/task/TID/children``)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


class DrillProc:
    """A ``python -m drills ...`` child: its console lines as they come, the processes it started (followed while
    it runs, so one that outlives it is found), signals, its exit.  With ``group`` it leads a process group of its
    own, as a CI job's command does, so ``send_group`` signals it and everything in its group (as `timeout` and
    CI runners cancel)."""

    def __init__(self, args: list[str], env: dict, wrap: list[str] | None = None, group: bool = False):
        self.args = list(map(str, args))
        self.proc = subprocess.Popen([*(wrap or []), sys.executable, "-m", "drills", *self.args], env=env,
                                     cwd=str(PROJECT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=group)
        self.pid = self.proc.pid
        self.out: list[str] = []
        self.err: list[str] = []
        self.tree: dict[int, tuple[int, str]] = {}     # pid -> (start ticks, command line) of every descendant
        self._done = threading.Event()
        self.readers = [threading.Thread(target=self._read, args=(stream, sink), daemon=True)
                        for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self.readers:
            t.start()
        threading.Thread(target=self._follow, daemon=True).start()

    @staticmethod
    def _read(stream, sink: list[str]):
        for line in stream:
            sink.append(line)

    def _follow(self):
        while not self._done.wait(0.1):
            self.scan()

    def scan(self) -> None:
        """Note every live descendant of the drill (children reparented after its exit are kept by pid).  Each
        process's children come from its threads' ``children`` files (Linux's CONFIG_PROC_CHILDREN): a walk of the
        drill's own tree, not of every process on the machine ten times a second (a full /proc read cost a
        running fault case ~10 % of a core on a busy machine); without those files, every process's parent."""
        children = _children_of
        if not os.path.exists(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children"):
            parents: dict[int, list[int]] = {}
            for d in Path("/proc").iterdir():
                if d.name.isdigit():
                    st = _stat(int(d.name))
                    if st:
                        parents.setdefault(st[0], []).append(int(d.name))
            children = lambda pid: parents.get(pid, [])      # noqa: E731
        todo = [self.pid]
        while todo:
            for child in children(todo.pop()):
                st = _stat(child)
                # seen again: its command line now (one first seen between its fork and its exec showed the
                # parent's), the same start ticks (a pid reused since is another process: replaced)
                if st:
                    self.tree[child] = (st[1], cmdline(child))
                todo.append(child)

    @property
    def console(self) -> str:
        return "".join(self.err) + "".join(self.out)

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.err) + list(self.out))

    def seen(self, text: str, times: int = 1) -> bool:
        return self.count(text) >= times

    def wait_line(self, text: str, timeout: float = 300, times: int = 1) -> None:
        until(f"the drill's console to say {text!r}" + (f" {times} times" if times > 1 else ""),
              lambda: self.seen(text, times) or self.proc.poll() is not None, timeout=timeout, interval=0.05,
              describe=lambda _: self.tail())
        if not self.seen(text, times):
            raise AssertionError(f"the drill exited ({self.proc.returncode}) before saying {text!r}: {self.tail()}")

    def tail(self, n: int = 3000) -> str:
        return self.console[-n:]

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def send_group(self, sig: int) -> None:
        """``sig`` to the drill's whole process group (it leads it: ``group=True``)."""
        os.killpg(self.pid, sig)

    def descendants(self, text: str) -> list[int]:
        """Live descendants whose command line has ``text``."""
        self.scan()      # (the command line read now: the one noted may be from before the child's exec)
        return [pid for pid, (start, _) in sorted(self.tree.items()) if (_stat(pid) or (0, -1))[1] == start
                and text in cmdline(pid) and pid_alive(pid)]

    def wait(self, timeout: float = 600) -> int:
        try:
            rc = self.proc.wait(timeout)
        finally:
            self.scan()
            self._done.set()
        for t in self.readers:      # the console ends at EOF (a process left holding it is a leftover)
            t.join(10)
        return rc

    def left_behind(self) -> list[str]:
        """Descendants still alive (the same process: same start time), with their listeners."""
        out = []
        for pid, (start, cmd) in sorted(self.tree.items()):
            st = _stat(pid)
            if st and st[1] == start and pid_alive(pid):
                ports = listening_ports_of([pid])
                out.append(f"pid {pid} ({cmd.strip()[:120]})" + (f" listening on {ports}" if ports else ""))
        return out

    def stop(self) -> None:
        """Test teardown: a drill still running is killed (a failing case must not leave it)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.scan()
        for pid in self.descendants("--drills-run-id"):       # its legs' pytest (a group of their own each)
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._done.set()


# --- the Rollout, watched ------------------------------------------------------------------------------------
class RolloutWatch:
    """The drilled Rollout as a watch delivers it (drills.kube.watching), for phase conditions."""

    def __init__(self, api, namespace: str, name: str):
        from kubernetes import client
        self.co = client.CustomObjectsApi(api)
        self.latest: dict | None = None
        self.history: list[dict] = []
        self.lw = ListWatch(self.co.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                            field_selector=f"metadata.name={name}", timeout_seconds=30)
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _take(self, obj):
        if obj:
            self.latest = obj
            self.history.append(obj)

    def _run(self):
        try:
            self.lw.run(lambda items, rv, relisted: self._take(items[0] if items else None),
                        lambda etype, obj: self._take(None if etype == "DELETED" else obj))
        except Exception:       # the cluster under a fault: the case's own waits say what was not seen
            pass

    def wait(self, what: str, pred, timeout: float = 300, drill: DrillProc | None = None) -> dict:
        def probe():
            if drill is not None and drill.proc.poll() is not None:
                raise AssertionError(f"the drill exited ({drill.proc.returncode}) before {what}: {drill.tail()}")
            return self.latest
        return until(what, probe, lambda ro: bool(ro) and pred(ro), timeout=timeout, interval=0.05,
                     describe=lambda ro: _brief(ro))

    def stop(self):
        self.lw.stop()


def _brief(ro: dict | None) -> str:
    if not ro:
        return "no Rollout yet"
    st = ro.get("status") or {}
    return (f"image {app_image(ro)}, steps {len(steps_of(ro) or [])}, phase {st.get('phase')}, "
            f"step {st.get('currentStepIndex')}, abort {st.get('abort')}, "
            f"weight {((st.get('canary') or {}).get('weights') or {}).get('canary', {}).get('weight')}")


def app_image(ro: dict, container: str = "app") -> str | None:
    return next((c.get("image") for c in ro["spec"]["template"]["spec"]["containers"] if c["name"] == container),
                None)


def steps_of(ro: dict) -> list | None:
    return ((ro["spec"].get("strategy") or {}).get("canary") or {}).get("steps")


def canary_weight(ro: dict) -> int:
    return int(((((ro.get("status") or {}).get("canary") or {}).get("weights") or {}).get("canary") or {})
               .get("weight") or 0)


# --- the embedded cluster's processes ---------------------------------------------------------------------
def _respawn(argv: list[bytes], env: dict, cwd: str, log: Path) -> int:
    with open(log, "ab") as lf:
        p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    return p.pid


def _image_of(pid: int) -> tuple[list[bytes], dict, str]:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    env = dict(x.split(b"=", 1) for x in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in x)
    return argv, env, os.readlink(f"/proc/{pid}/cwd")


def _kill_and_reap(pid: int, sig: int) -> None:
    os.kill(pid, sig)
    until(f"process {pid} to exit after {signal.Signals(sig).name}", lambda: not pid_alive(pid), timeout=60)


def restart_control_plane(cluster, name: str, while_down=None) -> int:
    """Kill one process kwokctl runs (kube-apiserver, etcd, ...) as a crash does (SIGKILL) and start it again with
    the same command line, environment and log (``while_down()`` runs in between); returns the new pid (kwokctl's
    pid file follows)."""
    pids = cluster._kwok_pids()
    pid = pids[name]
    argv, env, cwd = _image_of(pid)
    _kill_and_reap(pid, signal.SIGKILL)
    if while_down is not None:
        while_down()
    kdir = cluster.kwok_workdir / "clusters" / cluster.name
    started = [_respawn(argv, env, cwd, kdir / "logs" / f"{name}.log")]

    def up() -> bool:
        # as a supervisor does: a start that exits at once (its port still held by the killed process's
        # connections, "address already in use") is started again
        if not pid_alive(started[-1]):
            started.append(_respawn(argv, env, cwd, kdir / "logs" / f"{name}.log"))
            return False
        return name != "kube-apiserver" or cluster._api_ready(timeout=1)
    until(f"the restarted {name} to run" + (" and answer /readyz" if name == "kube-apiserver" else ""), up,
          timeout=120, interval=0.2, describe=lambda _: f"{len(started)} start(s)")
    (kdir / "pids" / f"{name}.pid").write_text(str(started[-1]))
    cluster.record_control_plane([name])      # started here, for this cluster: `down` may stop it
    return started[-1]


def kill_registered(cluster, name: str) -> tuple[list[bytes], dict, str, dict]:
    """SIGKILL a process drills started for the cluster (rollouts-controller, releaser, mesh-..., prometheus);
    returns what restart_registered needs to start it again."""
    entry = next(p for p in cluster.state()["processes"] if p["name"] == name)
    image = _image_of(entry["pid"])
    _kill_and_reap(entry["pid"], signal.SIGKILL)
    return (*image, entry)


def restart_registered(cluster, image) -> int:
    argv, env, cwd, entry = image
    pid = _respawn(argv, env, cwd, Path(entry["log"]))
    cluster.register_process(entry["name"], pid, entry.get("ports") or [], entry["log"])
    return pid


class Paused:
    """SIGSTOP one control-plane process (etcd) until the context ends (SIGCONT), whatever happens inside."""

    def __init__(self, cluster, name: str):
        self.pid = cluster._kwok_pids()[name]

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)
        return False


def etcd_url(cluster) -> str:
    argv = _image_of(cluster._kwok_pids()["etcd"])[0]
    flag = next(a.decode() for a in argv if a.startswith(b"--listen-client-urls="))
    return flag.split("=", 1)[1].split(",")[0]


def _etcd(cluster, path: str, body: dict) -> dict:
    req = urllib.request.Request(etcd_url(cluster) + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def etcd_revision(cluster) -> int:
    return int(_etcd(cluster, "/v3/maintenance/status", {})["header"]["revision"])


def compact_etcd(cluster) -> int:
    """Compact etcd's history up to its current revision (physically): every older resourceVersion is gone."""
    rev = etcd_revision(cluster)
    _etcd(cluster, "/v3/kv/compaction", {"revision": str(rev), "physical": True})
    return rev


# --- a TCP proxy in front of the apiserver ----------------------------------------------------------------
class ApiProxy:
    """127.0.0.1:port -> the apiserver, TLS passed through.  ``cut()`` closes every connection and refuses new
    ones (an unreachable API); ``silence()`` keeps connections open and forwards nothing (a silent API);
    ``restore()`` forwards again."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.mode = "forward"
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.flowing = threading.Event()
        self.flowing.set()
        self.listener = self._listen(0)
        self.port = self.listener.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @staticmethod
    def _listen(port: int) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(128)
        s.settimeout(0.2)
        return s

    def _accept(self):
        while not self._stop.is_set():
            lst = self.listener
            try:
                c, _ = lst.accept()
            except (OSError, AttributeError):
                if self.mode == "cut":
                    self._stop.wait(0.05)
                continue
            try:
                u = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket):
        try:
            while not self._stop.is_set():
                r, _, _ = select.select([src], [], [], 0.2)
                if not r:
                    continue
                self.flowing.wait()
                data = src.recv(65536)
                if not data:
                    break
                self.flowing.wait()
                dst.sendall(data)
        except (OSError, ValueError):       # ValueError: a socket closed by cut() meanwhile (fd -1)
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def _close_all(self):
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def cut(self) -> None:
        self.mode = "cut"
        self.listener.close()
        self._close_all()
        self.flowing.set()

    def silence(self) -> None:
        self.mode = "silent"
        self.flowing.clear()

    def restore(self) -> None:
        if self.mode == "cut":
            self.listener = self._listen(self.port)
        self.mode = "forward"
        self.flowing.set()

    def close(self) -> None:
        self._stop.set()
        self.flowing.set()
        try:
            self.listener.close()
        except OSError:
            pass
        self._close_all()

    def kubeconfig(self, source: Path, dest: Path) -> Path:
        """A copy of ``source`` whose server is this proxy (same host name, so the certificate still matches)."""
        doc = yaml.safe_load(Path(source).read_text())
        for c in doc["clusters"]:
            c["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        dest.write_text(yaml.safe_dump(doc))
        return dest


def api_address(cluster) -> tuple[str, int]:
    server = cluster.status()["api_server"]
    host, port = server.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)
