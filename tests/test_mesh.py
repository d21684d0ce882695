"""drills.traffic.mesh (EMULATION of the Istio data path): the routing core with objects shaped as the API returns them.

The HTTP front against a real cluster is in tests/test_mesh_cluster.py.
"""
from __future__ import annotations

import random
import subprocess
import sys

import pytest

from drills.traffic import mesh
from drills.routers import istio, nginx

NS = "shop"


def virtualservice(canary: int, stable: int) -> dict:
    # As the Argo Rollouts controller leaves it after a full Update of spec.http[0].route[].weight.
    return {"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService",
            "metadata": {"name": "web", "namespace": NS, "resourceVersion": "812"},
            "spec": {"hosts": ["web"], "http": [{"name": "primary", "route": [
                {"destination": {"host": "web", "subset": "stable"}, "weight": stable},
                {"destination": {"host": "web", "subset": "canary"}, "weight": canary}]}]}}


def destinationrule(stable_hash: str, canary_hash: str) -> dict:
    return {"apiVersion": "networking.istio.io/v1alpha3", "kind": "DestinationRule",
            "metadata": {"name": "web", "namespace": NS},
            "spec": {"host": "web", "subsets": [
                {"name": "stable", "labels": {"app": "web", mesh.HASH_LABEL: stable_hash}},
                {"name": "canary", "labels": {"app": "web", mesh.HASH_LABEL: canary_hash}}]}}


def pod(name: str, h: str, ready: bool = True, image: str = "registry.local/web:1.0.0",
        terminating: bool = False) -> dict:
    md = {"name": name, "namespace": NS, "labels": {"app": "web", mesh.HASH_LABEL: h},
          "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"web-{h}",
                               "controller": True}]}
    if terminating:
        md["deletionTimestamp"] = "2026-08-21T10:00:00Z"
    return {"metadata": md, "spec": {"containers": [{"name": "web", "image": image}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"}]}}


def router(vs: dict, dr: dict, pods: list[dict], capacity: float = 1e6, seed: int = 7) -> mesh.Router:
    r = mesh.Router(capacity, rng=random.Random(seed))
    r.routes = istio.route_table(vs, dr, {})
    r.set_pods({p.name: p for p in map(mesh.pod_info, pods)})
    return r


def run(r: mesh.Router, n: int, rps: float, t0: float = 1000.0) -> list[mesh.Decision]:
    return [r.decide(t0 + i / rps) for i in range(n)]


def test_weights_split_traffic_within_tolerance():
    pods = [pod("web-s1", "aaa"), pod("web-s2", "aaa"), pod("web-c1", "bbb"), pod("web-c2", "bbb")]
    for canary in (0, 20, 55, 100):
        r = router(virtualservice(canary, 100 - canary), destinationrule("aaa", "bbb"), pods)
        ds = run(r, 10000, 1000.0)
        assert all(d.code == 200 for d in ds)
        share = sum(d.subset == "canary" for d in ds) / len(ds)
        assert abs(share - canary / 100) < 0.02, (canary, share)
        assert {d.revision for d in ds if d.subset == "canary"} <= {"bbb"}
        assert {d.pod for d in ds if d.subset == "stable"} == ({"web-s1", "web-s2"} if canary < 100 else set())


def test_over_capacity_share_is_503_overflow():
    # 1 Ready canary pod at 10 rps, 100 % weight, 40 rps offered for 10 s:
    # served = burst (10) + 10 rps x 10 s = 110 of 400, the rest 503 overflow.
    pods = [pod("web-c1", "bbb"), pod("web-c2", "bbb", ready=False), pod("web-s1", "aaa")]
    r = router(virtualservice(100, 0), destinationrule("aaa", "bbb"), pods, capacity=10)
    ds = run(r, 400, 40.0)
    over = [d for d in ds if d.code == 503]
    assert all(d.flags == "UO" and not d.reached_pod for d in over)
    assert abs(len(over) / len(ds) - 290 / 400) < 0.02, len(over)
    assert {d.pod for d in ds if d.code == 200} == {"web-c1"}
    # Two Ready pods double the capacity: the same offer now mostly fits.
    pods[1] = pod("web-c2", "bbb", ready=True)
    r2 = router(virtualservice(100, 0), destinationrule("aaa", "bbb"), pods, capacity=10)
    share2 = sum(d.code == 503 for d in run(r2, 400, 40.0)) / 400
    assert abs(share2 - (400 - 220) / 400) < 0.02, share2


def test_no_ready_pod_is_503_no_healthy_upstream():
    pods = [pod("web-c1", "bbb", ready=False), pod("web-c2", "bbb", terminating=True), pod("web-s1", "aaa")]
    r = router(virtualservice(100, 0), destinationrule("aaa", "bbb"), pods)
    ds = run(r, 200, 100.0)
    assert {(d.code, d.body, d.flags) for d in ds} == {(503, mesh.NO_HEALTHY_UPSTREAM, "UH")}
    # weight 0 on that subset: nothing of it shows
    r = router(virtualservice(0, 100), destinationrule("aaa", "bbb"), pods)
    assert {d.code for d in run(r, 200, 100.0)} == {200}


def test_subset_labels_select_only_their_revision():
    # The canary subset before the controller wrote its hash label matches every app=web pod.
    dr = destinationrule("aaa", "bbb")
    dr["spec"]["subsets"][1]["labels"].pop(mesh.HASH_LABEL)
    pods = [pod("web-s1", "aaa"), pod("web-c1", "bbb")]
    r = router(virtualservice(100, 0), dr, pods)
    assert {d.pod for d in run(r, 500, 1000.0)} == {"web-s1", "web-c1"}
    r = router(virtualservice(100, 0), destinationrule("aaa", "bbb"), pods)
    assert {d.pod for d in run(r, 500, 1000.0)} == {"web-c1"}
    # unknown subset name in the VirtualService: no cluster
    vs = virtualservice(100, 0)
    vs["spec"]["http"][0]["route"][1]["destination"]["subset"] = "preview"
    r = router(vs, destinationrule("aaa", "bbb"), pods)
    assert {(d.code, d.flags) for d in run(r, 10, 100.0)} == {(503, "NC")}


def test_injected_error_rate_per_revision_by_hash_or_image_tag():
    pods = [pod("web-s1", "aaa", image="registry.local/web:1.0.0"),
            pod("web-c1", "bbb", image="registry.local/web:1.1.0")]
    r = router(virtualservice(50, 50), destinationrule("aaa", "bbb"), pods)
    r.error_rate = {"1.0.0": 0.3}     # stable broken, keyed by image tag
    ds = run(r, 10000, 1000.0)
    stable = [d for d in ds if d.revision == "aaa"]
    canary = [d for d in ds if d.revision == "bbb"]
    assert abs(sum(d.code == 500 for d in stable) / len(stable) - 0.3) < 0.03
    assert all(d.code == 200 for d in canary)
    assert all(d.reached_pod for d in ds)
    r.error_rate = {"bbb": 1.0}       # keyed by pod-template-hash
    ds = run(r, 1000, 1000.0, t0=5000.0)
    assert {d.code for d in ds if d.revision == "bbb"} == {500}
    assert {d.code for d in ds if d.revision == "aaa"} == {200}


def test_metrics_are_istio_shaped_and_reporters_differ():
    pods = [pod("web-s1", "aaa")]
    r = router(virtualservice(50, 50), destinationrule("aaa", "bbb"), pods)
    m = istio.IstioMetrics(NS)
    ds = run(r, 200, 100.0)
    for d in ds:
        m.observe(d, 2.0)
    text = m.render()
    uh = sum(d.flags == "UH" for d in ds)
    ok = sum(d.code == 200 for d in ds)
    assert uh and ok
    src_uh = (f'istio_requests_total{{reporter="source",destination_service="web.{NS}.svc.cluster.local",'
              f'destination_service_name="web",destination_service_namespace="{NS}",destination_workload="unknown",'
              f'destination_workload_namespace="{NS}",destination_canonical_revision="unknown",revision="unknown",'
              f'response_code="503",response_flags="UH"}} {uh}')
    assert src_uh in text
    dst_ok = (f'istio_requests_total{{reporter="destination",destination_service="web.{NS}.svc.cluster.local",'
              f'destination_service_name="web",destination_service_namespace="{NS}",destination_workload="web",'
              f'destination_workload_namespace="{NS}",destination_canonical_revision="aaa",revision="aaa",'
              f'response_code="200",response_flags="-"}} {ok}')
    assert dst_ok in text
    assert 'reporter="destination"' not in "".join(l for l in text.splitlines() if 'response_flags="UH"' in l)
    assert 'istio_request_duration_milliseconds_count{reporter="destination"' in text
    assert 'le="5"} ' + str(ok) in text and 'le="1"} 0' in text


def test_non_loopback_bind_is_refused():
    for bad in ("0.0.0.0", "10.0.0.1", "example.com", "::"):
        with pytest.raises(mesh.NotLoopback):
            mesh.require_loopback(bad)
    assert mesh.require_loopback("127.0.0.2") == "127.0.0.2"
    p = subprocess.run([sys.executable, "-m", "drills.traffic.mesh_server", "--kubeconfig", "/nonexistent", "--namespace", NS,
                        "--route", "web", "--port", "0",
                        "--capacity-rps", "10", "--bind", "0.0.0.0"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "not a loopback address" in p.stderr, p.stderr
