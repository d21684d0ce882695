"""Lane abort: reading measurements from recorded AnalysisRun updates, the template, the verdict rules.

The AnalysisRun records below have the shape the flight recorder writes (drills.record.recorder); the
template is checked against the real apiserver's CRD schema on the embedded cluster.
"""
from __future__ import annotations

import copy

import pytest
import yaml
from kubernetes import client

from drills.drill import analysis
from drills.lanes.abort import LaneAbort, outcome_rows
from drills.lanes.abort_drill import STEPS, AbortObservation
from drills.lanes.base import LaneContext
from drills.record.ledger import INCONCLUSIVE, PASS, UNVERIFIED, Ledger
from drills.drill.shapes import manifests


def _fixture() -> dict:
    return yaml.safe_load((LaneAbort.data_dir() / "drill.yaml").read_text())


def _record(led: Ledger, obs, expect, version: str) -> list[dict]:
    lane = LaneAbort(LaneContext(api=None, namespace="ns", evidence_dir=led.run_dir, ledger=led, version=version))
    return outcome_rows(lane, obs, expect)


def _ar(seq, wall, name, phase, count, failed, last):
    return {"seq": seq, "t": wall, "wall": wall, "kind": "AnalysisRun", "type": "MODIFIED", "name": name, "rv": str(seq),
            "obj": {"phase": phase, "message": None,
                    "metrics": {"error-rate": {"phase": phase, "count": count, "failed": failed, "last": last}}}}


def test_measurement_value_reads_the_prometheus_vector_text():
    assert analysis.measurement_value("[0.4839]") == pytest.approx(0.4839)
    assert analysis.measurement_value("[0]") == 0.0
    assert analysis.measurement_value("[1.5e-03]") == pytest.approx(0.0015)
    assert analysis.measurement_value(None) is None
    assert analysis.measurement_value("[]") is None


def test_measurements_one_per_count_increase_with_failures_and_coalescing():
    name = "checkout-abc-3"
    recs = [
        _ar(1, 100.0, name, "", 0, 0, None),
        _ar(2, 100.1, name, "Running", 1, 1, "[0.55]"),
        _ar(3, 100.2, name, "Running", 1, 1, "[0.55]"),            # a status update without a new measurement
        _ar(4, 103.0, name, "Running", 2, 1, "[0]"),
        _ar(5, 109.0, name, "Failed", 4, 3, "[0.5]"),              # two measurements in one update
        _ar(6, 109.5, "checkout-other-2", "Running", 9, 0, "[0]"),  # another run
    ]
    ms, phases = analysis.measurements(recs, name, "error-rate")
    assert [m["n"] for m in ms] == [1, 2, 3, 4]
    assert [m["failed"] for m in ms] == [True, False, True, True]
    assert [m["coalesced"] for m in ms] == [False, False, True, True]
    assert ms[0]["value"] == 0.55 and ms[1]["value"] == 0.0 and ms[2]["value"] is None and ms[3]["value"] == 0.5
    assert ms[3]["wall"] == 109.0
    assert [p[1:] for p in phases] == [["", 0, 0], ["Running", 1, 1], ["Running", 2, 1], ["Failed", 4, 3]]
    assert analysis.run_names(recs, "checkout-abc-") == [name]


def test_client_error_ratio_counts_5xx_in_the_window():
    reqs = [{"t": 10.0 + i * 0.1, "code": 500 if i % 2 else 200} for i in range(20)] + [{"t": 20.0, "code": 0}]
    ratio, n = analysis.client_error_ratio(reqs, 10.0, 12.0)
    assert n == 20 and ratio == 0.5
    assert analysis.client_error_ratio(reqs, 30.0, 31.0) == (None, 0)


def test_template_and_rollout_analysis_match_the_seed_counts():
    fx = _fixture()
    fqdn = analysis.service_fqdn("checkout", "ns1")
    whole = analysis.analysis_query(fx, fqdn, per_revision=False)
    per_rev = analysis.analysis_query(fx, fqdn, per_revision=True)
    assert "revision=" not in whole and whole.endswith("OR on() vector(0)")
    assert 'revision="{{args.canary-hash}}"' in per_rev
    at = analysis.analysis_template(fx, "ns1", "http://127.0.0.1:9", per_rev, per_revision=True)
    m = at["spec"]["metrics"][0]
    assert (m["failureLimit"], m["failureCondition"]) == (2, "result[0] >= 0.001")
    assert at["spec"]["args"] == [{"name": "canary-hash"}]
    spec = analysis.rollout_spec(fx, "per-revision-query")
    ro = manifests(spec, "ns1")["rollout"]
    assert "rollbackWindow" not in ro["spec"]
    assert ro["spec"]["strategy"]["canary"]["analysis"]["args"] == [
        {"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}}]
    assert "startingStep" not in ro["spec"]["strategy"]["canary"]["analysis"]
    win = manifests(analysis.rollout_spec(fx, "rollback-window"), "ns1")["rollout"]
    assert win["spec"]["rollbackWindow"] == {"revisions": 3}


def _obs(**over) -> AbortObservation:
    ms = [{"n": i, "failed": True, "above_threshold": True, "value": 0.5, "stable_rate": 0.5} for i in (1, 2, 3)]
    base = dict(step="whole-service-query", query="q", rollback_window=None, hash_v1="h1", hash_v2="h2",
                injected_error_rate=0.5, threshold=0.001, failure_limit=2, runs=["ro-h1-3"], run_phase="Failed",
                run_phases=[], measurements=ms, measured_above=3, failed_above=3,
                final_rollout={"phase": "Degraded", "abort": True, "stableRS": "h2"}, aborted=True,
                healthy_at_v1=False, canary_weights=[[0.0, 0], [3.0, 20], [6.0, 0]], final_canary_weight=0,
                rates_during_rollback=[], whole_rate_at_rollback=0.5, window_evidence=[], controller_skip_lines=[],
                v1_scale_down_deadline=None, load_phases={}, canary_requests=10, complete=True,
                incomplete_reasons=[], timeline="/tmp/x.timeline.jsonl", series="/tmp/x.series.json",
                evidence="/tmp/x.analysis.json")
    base.update(over)
    return AbortObservation(**base)


def test_record_counts_only_with_failure_limit_plus_one_measurements_above_threshold(tmp_path):
    led = Ledger(tmp_path, "r", "embedded", "v1.8.2")
    rows = _record(led, _obs(), "aborted", "v1.8.2")
    assert [r["verdict"] for r in rows] == [PASS, PASS, PASS]
    few = copy.deepcopy(_obs())
    few.measured_above, few.failed_above = 2, 2
    rows = _record(led, few, "aborted", "v1.8.2")
    assert {r["verdict"] for r in rows} == {INCONCLUSIVE}
    assert "failureLimit + 1 = 3" in rows[0]["reason"]
    rows = _record(led, _obs(), None, "v9.9.9")
    assert {r["verdict"] for r in rows} == {UNVERIFIED}
    # a completed rollback where an abort was expected is a failure, not a pass
    done = _obs(run_phase="Successful", failed_above=0, aborted=False, healthy_at_v1=True,
                final_rollout={"phase": "Healthy", "abort": False, "stableRS": "h1"})
    assert {r["verdict"] for r in _record(led, done, "aborted", "v1.8.2")} == {"fail"}
    # a revived ReplicaSet still in its scale-down delay makes the controller skip analysis: not this drill
    late = _obs(v1_scale_down_deadline="2026-01-01T00:00:00Z")
    assert {r["verdict"] for r in _record(led, late, "aborted", "v1.8.2")} == {INCONCLUSIVE}


def test_record_rollback_window_needs_the_error_rate_above_threshold(tmp_path):
    led = Ledger(tmp_path, "r", "embedded", "v1.8.2")
    ok = _obs(step="rollback-window", rollback_window=3, runs=[], run_phase=None, measurements=[], measured_above=0,
              failed_above=0, aborted=False, healthy_at_v1=True,
              final_rollout={"phase": "Healthy", "abort": False, "stableRS": "h1"})
    assert [r["verdict"] for r in _record(led, ok, "skipped-completed", "v1.8.2")] == [PASS, PASS]
    quiet = copy.deepcopy(ok)
    quiet.whole_rate_at_rollback = 0.0
    assert {r["verdict"] for r in _record(led, quiet, "skipped-completed", "v1.8.2")} == {INCONCLUSIVE}


def test_record_rollback_window_on_a_version_that_runs_the_analysis(tmp_path):
    """v1.7.1's reconcileAnalysisRuns has no rollbackWindow condition: its expectation (analysed-completed) asks
    for the AnalysisRun the rollback gets, and the same observation fails a version that skips it."""
    led = Ledger(tmp_path, "r", "embedded", "v1.7.1")
    ran = _obs(step="rollback-window", rollback_window=3, runs=["ro-h1-3"], run_phase="Successful", measurements=[],
               measured_above=0, failed_above=0, aborted=False, healthy_at_v1=True,
               final_rollout={"phase": "Healthy", "abort": False, "stableRS": "h1"})
    rows = _record(led, ran, "analysed-completed", "v1.7.1")
    assert [r["verdict"] for r in rows] == [PASS, PASS] and "still creates an AnalysisRun" in rows[0]["assertion"]
    assert rows[0]["id"] == "abort/rollback-window/no-analysis"
    assert [r["verdict"] for r in _record(led, ran, "skipped-completed", "v1.8.2")] == ["fail", PASS]
    none = copy.deepcopy(ran)
    none.runs = []
    assert [r["verdict"] for r in _record(led, none, "analysed-completed", "v1.7.1")] == ["fail", PASS]


@pytest.mark.single_version
def test_the_apiserver_accepts_the_template_and_the_rollout(kube, namespace):
    fx = _fixture()
    co = client.CustomObjectsApi(kube)
    for step in STEPS:
        per_rev = fx["outcomes"][step]["query"] == "per-revision"
        fqdn = analysis.service_fqdn(fx["name"], namespace)
        at = analysis.analysis_template(fx, namespace, "http://127.0.0.1:9",
                                          analysis.analysis_query(fx, fqdn, per_rev), per_rev)
        at["metadata"]["name"] = f"error-rate-{step}"
        co.create_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "analysistemplates", at,
                                           dry_run="All")
        ro = manifests(analysis.rollout_spec(fx, step), namespace)["rollout"]
        co.create_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "rollouts", ro, dry_run="All")
