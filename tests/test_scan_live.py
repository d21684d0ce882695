"""`drills scan` on a cluster: read-only, the controller version from its argo-rollouts Deployment."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from urllib.parse import quote

import pytest
import yaml
from kubernetes import client

from drills.core import config
from drills.scan.live import USER_AGENT, controller_of
from test_scan_outputs import validate_sarif
from drills.core.wait import until

WRITES = ("create", "update", "patch", "delete", "deletecollection")


def drills(*args):
    env = dict(os.environ, PYTHONPATH=str(config.project_root()))
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, timeout=300,
                          cwd=config.project_root(), env=env)


def _rollout(name: str, steps: list) -> dict:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": name},
            "spec": {"replicas": 4, "rollbackWindow": {"revisions": 3},
                     "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "app", "image": "registry.local/x:1"}]}},
                     "strategy": {"canary": {"minPodsPerReplicaSet": 1, "steps": steps, "trafficRouting": {
                         "istio": {"virtualService": {"name": name, "routes": ["primary"]},
                                   "destinationRule": {"name": name, "canarySubsetName": "canary",
                                                       "stableSubsetName": "stable"}}}}}}}


def _scan_requests(audit_log: str, since: float, until: float) -> list[tuple[str, str]]:
    """(verb, URI) of every request the apiserver recorded from the scan's user agent in [since, until]."""
    out = []
    with open(audit_log) as fh:
        for line in fh:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("stage") != "ResponseComplete" or not (ev.get("userAgent") or "").startswith(USER_AGENT):
                continue
            t = datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if since <= t <= until:
                out.append((ev["verb"], ev.get("requestURI")))
    return out


@pytest.mark.single_version
def test_cluster_inventory_and_predictions_without_a_single_write(cluster, kube, namespace, controller_version,
                                                                  tmp_path):
    # the controller Deployment as the upstream manifests label it (kwok runs no container for it)
    labels = {"app.kubernetes.io/name": "argo-rollouts"}
    client.AppsV1Api(kube).create_namespaced_deployment(namespace, {
        "metadata": {"name": "argo-rollouts", "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                     {"name": "argo-rollouts", "image": f"quay.io/argoproj/argo-rollouts:{controller_version}"}]}}}})
    co = client.CustomObjectsApi(kube)
    for name, steps in (("exposed", [{"setWeight": 5}, {"pause": {}}, {"setWeight": 100}]),
                        ("cut", [{"setWeight": 5}, {"pause": {}}])):
        co.create_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "rollouts", _rollout(name, steps))
    st = cluster.status()
    kubeconfig = st["kubeconfig"]
    (context,) = [c["name"] for c in yaml.safe_load(open(kubeconfig).read())["contexts"]]
    t0 = time.time()
    sarif = tmp_path / "live.sarif"
    r = drills("scan", "--kubeconfig", kubeconfig, "--all-contexts", "--json", "--fail-on", "none",
               "--sarif", str(sarif))
    t1 = time.time()
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (inv,) = out["clusters"]
    every = co.list_cluster_custom_object("argoproj.io", "v1alpha1", "rollouts")["items"]
    assert inv["context"] == context and inv["controller_version"] == controller_version
    assert inv["controller"] == f"{namespace}/argo-rollouts quay.io/argoproj/argo-rollouts:{controller_version}"
    assert inv["rollouts"] == len(every) == len(out["rollouts"])
    assert inv["exposed"] == sum(x["exposed"] for x in out["rollouts"])
    mine = {x["name"]: x for x in out["rollouts"] if x["namespace"] == namespace}
    assert (mine["exposed"]["predicted_peak_weight"], mine["exposed"]["exposed"]) == (100, True)
    assert (mine["cut"]["predicted_peak_weight"], mine["cut"]["exposed"]) == (5, False)
    assert mine["exposed"]["source"] == f"cluster:{context}/{namespace}/exposed"
    # SARIF of a live scan: valid 2.1.0, each result on cluster/<context>/<ns>/<name> (no file holds it)
    results = validate_sarif(json.loads(sarif.read_text()))
    mine_results = [x for x in results if f"/{namespace}/" in x["locations"][0]["physicalLocation"]["artifactLocation"]
                    ["uri"]]
    assert {x["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for x in mine_results} == \
        {f"cluster/{quote(context, safe='')}/{namespace}/exposed"}
    assert all(controller_version in x["message"]["text"] for x in mine_results)
    seen = until("the scan's list of Rollouts in the apiserver's audit log",
                 lambda: _scan_requests(st["audit_log"], t0 - 1, t1 + 1),
                 lambda got: ("list", "/apis/argoproj.io/v1alpha1/rollouts") in got, timeout=30, interval=0.5)
    assert [x for x in seen if x[0] in WRITES] == [] and {v for v, _ in seen} <= {"list", "get"}


def test_unreadable_contexts_exit_2(tmp_path):
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "down",
        "clusters": [{"name": "down", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "down", "context": {"cluster": "down", "user": "u"}}]}))
    r = drills("scan", "--kubeconfig", str(kc), "--context", "elsewhere")
    assert r.returncode == 2 and "context 'elsewhere' is not in" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = drills("scan", "--kubeconfig", str(kc), "--all-contexts")
    assert r.returncode == 2 and "cannot read context down" in r.stderr
    assert "down: controller not found" in r.stdout and "ERROR" in r.stdout


def _labelled(name: str, labels: dict) -> dict:
    body = _rollout(name, [{"setWeight": 5}, {"pause": {}}, {"setWeight": 100}])
    body["metadata"]["labels"] = labels
    return body


@pytest.mark.single_version
def test_live_scan_takes_the_controller_a_namespace_and_a_selector(cluster, kube, namespace, controller_version):
    # no argo-rollouts Deployment anywhere: the controller runs outside the cluster (as the embedded one does), so
    # the cluster shows no version; --controller says it.  (Another test's Deployment goes with its namespace.)
    until("no argo-rollouts controller Deployment left in the cluster", lambda: controller_of(client.AppsV1Api(kube)),
          lambda found: found == (None, None), timeout=120, interval=1)
    co = client.CustomObjectsApi(kube)
    for name, team in (("pay", "payments"), ("cart", "shop")):
        co.create_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "rollouts",
                                           _labelled(name, {"team": team}))
    st = cluster.status()
    kc = st["kubeconfig"]
    r = drills("scan", "--fail-on", "none", "--allow-empty", "--kubeconfig", kc, "-n", namespace, "--json")
    assert r.returncode == 0, r.stderr
    unknown = json.loads(r.stdout)
    assert unknown["clusters"][0]["controller_version"] is None and len(unknown["rollouts"]) == 2
    assert {x["rule"]["id"] for x in unknown["rollouts"]} == {"controller-unknown"}

    other = "v1.10.2" if controller_version != "v1.10.2" else "v1.8.2"
    t0 = time.time()
    r = drills("scan", "--fail-on", "none", "--allow-empty", "--kubeconfig", kc, "-n", namespace, "-l", "team=payments", "--controller", other, "--json")
    t1 = time.time()
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (inv,) = out["clusters"]
    assert (inv["controller_given"], inv["namespace"], inv["selector"]) == ([other], namespace, "team=payments")
    (pay,) = out["rollouts"]
    assert (pay["name"], pay["controller_version"], pay["predicted_peak_weight"], pay["exposed"]) == \
        ("pay", other, 100, True)
    assert pay["rule"]["id"] != "controller-unknown" and inv["rollouts"] == 1 and inv["exposed"] == 1
    text = drills("scan", "--fail-on", "none", "--allow-empty", "--kubeconfig", kc, "-n", namespace, "--controller", f"{controller_version},{other}")
    assert text.returncode == 0 and f"predicted on {controller_version}, {other} (--controller)" in text.stdout
    assert f"namespace {namespace}" in text.stdout and "2 Rollouts" in text.stdout

    every = json.loads(drills("scan", "--fail-on", "none", "--allow-empty", "--kubeconfig", kc, "-A", "-l", "team in (payments,shop)", "--json").stdout)
    assert {x["name"] for x in every["rollouts"] if x["namespace"] == namespace} == {"pay", "cart"}
    nowhere = json.loads(drills("scan", "--fail-on", "none", "--allow-empty", "--kubeconfig", kc, "-n", "drills-no-such-namespace", "--json").stdout)
    assert nowhere["rollouts"] == [] and nowhere["clusters"][0]["error"] is None
    both = drills("scan", "--kubeconfig", kc, "-n", namespace, "-A")
    assert both.returncode == 2 and "give one" in both.stderr

    want = f"/apis/argoproj.io/v1alpha1/namespaces/{namespace}/rollouts?labelSelector=team%3Dpayments"
    seen = until("the scan's namespaced, selected list in the apiserver's audit log",
                 lambda: _scan_requests(st["audit_log"], t0 - 1, t1 + 1),
                 lambda got: ("list", want) in got, timeout=30, interval=0.5)
    assert {v for v, _ in seen} <= {"list", "get"}


@pytest.mark.single_version
def test_live_scan_with_an_unknown_controller_keeps_the_lint_and_is_inconclusive_on_exposure(cluster, kube,
                                                                                              namespace,
                                                                                              controller_version):
    # the controller Deployment as the upstream manifests label it, its image pinned by digest: no version to read
    labels = {"app.kubernetes.io/name": "argo-rollouts"}
    image = "quay.io/argoproj/argo-rollouts@sha256:" + "0" * 64
    apps = client.AppsV1Api(kube)
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "argo-rollouts", "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                     {"name": "argo-rollouts", "image": image}]}}}})
    co = client.CustomObjectsApi(kube)
    for i in range(3):
        co.create_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "rollouts", _rollout(
            f"svc{i}", [{"setWeight": 5}, {"pause": {}}, {"setWeight": 100}]))
    kc = cluster.status()["kubeconfig"]
    scan = ("scan", "--kubeconfig", kc, "-n", namespace)
    r = drills(*scan, "--json", "--fail-on", "lint")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["summary"]["lint_errors"] == 3 and out["summary"]["controller_unknown"] == 3, out["summary"]
    assert all([f["rule"] for f in x["lint"]] == ["final-setweight-100"] for x in out["rollouts"]), out["rollouts"]
    (inv,) = out["clusters"]
    assert inv["controller_version"] is None and "digest-pinned" in inv["controller_unknown"], inv
    r = drills(*scan, "--fail-on", "exposed")
    assert r.returncode == 3, r.stderr
    assert "inconclusive" in r.stderr and "--controller" in r.stderr and "digest-pinned" in r.stderr, r.stderr
    assert "controller version UNKNOWN for 3 Rollout(s)" in r.stdout and "3 with lint errors" in r.stdout, r.stdout
    r = drills(*scan)                                  # the default gates: the lint errors decide (1 over 3)
    assert r.returncode == 1 and "--controller" in r.stderr, r.stderr
    # no controller Deployment visible at all (the embedded cluster's controller runs outside it)
    apps.delete_namespaced_deployment("argo-rollouts", namespace)
    until("no argo-rollouts controller Deployment left in the cluster", lambda: controller_of(apps),
          lambda found: found == (None, None), timeout=120, interval=1)
    r = drills(*scan, "--fail-on", "exposed")
    assert r.returncode == 3 and "no argo-rollouts controller Deployment visible" in r.stderr, r.stderr
    r = drills(*scan, "--fail-on", "exposed", "--controller", controller_version)
    assert r.returncode == 1 and "inconclusive" not in r.stderr, r.stderr      # predicted: exposed
