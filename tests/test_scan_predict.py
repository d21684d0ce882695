"""The scan's rules: read from each version's own source, checked against the peaks measured on the real
controller (fixtures/lanes/scan/measured.yaml), and the lint / safe pod count / wave built on them."""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from drills.core import config
from drills.drill.branches import BACKWARD, END, MID, find_branches
from drills.scan.advice import lint, safe_pod_count, wave
from drills.scan.model import ScannedRollout, last_set_weight_step, prescribed
from drills.scan.predict import EMPTY, FIRST_POD, FIRST_SIZE, FULL_FIRST, RPT, predict
from drills.scan.sources import FINDERS, TR, facts_for, facts_from_releases, facts_from_source, module_dir

VERSIONS = ("v1.7.1", "v1.7.2", "v1.8.2", "v1.8.5", "v1.9.3", "v1.10.2")
MEASURED = yaml.safe_load((config.fixtures_dir() / "lanes" / "scan" / "measured.yaml").read_text())["measurements"]


def W(*xs):
    return [{"setWeight": x} if isinstance(x, int) else {"pause": {"duration": x} if x else {}} for x in xs]


def spec(steps, replicas=2, min_pods=1, routing="subset", rpt=None, dss=False, window=3):
    return ScannedRollout("ns", "r", "test", steps, replicas, routing, "istio", min_pods=min_pods,
                       rollback_window=window, rpt=rpt, dss=dss)


@pytest.fixture(scope="module")
def facts():
    return {v: facts_for(v) for v in VERSIONS}


# --- the rules come from each version's source -------------------------------------------------------------
def test_facts_are_read_from_each_module_source(facts):
    for v in VERSIONS:
        f = facts[v]
        root = module_dir(v, download=False)
        assert root is not None and f.derived_from == f"source {root}"
        bm = find_branches(root / TR)
        assert (f.line(BACKWARD).line, f.line(MID).line, f.line(END).line) == \
            (bm.backward_search, bm.mid_steps, bm.end_of_steps)
        for key, ln in f.lines.items():
            text = (root / ln.file).read_text().splitlines()[ln.line - 1]
            if key in FINDERS:
                assert re.search(FINDERS[key][2], text), (v, key, text)
        # the release ranges the scan falls back on without a source say the same
        rel = facts_from_releases(v)
        assert (f.guard, f.guard_kind, f.rpt, f.cap, f.stable_check, f.min_pods_capped,
                f.skips_analysis_in_window) == (rel.guard, rel.guard_kind, rel.rpt, rel.cap, rel.stable_check,
                                                rel.min_pods_capped, rel.skips_analysis_in_window), v
    assert [facts[v].guard_kind for v in VERSIONS] == ["none", "none", "blocking", "dr-only", "blocking", "blocking"]
    assert [facts[v].rpt for v in VERSIONS] == [False, False, False, False, True, True]
    # v1.7.1's reconcileAnalysisRuns has no rollbackWindow condition (v1.7.2 added isRollbackWithinWindow)
    assert [facts[v].skips_analysis_in_window for v in VERSIONS] == [False, True, True, True, True, True]
    guard = facts["v1.8.2"].line("guard")
    src = (module_dir("v1.8.2", download=False) / guard.file).read_text().splitlines()
    func = max(i for i in range(guard.line) if src[i].startswith("func "))
    assert "UpdateHash(" in src[func] and "delaying destination rule switch" in src[guard.line - 1]


# --- measured on the real controller -------------------------------------------------------------------------
def _manifest(m: dict, name: str, rpt: dict | None = None) -> dict:
    canary = {"steps": m["steps"], "minPodsPerReplicaSet": m["minPodsPerReplicaSet"],
              "trafficRouting": {"istio": {"virtualService": {"name": name, "routes": ["primary"]}}}}
    if m["routing"] == "subset":
        canary["trafficRouting"]["istio"]["destinationRule"] = {"name": name, "canarySubsetName": "canary",
                                                                "stableSubsetName": "stable"}
    else:
        canary.update(canaryService=f"{name}-canary", stableService=f"{name}-stable")
    if rpt or m.get("replicaProgressThreshold"):
        canary["replicaProgressThreshold"] = rpt or m["replicaProgressThreshold"]
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": name, "namespace": "m"},
            "spec": {"replicas": m["replicas"], "rollbackWindow": {"revisions": 3},
                     "strategy": {"canary": canary}}}


def _scan(path: Path, version: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "drills", "scan", str(path), "--controller", version, "--json",
                        "--fail-on", "none"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return {x["name"]: x for x in json.loads(r.stdout)["rollouts"]}


@pytest.mark.parametrize("version", sorted({m["controller"] for m in MEASURED}))
def test_measured_shapes_get_the_measured_peaks(tmp_path, version):
    ms = [m for m in MEASURED if m["controller"] == version]
    path = tmp_path / "measured.yaml"
    path.write_text(yaml.safe_dump_all([_manifest(m, m["id"].replace(".", "-")) for m in ms]))
    got = _scan(path, version)
    for m in ms:
        r = got[m["id"].replace(".", "-")]
        assert (r["predicted_peak_weight"], r["pods_carrying"]) == (m["observed"]["peak"], m["observed"]["pods"]), \
            f"{m['id']} ({m['where']}): predicted {r['predicted_peak_weight']} on {r['pods_carrying']}, rule " \
            f"{r['rule']['text']}"
        assert r["controller_version"] == version and r["rule"]["lines"]


def test_the_same_manifests_with_replica_progress_threshold_get_the_hazard_on_v1_10_2(tmp_path):
    """replicaProgressThreshold {Pods, 1} on every measured shape: on v1.10.2 each shape whose weight lands while
    the revived ReplicaSet is partial gets 100 (the cut ones included); where the guard or `steps: []` kept the
    weight at 0 it stays 0.  v1.8.2's CRD has no such field: the measured peaks stand (shapes measured on v1.8.2
    and v1.10.2, whose guard and chain are the same)."""
    ms = [m for m in MEASURED if not m.get("replicaProgressThreshold") and m["controller"] in ("v1.8.2", "v1.10.2")]
    rpt = {"type": "Pods", "value": 1}
    path = tmp_path / "rpt.yaml"
    path.write_text(yaml.safe_dump_all([_manifest(m, m["id"].replace(".", "-"), rpt) for m in ms]))
    new, old = _scan(path, "v1.10.2"), _scan(path, "v1.8.2")
    hazard = [m for m in ms if m["observed"]["peak"] > 0]
    assert len(hazard) >= 6 and any(last_set_weight_step(m["steps"])[1] < 100 for m in hazard)  # a cut shape too
    for m in ms:
        name = m["id"].replace(".", "-")
        if m in hazard:
            assert (new[name]["predicted_peak_weight"], new[name]["rule"]["id"], new[name]["wave"]) == \
                (100, RPT, "4"), name
            assert new[name]["exposed"] and new[name]["promotes_while_partial"]
        else:
            assert new[name]["predicted_peak_weight"] == 0 and not new[name]["exposed"], name
        assert old[name]["predicted_peak_weight"] == m["observed"]["peak"]
        # v1.8.2's CRD prunes the field: predicted without it, and said where it was put
        assert old[name]["replicaProgressThreshold"] is None and new[name]["replicaProgressThreshold"] == rpt
        pruned = [f for f in old[name]["lint"] if f["rule"] == "crd-pruned-field"]
        assert len(pruned) == 1 and "spec.strategy.canary.replicaProgressThreshold" in pruned[0]["message"]
        assert "v1.10.2's has it" in pruned[0]["message"]
        assert not [f for f in new[name]["lint"] if f["rule"].startswith("crd-")]


# --- the rule table ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version,routing,steps,replicas,min_pods,rule,peak,pods", [
    # subset routing behind the UpdateHash guard: the first size (steps[0]) carries the last setWeight
    ("v1.8.2", "subset", W(1, "5m", 5, "5m", 100), 20, 2, FIRST_SIZE, 100, 2),     # the incident: 100 on 2 of 20
    ("v1.8.2", "subset", W(1, "5m", 5, "5m"), 20, 2, FIRST_SIZE, 5, 2),            # the prescription
    ("v1.10.2", "subset", W(10, "3m", 50, "5m", 100), 8, 2, FIRST_SIZE, 100, 2),
    # a first size that is already the whole target: the guard holds every weight until all are available
    ("v1.8.2", "subset", W(100), 3, 2, FULL_FIRST, 0, None),                        # the brief says exposed
    ("v1.8.2", "subset", W(100, "10m"), 6, 2, FULL_FIRST, 0, None),
    ("v1.8.2", "subset", W(None, 100), 4, 1, FULL_FIRST, 0, None),                  # leading pause: sized at end
    ("v1.8.2", "subset", W(10, "3m", 50, 100), 2, 2, FULL_FIRST, 0, None),          # minPods = replicas
    # no guard: host routing, and every routing on v1.7.x: the first available pod carries it
    ("v1.8.2", "host", W(100), 3, 2, FIRST_POD, 100, 1),
    ("v1.8.2", "host", W(None, 100), 4, 1, FIRST_POD, 100, 1),
    ("v1.8.2", "host", W(1, "5m", 5, "5m", 100), 20, 2, FIRST_POD, 100, 1),
    ("v1.7.2", "subset", W(100), 3, 2, FIRST_POD, 100, 1),
    ("v1.7.2", "subset", W(1, "5m", 5, "5m", 100), 20, 2, FIRST_POD, 100, 1),
    # v1.8.3-v1.8.5: UpdateHash delays only the DestinationRule switch; SetWeight runs at the first pod
    ("v1.8.5", "subset", W(100), 3, 2, FIRST_POD, 100, 1),
    ("v1.8.5", "subset", W(1, "5m", 5, "5m", 100), 20, 2, FIRST_POD, 100, 1),
    ("v1.9.3", "subset", W(100), 3, 2, FULL_FIRST, 0, None),
    # steps: [] -- nothing for the search to find
    ("v1.8.2", "subset", [], 4, 2, EMPTY, 0, None),
    ("v1.8.2", "host", [], 4, 2, EMPTY, 0, None),
])
def test_rule_table(facts, version, routing, steps, replicas, min_pods, rule, peak, pods):
    p = predict(spec(steps, replicas, min_pods, routing), facts[version])
    assert (p.rule, p.peak, p.carrying) == (rule, peak, pods), p.text
    assert p.exposed == bool(peak and peak * replicas > 100 * pods)
    assert all(ln.line for ln in p.lines), [ln.ref() for ln in p.lines]


def test_minpods_floor_is_capped_at_replicas_from_v1_10(facts):
    ro = spec(W(5, "10s", 100), replicas=2, min_pods=3)
    assert predict(ro, facts["v1.8.2"]).target == 3 and predict(ro, facts["v1.10.2"]).target == 2
    assert predict(ro, facts["v1.8.2"]).rule == predict(ro, facts["v1.10.2"]).rule == FULL_FIRST


def test_not_applicable_shapes(facts):
    f = facts["v1.8.2"]
    assert predict(spec(W(5, 100), replicas=1), f).peak is None
    assert predict(spec(W(5, 100), window=None), f).rule == "no-rollback-window"
    assert predict(spec(W(5, 100), routing="none"), f).rule == "basic-canary"


def test_dynamic_stable_scale_keeps_the_peak_and_says_why(facts):
    a = predict(spec(W(5, "10m", 100), replicas=4), facts["v1.8.2"])
    b = predict(spec(W(5, "10m", 100), replicas=4, dss=True), facts["v1.8.2"])
    assert (a.rule, a.peak, a.carrying) == (b.rule, b.peak, b.carrying)
    assert any("dynamicStableScale" in n for n in b.notes)


def test_dynamic_stable_scale_with_scale_down_delay_is_an_invalid_spec(facts):
    """The controller refuses it (seen on v1.8.2: phase Degraded, 'InvalidSpec: ... dynamicStableScale cannot be
    used with scaleDownDelaySeconds'), so nothing is predicted for it."""
    ro = dataclasses.replace(spec(W(5, "10m", 100), replicas=4, dss=True), scale_down_delay=5)
    p = predict(ro, facts["v1.8.2"])
    assert (p.rule, p.peak) == ("invalid-spec", None)
    assert p.lines[0].file == "pkg/apis/rollouts/validation/validation.go" and p.lines[0].line


def test_a_source_with_the_upstream_cap_caps_the_weight(tmp_path, facts):
    """A source tree whose reconcileTrafficRouting calls weightFromAvailableReplicas (the unmerged upstream
    fix) predicts the available share instead of the last setWeight."""
    root = module_dir("v1.8.2", download=False)
    for rel in {f for f, *_ in FINDERS.values()}:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, tmp_path / rel)
    tr = (tmp_path / TR).read_text().splitlines()
    end = facts["v1.8.2"].line(END).line            # the final else of the chain: add the cap after the chain
    indent = len(tr[end - 1]) - len(tr[end - 1].lstrip())
    close = next(i for i in range(end, len(tr)) if tr[i].strip() == "}" and len(tr[i]) - len(tr[i].lstrip()) == indent)
    tr.insert(close + 1, "\t\tdesiredWeight = c.weightFromAvailableReplicas(desiredWeight)")
    (tmp_path / TR).write_text("\n".join(tr) + "\n")
    capped = facts_from_source("v1.8.2-capped", tmp_path)
    assert capped.cap and capped.guard
    p = predict(spec(W(5, "10m", 100), replicas=4, min_pods=1), capped)
    assert (p.rule, p.peak, p.carrying, p.exposed) == ("capped", 25, 1, False)
    h = predict(spec(W(100), replicas=4, min_pods=1, routing="host"), capped)
    assert (h.peak, h.carrying, h.exposed) == (75, 3, False)


# --- lint, safe pod count, wave ------------------------------------------------------------------------------
def test_safe_pod_count_exact_and_the_briefs_formula(facts):
    incident = spec(W(1, "5m", 5, "5m", 100), replicas=20, min_pods=2)
    s = safe_pod_count(incident, facts["v1.8.2"])
    assert (s["remaining_rung"], s["safe_pod_count"], s["brief_safe_pod_count"]) == (5, 40, 40)   # brief §9.3
    assert "max(ceil(1 x 20 / 100), 2) = 2" in s["canary_count"]
    cut = dataclasses.replace(incident, steps=prescribed(incident.steps))
    assert not predict(dataclasses.replace(cut, replicas=40), facts["v1.8.2"]).exposed
    assert predict(dataclasses.replace(cut, replicas=41), facts["v1.8.2"]).exposed      # the count is the edge
    assert safe_pod_count(dataclasses.replace(incident, routing="host"), facts["v1.8.2"])["safe_pod_count"] == 20
    assert safe_pod_count(incident, facts["v1.7.2"])["safe_pod_count"] == 20
    # the base chart's [5, pause 10m]: the revived ReplicaSet's first size is ceil(5 % x R), so 5 % never
    # exceeds its share -- the brief's "40 pods" does not apply to it
    base = spec(W(5, "10m", 100), replicas=360, min_pods=2)
    s = safe_pod_count(base, facts["v1.8.2"])
    assert (s["safe_pod_count"], s["brief_safe_pod_count"]) == (None, 40)
    assert not predict(dataclasses.replace(base, steps=prescribed(base.steps)), facts["v1.8.2"]).exposed
    assert [f.rule for f in lint(dataclasses.replace(incident, replicas=41), facts["v1.8.2"])] == \
        ["final-setweight-100", "last-rung-ratio", "above-safe-pod-count"]


def test_lint_points_at_the_offending_step(facts):
    ro = dataclasses.replace(spec(W(100, "10m")), steps_file="values.yaml", step_lines=[7, 8])
    (f,) = lint(ro, facts["v1.8.2"])
    assert (f.rule, f.level, f.step, f.line, f.file) == ("final-setweight-100", "error", 0, 7, "values.yaml")
    assert "followed by 1 more step" in f.message
    ro = dataclasses.replace(spec(W(10, "3m", 50, "5m", 100)), steps_file="v.yaml", step_lines=[3, 4, 6, 7, 9])
    assert [(x.rule, x.level, x.line) for x in lint(ro, facts["v1.8.2"])] == \
        [("final-setweight-100", "error", 9), ("last-rung-ratio", "warning", 6)]
    assert lint(spec(W(5, "10m")), facts["v1.8.2"]) == []


@pytest.mark.parametrize("version,routing,steps,replicas,min_pods,rpt,expected", [
    ("v1.8.2", "subset", W(100), 3, 2, None, "-"),            # not exposed behind the guard
    ("v1.8.2", "host", W(100), 3, 2, None, "1"),
    ("v1.7.2", "subset", W(100, "10m"), 3, 2, None, "1"),
    ("v1.8.2", "subset", W(5, "10m", 100), 12, 2, None, "2"),
    ("v1.8.2", "subset", W(10, "3m", 50, "5m", 100), 8, 2, None, "3"),   # the cut leaves 50 on 2 of 8
    ("v1.8.2", "subset", W(1, "5m", 5, "5m", 100), 60, 2, None, "3"),    # above the safe pod count (40)
    ("v1.8.2", "subset", W(1, "5m", 5, "5m", 100), 20, 2, None, "2"),    # the incident: the cut suffices
    ("v1.10.2", "subset", W(5, "10m"), 2, 1, {"type": "Pods", "value": 1}, "4"),
    ("v1.10.2", "subset", W(5, "10m"), 10, 1, {"type": "Percent", "value": 50}, "-"),   # not met at 1 of 10
])
def test_fix_wave(facts, version, routing, steps, replicas, min_pods, rpt, expected):
    ro = spec(steps, replicas, min_pods, routing, rpt)
    assert wave(ro, predict(ro, facts[version]), facts[version]) == expected


# --- a machine with empty caches (a CI lint job, a laptop): the sources are downloaded, never built ------------
_ONE = """apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata: {name: svc, namespace: ns}
spec:
  replicas: 2
  rollbackWindow: {revisions: 3}
  strategy:
    canary:
      minPodsPerReplicaSet: 1
      steps: [{setWeight: 5}, {pause: {duration: 10s}}, {setWeight: 100}]
      trafficRouting:
        istio:
          virtualService: {name: svc, routes: [primary]}
          destinationRule: {name: svc, canarySubsetName: canary, stableSubsetName: stable}
"""


def _scan_empty_caches(tmp_path: Path, versions: str, as_json: bool = True, **env) -> subprocess.CompletedProcess:
    import os
    (tmp_path / "ro.yaml").write_text(_ONE)
    e = dict(os.environ, GOMODCACHE=str(tmp_path / "gomod"), GOCACHE=str(tmp_path / "gocache"),
             DRILLS_CACHE=str(tmp_path / "drills-cache"), **env)
    return subprocess.run([sys.executable, "-m", "drills", "scan", str(tmp_path / "ro.yaml"), "--controller", versions,
                           "--fail-on", "none", *(["--json"] if as_json else [])], capture_output=True, text=True, timeout=900, env=e,
                          cwd=str(tmp_path))


def test_scan_on_empty_caches_names_every_source_line_of_versions_that_need_a_newer_go(tmp_path):
    """v1.9.3 and v1.10.2 ask for a newer Go than the machine's: their sources come through the same toolchain
    rule as their builds (GOTOOLCHAIN), and nothing is built (no binary in the drills cache)."""
    r = _scan_empty_caches(tmp_path, "v1.9.3,v1.10.2")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["summary"]["sources_unreadable"] == {}
    assert {f["version"]: f["derived_from"].startswith("source ") for f in doc["controller_facts"]} == \
        {"v1.9.3": True, "v1.10.2": True}
    assert {x["controller_version"] for x in doc["rollouts"]} == {"v1.9.3", "v1.10.2"}
    for x in doc["rollouts"]:
        assert x["source_lines"] == "from source" and x["rule"]["lines"], x
        assert all(re.fullmatch(r"[\w/.]+\.go:\d+", ln) for ln in x["rule"]["lines"]), x["rule"]["lines"]
    assert "line unknown" not in r.stdout
    assert not (tmp_path / "drills-cache" / "rollouts").exists(), "reading a source built something"


def test_scan_without_a_module_proxy_says_lines_unknown_once_and_on_every_row(tmp_path):
    r = _scan_empty_caches(tmp_path, "v1.8.2,v1.10.2", GOPROXY="off")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert set(doc["summary"]["sources_unreadable"]) == {"v1.8.2", "v1.10.2"}
    assert all("GOPROXY=off" in why for why in doc["summary"]["sources_unreadable"].values()), doc["summary"]
    assert [x["source_lines"] for x in doc["rollouts"]] == ["lines unknown", "lines unknown"]
    # the table says it once per version, in its summary
    t = _scan_empty_caches(tmp_path, "v1.8.2,v1.10.2", as_json=False, GOPROXY="off")
    assert t.returncode == 0, t.stderr[-2000:]
    said = [ln for ln in t.stdout.splitlines() if "its source could not be read" in ln]
    assert len(said) == 2 and all("lines unknown" in ln for ln in said), t.stdout


@pytest.mark.parametrize("form", ["root", "rollout", "trafficrouting.go"])
def test_a_source_tree_is_read_from_any_form_source_takes(form):
    # --source and DRILLS_SOURCE name a tree by its root, its rollout/ folder or its trafficrouting.go (a user-built
    # controller's legs get the file form)
    root = module_dir("v1.8.2")
    given = {"root": root, "rollout": root / "rollout", "trafficrouting.go": root / TR}[form]
    facts = facts_for("v1.8.2", str(given))
    assert Path(facts.root) == root
    assert facts.lines == facts_for("v1.8.2").lines
