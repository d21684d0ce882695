"""Each Rollout checked against the CRD schema of the controller version it is predicted for: a field the CRD
prunes or rejects is a lint finding naming the field, where it was put and where it belongs, and the prediction
is made for the object the controller really sees."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from drills.scan.readers import rollouts_in
from drills.scan.records import evaluate
from drills.scan.schema import rollout_schema, seen_by_controller
from drills.scan.sources import facts_for
from drills.toolchain import Toolchain

MISPLACED = """apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata: {name: checkout, namespace: shop}
spec:
  replicas: 2
  strategy:
    canary:
      rollbackWindow:
        revisions: 3
      minPodsPerReplicaSet: 1
      trafficRouting:
        istio:
          virtualService: {name: checkout}
          destinationRule: {name: checkout, canarySubsetName: canary, stableSubsetName: stable}
      steps:
        - setWeight: 5
        - pause: {duration: 10m}
        - setWeight: 100
"""
PLACED = MISPLACED.replace("      rollbackWindow:\n        revisions: 3\n", "").replace(
    "  replicas: 2\n", "  replicas: 2\n  rollbackWindow:\n    revisions: 3\n")


def drills(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def test_the_schema_is_the_toolchains_crd_of_that_version():
    for v in ("v1.7.1", "v1.8.2", "v1.10.2"):
        s = rollout_schema(v)
        assert s.origin == str(Toolchain().ensure_crds(v) / "rollout-crd.yaml") and s.version == v
    assert rollout_schema("v1.8.2").belongs("rollbackWindow", ("spec", "strategy", "canary", "rollbackWindow")) == \
        ("spec.rollbackWindow",)
    assert rollout_schema("v1.8.2").places("replicaProgressThreshold") == []
    assert rollout_schema("v1.10.2").places("replicaProgressThreshold")


@pytest.mark.parametrize("version", ["v1.7.1", "v1.8.2", "v1.10.2"])
def test_rollback_window_under_canary_is_flagged_and_predicted_as_the_controller_sees_it(tmp_path, version):
    (tmp_path / "misplaced.yaml").write_text(MISPLACED)
    (tmp_path / "placed.yaml").write_text(PLACED)
    r = drills("scan", "misplaced.yaml", "placed.yaml", "--controller", version, "--json", "--sarif", "s.sarif",
               cwd=tmp_path)
    assert r.returncode == 1, r.stderr                         # lint errors and an exposure: the gate fails
    got = {x["source"].split(":")[0]: x for x in json.loads(r.stdout)["rollouts"]}
    mis, ok = got["misplaced.yaml"], got["placed.yaml"]
    (f,) = [x for x in mis["lint"] if x["rule"] == "crd-pruned-field"]
    assert "spec.strategy.canary.rollbackWindow" in f["message"] and "belongs at spec.rollbackWindow" in f["message"]
    assert version in f["message"] and (f["file"], f["line"], f["level"]) == ("misplaced.yaml", 8, "error")
    assert mis["crd_schema"][0]["field"] == "spec.strategy.canary.rollbackWindow"
    assert mis["crd_schema"][0]["belongs"] == ["spec.rollbackWindow"]
    # what the controller sees: no window at all, so nothing jumps; the same Rollout with the field in place is
    # exposed on every version (100 on the first revived pod, or on the first size behind the guard)
    assert mis["rollbackWindow"] is None and mis["rule"]["id"] == "no-rollback-window" and not mis["exposed"]
    assert ok["rollbackWindow"] == 3 and ok["exposed"] and ok["predicted_peak_weight"] == 100
    assert not [x for x in ok["lint"] if x["rule"].startswith("crd-")] and ok["crd_schema"] == []
    results = json.loads((tmp_path / "s.sarif").read_text())["runs"][0]["results"]
    (res,) = [x for x in results if x["ruleId"] == "crd-pruned-field"]
    loc = res["locations"][0]["physicalLocation"]
    assert (loc["artifactLocation"]["uri"], loc["region"]["startLine"]) == ("misplaced.yaml", 8)
    t = drills("scan", "misplaced.yaml", "--controller", version, cwd=tmp_path)
    assert "spec.strategy.canary.rollbackWindow" in t.stdout and "crd-pruned-field" in t.stdout


def test_pruned_and_rejected_fields_and_what_the_apiserver_keeps():
    text = MISPLACED.replace("      minPodsPerReplicaSet: 1\n", "      minPodsPerReplicaSet: 1\n      canaryService: 5\n"
                             "      stableService: null\n      scaleDownDelaySeconds: 30\n").replace(
        "        - pause: {duration: 10m}\n", "        - pause: {duration: 600}\n          setWieght: 7\n")
    (ro,) = rollouts_in(text, "x.yaml", "v1.8.2").rollouts
    seen = seen_by_controller(ro, "v1.8.2")
    kinds = {(f.kind, f.where) for f in seen.schema_findings}
    assert kinds == {("pruned", "spec.strategy.canary.rollbackWindow"),
                     ("rejected", "spec.strategy.canary.canaryService"),
                     ("pruned", "spec.strategy.canary.steps[1].setWieght")}, kinds
    typo = next(f for f in seen.schema_findings if f.where.endswith("setWieght"))
    assert "did you mean setWeight?" in typo.message
    assert typo.line == next(i for i, ln in enumerate(text.splitlines(), 1) if "setWieght" in ln)
    assert seen.rejected and seen.steps[1] == {"pause": {"duration": 600}} and seen.scale_down_delay == 30
    rec = evaluate(ro, facts_for("v1.8.2"))
    assert rec.pred.rule == "crd-rejected" and rec.pred.peak is None and "canaryService" in rec.pred.text
    assert {f.rule for f in rec.findings} >= {"crd-pruned-field", "crd-rejected-field"}
    # a Rollout read from a cluster is what its apiserver already kept: not checked again
    ro.origin = {"cluster": "stage"}
    assert seen_by_controller(ro, "v1.8.2") is ro


def test_a_field_the_version_does_not_have_names_the_version_that_has_it(tmp_path):
    text = PLACED.replace("      minPodsPerReplicaSet: 1\n",
                          "      minPodsPerReplicaSet: 1\n      replicaProgressThreshold: {type: Pods, value: 1}\n")
    (ro,) = rollouts_in(text, "x.yaml").rollouts
    old, new = evaluate(ro, facts_for("v1.8.2")), evaluate(ro, facts_for("v1.10.2"))
    (f,) = old.findings[:1]
    assert f.rule == "crd-pruned-field" and "anywhere in the v1.8.2 CRD" in f.message and "v1.10.2's has it" in f.message
    assert old.ro.rpt is None and new.ro.rpt == {"type": "Pods", "value": 1} and new.pred.rule == "rpt-end-of-steps"
    assert not [x for x in new.findings if x.rule.startswith("crd-")]


def test_a_crd_that_cannot_be_had_is_said_on_the_rollout(tmp_path):
    """No toolchain cache, an empty Go module cache and no module proxy: nothing is checked, and the Rollout says
    so (not modelled: the CRD schema), beside the release ranges that stand in for the source."""
    import os
    (tmp_path / "placed.yaml").write_text(PLACED)
    env = dict(os.environ, DRILLS_CACHE=str(tmp_path / "cache"), GOMODCACHE=str(tmp_path / "gomod"), GOPROXY="off")
    r = subprocess.run([sys.executable, "-m", "drills", "scan", "placed.yaml", "--json", "--fail-on", "none"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    (ro,) = json.loads(r.stdout)["rollouts"]
    assert "GOPROXY=off" in ro["crd_schema_unavailable"] and ro["crd_schema"] == []
    assert ro["not_modelled"] == [f"not modelled: the v1.8.2 CRD schema (fields not checked: "
                                  f"{ro['crd_schema_unavailable']})"]
    assert ro["facts_from"].startswith("release ranges") and ro["predicted_peak_weight"] == 100
