"""Steps as the controller reads them: any combination its validation allows (only two of setWeight, pause,
experiment and analysis in one step are refused), the revived ReplicaSet sized as GetCanaryReplicasOrWeight does
at index 0, and `not modelled: <what>` on a Rollout whose rollback does something the prediction leaves out."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from drills.scan.model import steps_text
from drills.scan.predict import FIRST_POD, FIRST_SIZE, INVALID
from drills.scan.readers import rollouts_in
from drills.scan.records import evaluate
from drills.scan.sources import facts_for


def rollout(steps: list, replicas: int = 4, routing: str = "subset", name: str = "r", **canary) -> dict:
    tr = {"istio": {"virtualService": {"name": name}}}
    if routing == "subset":
        tr["istio"]["destinationRule"] = {"name": name, "canarySubsetName": "canary", "stableSubsetName": "stable"}
    elif routing == "apisix":
        tr = {"apisix": {"route": {"name": name}}, "managedRoutes": [{"name": "set-header"}]}
    c = {"minPodsPerReplicaSet": 1, "trafficRouting": tr, "steps": steps, **canary}
    if routing == "apisix":
        c.update(canaryService=f"{name}-canary", stableService=f"{name}-stable")
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": name, "namespace": "s"},
            "spec": {"replicas": replicas, "rollbackWindow": {"revisions": 3}, "strategy": {"canary": c}}}


def scan(doc: dict, version: str = "v1.8.2"):
    (ro,) = rollouts_in(yaml.safe_dump(doc, sort_keys=False), "x.yaml", version).rollouts
    return evaluate(ro, facts_for(version))


HEADER = {"name": "set-header", "match": [{"headerName": "trace", "headerValue": {"exact": "debug"}}]}
APISIX = [{"setCanaryScale": {"replicas": 1}, "setHeaderRoute": HEADER}, {"pause": {}}, {"setWeight": 20},
          {"pause": {"duration": 15}}, {"setWeight": 100}]


@pytest.mark.parametrize("step0,size", [
    ({"setWeight": 20, "setCanaryScale": {"replicas": 3}}, 3),            # setCanaryScale replicas win, no floor
    ({"setWeight": 20, "setCanaryScale": {"weight": 50}}, 2),             # its weight: ceil(50 x 4 / 100)
    ({"setWeight": 50, "setCanaryScale": {"matchTrafficWeight": True}}, 2),   # back to the step's setWeight
    ({"setWeight": 25, "setCanaryScale": {}}, 1),                          # neither: GetCurrentSetWeight
    ({"setWeight": 20}, 1),
    ({"setCanaryScale": {"replicas": 2}, "setHeaderRoute": HEADER}, 2),
])
def test_a_step_with_several_fields_sizes_the_revived_replicaset_as_the_controller_does(step0, size):
    r = scan(rollout([step0, {"pause": {"duration": "10m"}}, {"setWeight": 100}]))
    assert r.pred.rule == FIRST_SIZE and r.pred.first_size == size and r.pred.carrying == size, r.pred.text
    assert r.pred.peak == 100 and not r.ro.invalid


def test_apisix_set_canary_scale_with_set_header_route_gets_a_verdict_and_says_what_is_not_modelled(tmp_path):
    """upstream's examples/apisix/rollout.yaml shape (its first step sets setCanaryScale and setHeaderRoute),
    given a rollbackWindow: predicted, and the header route it sets on the pass at index 0 is said."""
    doc = rollout(APISIX, replicas=5, routing="apisix", name="apisix")
    r = scan(doc)
    assert (r.pred.rule, r.pred.peak, r.pred.carrying, r.pred.first_size) == (FIRST_POD, 100, 1, 1)
    (nm,) = r.not_modelled
    assert nm.startswith("not modelled: setHeaderRoute at steps[0]")
    assert steps_text(r.ro.steps).startswith("[setCanaryScale+setHeaderRoute, pause, 20")
    (tmp_path / "apisix.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    base = [sys.executable, "-m", "drills", "scan", "apisix.yaml", "--fail-on", "none"]
    j = subprocess.run(base + ["--json", "--sarif", "s.sarif"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert j.returncode == 0, j.stderr
    (x,) = json.loads(j.stdout)["rollouts"]
    assert x["not_modelled"] == [nm] and x["predicted_peak_weight"] == 100
    t = subprocess.run(base, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "s/apisix (v1.8.2): not modelled: setHeaderRoute at steps[0]" in t.stdout, t.stdout
    results = json.loads((tmp_path / "s.sarif").read_text())["runs"][0]["results"]
    (note,) = [y for y in results if y["ruleId"] == "not-modelled"]
    assert note["level"] == "note" and "not modelled: setHeaderRoute" in note["message"]["text"]
    assert note["locations"][0]["physicalLocation"]["region"]["startLine"] == r.ro.step_lines[0]


def test_two_of_setweight_pause_experiment_analysis_in_one_step_is_the_controllers_invalid_spec(tmp_path):
    doc = rollout([{"setWeight": 5}, {"setWeight": 50, "pause": {}}, {"setWeight": 100}])
    r = scan(doc)
    assert r.pred.rule == INVALID and r.pred.peak is None and "validation.go" in r.pred.text
    (f,) = [x for x in r.findings if x.rule == "invalid-spec"]
    assert "step 1 sets setWeight and pause" in f.message and f.line == r.ro.step_lines[1] and f.level == "error"
    assert scan(rollout([{}, {"setWeight": 5}])).pred.rule == INVALID
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    p = subprocess.run([sys.executable, "-m", "drills", "scan", "bad.yaml", "--fail-on", "lint"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 1 and "invalid-spec" in p.stdout, p.stdout + p.stderr


def test_a_version_that_runs_analysis_inside_the_window_says_it_is_not_modelled():
    doc = rollout([{"setWeight": 5}, {"pause": {}}], analysis={"templates": [{"templateName": "error-rate"}]})
    old, new = scan(doc, "v1.7.1"), scan(doc, "v1.7.2")
    (nm,) = old.not_modelled
    assert "background analysis: v1.7.1 does not skip analysis" in nm and "rollout/analysis.go:" in nm
    assert new.not_modelled == [] and facts_for("v1.7.2").skips_analysis_in_window
    assert (old.pred.rule, old.pred.peak) == (new.pred.rule, new.pred.peak)


@pytest.mark.single_version
def test_set_canary_scale_with_set_weight_is_verified_on_the_real_controller(cluster, controller_version, tmp_path):
    """The probe runs the combined step as written: the revived ReplicaSet is first sized by setCanaryScale's
    replicas (3 of 4), not by the step's setWeight (1 of 4), and the last setWeight lands there."""
    doc = rollout([{"setWeight": 20, "setCanaryScale": {"replicas": 3}}, {"pause": {"duration": "10m"}},
                   {"setWeight": 100}], name="combo")
    (tmp_path / "combo.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    r = subprocess.run([sys.executable, "-m", "drills", "scan", str(tmp_path / "combo.yaml"), "--controller",
                        controller_version, "--verify", "1", "--json", "--fail-on", "none"],
                       capture_output=True, text=True, timeout=1200, env=dict(os.environ, DRILLS_REPORTS=str(tmp_path)))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    (row,) = out["verification"]
    expect = scan(doc, controller_version).pred
    assert (row["predicted"], row["predicted_pods"]) == (expect.peak, expect.carrying)
    assert row["verdict"] == "pass", json.dumps(row, indent=1)
    assert Path(row["evidence"]).is_file()
