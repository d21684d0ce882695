"""`drills watch` records what it claims to record: every route kind of the VirtualService (tls-only routing),
ping-pong services, a Rollout from its creation, and the audit-log completeness proof on the embedded cluster.
The shapes follow Argo Rollouts' own Istio e2e scenarios (host-only TLS split, host split ping-pong)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml
from tenacity import retry, retry_if_result, stop_after_delay, wait_fixed

from drills.drill.manifests import apply
from drills.kube.rollout import Predicate, Rollouts, healthy, paused

pytestmark = pytest.mark.single_version


def until(what: str, fn, timeout: float = 120):
    r = retry(retry=retry_if_result(lambda v: not v), stop=stop_after_delay(timeout), wait=wait_fixed(0.1),
              retry_error_callback=lambda st: pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}"))
    return r(fn)()


def _service(name: str, app: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app": app}, "ports": [{"port": 80, "targetPort": 8080, "name": "http"}]}}


def _rollout(name: str, canary: dict) -> dict:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": name, "image": f"registry.local/{name}:v1"}]}},
                     "strategy": {"canary": canary}}}


def tls_only(name: str = "tls-split") -> list[dict]:
    vs = {"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService", "metadata": {"name": name},
          "spec": {"hosts": [name], "tls": [{"match": [{"port": 3000, "sniHosts": [name]}], "route": [
              {"destination": {"host": f"{name}-stable"}, "weight": 100},
              {"destination": {"host": f"{name}-canary"}, "weight": 0}]}]}}
    canary = {"canaryService": f"{name}-canary", "stableService": f"{name}-stable",
              "trafficRouting": {"istio": {"virtualService": {
                  "name": name, "routes": ["primary"], "tlsRoutes": [{"port": 3000, "sniHosts": [name]}]}}},
              "steps": [{"setWeight": 10}, {"pause": {}}]}
    return [_service(f"{name}-canary", name), _service(f"{name}-stable", name), vs, _rollout(name, canary)]


def ping_pong(name: str = "pp-split") -> list[dict]:
    vs = {"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService", "metadata": {"name": name},
          "spec": {"hosts": [name], "http": [{"name": "primary", "route": [
              {"destination": {"host": f"{name}-ping"}, "weight": 100},
              {"destination": {"host": f"{name}-pong"}, "weight": 0}]}]}}
    canary = {"pingPong": {"pingService": f"{name}-ping", "pongService": f"{name}-pong"},
              "trafficRouting": {"istio": {"virtualService": {"name": name, "routes": ["primary"]}}},
              "steps": [{"setWeight": 25}, {"pause": {}}]}
    return [_service(f"{name}-ping", name), _service(f"{name}-pong", name), vs, _rollout(name, canary)]


@pytest.mark.parametrize("shape,weight", [(tls_only, 10), (ping_pong, 25)], ids=["tls-only", "ping-pong"])
def test_watch_from_creation_records_every_route_kind_and_proves_completeness(kube, cluster, namespace, tmp_path,
                                                                            shape, weight):
    docs = shape()
    name = docs[-1]["metadata"]["name"]
    out = tmp_path / f"{name}.timeline.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "drills", "watch", "-n", namespace, name, "--kubeconfig",
                             str(cluster.kubeconfig), "--duration", "600s", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        first = proc.stderr.readline()         # printed once every watch has listed
        assert "recording" in first and "does not exist yet" in first, first
        apply(kube, namespace, yaml.safe_dump_all(docs))
        rl = Rollouts(kube, namespace)
        rl.wait(name, healthy(), 120)
        rl.set_image(name, f"registry.local/{name}:v2", container=name)
        rl.wait(name, Predicate("paused at step 1", lambda o: paused()(o) and o["status"].get("currentStepIndex") == 1),
                120)
        until(f"the controller's weight {weight} in the VirtualService",
              lambda: weight in _weights(kube, namespace, name), 60)
    finally:
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout)
    assert weight in [w for _, w in summary["canary_weights"]], summary
    assert summary["complete"] is True and summary["audit_log_checked"] is True, summary
    assert summary["audit_writes_checked"] >= 1, summary
    assert any("did not exist" in n for n in summary["notes"]), summary
    assert summary["series"].endswith(f"{name}.series.json")
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = {k for r in recs if r["kind"] == "VirtualService" and r["type"] != "DELETED" for k in r["obj"]
             if r["obj"][k]}
    assert kinds == ({"tls"} if shape is tls_only else {"http"}), kinds


def _weights(kube, namespace: str, name: str) -> list[int]:
    from kubernetes import client
    vs = client.CustomObjectsApi(kube).get_namespaced_custom_object("networking.istio.io", "v1alpha3", namespace,
                                                                     "virtualservices", name)
    return [d.get("weight", 0) for kind in ("http", "tls", "tcp") for r in vs["spec"].get(kind) or []
            for d in r.get("route") or []]
