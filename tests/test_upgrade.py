"""Upgrade classification on recorded ledgers (no cluster): pairing, directions, classes, exit rule.

The ledgers are written with the project's own Ledger (and load.record_phase_rows) into run folders and
read back, with the row shapes the lanes write (lane a, lane order, lane abort, load phases).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from drills.drill import branches
from drills.core import config
from drills import lanes
from drills.traffic import load
from drills.reporting import upgrade
from drills.record.answer import condition_of, exposed, peak_fact
from drills.record.ledger import FAIL, HAZARD, HOLDS, INCONCLUSIVE, NOT_APPLICABLE, PASS, UNVERIFIED, Ledger, read_rows
from drills.reporting.report import write_matrix

# DESIGN.md §2: backward search / mid-steps / end of steps per release
LINES = {"v1.7.2": (217, 227, 233), "v1.8.2": (245, 255, 261), "v1.8.5": (245, 255, 261),
         "v1.9.3": (250, 260, 266), "v1.10.2": (250, 260, 266)}
PEAK = "peak canary weight while the revived ReplicaSet is below its desired count"
HAZARD_STEP = "hazard-replica-progress-threshold"
RPT = {"replicaProgressThreshold": {"type": "Pods", "value": 1}}


def _bm(version: str) -> branches.BranchMap:
    b, m, e = LINES[version]
    return branches.BranchMap(source=f"rollouts/{version}/source/trafficrouting.go", sha256="0" * 64,
                              backward_search=b, mid_steps=m, end_of_steps=e,
                              order=[branches.BACKWARD, branches.MID, branches.END])


def _lines(bm):
    if bm is None:
        return {"branch_lines": branches.LINES_UNKNOWN}
    return {"branch_lines": {branches.BACKWARD: bm.backward_search, branches.MID: bm.mid_steps,
                             branches.END: bm.end_of_steps}, "branch_source_order": bm.order}


def hazard_assertion(bm) -> str:
    """As lane order words it: the prescription, the field, and that version's lines."""
    return ("prescription [5,pause:10s] keeps the weight at the last rung (5) with replicaProgressThreshold "
            "{type: Pods, value: 1}" + (f" (backward search :{bm.backward_search}, end-of-steps :{bm.end_of_steps})"
                                        if bm else f" ({branches.LINES_UNKNOWN})"))


def record_lane_a(led: Ledger, before=100, after=5, exit_cap=5, healthy=True, user_built=False):
    """Lane a's rows as the lane records them: ids, polarities, what each shows, the headline's facts."""
    for step, peak, exp in (("before", before, 100), ("after", after, 5)):
        weights = [[0.0, 0, 0, 2], [4.1, peak, 1, 2]]
        polarity, shows = (HAZARD, exposed(weights)) if step == "before" else (HOLDS, peak <= 5)
        led.record("a", step, PEAK, None if user_built else exp, peak,
                   UNVERIFIED if user_built else (PASS if peak == exp else FAIL), evidence=f"{step}.timeline.jsonl",
                   reason="a user-built controller" if user_built else None,
                   key="peak-weight", polarity=polarity, shows=shows, fact=peak_fact(step.upper(), peak, weights),
                   variant="stage", steps="5,pause:10s,100" if step == "before" else "5,pause:10s",
                   rollback_via="gitops", partial_window_observed=True, exposure_seconds=14.2,
                   weights_while_partial=weights, revived_replicaset="6d5f7c9b8")
    led.record("a", "cut-steps", "steps after the cut (final setWeight removed), Rollout Healthy", "5,pause:10s",
               "5,pause:10s (Healthy)", PASS, evidence="a/stage-cut-steps.json", key="steps-cut", variant="stage")
    led.record("a", "exit", "promote --full clears abort", False, False, PASS, evidence="exit.timeline.jsonl",
               key="abort-cleared", polarity=HOLDS, shows=True, variant="stage")
    led.record("a", "exit", "weight never above its value at promote --full until the revived ReplicaSet is "
               "fully available", "<= 5", exit_cap, PASS if exit_cap <= 5 else FAIL, evidence="exit.timeline.jsonl",
               key="weight-capped", polarity=HOLDS, shows=exit_cap <= 5, variant="stage")
    led.record("a", "exit", "Healthy at v1 after promote --full", "Healthy, stableRS = v1",
               "Healthy, stableRS = v1" if healthy else "Degraded: RolloutAborted", PASS if healthy else FAIL,
               evidence="exit.timeline.jsonl", key="healthy", polarity=HOLDS, shows=healthy,
               fact="exit Healthy" if healthy else "exit not Healthy", variant="stage")


def record_load(led: Ledger, step: str, exposure_failure: float, p95: float, requests: int = 400):
    stats = {
        "steady": {"requests": requests, "failures": 0, "failure_ratio": 0.0, "p95_ms": 11.0, "p50_ms": 4.0,
                   "codes": {"200": requests}, "window": [0, 30]},
        "exposure": {"requests": requests, "failures": int(requests * exposure_failure),
                     "failure_ratio": exposure_failure, "p95_ms": p95, "p50_ms": 6.0,
                     "codes": {"200": requests}, "window": [30, 45]},
    }
    thresholds = {"defaults": {"*": {"failure_ratio": {"max": 0.01}, "p95_ms": {"max": 300}}}}
    return load.record_phase_rows(led, "a", step, stats, thresholds, evidence=f"{step}-load.json")


def record_order(led: Ledger, version: str, bm, eos=50, mid=25, hazard=None):
    """hazard None: the version's CRD lacks the field (not_applicable); else the observed peak."""
    led.record("order", "end-of-steps", branches.order_assertion(bm, branches.END), 50, eos,
               PASS if eos == 50 else FAIL, evidence="order-end-of-steps.timeline.jsonl", key="branch-order",
               polarity=HOLDS, shows=eos == 50,
               probe="rollback inside rollbackWindow, final rung not 100", steps="5,pause:10s,50", replicas=2,
               opposite_order_would_show=100, partial_window_observed=True, **_lines(bm))
    led.record("order", "mid-steps", branches.order_assertion(bm, branches.MID), 25, mid,
               PASS if mid == 25 else FAIL, evidence="order-mid-steps.timeline.jsonl", key="branch-order",
               polarity=HOLDS, shows=mid < 75,
               probe="normal deploy reaching a higher rung while the canary ReplicaSet is short",
               steps="25,pause:10s,75,pause", replicas=4, higher_rung=75, higher_rung_index=2,
               canary_target_at_rung=3, opposite_order_would_show=75, short_seconds=33.4,
               weights_while_short=[[1.2, 25, 1, 3], [19.6, 25, 2, 3]], **_lines(bm))
    if hazard is None:
        led.record("order", HAZARD_STEP, hazard_assertion(bm), 5, None, NOT_APPLICABLE, key="peak-weight",
                   polarity=HAZARD, condition=condition_of(RPT),
                   reason="replicaProgressThreshold is not in spec.strategy.canary of this version's Rollout CRD "
                          f"schema (rollouts/{version}/crds/rollout-crd.yaml)", steps="5,pause:10s", **_lines(bm))
    else:
        led.record("order", HAZARD_STEP, hazard_assertion(bm), 100, hazard, PASS if hazard == 100 else FAIL,
                   evidence="order-hazard.timeline.jsonl", key="peak-weight", polarity=HAZARD, shows=hazard > 5,
                   condition=condition_of(RPT), last_rung=5, steps="5,pause:10s", extra_canary=RPT,
                   upstream_expected_peak=100, known_hazard=True, prescription_holds=hazard <= 5,
                   partial_window_observed=True, **_lines(bm))


def record_abort(led: Ledger, completes=True):
    led.record("abort", "rollback-window", "the rollback completes: Healthy at the rolled-back revision",
               "Healthy, stableRS=7f8b9c6d5, abort=false",
               "Healthy, stableRS=7f8b9c6d5, abort=false" if completes else "Degraded, stableRS=5c4d3b2a1, abort=true",
               PASS if completes else FAIL, evidence="rollback-window.timeline.jsonl", rollback_window=3)


def ledger_of(tmp_path: Path, version: str, fill, sha: str | None = None) -> list[dict]:
    """Write rows with the project's Ledger into a run folder and read the recorded ledger back."""
    run = tmp_path / f"run-{version}-{sha or 'release'}"
    led = Ledger(run, run.name, "embedded", version, controller_sha256=sha)
    fill(led)
    return read_rows(run / "ledger.json")


def release(version, **kw):
    def fill(led):
        record_lane_a(led, **{k: kw[k] for k in ("before", "after", "exit_cap", "healthy") if k in kw})
        record_load(led, "before", kw.get("exposure_failure", 0.31), kw.get("p95", 40.0),
                    requests=kw.get("requests", 400))
        record_order(led, version, kw.get("bm", _bm(version) if version in LINES else None),
                     eos=kw.get("eos", 50), mid=kw.get("mid", 25), hazard=kw.get("hazard"))
        record_abort(led, completes=kw.get("completes", True))
    return fill


def by_key(changes):
    return {(c.lane, c.step, c.assertion): c for c in changes}


def find(changes, lane, step, start=""):
    hits = [c for c in changes if c.lane == lane and c.step == step and c.assertion.startswith(start)
            and (start.startswith("load.") or not c.assertion.startswith("load."))]
    assert len(hits) == 1, [(c.lane, c.step, c.assertion) for c in changes]
    return hits[0]


# --- pairing -----------------------------------------------------------------------------------------
def test_line_references_are_stripped_for_pairing_and_kept_on_the_change(tmp_path):
    assert upgrade.normalise_assertion("branch order: backward search (:245) before end-of-steps (:261)") == \
        upgrade.normalise_assertion("branch order: backward search (:250) before end-of-steps (:266)") == \
        upgrade.normalise_assertion("branch order: backward search before end-of-steps (lines unknown)") == \
        "branch order: backward search before end-of-steps"
    assert upgrade.normalise_assertion(hazard_assertion(_bm("v1.8.2"))) == \
        upgrade.normalise_assertion(hazard_assertion(None)) == \
        "prescription [5,pause:10s] keeps the weight at the last rung (5) with replicaProgressThreshold " \
        "{type: Pods, value: 1}"
    # a parenthetical that is not a line reference stays part of the key
    assert upgrade.normalise_assertion(f"{PEAK} [prod-shaped: replicas 20, minPodsPerReplicaSet 2]") != PEAK

    base = ledger_of(tmp_path, "v1.8.2", release("v1.8.2"))
    cand = ledger_of(tmp_path, "v1.10.2", release("v1.10.2", hazard=100))
    changes = upgrade.classify(base, cand)
    mid = find(changes, "order", "mid-steps")
    assert mid.baseline_assertion == "branch order: backward search (:245) before mid-steps (:255)"
    assert mid.candidate_assertion == "branch order: backward search (:250) before mid-steps (:260)"
    assert mid.cls == upgrade.SAME
    # every row of each side is in exactly one pair
    assert len(changes) == len({(r["lane"], r["step"], upgrade.normalise_assertion(r["assertion"]))
                                for r in base + cand})


def test_a_user_built_candidate_without_source_pairs_with_the_release(tmp_path):
    base = ledger_of(tmp_path, "v1.8.2", release("v1.8.2"))
    cand = ledger_of(tmp_path, "v1.2.0+351efb7", release("v1.2.0+351efb7", bm=None, before=50, mid=25),
                     sha="ab" * 32)
    changes = upgrade.classify(base, cand)
    assert {c.cls for c in changes if c.lane == "order"} == {upgrade.SAME}
    before = find(changes, "a", "before")
    assert before.cls == upgrade.IMPROVED and before.candidate["controller_sha256"] == "ab" * 32
    assert "100 -> 50" in before.words
    assert "v1.2.0+351efb7 (sha256 abababababab)" in upgrade.changes_table(changes)


# --- every class ---------------------------------------------------------------------------------------
def test_every_class_appears_on_recorded_ledgers(tmp_path):
    base = ledger_of(tmp_path, "v1.8.2", release("v1.8.2", eos=50, mid=25, exit_cap=5, healthy=True))
    cand = ledger_of(tmp_path, "v1.10.2", release(
        "v1.10.2", before=50,            # improved: lower peak while partial
        mid=75,                          # regressed: the opposite order's value
        eos=40,                          # changed: neither expected nor opposite
        hazard=100,                      # new: a real observation where the baseline had none
        healthy=False,                   # regressed (verdict): pass -> fail
        requests=5))                     # inconclusive: too few requests in the load phases
    changes = upgrade.classify(base, cand)
    classes = {c.cls for c in changes}

    assert find(changes, "a", "after").cls == upgrade.SAME
    assert find(changes, "a", "before").cls == upgrade.IMPROVED
    mid = find(changes, "order", "mid-steps")
    assert mid.cls == upgrade.REGRESSED and "the branch order flipped" in mid.words, mid.words
    assert find(changes, "order", "end-of-steps").cls == upgrade.CHANGED
    assert find(changes, "a", "exit", "Healthy at v1").cls == upgrade.REGRESSED
    assert find(changes, "a", "before", "load.exposure.failure_ratio").cls == upgrade.INCONCLUSIVE_PAIR
    hazard = find(changes, "order", HAZARD_STEP)
    assert hazard.cls == upgrade.NEW and hazard.danger

    # gone: the same two ledgers the other way round (a downgrade check)
    back = upgrade.classify(cand, base)
    gone = find(back, "order", HAZARD_STEP)
    assert gone.cls == upgrade.GONE and not gone.danger
    assert "on the baseline only" in gone.words and "not in spec.strategy.canary" in gone.words
    assert classes | {c.cls for c in back} == set(upgrade.CLASSES)
    assert upgrade.exit_code(changes) == upgrade.EXIT_REGRESSED


def test_the_replica_progress_threshold_hazard_is_new_with_its_danger_in_words(tmp_path):
    base = ledger_of(tmp_path, "v1.8.2", release("v1.8.2"))
    cand = ledger_of(tmp_path, "v1.10.2", release("v1.10.2", hazard=100))
    changes = upgrade.classify(base, cand)
    hz = find(changes, "order", HAZARD_STEP)
    assert hz.cls == upgrade.NEW and hz.danger and hz.direction == upgrade.LOWER_IS_BETTER
    assert hz.baseline["verdict"] == NOT_APPLICABLE and hz.candidate["observed"] == 100
    w = hz.words
    assert w.startswith("DANGER: the prescription no longer holds with replicaProgressThreshold "
                        "{type: Pods, value: 1}"), w
    assert "put 100% of the traffic on it, above the last rung 5%" in w, w
    assert "steps [5,pause:10s]" in w and "not in spec.strategy.canary" in w, w
    assert "not recorded" not in w, w
    table = upgrade.changes_table(changes)
    assert "!! DANGER: the prescription no longer holds" in table, table
    # nothing but the hazard changed: it is new, not a regression, and yet it gates the upgrade (exit 1): the
    # candidate shows a hazard the baseline lacks, whatever its class
    assert [c.cls for c in changes if c.cls != upgrade.SAME] == [upgrade.NEW]
    assert hz.new_hazard and upgrade.new_hazards(changes) == [hz]
    assert upgrade.exit_code(changes) == upgrade.EXIT_REGRESSED
    # a baseline that said nothing of it (no row, or an inconclusive one) is missing evidence, not its absence
    no_base = upgrade.classify([r for r in base if r["lane"] != "order"], cand)
    assert not upgrade.new_hazards(no_base)
    unsure = [dict(r, verdict=INCONCLUSIVE, reason="the window closed") if r["step"] == HAZARD_STEP else r
              for r in base]
    assert not upgrade.new_hazards(upgrade.classify(unsure, cand))
    (line,) = upgrade.hazard_lines(changes)
    assert line.startswith("!! HAZARD on v1.10.2 that v1.8.2 lacks (with replicaProgressThreshold {type: Pods}): "
                           "DANGER: the prescription no longer holds"), line
    assert "order/hazard-replica-progress-threshold/peak-weight, new" in line, line


def test_a_hazard_row_where_the_prescription_holds_carries_no_danger(tmp_path):
    base = ledger_of(tmp_path, "v1.8.2", release("v1.8.2"))
    cand = ledger_of(tmp_path, "v1.2.0", release("v1.2.0", bm=None, hazard=5), sha="cd" * 32)
    hz = find(upgrade.classify(base, cand), "order", HAZARD_STEP)
    assert hz.cls == upgrade.NEW and not hz.danger and "DANGER" not in hz.words


# --- directions ---------------------------------------------------------------------------------------
def test_lower_is_better_with_tolerance_on_load_rows(tmp_path):
    def fill(exposure, p95):
        return lambda led: record_load(led, "before", exposure, p95)
    base = ledger_of(tmp_path, "v1.8.2", fill(0.31, 40.0))
    same = upgrade.classify(base, ledger_of(tmp_path, "v1.8.5", fill(0.305, 60.0)))
    assert {c.cls for c in same} == {upgrade.SAME}, upgrade.changes_table(same, include_same=True)
    worse = by_key(upgrade.classify(base, ledger_of(tmp_path, "v1.9.3", fill(0.0, 400.0))))
    # outside the noise band a load figure is changed (its words say which way), never improved or regressed:
    # informational, it never gates (tests/test_gates.py)
    better, slower = worse[("a", "before", "load.exposure.failure_ratio")], worse[("a", "before", "load.exposure.p95_ms")]
    assert better.cls == upgrade.CHANGED and "better by 0.31" in better.words and not better.gates
    assert slower.cls == upgrade.CHANGED and "worse by 360" in slower.words and not slower.gates
    assert worse[("a", "before", "load.steady.p95_ms")].cls == upgrade.SAME


def test_verdict_rows_fail_to_pass_improves_and_unverified_values_change(tmp_path):
    base = ledger_of(tmp_path, "v1.8.2", lambda led: record_abort(led, completes=False))
    cand = ledger_of(tmp_path, "v1.8.5", lambda led: record_abort(led, completes=True))
    (ch,) = upgrade.classify(base, cand)
    assert ch.cls == upgrade.IMPROVED and ch.direction == upgrade.VERDICT and ch.words == "fail -> pass"

    def unverified(observed):
        return lambda led: led.record("b", "first-deploy", "Healthy at the new revision", None, observed, UNVERIFIED)
    (ch,) = upgrade.classify(ledger_of(tmp_path, "v1.6.6", unverified("Healthy")),
                             ledger_of(tmp_path, "v1.7.1", unverified("Progressing")))
    assert ch.cls == upgrade.CHANGED and "Healthy -> Progressing" in ch.words


def test_inconclusive_on_either_side_is_never_same(tmp_path):
    def row(verdict, reason=None):
        return lambda led: led.record("a", "before", PEAK, 100, 100, verdict, reason=reason)
    base = ledger_of(tmp_path, "v1.8.2", row(PASS))
    cand = ledger_of(tmp_path, "v1.10.2", row(INCONCLUSIVE, "no partial window observed"))
    (ch,) = upgrade.classify(base, cand)
    assert ch.cls == upgrade.INCONCLUSIVE_PAIR and "no partial window observed" in ch.words
    assert upgrade.exit_code([ch]) == upgrade.EXIT_INCONCLUSIVE
    assert upgrade.exit_code(upgrade.classify(base, base)) == upgrade.EXIT_OK
    assert upgrade.exit_code(upgrade.classify(base, base), inconclusive_legs=1) == upgrade.EXIT_INCONCLUSIVE


def test_every_row_has_a_declared_direction():
    decls = upgrade.load_directions()
    assert decls[-1].direction == upgrade.VERDICT
    got = {(lane, step, a): upgrade.declaration_for(lane, step, a, decls).direction for lane, step, a in [
        ("a", "before", PEAK), ("a", "after", f"{PEAK} [prod-shaped: replicas 20, minPodsPerReplicaSet 2]"),
        ("a", "before", "load.exposure.failure_ratio"), ("abort", "whole-service-query", "load.steady.p95_ms"),
        ("order", "mid-steps", "branch order: backward search (:250) before mid-steps (:260)"),
        ("order", HAZARD_STEP, hazard_assertion(_bm("v1.9.3"))),
        ("a", "exit", "Healthy at v1 after promote --full"), ("b", "first-deploy", "Healthy at the new revision")]}
    assert list(got.values()) == [upgrade.LOWER_IS_BETTER] * 4 + [upgrade.ORDER_MUST_HOLD, upgrade.LOWER_IS_BETTER,
                                                                  upgrade.VERDICT, upgrade.VERDICT], got


@pytest.mark.parametrize("text, message", [
    ("directions:\n  - {lane: a, assertion: x, direction: higher_is_worse}\n", "is not one of"),
    ("directions:\n  - {lane: a, assertion: x, direction: verdict, colour: red}\n", "unknown keys"),
    ("directions:\n  - {lane: a, assertion: x, direction: verdict}\n", "must match every row"),
    ("directions:\n  - {assertion: '*', direction: verdict, tolerance: {pct: 3}}\n", "tolerance takes"),
])
def test_bad_declarations_are_refused(tmp_path, text, message):
    p = tmp_path / "directions.yaml"
    p.write_text(text)
    with pytest.raises(upgrade.UpgradeInputError, match=message):
        upgrade.load_directions(p)


def test_bad_rows_are_bad_input(tmp_path):
    good = ledger_of(tmp_path, "v1.8.2", lambda led: record_abort(led))
    with pytest.raises(upgrade.UpgradeInputError, match="candidate row 0: missing step"):
        upgrade.classify(good, [{"lane": "a", "assertion": PEAK, "verdict": PASS}])
    with pytest.raises(upgrade.UpgradeInputError, match="unknown verdict 'ok'"):
        upgrade.classify([dict(good[0], verdict="ok")], good)
    mixed = good + ledger_of(tmp_path, "v1.8.5", lambda led: record_lane_a(led))
    with pytest.raises(upgrade.UpgradeInputError, match="more than one controller: v1.8.2, v1.8.5"):
        upgrade.classify(mixed, good)


# --- the matrix: neighbouring tested versions -----------------------------------------------------------
def test_neighbouring_versions_of_a_merged_ledger(tmp_path):
    merged = []
    for v in ("v1.10.2", "v1.7.2", "v1.9.3", "v1.8.2", "v1.8.5"):        # runs merged in any order
        merged += ledger_of(tmp_path, v, release(v, hazard=100 if v in ("v1.9.3", "v1.10.2") else None))
    # a re-run of v1.8.5 recorded later: its row stands
    rerun = ledger_of(tmp_path / "rerun", "v1.8.5", lambda led: led.record(
        "a", "before", PEAK, 100, 50, FAIL, evidence="before.timeline.jsonl", key="peak-weight", polarity=HAZARD))
    rerun[0]["recorded_at"] = "9999-01-01T00:00:00Z"
    merged += rerun
    merged += ledger_of(tmp_path, "v1.2.0", release("v1.2.0", bm=None), sha="ef" * 32)   # not a release
    steps = upgrade.classify_neighbours(merged)
    assert [(s.from_column, s.to_column) for s in steps] == [
        ("v1.7.2", "v1.8.2"), ("v1.8.2", "v1.8.5"), ("v1.8.5", "v1.9.3"), ("v1.9.3", "v1.10.2")]
    summary = {(s.from_column, s.to_column): {k: v for k, v in s.counts().items() if v and k != upgrade.SAME}
               for s in steps}
    assert summary == {("v1.7.2", "v1.8.2"): {}, ("v1.8.2", "v1.8.5"): {upgrade.IMPROVED: 1},
                       ("v1.8.5", "v1.9.3"): {upgrade.REGRESSED: 1, upgrade.NEW: 1}, ("v1.9.3", "v1.10.2"): {}}, summary
    # v1.7.2 -> v1.8.2: the branch lines moved (217 -> 245), the behaviour did not
    first = by_key(steps[0].changes)
    eos = first[("order", "end-of-steps", "branch order: backward search before end-of-steps")]
    assert (eos.cls, eos.baseline_assertion, eos.candidate_assertion) == (
        upgrade.SAME, "branch order: backward search (:217) before end-of-steps (:233)",
        "branch order: backward search (:245) before end-of-steps (:261)")
    new = [c for c in steps[2].changes if c.cls == upgrade.NEW]
    assert [c.step for c in new] == [HAZARD_STEP] and new[0].danger
    assert json.loads(json.dumps([c.as_dict() for c in steps[2].changes]))   # serialisable for --json


def test_changes_table_lists_changes_first_with_counts(tmp_path):
    base = ledger_of(tmp_path, "v1.8.2", release("v1.8.2"))
    cand = ledger_of(tmp_path, "v1.10.2", release("v1.10.2", mid=75, hazard=100))
    table = upgrade.changes_table(upgrade.classify(base, cand))
    lines = table.splitlines()
    assert lines[0].startswith("v1.8.2 -> v1.10.2: 1 regressed, 0 inconclusive, 1 new, 0 improved, 0 changed, "
                               "0 gone, "), lines[0]
    assert lines[1].split()[:6] == ["class", "lane", "step", "baseline", "candidate", "assertion"]
    assert lines[2].startswith("regressed") and "mid-steps" in lines[2] and "25" in lines[2] and "75" in lines[2]
    assert lines[4].split()[:5] == ["new", "order", HAZARD_STEP, "n/a", "100"], lines[4]
    assert lines[-1].endswith("same, not listed)")
    full = upgrade.changes_table(upgrade.classify(base, cand), include_same=True)
    assert "not listed" not in full and full.count("\nsame ") > 5


def test_a_row_on_one_side_only_is_new_or_gone(tmp_path):
    base = ledger_of(tmp_path, "v1.8.2", lambda led: (record_lane_a(led), record_abort(led)))
    cand = ledger_of(tmp_path, "v1.8.5", lambda led: record_lane_a(led))          # a leg without lane abort
    gone = find(upgrade.classify(base, cand), "abort", "rollback-window")
    assert gone.cls == upgrade.GONE and gone.candidate is None and gone.words.endswith("candidate: no row")
    new = find(upgrade.classify(cand, base), "abort", "rollback-window")
    assert new.cls == upgrade.NEW and new.baseline is None and not new.danger
    assert "no row" in upgrade.changes_table([new])


# --- the command and the report, on recorded run folders -------------------------------------------------
def _series(peak: int) -> dict:
    return {"title": "before", "t0_wall": 0.0, "canary_weight": [[0.0, 0], [4.1, peak], [20.0, 0]],
            "stable_weight": [[0.0, 100]], "canary_available": [[0.0, 0, 2], [10.0, 1, 2], [18.0, 2, 2]],
            "partial": [[0.0, 18.0]], "exposure": [[4.1, 18.0]] if peak > 50 else [], "markers": [[0.0, "rollback"]],
            "summary": {"peak_canary_weight_while_partial": peak, "partial_window_observed": True,
                        "exposure_seconds": 13.9 if peak > 50 else 0.0}}


def _one_run_folder(tmp_path: Path) -> Path:
    """One run folder with both controllers' rows (as `drills run --controller v1.8.2,v1.10.2` writes it), each
    side's lane A timelines' series beside the rows that name them."""
    run = tmp_path / "reports" / "20261201T000000Z-1"
    for version, kw in (("v1.8.2", {}), ("v1.10.2", {"before": 50, "hazard": 100})):
        led = Ledger(run, run.name, "embedded", version)
        release(version, **kw)(led)
    # each side's lane A timelines apart, their series beside them (the paired picture draws from them)
    rows = read_rows(run / "ledger.json")
    for r in rows:
        if r["lane"] == "a" and r.get("evidence") in ("before.timeline.jsonl", "after.timeline.jsonl"):
            side = run / r["controller_version"]
            side.mkdir(exist_ok=True)
            step = r["step"]
            peak = 50 if (r["controller_version"], step) == ("v1.10.2", "before") else (100 if step == "before" else 5)
            (side / f"{step}.series.json").write_text(json.dumps(_series(peak)))
            r["evidence"] = f"{r['controller_version']}/{step}.timeline.jsonl"
    (run / "ledger.json").write_text(json.dumps(rows))
    for r in rows:                    # a pass needs its evidence: every file a row names, whole
        write_evidence(run / r["evidence"]) if r.get("evidence") else None
    return write_run_json(run)


def write_run_json(run: Path) -> Path:
    """run.json as `drills run` writes it: a leg per (controller, lane) of the rows, each ended with pytest exit 0."""
    legs_ = sorted({f"{r['controller_version']}/{r['lane']}/stage" for r in read_rows(run / "ledger.json")})
    (run / "run.json").write_text(json.dumps({"run_id": run.name, "plan_digest": "p1", "all_legs": legs_,
                                              "legs": [{"id": i, "rc": 0, "error": None} for i in legs_]}))
    return run


def write_evidence(path: Path) -> Path:
    """A row's evidence file as the lanes leave it: a timeline closed by the recorder's END record, else JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".timeline.jsonl"):
        path.write_text('{"seq":1,"type":"ADDED","kind":"Rollout"}\n'
                        + json.dumps({"seq": 2, "type": "END", "kind": "Recorder", "obj": {"complete": True}}) + "\n")
    else:
        path.write_text("{}\n")
    return path


def _identical_run(tmp_path: Path, run: Path) -> Path:
    """The baseline's rows again as another release's (v1.8.5): a candidate identical to the baseline (the
    recorded run folder copied, its evidence with it)."""
    out = tmp_path / "identical"
    shutil.copytree(run, out)
    # the copy is a run of its own: its rows name its run id (a row naming another run's is another run's evidence)
    rows = [dict(r, run_id=out.name) for r in read_rows(run / "ledger.json") if r["controller_version"] == "v1.8.2"]
    (out / "ledger.json").write_text(json.dumps(rows + [dict(r, controller_version="v1.8.5") for r in rows]))
    return write_run_json(out)


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_upgrade_check_on_recorded_runs_writes_the_change_table_and_both_timelines(tmp_path):
    run = recorded = _one_run_folder(tmp_path)
    before = _tree(run)
    r = subprocess.run([sys.executable, "-m", "drills", "upgrade-check", "--from", "v1.8.2", "--to", "v1.10.2",
                        "--runs", str(run), "--lanes", "a,order,abort"], capture_output=True, text=True, timeout=300,
                       cwd=str(config.project_root()), env={**os.environ, "DRILLS_REPORTS": str(tmp_path / "reports")})
    # improved and new, nothing regressed, but the new hazard gates the upgrade and the first line names it
    assert r.returncode == 1, r.stdout + r.stderr
    first = r.stdout.splitlines()
    assert first[0].startswith("!! HAZARD on v1.10.2 that v1.8.2 lacks (with replicaProgressThreshold "
                               "{type: Pods}): DANGER: the prescription no longer holds"), first[:3]
    assert first[1] == "prescription holds on v1.8.2: yes (BEFORE 100 on 1 of 2 pods → AFTER 5; exit Healthy)", first
    assert first[2] == ("prescription holds on v1.10.2: yes (BEFORE 50 → AFTER 5; exit Healthy), except with "
                        "replicaProgressThreshold {type: Pods} (100)"), first
    assert "v1.8.2 -> v1.10.2:" in r.stdout and "improved" in r.stdout, r.stdout
    assert "!! DANGER: the prescription no longer holds" in r.stdout, r.stdout
    assert _tree(run) == before                            # the input run folder is left exactly as it was
    run = Path(r.stdout.split("run folder: ", 1)[1].split()[0])
    assert run.parent == tmp_path / "reports" and json.loads((run / "run.json").read_text())["classified_from"] == \
        [str(tmp_path / "reports" / "20261201T000000Z-1")]
    doc = json.loads((run / "upgrade.json").read_text())
    assert doc["counts"]["new"] == 1 and doc["counts"]["improved"] == 1 and doc["counts"]["regressed"] == 0, doc
    assert doc["exit"] == 1 and list(doc)[:2] == ["headlines", "new_hazards"] and len(doc["new_hazards"]) == 1
    same = subprocess.run([sys.executable, "-m", "drills", "upgrade-check", "--from", "v1.8.2", "--to", "v1.8.5",
                           "--runs", str(_identical_run(tmp_path, recorded)), "--lanes", "a,order,abort"],
                          capture_output=True, text=True, timeout=300, cwd=str(config.project_root()),
                          env={**os.environ, "DRILLS_REPORTS": str(tmp_path / "reports")})
    assert same.returncode == 0, same.stdout + same.stderr      # a candidate identical to the baseline
    assert not same.stdout.startswith("!!") and "0 new" in same.stdout, same.stdout
    md = (run / "report.md").read_text()
    top = md.index("## Upgrade check: v1.8.2 → v1.10.2")
    assert top < md.index("## v1.8.2 · lane a"), md[:2000]        # the change table comes first
    pic = run / "upgrade" / "a-before.png"
    assert pic.is_file() and pic.stat().st_size > 5000 and "upgrade/a-before.png" in md
    assert not (run / "upgrade" / "a-after.png").exists()        # 'after' did not change: no picture of it

    bad = subprocess.run([sys.executable, "-m", "drills", "upgrade-check", "--from", "v1.8.2", "--to", "v1.10.2",
                          "--runs", str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=300,
                         cwd=str(config.project_root()))
    assert bad.returncode == 2 and "not a run folder" in bad.stderr, bad.stderr


def test_the_matrix_shows_what_changed_from_one_release_to_the_next(tmp_path):
    run = _one_run_folder(tmp_path)
    _, md_path = write_matrix([run], tmp_path / "reports")
    md = md_path.read_text()
    sec = md[md.index("## What changed from one tested release to the next"):]
    line = next(x for x in sec.splitlines() if "v1.8.2 → v1.10.2" in x)
    assert "1 improved" in line and "1 new" in line and "DANGER" in line, line
    # one matrix line per branch-order assertion, whatever lines each version names
    assert md.count("| order/end-of-steps/branch order: backward search before end-of-steps |") == 1, md


def test_every_registered_lane_sorts_in_registry_order(tmp_path):
    """The change table lists changes by class, then in the registry's lane order (lane alert included)."""
    keys = list(lanes.REGISTRY)
    assert "alert" in keys

    def fill(verdict):
        def go(led):
            for key in reversed(keys):
                led.record(key, "step", f"{key} holds", "ok", "ok" if verdict == PASS else "not ok", verdict,
                           evidence="e.json", key="holds")
        return go
    rows = {}
    for version, verdict in (("v1.8.2", PASS), ("v1.10.2", FAIL)):
        led = Ledger(tmp_path / version, version, "embedded", version)
        fill(verdict)(led)
        rows[version] = read_rows(led.path)
    changes = upgrade.classify(rows["v1.8.2"], rows["v1.10.2"])
    ordered = [c.lane for c in sorted(changes, key=upgrade._sort_key)]
    assert ordered == keys
    table = upgrade.changes_table(changes).splitlines()
    assert [line.split()[1] for line in table[2::2]] == keys, table
    # a lane no longer registered sorts after every registered one
    led = Ledger(tmp_path / "old", "old", "embedded", "v1.10.2")
    led.record("retired", "step", "retired holds", "ok", "not ok", FAIL, evidence="e.json", key="holds")
    extra = upgrade.classify(rows["v1.8.2"] + [dict(rows["v1.8.2"][0], lane="retired", id="retired/step/holds",
                                                    assertion="retired holds")],
                             rows["v1.10.2"] + read_rows(led.path))
    assert [c.lane for c in sorted(extra, key=upgrade._sort_key)] == keys + ["retired"]
