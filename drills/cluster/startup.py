"""Start-up helpers of the embedded cluster: control-plane ports, the phase clock, the kwokctl configuration,
the checks a start waits on (CRDs served, the sentinel reconciled, nodes Ready) and a polling API client.

Ports are chosen by the project and recorded before kwokctl starts.  kwokctl picks a port by counting
down from 32767 in every process and skips only the ports of clusters whose configuration is already
saved, so two clusters created at the same moment pick the same ports.  Here a port is drawn at random
below the kernel's ephemeral range (an outgoing connection never takes it), must be free to bind, and is
recorded in the cluster's state.json while a lock over all clusters is held, so a concurrent ``up`` of
another name skips it.
"""
from __future__ import annotations

import fcntl
import json
import os
import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from ..core import config, fastyaml
from .. import routers
from .stages import load_stages

RANGE = (20000, 32000)
SENTINEL_NS = "drills-system"
SENTINEL = "drills-sentinel"


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def reserve_ports(clusters_dir: Path, name: str, count: int, record: Callable[[list[int]], None]) -> list[int]:
    """``count`` free ports no other cluster folder has recorded; ``record`` stores them under the lock."""
    clusters_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(clusters_dir / ".ports.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        used: set[int] = set()
        for st in clusters_dir.glob("*/state.json"):
            if st.parent.name == name:
                continue
            try:
                used.update(json.loads(st.read_text()).get("control_plane_ports") or [])
            except (OSError, ValueError):
                continue
        rng = random.SystemRandom()
        picks: list[int] = []
        while len(picks) < count:
            port = rng.randrange(*RANGE)
            if port not in used and port not in picks and _bindable(port):
                picks.append(port)
        record(picks)
        return picks
    finally:
        os.close(fd)


class PhaseClock:
    """Start and end of each start-up phase, in seconds since ``up`` began (phases may overlap)."""

    def __init__(self):
        self.t0, self.at = time.monotonic(), time.time()
        self.phases: list[dict] = []

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    @contextmanager
    def phase(self, name: str):
        start = self.now()
        try:
            yield
        finally:
            self.phases.append({"phase": name, "start": start, "end": self.now()})

    def mark(self, name: str) -> None:
        t = self.now()
        self.phases.append({"phase": name, "start": t, "end": t})


ETCD_TICK_MS = 100
# the controller manager's controllers a drill needs: pods of ReplicaSets (and of a Deployment: a live scan's
# controller Deployment), owners' garbage, namespaces deleted with their objects, a namespace's default
# ServiceAccount (a pod is refused without it), a Ready node's not-ready taint lifted (no pod is scheduled before),
# autoscalers, the aggregated ClusterRoles, orphaned pods
CONTROLLERS = ("replicaset-controller", "deployment-controller", "garbage-collector-controller",
               "namespace-controller", "serviceaccount-controller", "node-lifecycle-controller",
               "horizontal-pod-autoscaler-controller", "clusterrole-aggregation-controller",
               "pod-garbage-collector-controller")
CONTROL_PLANE_GOGC = 400


@dataclass
class KwokctlConfiguration:
    documents: list[dict]      # the kwokctl configuration file: the configuration, then the Stages
    options: dict              # its options and component patches (a snapshot input)
    stages: list[dict]
    audit_policy: dict


def kwokctl_configuration(tc, folder: Path, ports: list[int], api_port: int | None) -> KwokctlConfiguration:
    """The cluster's kwokctl configuration (binary runtime, the toolchain's binaries, 127.0.0.1, audit log)."""
    audit_policy = folder / "audit-policy.yaml"
    policy = {
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
        # the routers' route objects with their response, so the recorder's completeness can be proved from the
        # apiserver's own record (every resourceVersion it handed out); everything else with metadata.
        "rules": [{"level": "RequestResponse", "verbs": ["create", "update", "patch"],
                   "resources": [{"group": g, "resources": [plural]}
                                 for g, plural in (r.audit_resource for r in routers.ROUTERS.values())]},
                  {"level": "Metadata"}]}
    audit_policy.write_text(yaml.safe_dump(policy))
    opts = {
        "runtime": "binary", "bindAddress": "127.0.0.1",
        "kubeVersion": config.KUBERNETES_VERSION, "etcdVersion": config.ETCD_VERSION.lstrip("v"),
        "kubeApiserverBinary": str(tc.kube_bin("kube-apiserver")),
        "kubeControllerManagerBinary": str(tc.kube_bin("kube-controller-manager")),
        "kubeSchedulerBinary": str(tc.kube_bin("kube-scheduler")),
        "kubectlBinary": str(tc.kube_bin("kubectl")),
        "kwokControllerBinary": str(tc.bin("kwok", config.KWOK_VERSION, "kwok")),
        "etcdBinary": str(tc.bin("etcd", config.ETCD_VERSION, "etcd")),
        "kubeAuditPolicy": str(audit_policy),
        "quietPull": True,
        "etcdPort": ports[0], "etcdPeerPort": ports[1], "kwokControllerPort": ports[2],
        "kubeControllerManagerPort": ports[3], "kubeSchedulerPort": ports[4],
    }
    if api_port:
        opts["kubeApiserverPort"] = api_port
    # one instance each, so no leader election: no Lease in a snapshot for a restored one to wait out
    patches = [{"name": n, "extraArgs": [{"key": "leader-elect", "value": "false"}]}
               for n in ("kube-controller-manager", "kube-scheduler")]
    # a single etcd member fast-forwards its election ticks and elects itself a tick or a few later: a 100 ms tick
    # starts a cluster as fast as a 25 ms one (2.9 s from a snapshot either way) and idles at ~55 % of its CPU
    # (0.46 against 0.83 CPU-s a minute; a raft tick every interval, for life, in every cluster a test run starts)
    patches.append({"name": "etcd", "extraArgs": [{"key": "heartbeat-interval", "value": str(ETCD_TICK_MS)},
                                                  {"key": "election-timeout", "value": str(5 * ETCD_TICK_MS)}]})
    # a short-lived cluster on a small machine: the Go collector of the control plane runs at a quarter of its
    # default pace (GOGC): the apiserver's start-up takes a third less CPU for ~100 MiB more heap
    # (benchmarks/bench_cluster.py prints a start's CPU); and one thread runs Go code at a time (GOMAXPROCS): an
    # idle cluster costs ~20 % less CPU (1.6 against 1.9-2.2 CPU-s a minute: no scheduler threads spinning for
    # work on the other core) and a start the same CPU, ~0.2 s later.  The controller under test keeps its defaults.
    envs = [{"name": "GOGC", "value": str(CONTROL_PLANE_GOGC)}, {"name": "GOMAXPROCS", "value": "1"}]
    for patch in patches:
        patch["extraEnvs"] = list(envs)
    # what an embedded cluster does not need, left out of every minute of its life (a test run keeps eight up at once
    # and starts over a hundred): the controller manager runs only the controllers a drill's objects need, and the
    # apiserver no priority and fairness (its configuration controller and per-request queueing: a cluster of one
    # drill has no tenants to keep apart), no reconciling of the `kubernetes` Service's endpoints and no identity
    # Lease (each rewritten every 10 s).  Idle CPU: benchmarks/bench_cluster.py --idle
    next(p for p in patches if p["name"] == "kube-controller-manager")["extraArgs"].append(
        {"key": "controllers", "value": ",".join(CONTROLLERS)})
    patches.append({"name": "kube-apiserver", "extraEnvs": list(envs), "extraArgs": [
        {"key": "enable-priority-and-fairness", "value": "false"},
        {"key": "endpoint-reconciler-type", "value": "none"},
        {"key": "feature-gates", "value": "APIServerIdentity=false,UnknownVersionInteroperabilityProxy=false"}]})
    conf = {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokctlConfiguration", "options": opts,
            "componentsPatches": patches}
    stages = load_stages(tc.bin("kwok", config.KWOK_VERSION, "stages"))
    return KwokctlConfiguration([conf, *stages], {**opts, "componentsPatches": patches}, stages, policy)


def install_crds(api, files: list[Path], wait) -> list[dict]:
    """Create the CRDs of ``files`` and wait until they are served; each one's name, group, version, plural."""
    from ..kube.k8s import client
    ext = client.ApiextensionsV1Api(api)
    crds = []
    for f in files:
        for doc in fastyaml.safe_load_all(Path(f).read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            ext.create_custom_resource_definition(doc)
            spec = doc["spec"]
            crds.append({"name": doc["metadata"]["name"], "group": spec["group"], "plural": spec["names"]["plural"],
                         "version": next(v["name"] for v in spec["versions"] if v.get("served"))})
    wait(crds_served(api, crds), 30, "the CRDs to be Established and served")
    return crds


def crds_served(api, crds: list[dict]) -> Callable[[], bool]:
    """A check: a list of each CRD's resources answers 200 (the apiserver serves a CRD's resources only
    once it is Established).

    The first list of a resource makes the apiserver build what serves it (schemas, validators, its watch
    cache); until that is done a list answers 429 or 503 and a client's informer (the controller's) backs
    off for a second, so all are listed, side by side, as soon as the apiserver answers.  The controller
    probes the Istio CRDs once at its start (missing ones are looked for again only every 10 minutes): it
    must not start before this holds.  An apiserver not answering yet counts as not yet."""
    from ..kube.k8s import client
    from ..kube.k8s import ApiException
    from urllib3.exceptions import HTTPError
    co = client.CustomObjectsApi(api)
    pending = {c["name"]: c for c in crds}
    answered = [False]

    def served(c: dict) -> bool:
        try:
            co.list_cluster_custom_object(c["group"], c["version"], c["plural"], limit=1, _request_timeout=5)
            answered[0] = True
            return True
        except ApiException as e:
            answered[0] = True
            if e.status in (404, 429, 503):
                return False
            raise
        except HTTPError:
            return False

    def check() -> bool:
        todo = list(pending.values())
        if todo and not answered[0]:      # one request at a time until the apiserver answers at all
            if not served(todo[0]):
                return False
            pending.pop(todo.pop(0)["name"])
        with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
            for c, ok in zip(todo, pool.map(served, todo)):
                if ok:
                    pending.pop(c["name"])
        return not pending
    return check


def polling_client(kubeconfig: Path):
    """An API client for polling a starting apiserver, once the kubeconfig is complete (else None).  It does
    not retry by itself: urllib3 would sleep out a starting apiserver's Retry-After inside one call."""
    from ..kube.k8s import client
    from ..kube.k8s import config as kconfig
    try:
        cfg = client.Configuration()
        kconfig.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    except Exception:
        return None
    cfg.retries = False
    return client.ApiClient(cfg)


def create_sentinel(api) -> None:
    """The Rollout whose status, written by this cluster's controller, proves it reconciles (never in a
    snapshot: a snapshot is taken before any controller ran)."""
    from ..kube.k8s import client
    body = {
        "apiVersion": config.ARGO_API_VERSION, "kind": "Rollout",
        "metadata": {"name": SENTINEL, "namespace": SENTINEL_NS},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": SENTINEL}},
                 "template": {"metadata": {"labels": {"app": SENTINEL}},
                              "spec": {"containers": [{"name": "c", "image": "sentinel:1"}]}},
                 "strategy": {"canary": {"steps": [{"setWeight": 50}]}}},
    }
    client.CustomObjectsApi(api).create_namespaced_custom_object(config.ARGO_GROUP, config.ARGO_VERSION, SENTINEL_NS,
                                                                 "rollouts", body)


def sentinel_reconciled(api) -> bool:
    from ..kube.k8s import client
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(config.ARGO_GROUP, config.ARGO_VERSION, SENTINEL_NS,
                                                                    "rollouts", SENTINEL)
    return bool((obj.get("status") or {}).get("observedGeneration"))


def nodes_ready(api, count: int) -> bool:
    from ..kube.k8s import client
    nodes = client.CoreV1Api(api).list_node().items
    return len(nodes) >= count and all(
        any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or [])) for n in nodes)


__all__ = ["SENTINEL", "SENTINEL_NS", "KwokctlConfiguration", "PhaseClock", "create_sentinel", "crds_served",
           "install_crds", "kwokctl_configuration", "nodes_ready", "polling_client", "reserve_ports",
           "sentinel_reconciled"]


# --- a control plane whose controller manager gave up at its start ---------------------------------------------
REVIVABLE = ("kube-controller-manager", "kube-scheduler")   # exit by themselves when the apiserver is slow to start
PLANE_RESTARTS = 3
REVIVE_SETTLE_S = 12.0     # a revived kube-controller-manager waits up to 10 s for the apiserver's /healthz


def revive_exited(cluster, kdir: Path, exited_error: type[Exception]) -> None:
    """kube-controller-manager (and the scheduler) wait only 10 s for the kube-apiserver's /healthz when they
    start, then exit: on a loaded machine that happens while the rest of the plane is fine.  With the apiserver
    ready, `kwokctl start cluster` starts what is not running (and nothing else); a process that exits again, or
    any other control-plane process that exited, ends the start (``exited_error``)."""
    from ..core.procs import pid_alive, process_age
    for attempt in range(PLANE_RESTARTS + 1):
        dead = [name for name, pid in cluster._kwok_pids().items() if not pid_alive(pid)]
        if not dead:
            return
        if attempt == PLANE_RESTARTS or not set(dead) <= set(REVIVABLE):
            logs = kdir / "logs"
            tails = "; ".join(f"{n}: {(logs / f'{n}.log').read_text()[-300:].strip()}" for n in dead
                              if (logs / f"{n}.log").is_file())
            raise exited_error(f"control-plane process(es) {', '.join(dead)} exited while the cluster started: "
                               f"{tails}")
        cluster.log(f"cluster: {', '.join(dead)} exited at its start (the kube-apiserver was slow to answer "
                    f"/healthz); starting it again")
        for name in dead:        # kwokctl would take an exited process not yet reaped (a zombie) for running
            (kdir / "pids" / f"{name}.pid").unlink(missing_ok=True)
        cluster._kwokctl("start", "cluster", "--name", cluster.name, timeout=180)
        cluster.record_control_plane(dead)      # the new processes are the product's own: down stops them

        def settled() -> bool:
            pids = cluster._kwok_pids()
            alive = [pid_alive(pids.get(n, -1)) for n in dead]
            return not all(alive) or all(process_age(pids[n]) >= REVIVE_SETTLE_S for n in dead)
        cluster._wait(settled, REVIVE_SETTLE_S + 30, f"{', '.join(dead)} to stay up past its wait for the apiserver")
