"""The remains of a killed run: a cluster marked by a run whose process is gone is taken down by the next `drills
run` or `drills cluster up`, which says so; a cluster whose run still lives, or that somebody holds, is left.
(No toolchain: the cluster here is its record and one process that names its folder, as drills starts them.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drills.cluster import EmbeddedCluster, remains
from drills.core.procs import pid_alive
from drills.core.wait import until

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    c = tmp_path / "cache"
    monkeypatch.setenv("DRILLS_CACHE", str(c))
    return c


def _env(cache: Path, **extra) -> dict:
    return dict(os.environ, DRILLS_CACHE=str(cache), PYTHONPATH=str(ROOT), **extra)


def _cluster_with_a_process(name: str) -> tuple[EmbeddedCluster, subprocess.Popen]:
    """A cluster folder, its state, and one process recorded in it whose command line names the folder."""
    c = EmbeddedCluster(name)
    (c.folder / "logs").mkdir(parents=True)
    c._save({"name": name, "controller_version": "v1.8.2", "ready": True, "processes": []})
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(c.folder) + "/"],
                            start_new_session=True, stdin=subprocess.DEVNULL)
    c.register_process("rollouts-controller", proc.pid, [], c.folder / "logs" / "x.log")
    return c, proc


def _mark_by_a_process_that_exits(cache: Path, name: str) -> None:
    """The mark a run leaves when it is killed: written by a process that is gone now."""
    subprocess.run([sys.executable, "-c", f"from drills.cluster import remains; remains.mark({name!r}, 'run-killed')"],
                   env=_env(cache), check=True, timeout=60)


def test_a_killed_runs_cluster_is_taken_down_and_said(cache):
    c, proc = _cluster_with_a_process("killed-run")
    try:
        _mark_by_a_process_that_exits(cache, c.name)
        assert [n for n, _ in remains.abandoned()] == [c.name]
        said: list[str] = []
        assert remains.reap(said.append) == [c.name]
        proc.wait(30)                   # stopped by the reap (SIGTERM), reaped here
        assert not c.folder.exists() and not remains.mark_path(c.name).exists()
        assert any("run run-killed" in line and "left behind" in line and c.name in line for line in said), said
        assert any("rollouts-controller" in line for line in said), said
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_live_runs_cluster_and_a_held_one_are_left(cache):
    live, p1 = _cluster_with_a_process("live-run")
    held, p2 = _cluster_with_a_process("held-run")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from drills.cluster import EmbeddedCluster; "
                               "EmbeddedCluster('held-run').hold('a probe'); print('held', flush=True); "
                               "time.sleep(600)"], env=_env(cache), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        remains.mark(live.name, "run-alive")                # this process: alive
        _mark_by_a_process_that_exits(cache, held.name)
        said: list[str] = []
        assert remains.reap(said.append) == []
        assert live.folder.exists() and held.folder.exists() and pid_alive(p1.pid) and pid_alive(p2.pid)
        assert any("held-run" in line and "in use" in line for line in said), said
        holder.kill()
        holder.wait()
        assert remains.reap(said.append) == [held.name]     # its holder gone: now it is remains
        assert live.folder.exists() and pid_alive(p1.pid)
    finally:
        for p in (p1, p2, holder):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_cluster_up_takes_down_what_a_killed_run_left(cache):
    c, proc = _cluster_with_a_process("killed-before-up")
    try:
        _mark_by_a_process_that_exits(cache, c.name)
        # the toolchain is not built in this cache: `up --no-build` refuses, after the remains are gone
        r = subprocess.run([sys.executable, "-m", "drills", "cluster", "up", "--no-build"], capture_output=True,
                           text=True, timeout=120, env=_env(cache, DRILLS_CLUSTER="another-name"))
        assert r.returncode == 2, r.stderr
        assert f"cluster: {c.name} is what run run-killed" in r.stderr, r.stderr
        until("the killed run's process to be stopped", lambda: proc.poll() is not None, timeout=30)
        assert not c.folder.exists()
        assert json.loads(json.dumps(remains.abandoned())) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
