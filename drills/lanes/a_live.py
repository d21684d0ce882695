"""Lane A's live variant: the same runbook on an existing stage Rollout, natural timing, under the live gate
(drills.live owns the gate, the journal, the lease and the signals; this module only runs the steps).

BEFORE: roll back (the application container's image reverted in the spec), observe the last setWeight on
the partial ReplicaSet -> cut the final setWeight 100 -> redeploy the current image (only the application
container changes; the ReplicaSet then running must be that template) -> AFTER: roll back again, observe.
"""
from __future__ import annotations

from kubernetes import client

from ..kit import DrillRollout, Observation
from ..ledger import FAIL, PASS
from ..phases import PhasedLoad
from ..podtemplate import container_images, with_image
from ..rollout import HASH_LABEL
from ..steps import last_set_weight
from ..wait import WaitTimeout
from .a import ASSERT_PEAK
from .base import LaneContext, Runbook, StepFailed, step


class LiveLaneA(Runbook):
    key = "a"
    title = "live rollback on a stage Rollout (natural timing)"

    def __init__(self, ctx: LaneContext, drill: DrillRollout, steps: list, cut: list, template_v1: dict,
                 load: PhasedLoad | None = None):
        super().__init__(ctx)
        self.drill, self.steps, self.cut, self.template_v1, self.load = drill, steps, cut, template_v1, load

    def _rollback(self, label: str) -> Observation:
        d = self.drill
        if self.load:
            self.load.start(label)
        rec = d.record(label)
        d.rollback(self.template_v1)
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
        return self.row(step_name, ASSERT_PEAK, last_set_weight(steps), obs.peak_canary_weight_while_partial, v,
                        evidence=obs.timeline, reason=r, mode="live", series_text=obs.describe())

    @step()
    def before(self) -> dict:
        return self._peak_row("before", self.steps, self._rollback("before"))

    @step("before")
    def cut_steps(self) -> None:
        self.drill.cut_steps(self.cut)

    @step("cut_steps")
    def redeploy(self) -> dict:
        d = self.drill
        before = d.ro.get(d.name)["spec"]["template"]
        meant = container_images(with_image(before, d.spec.container, d.spec.image_v2))
        d.deploy(d.spec.image_v2)
        rolled = self._stable_images()
        ok = rolled == meant
        row = self.row("redeploy", "the redeploy changes only the application container's image", meant, rolled,
                       PASS if ok else FAIL, mode="live", container=d.spec.container)
        if not ok:
            raise StepFailed(f"the redeployed ReplicaSet runs {rolled}, not the template the drill meant ({meant})")
        d.wait_scaled_to_zero(d.hash_v1, timeout=600)
        return row

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

    def run(self) -> None:
        """The whole live runbook, in order."""
        self.before()
        self.cut_steps()
        self.redeploy()
        self.after()


__all__ = ["LiveLaneA"]
