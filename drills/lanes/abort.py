"""Lane abort — "the rollback that aborts itself" (brief §6, §13), one fresh Rollout per outcome.

Each outcome: mesh emulator + real Prometheus on 127.0.0.1, AnalysisTemplate with Argo's prometheus provider
(interval shortened, failureLimit 2 and `result[0] >= 0.001` as in the seed) -> deploy v1 -> Locust load ->
deploy v2 (healthy: its analysis passes) -> v2, now the stable, breaks (injected errors) -> GitOps rollback to v1.

- whole-service query, no rollbackWindow: the rollback's own AnalysisRun fails, the Rollout is aborted and
  traffic returns to the broken release;
- per-revision query (revision = podTemplateHashValue Latest): the same rollback completes;
- whole-service query with rollbackWindow (revisions 3): no analysis, the rollback completes (v1.7.1, whose
  reconcileAnalysisRuns has no rollbackWindow condition, runs the analysis: its expectation says ``analysed-*``).

A self-abort outcome counts only if the analysis took at least failureLimit + 1 measurements while the injected
error rate was above its threshold (DESIGN.md §6); under a rollbackWindow there are no measurements, and the
whole-service error rate must be above the threshold when the rollback was sent.

The three outcomes need nothing from each other: they start together at the first step and run side by side
(drills.drill.together), each with its own namespace, mesh emulator, Prometheus and load; each step records its
outcome's rows once that outcome is observed.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path

from ..traffic import load
from ..cluster.namespaces import drop_namespace
from ..record.ledger import FAIL, INCONCLUSIVE, PASS, UNVERIFIED
from ..routers import ISTIO
from .abort_drill import STEPS, AbortObservation, SelfAbortDrill, fmt
from .base import Runbook, step


class LaneAbort(Runbook):
    key = "abort"
    estimate_s = 120.0
    title = "the rollback that aborts itself: whole-service query, per-revision query, rollbackWindow"
    extras = ("prometheus",)
    probes_leave = ", their mesh emulators, Prometheus and load (these end with the leg)"
    probes_stop_s = 40.0      # a probe's unwinding stops its load (Locust writes its stats: up to 35 s), Prometheus, mesh

    @cached_property
    def fx(self) -> dict:
        """fixtures/lanes/abort/drill.yaml: the Rollout, the analysis, the load, the three outcomes."""
        return self.data("drill.yaml")

    @cached_property
    def observations(self) -> dict[str, AbortObservation]:
        """What each outcome observed (the tests assert on it beside the rows)."""
        return {}

    def _run_outcome(self, name: str, ns: str, reached) -> AbortObservation:
        try:
            return SelfAbortDrill(self.ctx.api, self.ctx.cluster, ns, name, Path(self.ctx.evidence_dir),
                                  self.ctx.name, self.fx, log=self.together().lines_of(name, f"[{name}] ")).run()
        finally:
            drop_namespace(self.ctx.api, ns)

    def _outcome(self, name: str) -> list[dict]:
        """One outcome on a fresh Rollout in a namespace of its own; the three run side by side (each with its own
        mesh emulator, Prometheus and load), started together at the first step."""
        self.start_in_namespaces("abort", STEPS, self._run_outcome)
        obs = self.probes.wait(name)
        self.observations[name] = obs
        return outcome_rows(self, obs, self.expected(name))


    @step()
    def whole_service_query(self) -> list[dict]:
        return self._outcome("whole-service-query")

    @step()
    def per_revision_query(self) -> list[dict]:
        return self._outcome("per-revision-query")

    @step()
    def rollback_window(self) -> list[dict]:
        return self._outcome("rollback-window")


def _precondition_reason(obs: AbortObservation) -> str | None:
    if not obs.complete:
        return f"timeline incomplete: {'; '.join(obs.incomplete_reasons)}"
    if obs.v1_scale_down_deadline:
        return (f"the revived ReplicaSet still carried a scale-down deadline ({obs.v1_scale_down_deadline}) at the "
                f"rollback: the controller skips analysis for that reason, not for the one under test")
    return None


def _counts_reason(obs: AbortObservation) -> str | None:
    need = obs.failure_limit + 1
    pre = _precondition_reason(obs)
    if pre:
        return pre
    if obs.measured_above < need:
        return (f"only {obs.measured_above} measurement(s) were taken while the injected error rate was above "
                f"{obs.threshold} (< failureLimit + 1 = {need}): the outcome does not count")
    return None


def outcome_rows(lane: "LaneAbort", obs: AbortObservation, expect: str | None) -> list[dict]:
    """Ledger rows of one outcome; verdicts derive from the observation, never from the expectation alone."""
    rows = []
    ev = obs.evidence
    need = obs.failure_limit + 1
    common = {"query": obs.query, "rollback_window": obs.rollback_window, "revived_replicaset": obs.hash_v1,
              "broken_replicaset": obs.hash_v2, "injected_error_rate": obs.injected_error_rate,
              "analysis_runs": obs.runs, "run_phases": obs.run_phases, "measurements": obs.measurements,
              "series_text": obs.summary(), "timeline": Path(obs.timeline).name, "load_phases": obs.load_phases,
              "load_note": load.EMULATED_NOTE}

    def verdict(ok: bool, reason: str | None) -> tuple[str, str | None]:
        if reason:
            return INCONCLUSIVE, reason
        if expect is None:
            return UNVERIFIED, lane.no_expectation
        return (PASS if ok else FAIL), None

    if obs.step == "whole-service-query":
        reason = _counts_reason(obs)
        ok = obs.run_phase == "Failed" and obs.failed_above >= need
        v, r = verdict(ok, reason)
        rows.append(lane.row(
            obs.step, "the rollback's AnalysisRun (whole-service error rate, no revision filter) fails: "
                            f">= failureLimit + 1 = {need} failed measurements while the broken stable's error "
                            "rate is above the threshold",
            f"Failed, >= {need} failed measurements above threshold",
            f"{obs.run_phase}, {len(obs.measurements)} measurements, {obs.failed_above} failed above threshold",
            v, evidence=ev, reason=r, key="analysis-fails", **common))
        ok = obs.aborted and obs.final_rollout.get("stableRS") == obs.hash_v2 and not obs.healthy_at_v1
        v, r = verdict(ok, reason)
        rows.append(lane.row(
            obs.step, "the Rollout is aborted by its own AnalysisRun; the broken release stays stable",
            f"abort=true, stableRS={obs.hash_v2} (broken)",
            f"abort={str(obs.aborted).lower()}, phase={obs.final_rollout.get('phase')}, "
            f"stableRS={obs.final_rollout.get('stableRS')}", v, evidence=ev, reason=r,
            message=obs.final_rollout.get("message"), key="aborted", **common))
        ok = obs.final_canary_weight == 0 and obs.aborted
        after = obs.load_phases.get("after") or {}
        v, r = verdict(ok, reason)
        rows.append(lane.row(
            obs.step, f"traffic returns to the broken release: {ISTIO.route_kind} canary weight back to 0",
            "canary weight 0 after the abort", f"canary weight {obs.final_canary_weight}; weights {obs.canary_weights}; "
            f"5xx ratio after: {fmt(after.get('failure_ratio'))}", v, evidence=ev, reason=r, key="weight-back",
            **common))
    elif obs.step == "per-revision-query":
        reason = _counts_reason(obs)
        failed = sum(1 for m in obs.measurements if m["failed"])
        ok = obs.run_phase in ("Successful", "Running") and failed < need and not obs.aborted
        v, r = verdict(ok, reason)
        rows.append(lane.row(
            obs.step, "the rollback's AnalysisRun (per-revision error rate, revision = "
                            "podTemplateHashValue Latest) does not fail although it measured >= failureLimit + 1 "
                            "times while the broken stable's error rate was above the threshold",
            f"not Failed, < {need} failed measurements, >= {need} measurements above threshold",
            f"{obs.run_phase}, {len(obs.measurements)} measurements ({obs.measured_above} above threshold), "
            f"{failed} failed; the rolled-back revision served {obs.canary_requests} requests",
            v, evidence=ev, reason=r, canary_requests=obs.canary_requests, key="analysis-passes", **common))
    else:   # rollback-window
        reason = _precondition_reason(obs)
        if reason:
            pass
        elif obs.whole_rate_at_rollback is None or obs.whole_rate_at_rollback < obs.threshold:
            reason = (f"the whole-service error rate at the rollback was {obs.whole_rate_at_rollback} (< "
                      f"{obs.threshold}): an analysis would not have failed, the outcome does not count")
        # `analysed-*`: a version whose reconcileAnalysisRuns has no rollbackWindow condition (v1.7.1) runs the
        # rollback's analysis like any other
        analysed = str(expect or "").startswith("analysed")
        ok = bool(obs.runs) == analysed
        v, r = verdict(ok, reason)
        assertion, expected = (
            ("a rollback inside rollbackWindow still creates an AnalysisRun (this version does not skip analysis for "
             "it) while the whole-service error rate is above the threshold",
             "an AnalysisRun for the rolled-back revision") if analysed else
            ("a rollback inside rollbackWindow creates no AnalysisRun (analysis skipped) while the whole-service "
             "error rate is above the threshold", "no AnalysisRun for the rolled-back revision"))
        rows.append(lane.row(
            obs.step, assertion, expected,
            f"{len(obs.runs)} AnalysisRun(s) {obs.runs}; whole-service error rate at the rollback "
            f"{fmt(obs.whole_rate_at_rollback)}", v, evidence=ev, reason=r,
            window_evidence=obs.window_evidence, controller_log=obs.controller_skip_lines,
            rates_during_rollback=obs.rates_during_rollback, key="no-analysis", **common))
    if obs.step != "whole-service-query":     # the two outcomes in which the rollback must complete
        v, r = verdict(obs.healthy_at_v1 and not obs.aborted, reason)
        rows.append(lane.row(
            obs.step, "the rollback completes: Healthy at the rolled-back revision",
            f"Healthy, stableRS={obs.hash_v1}, abort=false",
            f"{obs.final_rollout.get('phase')}, stableRS={obs.final_rollout.get('stableRS')}, "
            f"abort={str(obs.aborted).lower()}", v, evidence=ev, reason=r, key="completes", **common))
    return rows
