"""Cancelled commands stop what they started.

Each command that starts clusters is cancelled as `timeout` and CI runners do (SIGTERM to its whole process group)
at a named phase: `drills run` and `run --shard 1/2` once a leg's pytest runs, `upgrade-check` once both sides'
legs run, a probe and `scan --verify 1` once their Rollout is deployed.  Each ends with exit 3 and a last line
saying it was interrupted, and nothing of it is left: no process it started, no listener, no cluster folder or
cluster process, no namespace; a run's folder has run.json (``interrupted``, the signal, each leg's state), its
report, and an inconclusive row for each stopped leg.  A second signal during the stop stops at once and says what
is left, which the next run takes down.  A leg's pytest killed (SIGKILL) mid-run makes that leg inconclusive,
never a pass.  Each case runs its own clusters (a DRILLS_CLUSTER base of its own) on the shortest lane."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from checks import World
from faultkit import DrillProc

from drills.core import config
from drills.cluster import EmbeddedCluster, remains
from drills.toolchain import Toolchain, components_for
from drills.record.ledger import INCONCLUSIVE, read_rows
from drills.run import legs as run_legs
from drills.core.wait import until

pytestmark = pytest.mark.single_version
LEG = "--drills-run-id"           # what a leg's pytest has on its command line
OTHER = "v1.10.2"


def _names(base: str, versions: list[str]) -> list[str]:
    if len(versions) == 1:
        return [base]
    return [f"{base}-{re.sub(r'[^a-z0-9]+', '-', v.lower()).strip('-')}" for v in versions]


def _env(tmp_path: Path, base: str) -> dict:
    return dict(os.environ, DRILLS_REPORTS=str(tmp_path / "reports"), DRILLS_CLUSTER=base,
                DRILLS_CONFIG=str(tmp_path / "none.yaml"))


def _run_folder(tmp_path: Path) -> Path:
    folders = [d for d in (tmp_path / "reports").iterdir() if d.is_dir() and not d.is_symlink()
               and (d / "run.json").exists()]
    assert len(folders) == 1, folders
    return folders[0]


def _clusters_left(names: list[str]) -> list[str]:
    out = []
    for name in names:
        c = EmbeddedCluster(name)
        if c.folder.exists() or c.kwok_dir.exists():
            out.append(f"cluster {name}: its folder")
        out += [f"cluster {name}: pid {p}" for p in c.own_processes()]
        if remains.mark_path(name).exists():
            out.append(f"cluster {name}: the run's mark")
    return out


def _take_down(names: list[str]) -> None:
    for name in names:
        c = EmbeddedCluster(name)
        if c.folder.exists() or c.kwok_dir.exists():
            c.down(quiet=True)
        remains.unmark(name)


def _legs_running(drill: DrillProc, n: int) -> None:
    until(f"{n} leg(s)' pytest to run", lambda: len(drill.descendants(LEG)) >= n or drill.proc.poll() is not None,
          timeout=900, interval=0.2, describe=lambda _: drill.tail(1500))
    assert drill.proc.poll() is None, drill.tail()


def _assert_interrupted(drill: DrillProc, rc: int, sig: str) -> None:
    assert rc == 3, drill.tail()
    assert "Traceback" not in drill.console, drill.tail()
    last = "".join(drill.err).strip().splitlines()[-1]
    assert last.startswith("drills: ") and "interrupted" in last and sig in last, last


def _assert_run_folder(tmp_path: Path, sig: str, stopped: int) -> dict:
    run_dir = _run_folder(tmp_path)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["interrupted"] is True and meta["signal"] == sig and meta["left"] == [], meta
    states = [x["state"] for x in meta["legs"]]
    assert states.count("interrupted") >= stopped and set(states) <= {"done", "interrupted", "not started"}, meta
    assert (run_dir / "report.html").is_file()
    rows = read_rows(run_dir / "ledger.json")
    for leg in (x for x in meta["legs"] if x["state"] == "interrupted"):
        mine = [r for r in rows if r["lane"] == leg["lane"] and r["step"] == "run"]
        assert mine and all(r["verdict"] == INCONCLUSIVE and sig in r["reason"] for r in mine), rows
    # a leg stopped (lane order runs its four probes side by side; a probe may not have started when the signal came):
    # no probe is left running and no namespace behind (the stop itself is tests/test_together.py's)
    for log in (run_dir / "legs").glob("*.log"):
        text = log.read_text(errors="replace")
        assert "did not stop within" not in text and "could not be removed" not in text, text[-3000:]
    return meta


@pytest.mark.parametrize("case,args,versions,legs", [
    pytest.param("run", ["run", "--controller", config.DEFAULT_CONTROLLER, "--lanes", "order"],
                 [config.DEFAULT_CONTROLLER], 1, id="run"),
    pytest.param("shard", ["run", "--controller", config.DEFAULT_CONTROLLER, "--lanes", "a,order", "--shard", "1/2"],
                 [config.DEFAULT_CONTROLLER], 1, id="run-shard"),
    pytest.param("upgrade", ["upgrade-check", "--from", config.DEFAULT_CONTROLLER, "--to", OTHER, "--lanes", "order",
                             "-j", "2"], [config.DEFAULT_CONTROLLER, OTHER], 2, id="upgrade-check"),
])
def test_group_sigterm_stops_the_legs_and_takes_down_the_clusters(tmp_path, case, args, versions, legs):
    base = f"cx-{case}"
    names = _names(base, versions)
    _take_down(names)
    # every side's binaries built (or waited for) first: on a cold machine one side's leg would otherwise wait for
    # its controller's build while the other side's leg runs to its end, and the legs would never run together
    Toolchain().ensure(components_for(versions))
    drill = DrillProc(args, _env(tmp_path, base), group=True)
    try:
        _legs_running(drill, legs)
        drill.send_group(signal.SIGTERM)
        rc = drill.wait(600)
    finally:
        drill.stop()
    try:
        _assert_interrupted(drill, rc, "SIGTERM")
        assert drill.left_behind() == [], drill.tail()
        assert _clusters_left(names) == [], drill.tail()
        _assert_run_folder(tmp_path, "SIGTERM", legs)
    finally:
        _take_down(names)


def test_a_second_signal_stops_at_once_and_the_next_run_takes_down_what_is_left(tmp_path):
    base = "cx-second"
    _take_down([base])
    drill = DrillProc(["run", "--controller", config.DEFAULT_CONTROLLER, "--lanes", "order"], _env(tmp_path, base),
                      group=True)
    try:
        _legs_running(drill, 1)
        drill.send_group(signal.SIGTERM)
        drill.wait_line("a second signal stops at once")
        drill.send_group(signal.SIGTERM)
        rc = drill.wait(120)
    finally:
        drill.stop()
    try:
        _assert_interrupted(drill, rc, "SIGTERM")
        meta = json.loads((_run_folder(tmp_path) / "run.json").read_text())
        assert meta["interrupted"] is True and any(f"cluster {base}" in x for x in meta["left"]), meta
        assert f"cluster {base}: take it down with" in drill.console, drill.tail()
        assert _clusters_left([base]), "what the stop left is the case's premise"
        said: list[str] = []
        assert base in remains.reap(said.append), said          # as the next run's start does
        assert any(base in line and "left behind" in line for line in said), said
        assert _clusters_left([base]) == []
    finally:
        _take_down([base])


def test_a_legs_pytest_killed_mid_run_makes_that_leg_inconclusive(tmp_path):
    base = "cx-legkill"
    _take_down([base])
    drill = DrillProc(["run", "--controller", config.DEFAULT_CONTROLLER, "--lanes", "order"], _env(tmp_path, base))
    try:
        _legs_running(drill, 1)
        run_dir = until("the leg's first row", lambda: next(iter((tmp_path / "reports").glob("*/ledger.json")), None),
                        timeout=600, interval=0.2, describe=lambda _: drill.tail(1500)).parent
        os.kill(drill.descendants(LEG)[0], signal.SIGKILL)
        rc = drill.wait(600)
    finally:
        drill.stop()
    try:
        assert rc == 3, drill.tail()
        assert "Traceback" not in drill.console, drill.tail()
        meta = json.loads((run_dir / "run.json").read_text())
        assert meta["interrupted"] is False and [x["rc"] for x in meta["legs"]] == [-signal.SIGKILL], meta
        # its short time is not kept as the leg's duration (the next run would start that leg last)
        assert run_legs.read_durations().get(meta["legs"][0]["id"]) != meta["legs"][0]["seconds"], meta
        rows = read_rows(run_dir / "ledger.json")
        ended = [r for r in rows if r["step"] == "run"]
        assert len(ended) == 1 and ended[0]["verdict"] == INCONCLUSIVE and "SIGKILL" in ended[0]["reason"], rows
        assert drill.left_behind() == [] and _clusters_left([base]) == [], drill.tail()
    finally:
        _take_down([base])


# --- commands that start one cluster for themselves -----------------------------------------------------------
ROLLOUT = """apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata: {name: checkout, namespace: shop}
spec:
  replicas: 4
  rollbackWindow: {revisions: 3}
  template: {metadata: {labels: {app: checkout}}, spec: {containers: [{name: app, image: "img:1"}]}}
  strategy:
    canary:
      trafficRouting: {istio: {virtualService: {name: vs}, destinationRule: {name: dr, canarySubsetName: canary,
                                                                            stableSubsetName: stable}}}
      steps: [{setWeight: 5}, {pause: {duration: 10s}}, {setWeight: 100}]
"""


# two shapes (the same Rollout at 4 and at 3 replicas): scan --verify 2 probes them side by side
TWO_SHAPES = ROLLOUT + "---\n" + ROLLOUT.replace("checkout", "cart").replace("replicas: 4", "replicas: 3")


def test_group_sigterm_during_scan_verify_takes_down_its_cluster(tmp_path):
    base = "cx-scanverify"
    _take_down([base])
    manifest = tmp_path / "rollout.yaml"
    manifest.write_text(TWO_SHAPES)
    drill = DrillProc(["scan", str(manifest), "--controller", config.DEFAULT_CONTROLLER, "--verify", "2",
                       "--fail-on", "none"], _env(tmp_path, base), group=True)
    try:
        drill.wait_line("probe: deploy v2", timeout=600, times=2)
        drill.send_group(signal.SIGTERM)
        rc = drill.wait(300)
    finally:
        drill.stop()
    try:
        _assert_interrupted(drill, rc, "SIGTERM")
        assert drill.left_behind() == [] and _clusters_left([base]) == [], drill.tail()
    finally:
        _take_down([base])


def test_group_sigterm_during_scan_verify_on_a_running_cluster_stops_each_probe_in_flight(kube, cluster,
                                                                                         controller_version, tmp_path):
    # the worker's cluster was up before the scan and stays up: the two probes, in flight side by side, stop
    # themselves at the signal (holds released, recordings stopped, namespaces removed) before the scan ends
    world = World(kube, cluster)
    manifest = tmp_path / "rollout.yaml"
    manifest.write_text(TWO_SHAPES)
    drill = DrillProc(["scan", str(manifest), "--controller", controller_version, "--verify", "2", "--fail-on",
                       "none"], dict(os.environ, DRILLS_REPORTS=str(tmp_path)), group=True)
    try:
        drill.wait_line("probe: deploy v2", times=2)
        drill.send_group(signal.SIGTERM)
        rc = drill.wait(300)
    finally:
        drill.stop()
    _assert_interrupted(drill, rc, "SIGTERM")
    lines = drill.console.splitlines()
    deploys = [i for i, x in enumerate(lines) if "probe: deploy v2" in x]
    rollbacks = [i for i, x in enumerate(lines) if "probe: roll back" in x]
    assert len({lines[i].split("]")[0] for i in deploys}) == 2, drill.tail()          # two probes, one line each
    assert not rollbacks or max(deploys) < min(rollbacks), drill.tail()              # side by side
    assert "stopping 2 probe(s) in flight" in drill.console and "did not stop within" not in drill.console, \
        drill.tail()
    assert world.leftovers(drill) == []


def test_group_sigterm_during_a_probe_leaves_nothing_of_it(kube, cluster, controller_version, tmp_path):
    world = World(kube, cluster)
    drill = DrillProc(["probe", "--steps", "5,pause:2s,100", "--replicas", "2", "--hold", "30", "--controller",
                       controller_version], dict(os.environ, DRILLS_REPORTS=str(tmp_path)), group=True)
    try:
        drill.wait_line("probe: deploy v2")
        drill.send_group(signal.SIGTERM)
        rc = drill.wait(300)
    finally:
        drill.stop()
    _assert_interrupted(drill, rc, "SIGTERM")
    assert world.leftovers(drill) == []


# --- killed outright: the next `cluster up` takes down what is left -----------------------------------------
@pytest.mark.parametrize("case,args,phase", [
    pytest.param("runkill", ["run", "--controller", config.DEFAULT_CONTROLLER, "--lanes", "order"], LEG,
                 id="run"),
    pytest.param("scankill", ["scan", "ROLLOUT", "--controller", config.DEFAULT_CONTROLLER, "--verify", "1",
                              "--fail-on", "none"], "probe: deploy v2", id="scan-verify"),
])
def test_sigkill_leaves_marked_remains_the_next_cluster_up_takes_down(cluster, tmp_path, case, args, phase):
    base = f"cx-{case}"
    _take_down([base])
    manifest = tmp_path / "rollout.yaml"
    manifest.write_text(ROLLOUT)
    drill = DrillProc([str(manifest) if a == "ROLLOUT" else a for a in args], _env(tmp_path, base))
    try:
        if phase == LEG:
            _legs_running(drill, 1)
        else:
            drill.wait_line(phase, timeout=600)
        drill.send(signal.SIGKILL)
        assert drill.wait(60) == -signal.SIGKILL
    finally:
        drill.stop()
    try:
        assert _clusters_left([base]), "a killed command cannot clean up: its cluster is the case's premise"
        assert base in [name for name, _ in remains.abandoned()]
        # the next `drills cluster up` (here of the worker's own cluster, already up) takes the remains down
        r = subprocess.run([sys.executable, "-m", "drills", "cluster", "up", "--controller", config.DEFAULT_CONTROLLER],
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, DRILLS_CLUSTER=cluster.name))
        assert r.returncode == 0, r.stderr
        assert f"cluster: {base} is what run " in r.stderr and "left behind" in r.stderr, r.stderr
        assert _clusters_left([base]) == []
        until("every process of the killed command to be gone", lambda: drill.left_behind(), lambda left: not left,
              timeout=30)
    finally:
        _take_down([base])
