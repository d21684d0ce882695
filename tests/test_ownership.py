"""The product signals only processes it can prove it started: the pid, the start time and the boot recorded when
it started them, and a command line naming its own cluster folder or kubeconfig; a process group only when it
created it.  A state file or a kwokctl pid file naming someone else's process (after a reboot, a reused pid, an
edit) gets nothing signalled.  No cluster needed: the processes here are the test's own stand-ins."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from drills.cluster import EmbeddedCluster
from drills.core.procs import boot_id, identity, pid_alive, proven, start_time, terminate_proven
from drills.core.wait import until

SLEEPER = "import signal, sys; signal.pause()"


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("DRILLS_CACHE", str(tmp_path / "cache"))
    c = EmbeddedCluster("owned", log=lambda m: None)
    (c.folder / "logs").mkdir(parents=True)
    return c


@pytest.fixture
def sleepers():
    """sleeper(*argv, session=True): a process of the test's own that waits for a signal (stopped at the end)."""
    made: list[subprocess.Popen] = []

    def start(*argv: str, session: bool = True) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", SLEEPER, *map(str, argv)], start_new_session=session,
                             stdin=subprocess.DEVNULL)
        made.append(p)
        until("the sleeper to run its own command line", lambda: SLEEPER.split(";")[0] in _cmd(p.pid), timeout=10)
        return p
    yield start
    for p in made:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _state(c: EmbeddedCluster, processes: list, **more) -> None:
    c.state_file.write_text(json.dumps({"name": c.name, "processes": processes, **more}))


def _rec(p: subprocess.Popen, name: str = "rollouts-controller", **change) -> dict:
    return {"name": name, "ports": [], "log": "/dev/null", "group": True, **identity(p.pid), **change}


def _down(c: EmbeddedCluster) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "drills", "cluster", "down"], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, DRILLS_CLUSTER=c.name))


@pytest.mark.parametrize("case", ["no start time", "another start time", "another boot", "empty name",
                                  "pid as text", "its folder not in its command line", "pid 1", "pid 0", "pid -1"])
def test_down_signals_nothing_a_record_does_not_prove(cluster, sleepers, case):
    """A recorded pid whose process is not provably the one drills started (reboot, reuse, an edit) stays."""
    named = sleepers(cluster.kubeconfig)          # names the cluster's kubeconfig, like the real controller does
    bare = sleepers("someone-else")               # names nothing of the cluster's
    rec = {
        "no start time": {"name": "rollouts-controller", "pid": named.pid, "ports": [], "log": "x"},
        "another start time": _rec(named, start_time=start_time(named.pid) - 1),
        "another boot": _rec(named, boot_id="00000000-0000-0000-0000-000000000000"),
        "empty name": _rec(bare, name=""),
        "pid as text": _rec(named, pid=str(named.pid)),
        "its folder not in its command line": _rec(bare),
        "pid 1": dict(_rec(named), pid=1, start_time=start_time(1)),
        "pid 0": dict(_rec(named), pid=0),
        "pid -1": dict(_rec(named), pid=-1),
    }[case]
    _state(cluster, [rec])
    r = _down(cluster)
    assert r.returncode == 0, r.stderr
    assert named.poll() is None and bare.poll() is None, r.stderr
    assert f"pid {named.pid}" in r.stderr and "never signalled" in r.stderr, r.stderr
    assert not cluster.folder.exists()


def _group(pgid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as fh:
                text = fh.read()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[2]) == pgid:
            out.append(int(d))
    return out


def test_down_stops_what_it_started_and_the_group_it_created(cluster, tmp_path):
    script = ("import signal, subprocess, sys; subprocess.Popen([sys.executable, '-c', "
              "'import signal; signal.pause()']); signal.pause()")
    leader = subprocess.Popen([sys.executable, "-c", script, str(cluster.kubeconfig)], start_new_session=True)
    try:
        until("the leader and its helper in the group", lambda: len(_group(leader.pid)) == 2, timeout=20)
        helper = next(p for p in _group(leader.pid) if p != leader.pid)
        cluster.register_process("rollouts-controller", leader.pid, [], "/dev/null")
        st = json.loads(cluster.state_file.read_text())["processes"][0]
        assert st["start_time"] == start_time(leader.pid) and st["boot_id"] == boot_id() and st["group"] is True
        r = _down(cluster)
        assert r.returncode == 0, r.stderr
        assert leader.wait(20) is not None
        until("the helper in the group drills created to exit", lambda: not pid_alive(helper), timeout=20)
        assert "never signalled" not in r.stderr, r.stderr
    finally:
        for pid in _group(leader.pid):
            os.kill(pid, 9)
        leader.wait(10)


def test_a_group_the_product_did_not_create_is_never_signalled(cluster, sleepers):
    """A process started in the caller's own process group: only that process is signalled, never the group
    (here: the test runner's own group, which must survive)."""
    p = sleepers(cluster.kubeconfig, session=False)
    sibling = sleepers("sibling", session=False)
    assert os.getpgid(p.pid) == os.getpgid(os.getpid()) == os.getpgid(sibling.pid)
    cluster.register_process("mesh-ns-svc", p.pid, [], "/dev/null")
    assert json.loads(cluster.state_file.read_text())["processes"][0]["group"] is False
    rec = cluster.process_records()[0]
    rec["group"] = True            # even a record that says so: the process does not lead a group of its own
    assert terminate_proven(rec, cluster.marks(), grace=10)
    assert p.wait(20) is not None and sibling.poll() is None


def test_kwokctl_pid_files_naming_someone_elses_process_are_never_acted_on(cluster, sleepers):
    """kwokctl signals what its pid files name; a pid file the record does not prove is removed before kwokctl
    runs, and its process is left alone."""
    pids = cluster.kwok_dir / "pids"
    pids.mkdir(parents=True)
    foreign = sleepers(cluster.kwok_dir / "etcd")      # names the cluster's kwokctl folder, but drills never started it
    (pids / "etcd.pid").write_text(str(foreign.pid))
    (pids / "kube-apiserver.pid").write_text(str(os.getpid()))    # a pid reused by the test runner itself
    (pids / "kube-scheduler.pid").write_text("not a pid")
    _state(cluster, [], control_plane={"kube-apiserver": {"pid": os.getpid(), "start_time": 1, "boot_id": boot_id()}})
    st = cluster.status()
    assert {p["name"]: p["alive"] for p in st["processes"]} == {"etcd": False, "kube-apiserver": False}
    r = _down(cluster)
    assert r.returncode == 0, r.stderr
    assert foreign.poll() is None and not (pids / "etcd.pid").exists() and not (pids / "kube-apiserver.pid").exists()
    assert f"pid {foreign.pid}" in r.stderr


def test_a_control_plane_process_kwokctl_started_again_after_the_start_began_is_stopped_older_ones_never(
        cluster, sleepers):
    """kwokctl may start a control-plane process again with no record written of it (a revival whose recorder was
    killed): one started after this cluster's start began, from its private kwokctl folder, named by its pid file,
    is the cluster's own and `down` stops it; one started before the start began is left alone."""
    from drills.core.procs import now_ticks
    pids = cluster.kwok_dir / "pids"
    pids.mkdir(parents=True)
    older = sleepers(cluster.kwok_dir / "bin" / "kube-scheduler")
    until("a clock tick after the older process started", now_ticks, lambda t: t > start_time(older.pid), timeout=10)
    began = now_ticks()
    until("a clock tick after the start began", now_ticks, lambda t: t > began, timeout=10)
    revived = sleepers(cluster.kwok_dir / "bin" / "kube-controller-manager")
    (pids / "kube-scheduler.pid").write_text(str(older.pid))
    (pids / "kube-controller-manager.pid").write_text(str(revived.pid))
    _state(cluster, [], control_plane={}, began_ticks=began, boot_id=boot_id())
    r = _down(cluster)
    assert r.returncode == 0, r.stderr
    assert revived.wait(20) is not None, "the revived process is the cluster's own: down stops it"
    assert older.poll() is None and f"pid {older.pid}" in r.stderr, r.stderr
    # a state from another boot proves nothing
    again = sleepers(cluster.kwok_dir / "bin" / "kube-controller-manager")
    (cluster.folder / "logs").mkdir(parents=True, exist_ok=True)
    pids.mkdir(parents=True, exist_ok=True)
    (pids / "kube-controller-manager.pid").write_text(str(again.pid))
    _state(cluster, [], control_plane={}, began_ticks=began, boot_id="another-boot")
    assert _down(cluster).returncode == 0 and again.poll() is None


def test_a_reused_pid_is_not_proven_and_a_record_is_checked_again_before_sigkill(sleepers, tmp_path):
    p = sleepers(tmp_path / "mark")
    rec = identity(p.pid)
    assert proven(rec, [str(tmp_path / "mark")])
    assert not proven(rec, [str(tmp_path / "other")]) and not proven(rec, []) and not proven(rec, [""])
    assert not proven(dict(rec, start_time=rec["start_time"] + 1), [str(tmp_path / "mark")])
    assert not proven(dict(rec, boot_id="x"), [str(tmp_path / "mark")])
    assert not proven(dict(rec, pid=True), [str(tmp_path / "mark")])
    p.kill()
    p.wait(10)
    assert not pid_alive(p.pid) and not proven(rec, [str(tmp_path / "mark")])
    assert terminate_proven(rec, [str(tmp_path / "mark")]) is False


@pytest.mark.parametrize("bad", [{"pid": "12"}, {"pid": 1.5}, {"pid": None}, {"pid": True}, {"pid": 10 ** 30},
                                 {"pid": 12, "ports": "80"}])
def test_status_of_a_state_with_a_pid_that_is_no_pid_is_exit_2_one_line(cluster, bad):
    _state(cluster, [{"name": "rollouts-controller", **bad}])
    env = dict(os.environ, DRILLS_CLUSTER=cluster.name)
    for args in (["cluster", "status"], ["cluster", "status", "--json"]):
        r = subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, env=env,
                           timeout=60)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and str(cluster.state_file) in lines[0] and "processes[0]" in lines[0], r.stderr
    # the way out: down removes the cluster, signalling nothing
    r = _down(cluster)
    assert r.returncode == 0 and not cluster.folder.exists(), r.stderr
    # and in the library, a status never raises on it: what is not a process record is left out
    cluster.folder.mkdir(parents=True)
    _state(cluster, [{"name": "x", **bad}, "junk", {"pid": 5}, {"name": "y", "pid": 5, "ports": [1]}])
    shown = cluster.status()["processes"]
    assert [p["name"] for p in shown] == (["x"] if "ports" in bad else []) + ["y"]
    assert not any(p["alive"] for p in shown)
