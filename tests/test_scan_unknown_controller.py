"""A scan whose controller version is unknown (a digest-pinned or 'latest' image, a mirrored repository, no visible
controller Deployment): the lint that does not depend on the version is never dropped, the unknown version is
said, and the exposure gate is inconclusive (exit 3) naming --controller.  Without a cluster."""
from __future__ import annotations

import json
from types import SimpleNamespace

from drills.commands.scan import gate
from drills.scan.live import _image_version, controller_of, unknown_reason
from drills.scan.model import from_object
from drills.scan.records import evaluate, table, to_json


def _obj(name: str, steps: list) -> dict:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"replicas": 4, "rollbackWindow": {"revisions": 3}, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "app", "image": "registry.local/x:1"}]}},
                     "strategy": {"canary": {"steps": steps, "trafficRouting": {"istio": {
                         "virtualService": {"name": name, "routes": ["primary"]},
                         "destinationRule": {"name": name, "canarySubsetName": "canary",
                                             "stableSubsetName": "stable"}}}}}}}


WHY = unknown_reason(None, "argo-rollouts/argo-rollouts quay.io/argoproj/argo-rollouts@sha256:" + "a" * 64)


def _unknown(name: str, steps: list):
    ro = from_object(_obj(name, steps), f"cluster:stage/ns/{name}")
    ro.origin = {"cluster": "stage", "controller_unknown": WHY}
    return evaluate(ro, None)


def test_the_lint_that_does_not_depend_on_the_version_is_kept_when_the_version_is_unknown():
    r = _unknown("svc", [{"setWeight": 5}, {"pause": {}}, {"setWeight": 100}])
    assert [f.rule for f in r.lint_errors] == ["final-setweight-100"] and r.pred is None
    bad = _unknown("bad", [{"setWeight": 5, "pause": {}}, {"setWeight": 20}])
    assert "invalid-spec" in {f.rule for f in bad.lint_errors}
    ratio = _unknown("ratio", [{"setWeight": 1}, {"pause": {}}, {"setWeight": 50}])
    assert {f.rule for f in ratio.findings} == {"last-rung-ratio"}


def test_an_unknown_version_is_said_and_the_exposure_gate_is_inconclusive_naming_controller():
    records = [_unknown(f"svc{i}", [{"setWeight": 5}, {"pause": {}}, {"setWeight": 100}]) for i in range(9)]
    code, said = gate(records, {"lint", "exposed"})
    assert code == 1 and "--controller" in said[0] and "9 Rollout(s)" in said[0] and "digest-pinned" in said[0]
    assert gate(records, {"exposed"})[0] == 3
    assert gate(records, {"lint"}) == (1, [])
    assert gate(records, set()) == (0, [])
    clean = [_unknown("cut", [{"setWeight": 5}, {"pause": {}}])]
    assert gate(clean, {"lint", "exposed"})[0] == 3
    doc = json.loads(to_json(records))
    assert doc["summary"]["lint_errors"] == 9 and doc["summary"]["controller_unknown"] == 9
    assert doc["rollouts"][0]["controller_unknown"] == WHY and "--controller" in doc["rollouts"][0]["rule"]["text"]
    assert [x["rule"] for x in doc["rollouts"][0]["lint"]] == ["final-setweight-100"]
    text = table(records)
    assert "9 with lint errors" in text and "controller version UNKNOWN for 9 Rollout(s)" in text \
        and "--controller" in text


def test_the_versions_a_controller_image_cannot_tell():
    assert _image_version("quay.io/argoproj/argo-rollouts@sha256:" + "a" * 64) is None
    assert _image_version("quay.io/argoproj/argo-rollouts:latest") is None
    assert _image_version("quay.io/argoproj/argo-rollouts:v1.8.2") == "v1.8.2"
    assert "no argo-rollouts controller Deployment" in unknown_reason(None, None)
    assert unknown_reason("v1.8.2", "x") is None


def _deployment(ns, name, labels, container, image):
    return SimpleNamespace(metadata=SimpleNamespace(namespace=ns, name=name, labels=labels), spec=SimpleNamespace(
        template=SimpleNamespace(spec=SimpleNamespace(containers=[SimpleNamespace(name=container, image=image)]))))


class _Apps:
    """The two list calls controller_of makes, answering from a list of Deployments (label selectors key=value)."""

    def __init__(self, deployments):
        self.deployments = deployments

    def list_deployment_for_all_namespaces(self, label_selector=None):
        k, _, v = (label_selector or "").partition("=")
        return SimpleNamespace(items=[d for d in self.deployments if not k or (d.metadata.labels or {}).get(k) == v])


def test_a_mirrored_controller_image_is_found_by_the_controllers_labels_and_container_name():
    mirrored = _deployment("argo", "argo-rollouts", {"app.kubernetes.io/name": "argo-rollouts"}, "argo-rollouts",
                           "mirror.local/platform/rollouts-ctl:v1.8.2")
    assert controller_of(_Apps([mirrored])) == ("v1.8.2", "argo/argo-rollouts mirror.local/platform/rollouts-ctl:v1.8.2")
    unlabelled = _deployment("argo", "ctl", {}, "argo-rollouts", "mirror.local/platform/rollouts-ctl:v1.8.2")
    assert controller_of(_Apps([unlabelled])) == (None, None)
