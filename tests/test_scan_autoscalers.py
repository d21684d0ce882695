"""`drills scan` and autoscalers: HPAs and KEDA ScaledObjects that target a Rollout, joined to it, predicted at
minReplicas, the current size and maxReplicas; the safe-pod check at the maximum with what would close it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from drills.core import config
from drills.scan.autoscalers import HPA, KEDA, from_object, join
from drills.scan.live import read_autoscalers
from drills.scan.model import ScanInputError, from_object as rollout_from_object
from drills.scan.records import evaluate
from drills.scan.sources import facts_for
from test_scan_outputs import validate_sarif

INCIDENT_STEPS = [{"setWeight": 1}, {"pause": {"duration": "5m"}}, {"setWeight": 5}, {"pause": {"duration": "5m"}}]


def drills(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(config.project_root()))
    return subprocess.run([sys.executable, "-m", "drills", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd or config.project_root(), env=env)


def rollout(name, steps=INCIDENT_STEPS, replicas=None, min_pods=2, ns="shop"):
    spec = {"rollbackWindow": {"revisions": 3}, "strategy": {"canary": {
        "minPodsPerReplicaSet": min_pods, "steps": steps, "trafficRouting": {"istio": {
            "virtualService": {"name": name, "routes": ["primary"]},
            "destinationRule": {"name": name, "canarySubsetName": "canary", "stableSubsetName": "stable"}}}}}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": name, "namespace": ns},
            "spec": spec}


def keda(name, target, lo=None, hi=None, ns="shop", api="argoproj.io/v1alpha1"):
    spec = {"scaleTargetRef": {"apiVersion": api, "kind": "Rollout", "name": target},
            "triggers": [{"type": "cpu", "metadata": {"value": "70"}}]}
    if lo is not None:
        spec["minReplicaCount"] = lo
    if hi is not None:
        spec["maxReplicaCount"] = hi
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name, "namespace": ns},
            "spec": spec}


def hpa(name, target, lo=None, hi=10, ns="shop"):
    spec = {"scaleTargetRef": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": target}}
    if lo is not None:
        spec["minReplicas"] = lo
    if hi is not None:
        spec["maxReplicas"] = hi
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


@pytest.fixture
def manifest(tmp_path):
    def write(*docs, name="m.yaml"):
        p = tmp_path / name
        p.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return p
    return write


def scan_json(path, *extra):
    r = drills("scan", path, "--json", "--fail-on", "none", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# --- reading ----------------------------------------------------------------------------------------------------
def test_hpa_and_keda_defaults_and_targets():
    a = from_object(hpa("h", "r", lo=None, hi=7), "t")
    assert (a.kind, a.min_replicas, a.max_replicas, a.defaulted) == (HPA, 1, 7, ["minReplicas 1 by default"])
    k = from_object(keda("k", "r"), "t")
    assert (k.kind, k.min_replicas, k.max_replicas) == (KEDA, 0, 100)
    assert k.defaulted == ["minReplicaCount 0 by default", "maxReplicaCount 100 by default"]
    # a ScaledObject's target defaults to apps/v1 Deployment: not the scan's
    so = keda("k", "r")
    del so["spec"]["scaleTargetRef"]["kind"]
    assert from_object(so, "t") is None
    deploy = hpa("h", "r")
    deploy["spec"]["scaleTargetRef"].update(apiVersion="apps/v1", kind="Deployment")
    assert from_object(deploy, "t") is None
    other = dict(hpa("h", "r"), apiVersion="example.com/v1")        # another group's kind of that name
    assert from_object(other, "t") is None


@pytest.mark.parametrize("obj, says", [
    (hpa("h", "r", lo=-1), "minReplicas must be an integer"),
    (hpa("h", "r", lo="2"), "minReplicas must be an integer"),
    (hpa("h", "r", hi=None), "maxReplicas is required"),
    (hpa("h", "r", lo=5, hi=3), "minReplicas 5 is above spec.maxReplicas 3"),
    (keda("k", "r", lo=400, hi=360), "minReplicaCount 400 is above spec.maxReplicaCount 360"),
    (keda("k", "r", hi=True), "maxReplicaCount must be an integer"),
    ({**hpa("h", "r"), "spec": {"scaleTargetRef": "r", "maxReplicas": 3}}, "scaleTargetRef must be a mapping"),
])
def test_malformed_autoscalers_are_refused(obj, says):
    with pytest.raises(ScanInputError, match=says):
        from_object(obj, "t", file="m.yaml", line=1)


def test_malformed_autoscaler_exits_2_naming_file_and_line_and_the_scan_goes_on(manifest):
    path = manifest(rollout("orders", replicas=20), keda("orders", "orders", lo=-3, hi=360))
    r = drills("scan", path, "--json", "--fail-on", "none")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{path.name}:" in r.stderr and "minReplicaCount must be an integer 0.." in r.stderr
    out = json.loads(r.stdout)
    assert [x["name"] for x in out["rollouts"]] == ["orders"] and out["unreadable"]


# --- predictions at min and max -------------------------------------------------------------------------------
def _record(version, ro_obj, *scalers):
    ro = rollout_from_object(ro_obj, "t", file="m.yaml", line=1)
    ro.controller_version = version
    ass = [from_object(s, "t", file="m.yaml", line=1) for s in scalers]
    assert join([ro], ass) == []
    return evaluate(ro, facts_for(version), {})


def test_the_incident_shape_is_closed_at_its_minimum_and_open_at_keda_max_360():
    """KEDA max 360, floor 2, remaining rung 5 (the final 100 already cut), guard on v1.8.2: at 20 the rung lands on
    2 pods (10 % of capacity, safe); at 360 the first rung sizes ceil(1 x 360 / 100) = 4 pods, 5 % on 1.1 %."""
    rec = _record("v1.8.2", rollout("orders", replicas=20), keda("orders", "orders", lo=10, hi=360))
    d = rec.as_dict()
    assert (d["min_replicas"], d["max_replicas"], d["replicas"]) == (10, 360, 20)
    assert (d["exposed"], d["exposed_at_min"], d["exposed_at_max"]) == (False, False, True)
    assert (d["at_min"]["predicted_peak_weight"], d["at_min"]["pods_carrying"]) == (5, 2)
    assert (d["at_max"]["predicted_peak_weight"], d["at_max"]["pods_carrying"]) == (5, 4)
    assert d["window"] == "closed at minReplicas 10, open at maxReplicas 360"
    close = d["close_at_max"]
    # rung at most 100 x 4 / 360 = 1.111.. rounded down; floor at least ceil(5 x 360 / 100) = 18
    assert (close["rung_at_most"], close["setweight_at_most"], close["min_pods_at_least"]) == (1.11, 1, 18)
    assert close["brief_rung_at_most"] == 0.55             # the brief's floor-only 2 / 360 x 100, rounded down
    assert d["autoscaler"]["kind"] == "ScaledObject" and d["autoscaler_conflict"] is False
    assert any(f["rule"] == "above-safe-pod-count" and "maxReplicas 360" in f["message"] for f in d["lint"])


def test_the_closing_numbers_close_it():
    """Each number, applied, leaves the Rollout safe at 360; one step short of it, still exposed."""
    def at_max(steps=INCIDENT_STEPS, min_pods=2):
        return _record("v1.8.2", rollout("orders", steps=steps, replicas=20, min_pods=min_pods),
                       keda("orders", "orders", lo=10, hi=360)).exposed_at_max
    rung1 = [dict(s, setWeight=1) if s.get("setWeight") == 5 else s for s in INCIDENT_STEPS]
    assert not at_max(steps=rung1) and not at_max(min_pods=18) and at_max(min_pods=17)


def test_without_the_guard_the_floor_does_not_close_it():
    """v1.8.5 (UpdateHash only delays the DestinationRule switch): the first available pod carries the rung."""
    d = _record("v1.8.5", rollout("orders", replicas=20), keda("orders", "orders", lo=10, hi=360)).as_dict()
    assert (d["exposed"], d["exposed_at_max"]) == (False, True)
    assert d["close_at_max"]["min_pods_at_least"] is None and d["close_at_max"]["rung_at_most"] == 0.27
    assert "no minPodsPerReplicaSet closes it" in d["close_at_max"]["text"]


def test_absent_replicas_predicts_exposed_at_the_minimum_and_says_so():
    d = _record("v1.8.2", rollout("orders"), hpa("orders", "orders", lo=50, hi=60)).as_dict()
    assert d["replicas"] == 50 and "current size is unknown from manifests" in d["replicas_basis"]
    assert d["exposed"] and d["exposed_at_min"] and d["exposed_at_max"]
    d = _record("v1.8.2", rollout("orders", replicas=55), hpa("orders", "orders", lo=20, hi=60)).as_dict()
    assert d["replicas"] == 55 and d["replicas_basis"] == "current size 55 (spec.replicas)"


def test_a_rollout_without_an_autoscaler_keeps_its_one_size():
    d = _record("v1.8.2", rollout("fixed", replicas=360)).as_dict()
    assert (d["min_replicas"], d["max_replicas"], d["autoscaler"], d["close_at_max"]) == (None, None, None, None)
    assert d["exposed"] is True and d["exposed_at_max"] is True


# --- joins ------------------------------------------------------------------------------------------------------
def test_unjoined_and_conflicting_autoscalers_are_reported(manifest, tmp_path):
    path = manifest(rollout("orders", replicas=20), keda("orders", "orders", lo=10, hi=360),
                    hpa("orders-hpa", "orders", lo=2, hi=400), hpa("ghost", "ghost"),
                    hpa("elsewhere", "orders", ns="other"), keda("wrongapi", "orders", hi=50, api="apps/v1"))
    out = scan_json(path)
    (x,) = out["rollouts"]
    assert x["autoscaler_conflict"] is True and x["autoscaler"]["conflict"] is True
    assert {a["name"] for a in x["autoscaler"]["autoscalers"]} == {"orders", "orders-hpa"}
    assert (x["min_replicas"], x["max_replicas"]) == (2, 400)          # the range either allows: none picked
    assert "none is picked" in x["autoscaler"]["text"]
    unjoined = {u["name"]: u["why"] for u in out["autoscalers_unjoined"]}
    assert set(unjoined) == {"ghost", "elsewhere", "wrongapi"}
    assert "not among the Rollouts read" in unjoined["ghost"] and "apps/v1" in unjoined["wrongapi"]
    r = drills("scan", path, "--fail-on", "none")
    assert "3 autoscaler(s) not joined to a Rollout" in r.stdout and "autoscalers target this Rollout" in r.stdout
    sarif = tmp_path / "s.sarif"
    drills("scan", path, "--fail-on", "none", "--sarif", sarif)
    ids = [res["ruleId"] for res in validate_sarif(json.loads(sarif.read_text()))]
    assert ids.count("autoscaler-unjoined") == 3 and ids.count("autoscaler-conflict") == 1


def test_a_manifest_autoscaler_joins_the_rollout_of_its_own_file_first(manifest, tmp_path):
    stage = manifest(rollout("orders", replicas=3), hpa("orders", "orders", hi=10), name="stage.yaml")
    manifest(rollout("orders", replicas=20), keda("orders", "orders", lo=10, hi=360), name="prod.yaml")
    out = scan_json(stage.parent)
    got = {x["file"].rsplit("/", 1)[-1]: (x["autoscaler"]["kind"], x["autoscaler_conflict"]) for x in out["rollouts"]}
    assert got == {"prod.yaml": ("ScaledObject", False), "stage.yaml": ("HorizontalPodAutoscaler", False)}
    assert out["autoscalers_unjoined"] == []


# --- outputs and the gate ---------------------------------------------------------------------------------------
def test_table_json_sarif_and_junit_carry_the_at_max_finding(manifest, tmp_path):
    path = manifest(rollout("orders", replicas=20), keda("orders", "orders", lo=10, hi=360))
    out = scan_json(path)
    (x,) = out["rollouts"]
    for key in ("min_replicas", "max_replicas", "autoscaler", "exposed", "exposed_at_max"):
        assert key in x, key
    assert out["summary"]["autoscaled"] == 1 and out["summary"]["exposed_at_max"] == 1
    sarif, junit = tmp_path / "s.sarif", tmp_path / "j.xml"
    r = drills("scan", path, "--sarif", sarif, "--junit", junit, "--fail-on", "none")
    assert r.returncode == 0, r.stderr
    assert "closed at minReplicas 10, open at maxReplicas 360" in r.stdout
    assert "remaining rung at most 1.11 %" in r.stdout and "minPodsPerReplicaSet at least 18" in r.stdout
    (res,) = [x for x in validate_sarif(json.loads(sarif.read_text())) if x["ruleId"] == "rollback-exposure-at-max"]
    assert res["level"] == "error" and res["properties"]["max_replicas"] == 360
    assert (res["properties"]["rung_at_most"], res["properties"]["min_pods_at_least"]) == (1.11, 18)
    line = path.read_text().splitlines()[res["locations"][0]["physicalLocation"]["region"]["startLine"] - 1]
    assert line.strip() == "- setWeight: 5"                   # on the remaining rung
    cases = ET.parse(junit).getroot().findall("testsuite/testcase")
    (case,) = [c for c in cases if c.get("name") == "shop/orders: rollback exposure at maxReplicas 360"]
    fail = case.find("failure")
    assert fail is not None and "at most 1.11 %" in fail.get("message") and "at least 18" in fail.get("message")


def test_an_exposure_at_the_maximum_fails_the_exposed_gate(manifest):
    path = manifest(rollout("orders", replicas=20), keda("orders", "orders", lo=10, hi=360))
    assert drills("scan", path, "--fail-on", "exposed").returncode == 1
    assert drills("scan", path, "--fail-on", "lint").returncode == 0            # warnings only
    safe = manifest(rollout("orders", replicas=20), keda("orders", "orders", lo=10, hi=40), name="safe.yaml")
    assert drills("scan", safe, "--fail-on", "exposed").returncode == 0


# --- live --------------------------------------------------------------------------------------------------------
class _Objects:
    """A CustomObjectsApi's two list calls, answering from a table (an ApiException for a missing API)."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def _answer(self, group, plural):
        a = self.answers[(group, plural)]
        if isinstance(a, Exception):
            raise a
        return {"items": a}

    def list_cluster_custom_object(self, group, version, plural, **kw):
        self.calls.append(("cluster", group, version, plural))
        return self._answer(group, plural)

    def list_namespaced_custom_object(self, group, version, namespace, plural, **kw):
        self.calls.append((namespace, group, version, plural))
        return self._answer(group, plural)


def test_live_lists_hpas_v2_and_a_cluster_without_keda_has_no_scaledobjects():
    item = hpa("orders", "orders", lo=2, hi=30)
    del item["kind"], item["apiVersion"]                      # list items of a built-in type carry neither
    co = _Objects({("autoscaling", "horizontalpodautoscalers"): [item],
                   ("keda.sh", "scaledobjects"): ApiException(status=404, reason="Not Found")})
    (a,) = read_autoscalers(co, "ctx", None)
    assert (a.kind, a.target, a.min_replicas, a.max_replicas, a.origin) == (HPA, "orders", 2, 30, {"cluster": "ctx"})
    assert co.calls == [("cluster", "autoscaling", "v2", "horizontalpodautoscalers"),
                        ("cluster", "keda.sh", "v1alpha1", "scaledobjects")]
    co = _Objects({("autoscaling", "horizontalpodautoscalers"): [],
                   ("keda.sh", "scaledobjects"): ApiException(status=403, reason="Forbidden")})
    with pytest.raises(ApiException):                          # refused is not absent: the scan says so (exit 2)
        read_autoscalers(co, "ctx", "shop")
    assert co.calls[0][0] == "shop"


def test_closing_numbers_at_max_do_not_depend_on_another_rollouts_minimum_of_the_same_size(tmp_path):
    """Two Rollouts of one shape: b's minimum is a's maximum (360).  a's closing numbers at its maximum are given,
    whichever size was predicted first; min == max gives them too."""
    f = tmp_path / "two.yaml"
    f.write_text(yaml.safe_dump_all([rollout("b", replicas=20), hpa("hpa-b", "b", lo=360, hi=400),
                                     rollout("a", replicas=20), hpa("hpa-a", "a", lo=20, hi=360),
                                     rollout("c", replicas=20), hpa("hpa-c", "c", lo=360, hi=360)]))
    r = drills("scan", f, "--controller", "v1.8.2", "--json")
    assert r.returncode == 1, r.stderr
    rows = {x["name"]: x for x in json.loads(r.stdout)["rollouts"]}
    for name in ("a", "c"):
        close = rows[name]["close_at_max"]
        assert rows[name]["exposed_at_max"] and close and close["min_pods_at_least"] == 18, rows[name]
        assert "setWeight 100" not in json.dumps(close), close


def test_a_list_whose_items_are_not_all_mappings_is_read_for_its_mappings(tmp_path):
    f = tmp_path / "list.yaml"
    f.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List",
                                 "items": [rollout("a", replicas=20), "x", 5, None, [1], hpa("hpa-a", "a", 20, 360)]}))
    r = drills("scan", f, "--controller", "v1.8.2", "--json", "--fail-on", "none")
    assert r.returncode == 0 and "Traceback" not in r.stderr and "Error" not in r.stderr, r.stderr
    (row,) = json.loads(r.stdout)["rollouts"]
    assert row["name"] == "a" and row["max_replicas"] == 360, row


def test_a_list_whose_items_are_not_a_list_is_unreadable_input(tmp_path):
    f = tmp_path / "list.yaml"
    f.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": {"a": rollout("a", replicas=20)}})
                 + "---\n" + yaml.safe_dump(rollout("b", replicas=20)))
    r = drills("scan", f, "--controller", "v1.8.2", "--json", "--fail-on", "none")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{f.name}:1: List: items must be a list of objects, found dict" in r.stderr, r.stderr
    assert [x["name"] for x in json.loads(r.stdout)["rollouts"]] == ["b"]       # the rest of the file is read


def test_only_the_lists_the_scan_reads_are_refused_for_non_list_items(tmp_path):
    f = tmp_path / "list.yaml"
    f.write_text(yaml.safe_dump({"apiVersion": "music.example/v1", "kind": "PlayList", "items": {"song": "x"}})
                 + "---\n" + yaml.safe_dump({"apiVersion": "argoproj.io/v1alpha1", "kind": "RolloutList",
                                             "items": "x"}) + "---\n" + yaml.safe_dump(rollout("b", replicas=20)))
    r = drills("scan", f, "--controller", "v1.8.2", "--json", "--fail-on", "none")
    assert r.returncode == 2 and "RolloutList: items must be a list" in r.stderr and "PlayList" not in r.stderr, \
        r.stderr
    assert [x["name"] for x in json.loads(r.stdout)["rollouts"]] == ["b"]


def test_a_long_name_keeps_what_is_wrong_at_the_end_of_the_error_line():
    with pytest.raises(ScanInputError) as e:
        from_object(hpa("h" * 600, "orders", lo=0, hi=5), "t", file="m.yaml", line=1)
    assert len(str(e.value)) < 500 and "characters cut" in str(e.value) and str(e.value).endswith("found 0")


def test_a_keda_maximum_of_zero_is_refused():
    with pytest.raises(ScanInputError, match="maxReplicaCount must be an integer 1"):
        from_object(keda("k", "orders", lo=0, hi=0), "t", file="m.yaml", line=1)


def test_a_rollout_at_zero_under_an_hpa_stays_at_zero():
    d = _record("v1.8.2", rollout("orders", replicas=0), hpa("orders", "orders", lo=3, hi=60)).as_dict()
    assert d["replicas"] == 0 and "an HPA leaves a target at zero alone" in d["replicas_basis"], d["replicas_basis"]


def test_a_huge_value_is_cut_in_the_error_line(manifest):
    path = manifest(rollout("orders", replicas=20), hpa("orders", "orders", lo="x" * 200_000, hi=360))
    r = drills("scan", path, "--json", "--fail-on", "none")
    assert r.returncode == 2 and "minReplicas must be an integer 1.." in r.stderr, r.stderr[:2000]
    line = next(ln for ln in r.stderr.splitlines() if "minReplicas" in ln)
    assert len(line) < 600 and "characters" in line, line[:1000]


def test_an_hpa_minimum_of_zero_is_refused_and_a_keda_one_is_read():
    with pytest.raises(ScanInputError, match="HorizontalPodAutoscaler orders: spec.minReplicas must be an integer 1"):
        from_object(hpa("orders", "orders", lo=0, hi=5), "t", file="m.yaml", line=1)
    assert from_object(keda("orders", "orders", lo=0, hi=5), "t").min_replicas == 0


def test_a_current_size_outside_the_range_is_predicted_where_the_autoscaler_moves_it():
    d = _record("v1.8.2", rollout("orders", replicas=20), hpa("orders", "orders", lo=50, hi=60)).as_dict()
    assert d["replicas"] == 50 and "spec.replicas 20 is outside the autoscaler's range 50..60" in d["replicas_basis"]
    assert "moves it to 50" in d["replicas_basis"] and d["exposed"] == d["exposed_at_min"]
    d = _record("v1.8.2", rollout("orders", replicas=500), keda("orders", "orders", lo=10, hi=360)).as_dict()
    assert d["replicas"] == 360 and "moves it to 360" in d["replicas_basis"] and d["exposed"] == d["exposed_at_max"]


def test_a_target_kind_in_another_case_is_reported_unjoined(manifest):
    so = keda("orders", "orders", lo=10, hi=360)
    so["spec"]["scaleTargetRef"]["kind"] = "rollout"
    spaced = hpa("spaced", "orders", lo=2, hi=30)
    spaced["spec"]["scaleTargetRef"]["kind"] = "Rollout "
    out = scan_json(manifest(rollout("orders", replicas=20), so, spaced))
    (row,) = out["rollouts"]
    assert row["autoscaler"] is None and row["max_replicas"] is None
    unjoined = {u["name"]: u for u in out["autoscalers_unjoined"]}
    assert set(unjoined) == {"orders", "spaced"}
    u = unjoined["orders"]
    assert u["target"]["kind"] == "rollout" and "case-sensitive" in u["why"], u
    assert unjoined["spaced"]["target"]["kind"] == "Rollout " and "is not 'Rollout'" in unjoined["spaced"]["why"]


# --- verification at the maximum ----------------------------------------------------------------------------------
def test_verify_picks_an_autoscaled_rollout_at_its_maximum_where_the_window_is_open():
    """The incident shape is closed at its 20 replicas and open at KEDA's 360: after the rules are covered, the
    verification probes it as a shape of its own at the maximum, at the fewest replicas with the maximum's rule, peak
    and exposure (41: the first count above the safe pod count 2 / 5 % = 40), and judges the maximum's prediction."""
    from drills.scan.verify import pick, probe_spec
    rec = _record("v1.8.2", rollout("orders", replicas=20), keda("orders", "orders", lo=10, hi=360))
    plain = _record("v1.8.2", rollout("plain", replicas=2))
    shapes, uncovered, _ = pick([rec, plain], 3)
    at_max = [s for s in shapes if s.at_max]
    assert len(at_max) == 1 and uncovered == []
    s = at_max[0]
    assert s.ro.replicas == 360 and s.pred is rec.sizes["max"] and s.pred.exposed and not rec.pred.exposed
    assert s.probe_replicas == 41 and probe_spec(s).replicas == 41 and "replicas 360 (autoscaler maximum)" in s.label
    assert {x.label for x in shapes if not x.at_max} == {
        x.label for x in pick([rec, plain], 2)[0]}                         # the rules first: the maximum after them
    assert [x for x in pick([rec, plain], 2)[0] if x.at_max] == []


def test_verify_at_the_maximum_probes_the_fewest_replicas_and_only_where_the_maximum_differs():
    from drills.scan.verify import pick
    small = _record("v1.8.2", rollout("small", replicas=20), keda("small", "small", lo=10, hi=50))
    shapes, _, _ = pick([small], 3)
    assert [s.probe_replicas for s in shapes if s.at_max] == [41]      # 50 is within 64: still the fewest
    same = _record("v1.8.2", rollout("same", steps=[{"setWeight": 1}, {"pause": {}}], replicas=20),
                   keda("same", "same", lo=10, hi=360))
    assert (same.sizes["max"].rule, same.sizes["max"].peak, same.sizes["max"].exposed) == \
        (same.pred.rule, same.pred.peak, same.pred.exposed)
    shapes, _, skipped = pick([same], 3)
    assert [s.at_max for s in shapes] == [False] and not skipped          # the same prediction: probed once
