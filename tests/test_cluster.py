"""The embedded cluster runs the real controller, which writes real VirtualService weights."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from kubernetes import client

from drills.core import config
from drills.cluster import Availability, pid_alive
from drills.cluster.embedded import listening_ports_of
from drills.kube.rollout import HASH_LABEL, Predicate, healthy, paused
from drills.drill.shapes import RolloutSpec, install
from drills.core.wait import hold_for, until

HELD_WINDOW_S = 4.0        # evidence window: well past the default release delay (1 s), a held pod stays un-Ready


def _vs_weights(kube, ns, name):
    vs = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        "networking.istio.io", "v1alpha3", ns, "virtualservices", name)
    return {r["destination"]["subset"]: r.get("weight", 0) for r in vs["spec"]["http"][0]["route"]}


def _deploy(kube, ns, spec):
    return install(kube, ns, spec)


def test_controller_writes_istio_weights_and_promotes(kube, namespace, controller_version, cluster):
    assert cluster.status()["controller_version"] == controller_version
    spec = RolloutSpec(steps=[{"setWeight": 25}, {"pause": {}}], replicas=4, min_pods=1, name="web")
    ro = _deploy(kube, namespace, spec)
    ro.wait("web", healthy(), 90)
    assert _vs_weights(kube, namespace, "web") == {"stable": 100, "canary": 0}

    ro.set_image("web", "registry.local/web:v2")
    obj = ro.wait("web", Predicate("paused at step 1", lambda o: paused()(o) and o["status"].get("currentStepIndex") == 1),
                  90)
    # the Rollout status is written before the VirtualService
    until("the VirtualService at 75/25", lambda: _vs_weights(kube, namespace, "web"),
          lambda w: w == {"stable": 75, "canary": 25}, 15)
    assert obj["status"]["canary"]["weights"]["canary"]["weight"] == 25

    dr = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        "networking.istio.io", "v1alpha3", namespace, "destinationrules", "web")
    subsets = {s["name"]: s["labels"] for s in dr["spec"]["subsets"]}
    assert subsets["canary"][HASH_LABEL] == obj["status"]["currentPodHash"]
    assert subsets["stable"][HASH_LABEL] == obj["status"]["stableRS"]
    assert subsets["canary"][HASH_LABEL] != subsets["stable"][HASH_LABEL]

    ro.promote("web")
    ro.wait("web", Predicate("Healthy at the new pod hash", lambda o: healthy()(o) and
                             o["status"]["stableRS"] == obj["status"]["currentPodHash"]), 90)
    until("the VirtualService back at 100/0", lambda: _vs_weights(kube, namespace, "web"),
          lambda w: w == {"stable": 100, "canary": 0}, 15)


@pytest.mark.single_version
def test_held_pod_stays_unavailable_until_released(kube, namespace, cluster):
    av = Availability(kube)
    hid = av.hold(namespace, {"app.kubernetes.io/name": "held"}, None)
    try:
        spec = RolloutSpec(steps=[{"setWeight": 50}], replicas=2, name="held")
        ro = _deploy(kube, namespace, spec)
        apps = client.AppsV1Api(kube)
        core = client.CoreV1Api(kube)
        pods = until("the Rollout's two pods", lambda: core.list_namespaced_pod(
            namespace, label_selector="app.kubernetes.io/name=held").items, lambda ps: len(ps) == 2, 30)
        hold_for(HELD_WINDOW_S, "held pods stay un-Ready past the default release delay")
        rs = apps.list_namespaced_replica_set(namespace).items[0]
        assert rs.spec.replicas == 2 and (rs.status.available_replicas or 0) == 0
        av.release_pod(namespace, pods[0].metadata.name)
        until("the released pod available", lambda: apps.read_namespaced_replica_set(rs.metadata.name, namespace),
              lambda r: (r.status.available_replicas or 0) == 1, 20)
        hold_for(HELD_WINDOW_S / 2, "the other pod stays held")
        rs = apps.read_namespaced_replica_set(rs.metadata.name, namespace)
        assert (rs.status.available_replicas or 0) == 1, "exactly the released pod is available"
        av.unhold(hid)
        ro.wait("held", healthy(), 30)
        rs = apps.read_namespaced_replica_set(rs.metadata.name, namespace)
        assert rs.status.available_replicas == 2
    finally:
        av.unhold(hid)


def _drills(*args, env=None, timeout=600):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, env=e,
                          timeout=timeout)


@pytest.mark.single_version
def test_room_for_a_fleet_sized_probe_adds_ready_nodes_and_never_removes_one(kube, cluster):
    """A probe at 360 replicas needs both ReplicaSets at full size at once: more pods than two fake nodes hold
    (110 each); the cluster adds Ready nodes for them, and asking for less later removes none."""
    from kubernetes import client
    from kubernetes.utils import parse_quantity
    core = client.CoreV1Api(cluster.api_client())
    before = core.list_node().items
    room = sum(int(parse_quantity(n.status.allocatable["pods"])) for n in before)
    got = cluster.ensure_pod_room(room + 1)
    nodes = core.list_node().items
    assert got == len(nodes) > len(before), (got, len(nodes), len(before))
    assert sum(int(parse_quantity(n.status.allocatable["pods"])) for n in nodes) > room
    assert all(any(c.type == "Ready" and c.status == "True" for c in n.status.conditions) for n in nodes)
    assert cluster.ensure_pod_room(1) == len(nodes) and len(core.list_node().items) == len(nodes)


@pytest.mark.single_version
def test_down_leaves_no_process_and_no_port(controller_version, cluster):
    env = {"DRILLS_CLUSTER": "drills-down-check"}
    r = _drills("cluster", "up", "--controller", controller_version, env=env)
    assert r.returncode == 0, r.stderr
    st = json.loads(_drills("cluster", "status", "--json", env=env).stdout)
    assert st["ready"] is True and st["api_server"].startswith("https://127.0.0.1:")
    pids = [p["pid"] for p in st["processes"]]
    names = {p["name"] for p in st["processes"]}
    assert {"etcd", "kube-apiserver", "kube-controller-manager", "kwok-controller", "rollouts-controller",
            "releaser"} <= names
    ports = listening_ports_of(pids)
    assert ports, "the running cluster listens somewhere"
    r = _drills("cluster", "down", env=env)
    assert r.returncode == 0, r.stderr
    until("every process of the cluster gone", lambda: [p for p in pids if pid_alive(p)], lambda alive: not alive, 10)
    for port in ports:
        with socket.socket() as s:
            s.settimeout(0.3)
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still listens"
    st = _drills("cluster", "status", "--json", env=env)
    assert json.loads(st.stdout) == {"ready": False} and st.returncode == 1


def test_unknown_controller_version_exits_2_listing_supported():
    r = _drills("cluster", "up", "--controller", "v1.99.0")
    assert r.returncode == 2
    for v in config.SUPPORTED_CONTROLLERS:
        assert v in r.stderr
    r = _drills("cluster", "up", "--controller", "latest-and-greatest")
    assert r.returncode == 2 and "not a version" in r.stderr


def test_occupied_port_exits_2_and_starts_nothing():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        env = {"DRILLS_CLUSTER": "drills-port-check"}
        r = _drills("cluster", "up", "--api-port", str(port), env=env)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and str(port) in r.stderr
    assert json.loads(_drills("cluster", "status", "--json", env=env).stdout) == {"ready": False}


def test_missing_binary_exits_2_and_starts_nothing(tmp_path):
    env = {"DRILLS_CACHE": str(tmp_path / "empty-cache"), "DRILLS_CLUSTER": "drills-missing-check"}
    r = _drills("cluster", "up", "--no-build", env=env)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "missing binary" in r.stderr
    assert not (tmp_path / "empty-cache" / "clusters" / "drills-missing-check").exists()


# --- a controller manager that gave up at its start (a slow apiserver on a loaded machine) ----------------------
def _kill(pid: int) -> None:
    import signal
    os.kill(pid, signal.SIGKILL)
    until(f"process {pid} to exit", lambda: not pid_alive(pid), timeout=30)


@pytest.mark.single_version
def test_a_controller_manager_that_exited_is_started_again_and_works(kube, cluster, namespace):
    from pathlib import Path

    from drills.cluster.embedded import ControlPlaneExited
    from drills.cluster.startup import revive_exited
    before = cluster._kwok_pids()
    _kill(before["kube-controller-manager"])
    revive_exited(cluster, Path(cluster.state()["kwok_cluster_dir"]), ControlPlaneExited)
    after = cluster._kwok_pids()
    assert after["kube-controller-manager"] != before["kube-controller-manager"]
    assert pid_alive(after["kube-controller-manager"])
    assert {k: v for k, v in after.items() if k != "kube-controller-manager"} == \
        {k: v for k, v in before.items() if k != "kube-controller-manager"}, "only the exited process was started"
    # the new one does its work: a ReplicaSet gets its pod
    labels = {"app": "revived-kcm"}
    client.AppsV1Api(kube).create_namespaced_replica_set(namespace, {
        "metadata": {"name": "revived-kcm"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "c", "image": "registry.local/x:1"}]}}}})
    until("the revived controller manager to create the ReplicaSet's pod",
          lambda: client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector="app=revived-kcm").items,
          bool, timeout=60)


@pytest.mark.single_version
def test_an_exited_etcd_is_not_started_again_it_ends_the_start(controller_version):
    from drills.cluster import EmbeddedCluster
    from drills.cluster.embedded import ControlPlaneExited
    from drills.cluster.startup import revive_exited
    c = EmbeddedCluster(f"revive-{os.getpid()}", log=lambda m: None)
    try:
        c.up(controller_version)
        pids = c._kwok_pids()
        _kill(pids["etcd"])
        with pytest.raises(ControlPlaneExited, match="etcd"):
            from pathlib import Path
            revive_exited(c, Path(c.state()["kwok_cluster_dir"]), ControlPlaneExited)
        assert not pid_alive(pids["etcd"])
    finally:
        c.down(quiet=True)
