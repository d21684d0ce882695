"""drills.traffic.mesh through real HTTP, a real mesh process fed by the embedded cluster's apiserver (watches).

VirtualService, DestinationRule and Pods are written here the way the controller and the ReplicaSets write
them; kwok makes pods Ready when availability control releases them.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client
from kubernetes import config as kconfig

from drills.traffic import mesh, mesh_server, prometheus
from drills.routers import istio
from drills.cluster import Availability
from drills.core.wait import hold_for, until

ISTIO = ("networking.istio.io", "v1alpha3")
STABLE, CANARY = "5d4b9c7f8", "6f7c8d9e1"


def _get(url: str) -> tuple[int, str, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


BUCKET_REFILL_S = 1.5     # evidence window: a pod's token bucket (20 rps, burst 20) full again
SCRAPES_S = 6.0           # evidence window: several 1 s scrapes of traffic for irate to read


def _until(fn, timeout: float, what: str, interval: float = 0.1):
    return until(what, fn, bool, timeout, interval=interval)


def _pod(name: str, h: str, image: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "web", mesh.HASH_LABEL: h}},
            "spec": {"containers": [{"name": "web", "image": image}],
                     "tolerations": [{"operator": "Exists"}]}}


def _vs(canary: int) -> dict:
    return {"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService", "metadata": {"name": "web"},
            "spec": {"hosts": ["web"], "http": [{"name": "primary", "route": [
                {"destination": {"host": "web", "subset": "stable"}, "weight": 100 - canary},
                {"destination": {"host": "web", "subset": "canary"}, "weight": canary}]}]}}


@pytest.fixture
def api(cluster):
    return kconfig.new_client_from_config(config_file=str(cluster.kubeconfig))


@pytest.fixture
def routed(cluster, namespace, api, tmp_path):
    co = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    co.create_namespaced_custom_object(*ISTIO, namespace, "virtualservices", _vs(0))
    co.create_namespaced_custom_object(*ISTIO, namespace, "destinationrules", {
        "apiVersion": "networking.istio.io/v1alpha3", "kind": "DestinationRule", "metadata": {"name": "web"},
        "spec": {"host": "web", "subsets": [
            {"name": "stable", "labels": {mesh.HASH_LABEL: STABLE}},
            {"name": "canary", "labels": {mesh.HASH_LABEL: CANARY}}]}})
    hold = Availability(api).hold(namespace, {mesh.HASH_LABEL: CANARY}, None)
    for i in range(2):
        core.create_namespaced_pod(namespace, _pod(f"web-stable-{i}", STABLE, "registry.local/web:1.0.0"))
    with mesh_server.MeshProcess(cluster.kubeconfig, namespace, "web", capacity_rps=20, folder=tmp_path,
                          register=cluster.register_process, unregister=cluster.unregister_process,
                          faults_configmap="mesh-faults", seed=1) as m:
        yield m, co, core, namespace, api
    Availability(api).unhold(hold)


@pytest.mark.single_version
def test_mesh_follows_weights_pods_and_faults_through_watches(routed):
    m, co, core, ns, api = routed
    _until(lambda: m.state()["ready_per_subset"].get("stable") == 2, 30, "2 Ready stable pods")
    code, body, h = _get(m.url + "/")
    assert code == 200 and h["x-mesh-subset"] == "stable" and h["x-mesh-revision"] == STABLE, (code, body, h)

    # The controller shifts weight to the canary whose pods are all held un-Ready: no healthy upstream.
    for i in range(2):
        core.create_namespaced_pod(ns, _pod(f"web-canary-{i}", CANARY, "registry.local/web:1.1.0"))
    vs = co.get_namespaced_custom_object(*ISTIO, ns, "virtualservices", "web")
    vs["spec"]["http"][0]["route"][0]["weight"], vs["spec"]["http"][0]["route"][1]["weight"] = 0, 100
    co.replace_namespaced_custom_object(*ISTIO, ns, "virtualservices", "web", vs)
    _until(lambda: m.state()["routes"][1]["weight"] == 100, 10, "the weight change through the watch")
    _until(lambda: len(m.state()["pods"]) == 4, 10, "the canary pods through the watch")
    codes = [_get(m.url + "/") for _ in range(20)]
    assert {(c, b.strip()) for c, b, _ in codes} == {(503, mesh.NO_HEALTHY_UPSTREAM)}, codes[:3]

    # One canary pod released: it serves up to its capacity (20 rps, burst 20), the rest is overflow.
    Availability(api).release_pod(ns, "web-canary-0")
    _until(lambda: m.state()["ready_per_subset"].get("canary") == 1, 30, "1 Ready canary pod")
    burst = [_get(m.url + "/")[0] for _ in range(60)]
    assert 20 <= burst.count(200) < 60 and burst.count(503) > 0, burst

    # A broken canary revision, injected through the faults ConfigMap (watched): 500s from that pod.
    hold_for(BUCKET_REFILL_S, "the canary pod's token bucket refilling after the burst")
    core.create_namespaced_config_map(ns, {"metadata": {"name": "mesh-faults"},
                                           "data": {"error-rate": json.dumps({"1.1.0": 1.0})}})
    _until(lambda: m.state()["faults"]["error_rate"] == {"1.1.0": 1.0}, 10, "the faults ConfigMap")
    c, b, h = _get(m.url + "/")
    assert c == 500 and h["x-mesh-revision"] == CANARY, (c, b, h)
    # the admin endpoint overrides the ConfigMap for the same key
    m.set_faults(error_rate={"1.1.0": 0.0})
    hold_for(BUCKET_REFILL_S, "one more second of capacity")
    assert _get(m.url + "/")[0] == 200

    text = m.metrics()
    assert 'reporter="source"' in text and 'response_flags="UH"' in text
    assert f'reporter="destination",destination_service="web.{ns}.svc.cluster.local"' in text
    assert f'revision="{CANARY}",response_code="500"' in text
    assert not any('reporter="destination"' in line and 'response_flags="UH"' in line for line in text.splitlines())



@pytest.mark.single_version
def test_real_prometheus_scrapes_the_mesh_and_evaluates_the_seed_query(routed, cluster):
    m, co, core, ns, api = routed
    _until(lambda: m.state()["ready_per_subset"].get("stable") == 2, 30, "2 Ready stable pods")
    binary = prometheus.ensure_binary()
    svc = f"web.{ns}.svc.cluster.local"
    m.set_faults(error_rate={STABLE: 0.5})
    with prometheus.Prometheus(cluster.folder, {"mesh": f"127.0.0.1:{m.port}"}, binary=binary,
                               register=cluster.register_process, unregister=cluster.unregister_process) as prom:
        prom.wait_scraped()
        codes: list[int] = []
        stop = time.monotonic() + 10
        paced = threading.Event()

        def traffic():                      # ~20 requests/second, far under capacity (2 pods x 20 rps)
            while time.monotonic() < stop:
                codes.append(_get(m.url + "/")[0])
                paced.wait(0.05)
        t = threading.Thread(target=traffic, daemon=True)
        t.start()
        hold_for(SCRAPES_S, "irate reads the last two scrapes: query while traffic flows")
        whole = prom.value(istio.error_rate_query(svc))
        per_canary = prom.value(istio.error_rate_query(svc, revision=CANARY))
        per_stable = prom.value(istio.error_rate_query(svc, revision=STABLE))
        t.join()
        assert 0.3 < codes.count(500) / len(codes) < 0.7, codes
        assert whole is not None and 0.2 < whole < 0.8, whole
        # per revision: the canary revision served nothing, so the query falls back to vector(0)
        assert per_canary == 0.0
        assert 0.2 < per_stable < 0.8, per_stable
        up = prom.targets_up()
        assert list(up.values()) == ["up"], up
    assert prom.proc.poll() is not None, "prometheus still running after stop"
