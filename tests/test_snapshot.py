"""The embedded cluster's snapshot cache: keyed by its inputs, restored warm, never carrying a drill's state,
safe for clusters of different names started at once."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from tenacity import retry, retry_if_result, stop_after_delay, wait_fixed

from drills.core import config
from drills.cluster import Availability, EmbeddedCluster, pid_alive
from drills.core.procs import listening_ports_of
from drills.cluster.snapshot import SnapshotStore, copy_sparse, snapshot_inputs, snapshot_key
from drills.cluster.startup import SENTINEL, SENTINEL_NS, kwokctl_configuration
from drills.drill.shapes import RolloutSpec, install
from drills.kube.rollout import Predicate, healthy, paused
from drills.toolchain import Toolchain, components_for

BASE = os.environ.get("DRILLS_CLUSTER") or config.EMBEDDED_CLUSTER_NAME


def _name(suffix: str) -> str:
    return f"{BASE}-{suffix}"


def _crd_files(tc: Toolchain, crds_dir: Path) -> list[Path]:
    return sorted(crds_dir.glob("*.yaml")) + [tc.component("istio-crds") / "crds.yaml"]


def _inputs(tc: Toolchain, crds_dir: Path, folder: Path, ports=(1, 2, 3, 4, 5)) -> dict:
    tc.ensure([c for c in components_for([]) if c.name != "helm"])      # the control plane's binaries are hashed
    kc = kwokctl_configuration(tc, folder, list(ports), None)
    return snapshot_inputs(tc, _crd_files(tc, crds_dir), kc.stages, kc.audit_policy, kc.options, SENTINEL_NS, 2)


def _marked_crds(tc: Toolchain, version: str, dest: Path, mark: str) -> Path:
    """The release's CRD files with one annotation added to the Rollout CRD: another CRD set, another key."""
    shutil.copytree(tc.ensure_crds(version), dest, dirs_exist_ok=True)
    f = dest / "rollout-crd.yaml"
    doc = yaml.safe_load(f.read_text())
    doc["metadata"].setdefault("annotations", {})["drills.dev/test-mark"] = mark
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


def _forget(key: str) -> None:
    """Remove a snapshot a test made under a key of its own, with its lock file."""
    store = SnapshotStore()
    store.remove(key)
    store.lock_path(key).unlink(missing_ok=True)


def _wait_for(what: str, fn, timeout: float = 60):
    """Poll ``fn`` until it returns something truthy; fail naming ``what``."""
    r = retry(stop=stop_after_delay(timeout), wait=wait_fixed(0.2), retry=retry_if_result(lambda v: not v),
              retry_error_callback=lambda state: pytest.fail(f"timed out waiting for {what}"))
    return r(fn)()


def _vs_weights(kube, ns, name):
    vs = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        "networking.istio.io", "v1alpha3", ns, "virtualservices", name)
    return {r["destination"]["subset"]: r.get("weight", 0) for r in vs["spec"]["http"][0]["route"]}


RECONCILE_WAIT_S = 240


def _reconciles_a_new_rollout(kube, label: str) -> None:
    """A fresh Rollout goes Healthy, then a new image pauses it at setWeight 50 with the VirtualService
    written: replica sets, scheduling, fake kubelet, releaser and the Istio routing of the controller."""
    ns = f"snap-{label}-{uuid.uuid4().hex[:5]}"
    client.CoreV1Api(kube).create_namespace({"metadata": {"name": ns}})
    try:
        ro = install(kube, ns, RolloutSpec(steps=[{"setWeight": 50}, {"pause": {}}], replicas=2, name="web"))
        # two clusters' controllers beside the other workers' on 2 cores: a reconcile was seen to take over 90 s
        ro.wait("web", healthy(), RECONCILE_WAIT_S)
        ro.set_image("web", "registry.local/web:v2")
        ro.wait("web", Predicate("paused at step 1", lambda o: paused()(o) and
                                 o["status"].get("currentStepIndex") == 1), RECONCILE_WAIT_S)
        _wait_for("VirtualService at canary 50",
                  lambda: _vs_weights(kube, ns, "web") == {"stable": 50, "canary": 50}, 30)
    finally:
        client.CoreV1Api(kube).delete_namespace(ns)


def _up_in_subprocess(name: str, version: str, crds_dir: Path | None) -> subprocess.Popen:
    code = ("import sys; from pathlib import Path; from drills.cluster import EmbeddedCluster; "
            "c = sys.argv[3]; EmbeddedCluster(sys.argv[1]).up(sys.argv[2], crds_dir=Path(c) if c else None)")
    return subprocess.Popen([sys.executable, "-c", code, name, version, str(crds_dir or "")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# --- the key and the store, without a cluster ------------------------------------------------------
@pytest.mark.single_version
def test_key_follows_every_input_and_only_them(controller_version, tmp_path):
    tc = Toolchain()
    crds = _marked_crds(tc, controller_version, tmp_path / "crds", "a")
    base = _inputs(tc, crds, tmp_path)
    key = snapshot_key(base)
    # per-cluster values (ports, the cluster folder) do not reach etcd: same key
    (tmp_path / "other").mkdir()
    assert snapshot_key(_inputs(tc, crds, tmp_path / "other", ports=(9, 8, 7, 6, 5))) == key
    # the same CRD content in another folder: same key
    assert snapshot_key(_inputs(tc, _marked_crds(tc, controller_version, tmp_path / "copy", "a"), tmp_path)) == key
    # one CRD file's content changes: another key
    assert snapshot_key(_inputs(tc, _marked_crds(tc, controller_version, tmp_path / "crds", "b"), tmp_path)) != key
    _marked_crds(tc, controller_version, tmp_path / "crds", "a")
    changed = {
        "stages": lambda i: i["stages"][0]["metadata"].__setitem__("name", "renamed"),
        "audit policy": lambda i: i["audit_policy"]["rules"].pop(0),
        "system namespace": lambda i: i.__setitem__("system_namespace", "elsewhere"),
        "nodes": lambda i: i.__setitem__("nodes", 3),
        "kubernetes binary": lambda i: i["kubernetes"]["binaries"].__setitem__("kube-apiserver", "0" * 64),
        "etcd version": lambda i: i["etcd"].__setitem__("version", "v3.6.0"),
        "kwok binary": lambda i: i["kwok"]["binaries"].__setitem__("kwok", "0" * 64),
        "component patches": lambda i: i["options"]["componentsPatches"].pop(),
    }
    for what, change in changed.items():
        inputs = _inputs(tc, crds, tmp_path)
        assert snapshot_key(inputs) == key
        change(inputs)
        assert snapshot_key(inputs) != key, what


def test_a_missing_key_is_built_once_while_a_second_process_waits(tmp_path):
    store = SnapshotStore(tmp_path / "snapshots")
    lease = store.acquire("k1")
    assert not lease.ready
    waiter = subprocess.Popen(
        [sys.executable, "-c", "import sys, json; from drills.cluster.snapshot import SnapshotStore; "
         "l = SnapshotStore(sys.argv[1]).acquire('k1'); l.restore(__import__('pathlib').Path(sys.argv[2])); "
         "print(json.dumps({'ready': l.ready}))", str(store.root), str(tmp_path / "restored")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    inode = os.stat(store.lock_path("k1")).st_ino

    def blocked_on_the_lock() -> bool:   # the kernel's own list of lock requests, a waiting one marked "->"
        rows = [line.split() for line in Path("/proc/locks").read_text().splitlines()]
        return any(r[1] == "->" and r[5] == str(waiter.pid) and r[6].endswith(f":{inode}") for r in rows)
    _wait_for("the second process to wait on the builder's lock", blocked_on_the_lock, 30)
    assert waiter.poll() is None and not (tmp_path / "restored").exists()
    data = tmp_path / "data"
    (data / "member").mkdir(parents=True)
    (data / "member" / "db").write_bytes(b"etcd" * 1000)
    lease.save(data, {"x": 1}, {"crds": ["a"]})
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    assert json.loads(out) == {"ready": True}
    assert (tmp_path / "restored" / "member" / "db").read_bytes() == b"etcd" * 1000
    assert store.keys() == ["k1"]


def test_copy_keeps_content_and_leaves_zero_runs_as_holes(tmp_path):
    src = tmp_path / "src" / "member" / "wal"
    src.mkdir(parents=True)
    wal = src / "0.wal"
    with open(wal, "wb") as f:
        f.write(b"record" * 100)
        f.truncate(64 << 20)       # a preallocated segment: mostly zeros
    copy_sparse(tmp_path / "src", tmp_path / "dst")
    out = tmp_path / "dst" / "member" / "wal" / "0.wal"
    assert out.stat().st_size == 64 << 20
    assert out.read_bytes() == wal.read_bytes()
    assert out.stat().st_blocks * 512 <= 1 << 20     # the one chunk that holds data


def test_pruning_skips_a_snapshot_in_use(tmp_path):
    store = SnapshotStore(tmp_path / "snapshots")
    data = tmp_path / "data"
    data.mkdir()
    (data / "f").write_text("x")
    for k in ("a", "b", "c"):
        store.acquire(k).save(data, {}, {"crds": []})
    held = store.acquire("a")       # a restore in progress holds it shared
    assert held.ready
    removed = store.prune(keep={"c"}, limit=1)
    assert removed == ["b"] and store.keys() == ["a", "c"]
    held.release()
    assert store.prune(keep={"c"}, limit=1) == ["a"]


# --- with clusters -----------------------------------------------------------------------------------
@pytest.mark.single_version
def test_stale_snapshot_is_rebuilt_and_the_fresh_one_restored(controller_version, tmp_path):
    tc = Toolchain()
    store = SnapshotStore()
    c = EmbeddedCluster(_name("snap-stale"), log=lambda m: None)
    keys = []
    try:
        for mark, start in (("one", "cold"), ("two", "cold"), ("two", "warm")):
            crds = _marked_crds(tc, controller_version, tmp_path / "crds", mark)
            c.up(controller_version, crds_dir=crds)
            snap = c.state()["snapshot"]
            assert snap["start"] == start, (mark, snap)
            assert store.is_ready(snap["key"])
            keys.append(snap["key"])
            crd = client.ApiextensionsV1Api(c.api_client()).read_custom_resource_definition(
                "rollouts.argoproj.io")
            assert crd.metadata.annotations["drills.dev/test-mark"] == mark
            c.down(quiet=True)
        assert keys[0] != keys[1] == keys[2]
    finally:
        c.down(quiet=True)
        for k in set(keys):
            _forget(k)


@pytest.mark.single_version
def test_warm_start_serves_established_crds_and_reconciles(controller_version):
    c = EmbeddedCluster(_name("snap-warm"), log=lambda m: None)
    try:
        c.up(controller_version)            # builds the snapshot of this version if it is not there yet
        c.down(quiet=True)
        c.up(controller_version)
        assert c.state()["snapshot"]["start"] == "warm"
        kube = c.api_client()
        tc = Toolchain()
        names = {d["metadata"]["name"] for f in _crd_files(tc, tc.rollouts(controller_version) / "crds")
                 for d in yaml.safe_load_all(f.read_text()) if d and d.get("kind") == "CustomResourceDefinition"}
        crds = {x.metadata.name: x for x in client.ApiextensionsV1Api(kube).list_custom_resource_definition().items}
        assert names <= set(crds)
        for n in names:
            assert {x.type: x.status for x in crds[n].status.conditions}["Established"] == "True", n
        nodes = client.CoreV1Api(kube).list_node().items
        assert len(nodes) == 2
        _reconciles_a_new_rollout(kube, "warm")
    finally:
        c.down(quiet=True)


@pytest.mark.single_version
def test_no_state_of_a_previous_life_survives_a_warm_start(controller_version):
    c = EmbeddedCluster(_name("snap-life"), log=lambda m: None)
    ns = f"carry-{uuid.uuid4().hex[:5]}"
    try:
        c.up(controller_version)
        kube = c.api_client()
        core = client.CoreV1Api(kube)
        core.create_namespace({"metadata": {"name": ns}})
        core.create_namespaced_config_map(ns, {"metadata": {"name": "left-behind"}})
        Availability(kube).hold(ns, {"app": "held"}, None)
        co = client.CustomObjectsApi(kube)
        first = co.get_namespaced_custom_object("argoproj.io", "v1alpha1", SENTINEL_NS, "rollouts", SENTINEL)
        c.down(quiet=True)

        c.up(controller_version)
        assert c.state()["snapshot"]["start"] == "warm"
        kube = c.api_client()
        core = client.CoreV1Api(kube)
        for read in (lambda: core.read_namespace(ns),
                     lambda: core.read_namespaced_config_map("drills-availability", SENTINEL_NS)):
            with pytest.raises(ApiException) as e:
                read()
            assert e.value.status == 404
        assert Availability(kube).config()["holds"] == []
        rollouts = client.CustomObjectsApi(kube).list_cluster_custom_object("argoproj.io", "v1alpha1", "rollouts")
        assert [r["metadata"]["name"] for r in rollouts["items"]] == [SENTINEL]
        sentinel = rollouts["items"][0]
        assert sentinel["metadata"]["uid"] != first["metadata"]["uid"]
        assert sentinel["status"]["observedGeneration"]
        # the apiserver's record of this life: the sentinel's status was written by this life's controller
        events = [json.loads(line) for line in Path(c.status()["audit_log"]).read_text().splitlines() if line]
        writes = [e for e in events if e.get("verb") in ("update", "patch")
                  and (e.get("objectRef") or {}).get("resource") == "rollouts"
                  and e["objectRef"].get("name") == SENTINEL and e.get("responseStatus", {}).get("code") == 200]
        assert writes and all("rollouts-controller" in e.get("userAgent", "") for e in writes), writes[:2]
    finally:
        c.down(quiet=True)


def _both_up(version: str, crds: Path | None, names: list[str]) -> list[EmbeddedCluster]:
    procs = [_up_in_subprocess(n, version, crds) for n in names]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
    return [EmbeddedCluster(n, log=lambda m: None) for n in names]


@pytest.mark.single_version
def test_two_names_at_once_build_one_snapshot_and_both_reconcile(controller_version, tmp_path):
    """Two clusters of different names started together on a CRD set with no snapshot: one builds it,
    the other waits for it and restores it; both then run, on ports of their own."""
    tc = Toolchain()
    crds = _marked_crds(tc, controller_version, tmp_path / "crds", uuid.uuid4().hex)
    key = snapshot_key(_inputs(tc, crds, tmp_path))
    assert not SnapshotStore().is_ready(key)
    names = [_name("snap-a"), _name("snap-b")]
    try:
        clusters = _both_up(controller_version, crds, names)
        snaps = [cl.state()["snapshot"] for cl in clusters]
        assert [s["key"] for s in snaps] == [key, key]
        assert sorted(s["start"] for s in snaps) == ["cold", "warm"]
        ports = [set(cl.state()["control_plane_ports"]) for cl in clusters]
        assert not ports[0] & ports[1]
        for cl in clusters:
            assert cl.status()["ready"]
            _reconciles_a_new_rollout(cl.api_client(), cl.name[-1])
    finally:
        for n in names:
            EmbeddedCluster(n, log=lambda m: None).down(quiet=True)
        _forget(key)


@pytest.mark.single_version
def test_two_names_at_once_from_the_same_snapshot_both_reconcile(controller_version):
    names = [_name("snap-c"), _name("snap-d")]
    try:
        first = EmbeddedCluster(names[0], log=lambda m: None)
        first.up(controller_version)        # the release's snapshot exists from here on
        first.down(quiet=True)
        clusters = _both_up(controller_version, None, names)
        assert [cl.state()["snapshot"]["start"] for cl in clusters] == ["warm", "warm"]
        assert clusters[0].state()["snapshot"]["key"] == clusters[1].state()["snapshot"]["key"]
        pids = [p["pid"] for cl in clusters for p in cl.status()["processes"]]
        listening = listening_ports_of(pids)
        for cl in clusters:
            _reconciles_a_new_rollout(cl.api_client(), cl.name[-1])
    finally:
        for n in names:
            EmbeddedCluster(n, log=lambda m: None).down(quiet=True)
    assert listening
    _wait_for("every process of both clusters gone", lambda: not [p for p in pids if pid_alive(p)], 30)
    for port in listening:
        with socket.socket() as s:
            s.settimeout(0.3)
            assert s.connect_ex(("127.0.0.1", port)) != 0, \
                f"port {port} still listens " + subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    for n in names:
        assert not (config.clusters_dir() / n).exists()
