"""Lane A — the live rollback drill (brief §14.2) as a runbook over one DrillRollout: two probes and an exit.

deploy v1 -> update to v2 and let it promote -> wait until v1 is scaled to 0
-> BEFORE: roll back to v1 inside rollbackWindow, observe the last setWeight (100) on a partial ReplicaSet
-> cut the steps to [5, pause 10s] -> deploy v2 again, promote, wait for scale-down
-> AFTER: roll back, observe 5 -> exit: abort while partial, then promote --full -> the load users felt.
"""
from __future__ import annotations

from pathlib import Path

from ..record import timeline
from ..record.answer import exposed, peak_fact
from ..drill.kit import DrillRollout, Observation
from ..record.ledger import FAIL, HAZARD, HOLDS, INCONCLUSIVE, PASS
from ..traffic.phases import PhasedLoad
from ..kube.rollout import healthy_at
from ..drill.shapes import RolloutSpec
from ..core.steps import last_set_weight, steps_text
from ..core.wait import WaitTimeout
from .base import LaneContext, Runbook, StepFailed, step

ASSERT_PEAK = "peak canary weight while the revived ReplicaSet is below its desired count"
# evidence windows
AFTER_EVIDENCE_S = 5.0       # after the first weight on the partial ReplicaSet: room for the controller to write more
ABORT_SETTLE_S = 1.0         # between the abort and reading the weight in force (the exit's starting point)
# the controller's answer to an abort can be several writes (on nginx: weight 0, the abort cleared, the weight back):
# the exit starts once they paused for ABORT_SETTLE_S, at most this long after the abort
ABORT_QUIET_CAP_S = 5.0


class LaneA(Runbook):
    key = "a"
    estimate_s = 150.0
    title = "live rollback: BEFORE 100 on a partial ReplicaSet, cut the final setWeight, AFTER 5, exit"
    variants = ("stage", "prod")
    routers = ("istio", "nginx")       # the backward search is the controller's, whatever routes the traffic

    def __init__(self, ctx: LaneContext):
        super().__init__(ctx)
        self.fx = self.data(f"{ctx.variant}.yaml")
        spec, _ = RolloutSpec.from_fixture(self.data_dir() / f"{ctx.variant}.yaml",
                                           availability_control=ctx.options.get("availability_control", True),
                                           rollback_via=ctx.options.get("rollback_via", "gitops"),
                                           router=ctx.router)
        self.drill = DrillRollout(ctx.api, ctx.namespace, spec, Path(ctx.evidence_dir) / f"lane-a-{ctx.variant}",
                                  log=ctx.log, controller_version=ctx.name, audit_log=ctx.audit_log)
        self.load: PhasedLoad | None = None
        self.load_rows: list[dict] = []

    # --- plumbing --------------------------------------------------------------------------------------
    def _assertion(self, text: str) -> str:
        return text if self.ctx.variant == "stage" else f"{text} [prod-shaped: replicas {self.fx['replicas']}, " \
                                                        f"minPodsPerReplicaSet {self.fx['minPodsPerReplicaSet']}]"

    def _key(self, key: str) -> str:
        """The assertion's key: the prod-shaped variant's rows are ids of their own."""
        return key if self.ctx.variant == "stage" else f"{key}.{self.ctx.variant}"

    def _fact(self, text: str | None) -> str | None:
        return text if text is None or self.ctx.variant == "stage" else f"prod-shaped {text}"

    def close(self) -> None:
        if self.load:
            self.load.close()
        self.drill.cleanup()

    def _peak_row(self, step_name: str, obs: Observation) -> dict:
        """BEFORE is the incident reproduced (hazard: a weight above the share of pods that carry it); AFTER is the
        prescription holding (the weight while partial no higher than the last rung of the cut steps)."""
        verdict, reason = obs.verdict(self.expected(step_name), self.no_expectation)
        d = self.drill
        peak = obs.peak_canary_weight_while_partial
        if step_name == "before":
            polarity, shows = HAZARD, exposed(obs.weights_while_partial)
        else:
            polarity, shows = HOLDS, None if peak is None else peak <= last_set_weight(d.spec.steps)
        return self.row(step_name, self._assertion(ASSERT_PEAK), self.expected(step_name),
                        peak, verdict, evidence=obs.timeline, reason=reason, key=self._key("peak-weight"),
                        polarity=polarity, shows=shows,
                        fact=self._fact(peak_fact(step_name.upper(), peak, obs.weights_while_partial)),
                        variant=self.ctx.variant, steps=steps_text(d.spec.steps), rollback_via=d.spec.rollback_via,
                        partial_window_observed=obs.partial_window_observed, exposure_seconds=obs.exposure_seconds,
                        window_evidence=obs.window_evidence, weights_while_partial=obs.weights_while_partial,
                        series=Path(obs.series).name, series_text=obs.describe(), revived_replicaset=obs.revived_hash,
                        availability_control=d.spec.availability_control)

    def _load_phases(self, step_name: str, settled: bool = False, exit_mark: str | None = None) -> dict | None:
        if not self.load or not self.load.run:
            return None
        rows, extra = self.load.phases(self.ctx.ledger, step_name, self.drill.recording.records(),
                                       self.drill.hash_v1, settled=settled, exit_mark=exit_mark)
        self.load_rows.extend(rows)
        return extra

    # --- the runbook ------------------------------------------------------------------------------------
    @step()
    def deploy_v1(self) -> None:
        self.drill.deploy_v1()
        if self.ctx.cluster is not None and self.ctx.variant == "stage":
            # a user-built controller's load figures are observations: no threshold of a release fails them
            self.load = PhasedLoad(self.ctx.cluster, self.drill.ns, self.drill.name, self.drill.evidence_dir / "load",
                                   lane=self.key, router=self.drill.spec.router,
                                   judged=self.no_expectation if self.ctx.options.get("user_built") else None)

    @step("deploy_v1")
    def deploy_v2(self) -> None:
        self.drill.deploy_v2()

    @step("deploy_v2")
    def wait_v1_scaled_down(self) -> None:
        self.drill.wait_scaled_to_zero(self.drill.hash_v1)

    @step("wait_v1_scaled_down")
    def before(self) -> dict:
        if self.load:
            self.load.start("before")
        self.drill.start_rollback("before")
        stopped = None
        try:
            self.drill.wait_settled()
        except WaitTimeout as e:
            stopped = f"the BEFORE rollback did not settle: {e}"
        finally:
            extra = self._load_phases("before", settled=True)
            self.drill.release_holds()
            obs = self.drill.recording.finish(extra, stopped_early=stopped)
        return self._peak_row("before", obs)

    @step("before")
    def cut_steps(self) -> dict:
        steps = self.fx["steps_after"]
        self.drill.cut_steps(steps)
        ro = self.drill.ro.get(self.drill.name)
        observed = ro["spec"]["strategy"]["canary"]["steps"]
        ok = observed == steps and ro["status"].get("phase") == "Healthy"
        seen = self.observation(f"{self.ctx.variant}-cut-steps", {  # the Rollout as read back after the cut
            "resourceVersion": ro["metadata"].get("resourceVersion"), "generation": ro["metadata"].get("generation"),
            "steps": observed, "status": {k: ro["status"].get(k) for k in ("phase", "observedGeneration",
                                                                             "currentStepIndex", "stableRS")}})
        return self.row("cut-steps", self._assertion("steps after the cut (final setWeight removed), Rollout Healthy"),
                        steps_text(steps), steps_text(observed) + f" ({ro['status'].get('phase')})",
                        PASS if ok else FAIL, evidence=seen, key=self._key("steps-cut"), variant=self.ctx.variant)

    @step("cut_steps")
    def redeploy_v2(self) -> None:
        self.drill.deploy_v2()
        self.drill.wait_scaled_to_zero(self.drill.hash_v1)

    @step("redeploy_v2")
    def after(self) -> dict:
        d = self.drill
        if self.load:
            self.load.start("after")
        rec = d.start_rollback("after")
        d.wait_partial_weight()
        d.observe_for(min(AFTER_EVIDENCE_S, d.spec.hold_seconds / 3), "room for the controller to write more")
        return self._peak_row("after", rec.observe())

    @step("after")
    def exit(self) -> list[dict]:
        """Abort the AFTER rollback while the revived ReplicaSet is partial (the incident posture), then
        promote --full.  The controller may not act on the abort while the ReplicaSet is partial (Istio's
        subset switch waits for full availability): what it did is recorded, not assumed."""
        d, rec = self.drill, self.drill.recording
        res = d.ro.abort(d.name)
        rec.mark("abort", res)
        d.observe_for(ABORT_SETTLE_S, "the abort reaching the controller")
        rec.wait_quiet("the abort", ABORT_SETTLE_S, ABORT_QUIET_CAP_S - ABORT_SETTLE_S)
        now = rec.derive()
        partial_at_exit = bool(now.partial) and now.partial[-1][1] is None
        weight_after_abort = now.canary_weight[-1][1] if now.canary_weight else None
        res = d.ro.promote(d.name, full=True)
        rec.mark("promote --full", res)
        try:
            d.ro.wait(d.name, healthy_at(d.hash_v1), d.settle_timeout(), progress=d.progress)
            healthy_ok, healthy_err = True, None
        except WaitTimeout as e:
            healthy_ok, healthy_err = False, str(e)
        if healthy_ok:
            d.wait_settled(timeout=60)
        extra = self._load_phases("after", settled=True, exit_mark="abort")
        d.release_holds()
        obs = rec.finish(extra)
        ex = timeline.exit_analysis(timeline.load(Path(obs.timeline)), d.hash_v1, replicas=d.spec.replicas)
        return exit_rows(self, obs, ex, res, partial_at_exit, weight_after_abort, healthy_ok, healthy_err,
                         variant=self.ctx.variant, label=self._assertion, key=self._key, fact=self._fact)

    @step("exit")
    def load_felt(self) -> list[dict]:
        """The per-phase load rows of BEFORE and AFTER (the stage lane on the embedded cluster runs load)."""
        if self.load is None:
            if self.ctx.variant == "stage" and self.ctx.cluster is not None:
                raise StepFailed("no load ran during the stage lane")
            return []
        phases = {(r["step"], r["assertion"]) for r in self.load_rows}
        for s in ("before", "after"):
            if (s, "load.exposure.failure_ratio") not in phases:
                raise StepFailed(f"no load was measured in the {s} exposure phase")
        return self.load_rows


def exit_rows(lane: Runbook, obs, ex: dict, res, partial_at_exit: bool, weight_after_abort, healthy_ok: bool,
              healthy_err: str | None, variant: str, label=lambda text: text, window_missed: str | None = None,
              key=lambda k: k, fact=lambda text: text) -> list[dict]:
    """The exit's rows (embedded and live): abort cleared by promote --full, the weight never above its value then
    until the revived ReplicaSet is fully available, Healthy at v1; inconclusive when the posture was not reached.
    Each is evidence that the prescription's exit holds (polarity holds)."""
    ev = obs.timeline
    reason = None
    if res is None:
        reason = "promote --full had nothing to do: the rollback had already completed"
    elif window_missed:
        reason = window_missed
    elif not partial_at_exit:
        reason = "the revived ReplicaSet was no longer partial when promote --full was sent"
    elif not obs.complete:
        reason = f"timeline incomplete: {'; '.join(obs.incomplete_reasons)}"
    details = dict(variant=variant, weight_after_abort=weight_after_abort, partial_at_promote_full=partial_at_exit,
                   weights_after_promote_full=ex["weights_after"], abort_seen_by_controller=ex["abort_effective"])

    def verdict(ok: bool) -> str:
        return INCONCLUSIVE if reason else (PASS if ok else FAIL)

    cap = ex["max_weight_until_available"]
    cleared = None if ex["abort_after_promote_full"] is None else ex["abort_after_promote_full"] is False
    return [
        # None: no Rollout status after promote --full in the recording, so nothing to judge (never a fail)
        lane.row("exit", label("promote --full clears abort"), False, ex["abort_after_promote_full"],
                 INCONCLUSIVE if ex["abort_after_promote_full"] is None and not reason
                 else verdict(ex["abort_after_promote_full"] is False), evidence=ev,
                 reason=reason or (None if ex["abort_after_promote_full"] is not None else
                                   "the recording has no Rollout status after promote --full"),
                 key=key("abort-cleared"), polarity=HOLDS, shows=cleared, **details),
        lane.row("exit", label("weight never above its value at promote --full until the revived ReplicaSet is "
                               "fully available"),
                 f"<= {ex['weight_at_promote_full']}", cap,
                 INCONCLUSIVE if reason or cap is None else (PASS if cap <= ex["weight_at_promote_full"] else FAIL),
                 evidence=ev, reason=reason or (None if cap is not None else
                                                "the revived ReplicaSet never became fully available in the recording"),
                 key=key("weight-capped"), polarity=HOLDS,
                 shows=None if cap is None else cap <= ex["weight_at_promote_full"],
                 series_text=f"canary weights after promote --full: {ex['weights_after']}", **details),
        lane.row("exit", label("Healthy at v1 after promote --full"), "Healthy, stableRS = v1",
                 "Healthy, stableRS = v1" if healthy_ok else healthy_err, verdict(healthy_ok), evidence=ev,
                 reason=reason, key=key("healthy"), polarity=HOLDS, shows=healthy_ok,
                 fact=fact("exit Healthy" if healthy_ok else "exit not Healthy"), **details),
    ]
