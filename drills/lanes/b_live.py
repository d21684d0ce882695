"""Lane B's live step: observe the first real deploy of the inheriting service on a stage cluster, read-only.

`drills run --lanes b --kubeconfig … --context … --namespace … --rollout … [--duration D]` watches the named
Rollout (the flight recorder, nothing mutated) until its next deploy completes or the duration ends: the deployed
steps no longer end in ``setWeight: 100``, the deploy still reaches weight 100 through the controller's
end-of-steps default, and it promotes Healthy.  A deploy that does not come (or does not finish) within the
duration is ``inconclusive`` with that reason.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..record import recorder, timeline
from ..record.ledger import FAIL, INCONCLUSIVE, PASS
from ..kube.rollout import Predicate, Rollouts, healthy
from ..core.steps import steps_text
from ..core.wait import WaitTimeout
from .base import LaneContext, Runbook, step

ASSERT_STEPS = "the deployed steps no longer end in setWeight 100 (the base default inherited)"
ASSERT_FULL = "the deploy reaches weight 100 through the controller's end-of-steps default"
ASSERT_HEALTHY = "Healthy at the new revision"


class LiveLaneB(Runbook):
    key = "b"
    title = "live: the first real deploy of the inheriting service, watched read-only"

    def __init__(self, ctx: LaneContext, rollout: str, duration: float):
        super().__init__(ctx)
        self.rollout, self.duration = rollout, duration

    @step()
    def first_deploy(self) -> list[dict]:
        api, ns, name, log = self.ctx.api, self.ctx.namespace, self.rollout, self.ctx.log
        rl = Rollouts(api, ns)
        stable0 = (rl.get(name).get("status") or {}).get("stableRS")
        out = Path(self.ctx.evidence_dir) / f"first-deploy{timeline.TIMELINE_SUFFIX}"
        rec = recorder.Recorder(api, ns, name, out).start()
        deadline = time.monotonic() + self.duration
        log(f"lane b: watching {ns}/{name} (read-only) for its next deploy, up to {self.duration:.0f}s")
        started = done = None
        try:
            started = rl.wait(name, Predicate("a deploy (a new pod template)", lambda o: (o.get("status") or {}).get(
                "currentPodHash") not in (None, stable0)), max(1.0, deadline - time.monotonic()))
            new_hash = started["status"]["currentPodHash"]
            log(f"lane b: deploy of {new_hash} started; waiting for it to complete")
            done = rl.wait(name, Predicate("Healthy at the new revision", lambda o: healthy()(o) and o["status"].get(
                "stableRS") == new_hash), max(1.0, deadline - time.monotonic()))
        except WaitTimeout as e:
            log(f"lane b: {e}")
        finally:
            result = rec.stop()
        return self._rows(rec, result, started, done)

    def _rows(self, rec, result, started, done) -> list[dict]:
        ev = str(rec.out)
        if started is None:
            reason = f"no deploy of {self.ctx.namespace}/{self.rollout} started within {self.duration:.0f}s"
            return [self.row("first-deploy", a, e, None, INCONCLUSIVE, evidence=ev, reason=reason, key=k, mode="live")
                    for a, e, k in ((ASSERT_STEPS, "no final setWeight 100", "inherited-steps"),
                                    (ASSERT_FULL, 100, "full-weight"), (ASSERT_HEALTHY, "Healthy", "healthy"))]
        steps = ((started["spec"].get("strategy") or {}).get("canary") or {}).get("steps") or []
        last = steps[-1] if steps else None
        no_final_100 = not (isinstance(last, dict) and last.get("setWeight") == 100)
        d = timeline.derive(rec.records, started["status"]["currentPodHash"], target="rs_spec")
        timeline.series_path(rec.out).write_text(json.dumps(d.series(
            f"live lane b: deploy of {self.ctx.namespace}/{self.rollout}"), indent=1))
        weights = [w for _, w in d.canary_weight]
        reason = None if done is not None else (f"the deploy did not complete within {self.duration:.0f}s "
                                                f"(last seen phase {(started.get('status') or {}).get('phase')})")
        if reason is None and not result["complete"]:
            reason = f"timeline incomplete: {'; '.join(result['reasons'])}"
        return [
            self.row("first-deploy", ASSERT_STEPS, "no final setWeight 100", steps_text(steps),
                     PASS if no_final_100 else FAIL, evidence=ev, key="inherited-steps", mode="live"),
            self.row("first-deploy", ASSERT_FULL, 100, max(weights, default=None),
                     INCONCLUSIVE if reason else (PASS if 100 in weights else FAIL), evidence=ev, reason=reason,
                     weights=weights, key="full-weight", mode="live"),
            self.row("first-deploy", ASSERT_HEALTHY, "Healthy", (done or started)["status"].get("phase"),
                     INCONCLUSIVE if reason else PASS, evidence=ev, reason=reason, key="healthy", mode="live"),
        ]
