"""The embedded cluster's own processes dying under a probe, and a corrupted controller binary.

A probe depends on the rollouts controller and the pod releaser of its cluster: one of them killed mid-probe stops
the probe at once (exit 3, the reason named), its namespace and holds are removed, and the process started again
leaves the cluster whole.  A controller binary that is not what it claims to be is never run: the cached release
truncated or overwritten (under a cache of its own, the rest of the toolchain linked in) and a truncated
--controller-binary are refused with exit 2 and one line, before any process starts."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from checks import World, cluster_whole
from faultkit import PROJECT, DrillProc, kill_registered, restart_registered

from drills.cluster.availability import Availability
from drills.core.procs import pid_alive
from drills.toolchain import Toolchain, components_for
from drills.core.wait import until

pytestmark = pytest.mark.single_version


def _probe_holds(kube, world) -> list:
    return [h for h in Availability(kube).config().get("holds", []) if h["namespace"] not in world.namespaces]


@pytest.mark.parametrize("name,line", [
    pytest.param("releaser", "probe: roll back to v1", id="releaser-killed-during-rollback"),
    pytest.param("rollouts-controller", "probe: deploy v2", id="controller-killed-during-deploy"),
])
def test_cluster_process_killed_stops_the_probe(kube, cluster, controller_version, tmp_path, name, line):
    world = World(kube, cluster)
    drill = DrillProc(["probe", "--steps", "5,pause:2s,100", "--replicas", "2", "--hold", "30", "--controller",
                       controller_version], dict(os.environ, DRILLS_REPORTS=str(tmp_path)))
    image = None
    try:
        drill.wait_line(line)
        if "roll back" in line:            # the revived pods held: the rollback is under way
            until("the probe's hold on its revived pods", lambda: _probe_holds(kube, world), timeout=60)
        image = kill_registered(cluster, name)
        assert drill.wait(120) == 3, drill.tail()
    finally:
        drill.stop()
        if image is not None:
            restart_registered(cluster, image)
    assert "Traceback" not in drill.console, drill.tail()
    assert f"{name} (pid {image[3]['pid']}) exited" in drill.console, drill.tail()
    assert world.leftovers(drill) == []
    until("the restarted process to keep running and the cluster ready", lambda: cluster_whole(cluster),
          lambda broken: broken == [], timeout=60)


# --- a controller binary that is not what it claims to be --------------------------------------------------------
def _cache_with_corrupt_controller(tmp: Path, version: str, corrupt) -> Path:
    """A cache of its own: every built component linked from the real cache, ``rollouts/<version>`` a folder whose
    controller is a corrupted copy (``corrupt(path)``) beside the original build stamp."""
    tc = Toolchain()
    tc.ensure(components_for([version]))       # built (or waited for) before the real cache is linked
    real = tc.root
    cache = tmp / "cache"
    cache.mkdir()
    for entry in real.iterdir():
        if entry.name in ("clusters", "kwok-workdir", "locks", "logs", "snapshots", "legs", "build", "rollouts"):
            continue
        (cache / entry.name).symlink_to(entry)
    for rel in (real / "rollouts").iterdir():
        dst = cache / "rollouts" / rel.name
        if rel.name != version:
            dst.parent.mkdir(exist_ok=True)
            dst.symlink_to(rel)
            continue
        dst.mkdir(parents=True)
        for f in rel.iterdir():
            if f.name not in ("rollouts-controller", ".verified.json"):
                (dst / f.name).symlink_to(f)
        shutil.copy2(rel / "rollouts-controller", dst / "rollouts-controller")
        corrupt(dst / "rollouts-controller")
    return cache


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _overwrite(path: Path) -> None:
    """Another program under the controller's name: it runs, and says it is a rollouts controller."""
    path.write_text("#!/bin/sh\necho 'argo-rollouts: v1.8.2+0000000'\nexec sleep 3600\n")
    path.chmod(0o755)


@pytest.mark.parametrize("corrupt", [pytest.param(_truncate, id="truncated-cached-controller-at-cluster-up"),
                                     pytest.param(_overwrite, id="overwritten-cached-controller-at-cluster-up")])
def test_corrupted_cached_controller_is_refused(controller_version, tmp_path, corrupt):
    cache = _cache_with_corrupt_controller(tmp_path, controller_version, corrupt)
    env = dict(os.environ, DRILLS_CACHE=str(cache), DRILLS_CLUSTER="faults-corrupt",
               DRILLS_REPORTS=str(tmp_path / "reports"))
    drill = DrillProc(["probe", "--steps", "5,100", "--controller", controller_version], env)
    try:
        rc = drill.wait(120)
    finally:
        drill.stop()
    err = "".join(drill.err).strip().splitlines()
    assert rc == 2, drill.tail()
    assert "Traceback" not in drill.console, drill.tail()
    assert "rollouts-controller is not the one built there" in err[-1] and "it is not run" in err[-1], err
    # never run, nothing started: no process of the drill left, no cluster folder with a process in it
    assert drill.left_behind() == []
    assert not any("rollouts-controller" in cmd and str(cache) in cmd for _, cmd in drill.tree.values()), drill.tree
    assert not list((cache / "clusters").glob("*/state.json")) or all(
        not pid_alive(p) for p in _state_pids(cache)), "a process of the refused cluster runs"
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").rglob("*.json"))


def _state_pids(cache: Path) -> list[int]:
    out = []
    for f in (cache / "clusters").glob("*/state.json"):
        out += [p["pid"] for p in json.loads(f.read_text()).get("processes", [])]
    return out


@pytest.mark.parametrize("phase", [pytest.param("run", id="truncated-controller-binary-before-run")])
def test_truncated_user_built_controller_is_refused(controller_version, tmp_path, phase):
    real = Toolchain().rollouts(controller_version)
    binary = tmp_path / "rollouts-controller"
    shutil.copy2(real / "rollouts-controller", binary)
    _truncate(binary)
    r = subprocess.run([sys.executable, "-m", "drills", "run", "--controller-binary", str(binary), "--crds",
                        str(real / "crds"), "--lanes", "a"], capture_output=True, text=True, cwd=str(PROJECT),
                       env=dict(os.environ, DRILLS_REPORTS=str(tmp_path / "reports"), DRILLS_CLUSTER="faults-corrupt"),
                       timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(binary) in lines[0], lines
    assert not (tmp_path / "reports").exists()

