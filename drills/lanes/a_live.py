"""Lane A's live variant: the same runbook on an existing stage Rollout, natural timing, under the live gate
(drills.run.live owns the gate, the journal, the lease and the signals; this module only runs the steps).

BEFORE: roll back (the application container's image reverted in the spec), observe the last setWeight on
the partial ReplicaSet -> cut the final setWeight 100 -> redeploy the current image (only the application
container changes; the ReplicaSet then running must be that template) -> AFTER: roll back again, observe ->
EXIT: redeploy, roll back once more, send the abort while the revived ReplicaSet is partly available (acted on
from the watch of its available count) once the controller's non-zero weight is in force on it, then
promote --full: the weight never rises above its value at that moment until the ReplicaSet is fully available, and
the Rollout ends Healthy at the rolled-back revision.
"""
from __future__ import annotations

from pathlib import Path

from ..kube.k8s import client

from ..record import timeline
from ..record.answer import exposed, peak_fact
from ..drill.kit import DrillRollout, Observation
from ..record.ledger import FAIL, HAZARD, HOLDS, PASS
from ..traffic.phases import PhasedLoad
from ..core.podtemplate import container_images, template_differences
from ..kube.rollout import HASH_LABEL, Predicate, healthy_at
from ..core.steps import last_set_weight
from ..core.wait import WaitTimeout
from .a import ASSERT_PEAK, exit_rows
from .base import LaneContext, Runbook, StepFailed, step


class LiveLaneA(Runbook):
    key = "a"
    title = "live rollback on a stage Rollout (natural timing)"

    def __init__(self, ctx: LaneContext, drill: DrillRollout, steps: list, cut: list, template_v1: dict,
                 load: PhasedLoad | None = None, template_before: dict | None = None,
                 other_differences: list[str] | None = None):
        super().__init__(ctx)
        self.drill, self.steps, self.cut, self.template_v1, self.load = drill, steps, cut, template_v1, load
        # the pod template before the drill: what every template the drill sends is compared with
        self.template_before = template_before if template_before is not None else \
            drill.ro.get(drill.name)["spec"]["template"]
        self.other_differences = list(other_differences or [])

    def _rollback(self, label: str) -> Observation:
        d = self.drill
        changed = template_differences(self.template_before, self.template_v1, d.spec.container)
        if changed:         # never sent: the rollback reverts the application container's image, nothing else
            raise StepFailed(f"the {label} rollback template differs from the template before the drill in more "
                             f"than container {d.spec.container}'s image ({'; '.join(changed)}); nothing was sent")
        if self.load:
            self.load.start(label)
        rec = d.record(label)
        d.rollback(self.template_v1)
        if d.hash_v1 is None:       # a template no ReplicaSet ran (other differences left as they are): a new one
            stable = d.hash_v2
            ro = d.ro.wait(d.name, Predicate(f"a ReplicaSet other than {stable} for the rolled-back template",
                                             lambda o: (o.get("status") or {}).get("currentPodHash") not in
                                             (None, stable)), d.settle_timeout(), progress=d.progress)
            d.hash_v1 = ro["status"]["currentPodHash"]
        stopped, extra = None, None
        try:
            d.wait_settled()
        except WaitTimeout as e:
            stopped = f"the {label} rollback did not settle: {e}"
        finally:
            if self.load and self.load.run:
                _, extra = self.load.phases(self.ctx.ledger, label, rec.records(), d.hash_v1)
                self.load.run = None
        return rec.finish(extra, stopped_early=stopped)

    def _peak_row(self, step_name: str, steps: list, obs: Observation) -> dict:
        v, r = obs.verdict(last_set_weight(steps))
        peak = obs.peak_canary_weight_while_partial
        polarity, shows = (HAZARD, exposed(obs.weights_while_partial)) if step_name == "before" else \
            (HOLDS, None if peak is None else peak <= last_set_weight(steps))
        left = {"other_differences_left_as_they_are": self.other_differences} if self.other_differences else {}
        return self.row(step_name, ASSERT_PEAK, last_set_weight(steps), peak, v, evidence=obs.timeline, reason=r,
                        key="peak-weight", polarity=polarity, shows=shows,
                        fact=peak_fact(step_name.upper(), peak, obs.weights_while_partial),
                        weights_while_partial=obs.weights_while_partial, mode="live", series_text=obs.describe(),
                        **left)

    @step()
    def before(self) -> dict:
        return self._peak_row("before", self.steps, self._rollback("before"))

    @step("before")
    def cut_steps(self) -> None:
        self.drill.cut_steps(self.cut)

    @step("cut_steps")
    def redeploy(self) -> dict:
        d = self.drill
        meant = container_images(self.template_before)
        d.deploy(d.spec.image_v2)
        # the template the drill sent, container by container (init containers too), against the one before the drill
        sent = template_differences(self.template_before, d.ro.get(d.name)["spec"]["template"])
        rolled = self._stable_images()
        ok = rolled == meant and not sent

        seen = self.observation("redeploy-images", {"before_the_drill": meant, "rolled_out": rolled,
                                                    "sent_differences": sent})

        def row(verdict: str) -> dict:
            return self.row("redeploy", "the redeploy changes only the application container's image", meant,
                            rolled, verdict, evidence=seen, key="image-only", mode="live", container=d.spec.container,
                            compared_with="the pod template before the drill", sent_differences=sent,
                            **({"reason": f"the template sent differs from the one before the drill: "
                                          f"{'; '.join(sent)}"} if sent else {}))
        if not ok:
            row(FAIL)
            raise StepFailed(f"the redeployed ReplicaSet runs {rolled} and the template sent differs from the one "
                             f"before the drill in {sent or 'nothing'}; the template before the drill: {meant}")
        d.wait_scaled_to_zero(d.hash_v1, timeout=600)
        return row(PASS)        # a pass only once the step is done: an interrupted step never has one

    @step("redeploy")
    def after(self) -> dict:
        return self._peak_row("after", self.cut, self._rollback("after"))

    def _stable_images(self) -> dict:
        """The container images of the ReplicaSet the Rollout now runs as stable."""
        d = self.drill
        ro = d.ro.get(d.name)
        stable = ro["status"].get("stableRS")
        for rs in d.ro.owned_replicasets(ro):
            if (rs.metadata.labels or {}).get(HASH_LABEL) == stable:
                return container_images(client.ApiClient().sanitize_for_serialization(rs.spec.template))
        return {}

    @step("after")
    def exit(self) -> list[dict]:
        d = self.drill
        d.deploy(d.spec.image_v2)
        d.wait_scaled_to_zero(d.hash_v1, timeout=600)
        rec = d.record("exit")
        d.rollback(self.template_v1)
        partial = None
        # natural timing: the abort goes out the moment the controller's weight is in force on the partly available
        # revived ReplicaSet (the incident posture; partly available alone is not it: the controller writes the
        # weight in a reconcile after the first revived pod is available, and a slow one writes it after an abort
        # sent then, which read as a rise after promote --full)
        try:
            got = rec.wait("a non-zero canary weight on the partly available revived ReplicaSet (or the window "
                           "closed)", lambda d: timeline.weight_on_partial(d) or _window_closed(d),
                           d.settle_timeout(), interval=0.02)
            if not timeline.weight_on_partial(got):
                partial = ("the revived ReplicaSet was fully available before the controller wrote a non-zero "
                           "weight on it while it was partly available")
        except WaitTimeout as e:
            partial = f"the controller wrote no weight on a partly available revived ReplicaSet: {e}"
        res = d.ro.abort(d.name)
        rec.mark("abort", res)
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
        obs = rec.finish()
        ex = timeline.exit_analysis(timeline.load(Path(obs.timeline)), d.hash_v1, replicas=d.spec.replicas)
        rows = exit_rows(self, obs, ex, res, partial_at_exit, weight_after_abort, healthy_ok, healthy_err,
                         variant="live", window_missed=partial or (None if partial_at_exit else
                                                                  "the window closed before the abort landed"))
        return rows

    def run(self) -> None:
        """The whole live runbook, in order."""
        self.before()
        self.cut_steps()
        self.redeploy()
        self.after()
        self.exit()


def _window_closed(d: timeline.Derived) -> bool:
    """The revived ReplicaSet fully available since the rollback: too late for the exit's posture."""
    return (bool(d.canary_available) and 0 < d.canary_available[-1][2] <= d.canary_available[-1][1]
            and d.canary_available[-1][0] >= d.t0)


__all__ = ["LiveLaneA"]
