"""Outputs of `drills scan`: JSON contract, SARIF 2.1.0, JUnit XML, and the --fail-on exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import jsonschema
import pytest
import yaml

from drills import config

# The parts of the SARIF 2.1.0 schema (OASIS, sarif-schema-2.1.0.json) that code scanning reads: required
# properties and types of the log, run, tool, rule, result, location and region objects.
SARIF_SUBSET = {
    "type": "object", "required": ["version", "runs"],
    "properties": {
        "version": {"const": "2.1.0"}, "$schema": {"type": "string", "format": "uri"},
        "runs": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["tool"],
            "properties": {
                "tool": {"type": "object", "required": ["driver"], "properties": {"driver": {
                    "type": "object", "required": ["name"], "properties": {
                        "name": {"type": "string"}, "version": {"type": "string"},
                        "rules": {"type": "array", "items": {
                            "type": "object", "required": ["id"], "properties": {
                                "id": {"type": "string"},
                                "shortDescription": {"type": "object", "required": ["text"]},
                                "defaultConfiguration": {"type": "object", "properties": {
                                    "level": {"enum": ["none", "note", "warning", "error"]}}}}}}}}}},
                "results": {"type": "array", "items": {
                    "type": "object", "required": ["message"],
                    "properties": {
                        "ruleId": {"type": "string"}, "ruleIndex": {"type": "integer", "minimum": 0},
                        "level": {"enum": ["none", "note", "warning", "error"]},
                        "message": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
                        "locations": {"type": "array", "items": {"type": "object", "properties": {
                            "physicalLocation": {"type": "object", "required": ["artifactLocation"], "properties": {
                                "artifactLocation": {"type": "object", "required": ["uri"],
                                                     "properties": {"uri": {"type": "string"}}},
                                "region": {"type": "object", "required": ["startLine"],
                                           "properties": {"startLine": {"type": "integer", "minimum": 1}}}}},
                            "logicalLocations": {"type": "array"}}}},
                        "partialFingerprints": {"type": "object",
                                                "additionalProperties": {"type": "string"}}}}}}}}},
}


def rollout(name, steps, replicas=4, routing="subset"):
    canary = {"minPodsPerReplicaSet": 1, "steps": steps,
              "trafficRouting": {"istio": {"virtualService": {"name": name, "routes": ["primary"]}}}}
    if routing == "subset":
        canary["trafficRouting"]["istio"]["destinationRule"] = {"name": name, "canarySubsetName": "canary",
                                                                "stableSubsetName": "stable"}
    else:
        canary.update(canaryService=f"{name}-c", stableService=f"{name}-s")
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": name, "namespace": "shop"},
            "spec": {"replicas": replicas, "rollbackWindow": {"revisions": 3}, "strategy": {"canary": canary}}}


EXPOSED = rollout("exposed", [{"setWeight": 5}, {"pause": {"duration": "10m"}}, {"setWeight": 100}])
CLEAN = rollout("clean", [{"setWeight": 5}, {"pause": {"duration": "10m"}}])
GUARDED = rollout("guarded", [{"setWeight": 100}])          # lint error, not exposed behind the guard (v1.8.2)


def drills(*args, cwd=None):
    """The worktree's drills, also from another working directory."""
    env = dict(os.environ, PYTHONPATH=str(config.project_root()))
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


@pytest.fixture
def manifests(tmp_path):
    def write(*objs, name="m.yaml"):
        p = tmp_path / name
        p.write_text(yaml.safe_dump_all(list(objs), sort_keys=False))
        return p
    return write


def test_json_has_one_object_per_rollout_with_the_contract_fields(manifests):
    r = drills("scan", str(manifests(EXPOSED, CLEAN, GUARDED)), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["name"] for x in doc["rollouts"]] == ["exposed", "clean", "guarded"]
    for x in doc["rollouts"]:
        for key in ("namespace", "name", "source", "controller_version", "routing", "steps", "predicted_peak_weight",
                    "pods_carrying", "rule", "lint", "wave"):
            assert key in x, key
        assert x["controller_version"] == "v1.8.2" and x["rule"]["id"] and x["rule"]["lines"]
    ex, cl, gu = doc["rollouts"]
    assert (ex["predicted_peak_weight"], ex["pods_carrying"], ex["exposed"], ex["wave"]) == (100, 1, True, "2")
    assert (cl["predicted_peak_weight"], cl["exposed"], cl["lint"], cl["wave"]) == (5, False, [], "-")
    assert (gu["predicted_peak_weight"], gu["exposed"], [f["rule"] for f in gu["lint"]]) == \
        (0, False, ["final-setweight-100"])
    assert doc["summary"]["by_wave"] == {"-": {"v1.8.2": 2}, "2": {"v1.8.2": 1}}
    assert doc["controller_facts"][0]["lines"]["backward-search"].startswith("rollout/trafficrouting.go:")


@pytest.mark.parametrize("fail_on,objs,code", [
    ("none", (EXPOSED, GUARDED), 0),
    ("exposed", (EXPOSED,), 1),
    ("exposed", (GUARDED, CLEAN), 0),
    ("lint", (GUARDED,), 1),
    ("lint", (CLEAN,), 0),
    ("exposed,lint", (CLEAN, GUARDED), 1),
])
def test_fail_on_exit_codes(manifests, fail_on, objs, code):
    r = drills("scan", str(manifests(*objs)), "--fail-on", fail_on)
    assert r.returncode == code, r.stdout + r.stderr


def test_sarif_points_at_the_offending_step(manifests, tmp_path):
    path = manifests(EXPOSED, CLEAN, GUARDED)
    out = tmp_path / "scan.sarif"
    r = drills("scan", path.name, "--sarif", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    log = json.loads(out.read_text())
    jsonschema.validate(log, SARIF_SUBSET)
    run = log["runs"][0]
    ids = [rule["id"] for rule in run["tool"]["driver"]["rules"]]
    lines = path.read_text().splitlines()
    got = []
    for res in run["results"]:
        assert ids[res["ruleIndex"]] == res["ruleId"]
        loc = res["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"]["uri"] == "m.yaml"
        got.append((res["ruleId"], res["level"], lines[loc["region"]["startLine"] - 1].strip()))
    assert sorted(got) == sorted([("final-setweight-100", "error", "- setWeight: 100"),
                                  ("rollback-exposure", "error", "- setWeight: 100"),
                                  ("final-setweight-100", "error", "- setWeight: 100")])
    assert sum(1 for res in run["results"] if res["ruleId"] == "rollback-exposure") == 1


def test_junit_counts_exposures_and_lint_errors(manifests, tmp_path):
    out = tmp_path / "scan.xml"
    r = drills("scan", str(manifests(EXPOSED, CLEAN, GUARDED)), "--junit", str(out))
    assert r.returncode == 0, r.stderr
    root = ET.parse(out).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) == 6 and int(root.get("tests")) == 6
    failed = {(c.get("name"), c.find("failure").get("type")) for c in cases if c.find("failure") is not None}
    assert failed == {("shop/exposed: rollback exposure", "subset-first-size"),
                      ("shop/exposed: last-rung lint", "lint"), ("shop/guarded: last-rung lint", "lint")}
    assert int(suite.get("failures")) == int(root.get("failures")) == 3


def test_host_routing_is_reported_apart(manifests):
    r = drills("scan", str(manifests(rollout("h", [{"setWeight": 100}], routing="host"))), "--json")
    (x,) = json.loads(r.stdout)["rollouts"]
    assert (x["routing"], x["rule"]["id"], x["predicted_peak_weight"], x["pods_carrying"], x["wave"]) == \
        ("host", "first-pod", 100, 1, "1")
