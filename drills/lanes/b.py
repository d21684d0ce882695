"""Lane B — the base chart path, verified without live traffic, then the first real deploy (brief §9.4, §14.3).

Steps, in order: (1) render equivalence of 3.0.13 vs 3.0.14-rc.0 for every app, (2) publishing 3.0.14-rc.0
alone (no service bumped) changes no rendered manifest, (3) bumping one inheritor changes that service only,
(4) that inheritor's first real deploy on the cluster: the chart version sits in the pod template labels, so the
bump is itself a deploy; the Rollout walks the new default steps [5, pause 10m] (the long pause promoted through
with a plain promote, recorded), reaches 100 by the controller's own default after the last step, is Healthy.
Everything runs on working copies of fixtures/fleet; the registry is the real `registry` on 127.0.0.1.
"""
from __future__ import annotations

import json
import tempfile
import time
from functools import cached_property
from pathlib import Path

from ..record import recorder, timeline
from ..charts.fleet import Fleet, Workspace
from ..charts.helm import Helm, Registry
from ..record.ledger import FAIL, NOT_APPLICABLE, PASS
from ..drill.manifests import apply, docs
from ..kube.rollout import Predicate, Rollouts, healthy, paused
from ..core.steps import steps_text
from ..core.wait import WaitTimeout
from .b_checks import check_equivalence, check_merge_alone, check_propagation, ensure_published, inheritors
from .base import LaneContext, Runbook, step

PINNED = "3.0.13"
CANDIDATE = "3.0.14-rc.0"
LANE_ENV = "stage"
NEW_STEPS = [{"setWeight": 5}, {"pause": {"duration": "10m"}}]
DEPLOY_TIMEOUT_S = 300


class LaneB(Runbook):
    key = "b"
    estimate_s = 45.0
    title = "base chart path: render equivalence, merge-alone, propagation to one inheritor, its first deploy"
    extras = ("registry",)
    uses_helm = True

    def __init__(self, ctx: LaneContext):
        super().__init__(ctx)
        self._tmp = tempfile.TemporaryDirectory(prefix="drills-lane-b-")   # working copies of the fleet
        self.work = Path(self._tmp.name)
        self.fleet = Fleet()
        self.helm = Helm()
        self._registry: Registry | None = None

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = Registry().start()
        return self._registry

    def close(self) -> None:
        if self._registry is not None:
            self._registry.stop()
        self.helm.close()
        self._tmp.cleanup()

    def _record(self, step_name: str, assertion: str, expected, observed, ok: bool, evidence: dict, key: str,
                **details):
        """One lane B row; the full result goes to <evidence dir>/lane-b/<step>.json as evidence (the evidence dir is
        the controller's: two legs of one run never write one file)."""
        path = Path(self.ctx.evidence_dir) / "lane-b" / f"{step_name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(evidence, indent=2, default=str))
        return self.row(step_name, assertion, expected, observed, PASS if ok else FAIL, evidence=str(path), key=key,
                        **details)

    @cached_property
    def inheritor(self) -> str:
        """The first app of the lane's environment that declares no steps of its own (it inherits the base's)."""
        return inheritors(self.fleet, LANE_ENV, self.helm, self.work / "inheritors", PINNED)[0]

    # --- the runbook ------------------------------------------------------------------------------------
    @step()
    def render_equivalence(self) -> dict:
        results = [check_equivalence(self.fleet, env, PINNED, CANDIDATE, self.helm, self.work / "eq" / env)
                   for env in self.fleet.envs()]
        return self._record(
            "render-equivalence",
            f"helm template {PINNED} vs {CANDIDATE}: inheritors change only the Rollout's canary steps "
            "(final setWeight 100 removed), other apps nothing, chart-version restatements aside",
            expected={"unexpected": []}, observed={"unexpected": [u for r in results for u in r.unexpected],
                                                   "summary": [r.describe() for r in results]},
            ok=all(r.ok for r in results), evidence={"envs": [r.to_dict() for r in results]}, key="steps-only")

    @step()
    def merge_alone(self) -> dict:
        res = check_merge_alone(self.fleet, LANE_ENV, CANDIDATE, self.helm, self.registry, self.work / "merge")
        return self._record(
            "merge-alone", f"publishing base {CANDIDATE} to the registry, no service bumped, then helm dependency "
                           "update: no rendered manifest changes",
            expected={"changed_apps": []},
            observed={"changed_apps": res.changed_apps, "registry_tags": res.registry_tags,
                      "vendored_after": res.vendored_after, "precondition": res.precondition},
            ok=res.ok, evidence=res.to_dict(), key="no-change")

    @step()
    def propagation(self) -> dict:
        service = self.inheritor
        res = check_propagation(self.fleet, LANE_ENV, service, CANDIDATE, self.helm, self.registry,
                                self.work / "propagation")
        return self._record(
            "propagation", f"bumping {service} to base {CANDIDATE} (Chart.yaml edit + helm dependency update) "
                           "changes that service only",
            expected={"changed_apps": [service]},
            observed={"changed_apps": res.changed_apps, "changed": res.diffs[service].to_dict()["changed"],
                      "chart_version_only": res.diffs[service].to_dict()["chart_version_only"]},
            ok=res.ok, evidence=res.to_dict(), key="one-service", service=service)

    @step()
    def first_deploy(self) -> list[dict]:
        service = self.inheritor
        for version in (PINNED, CANDIDATE):
            ensure_published(self.helm, self.registry, version, self.work / "pkg")
        ws = Workspace(self.fleet, self.work / "ws", self.helm, self.registry.url)
        return self._first_deploy(ws, ws.fleet.app(service, LANE_ENV))

    # --- step 4 ---------------------------------------------------------------------------------------
    def _first_deploy(self, ws: Workspace, app) -> list[dict]:
        api, ns, log = self.ctx.api, self.ctx.namespace, self.ctx.log
        evidence_dir = Path(self.ctx.evidence_dir) / "lane-b"
        before = ws.render(app)
        name = _rollout_doc(before.text)["metadata"]["name"]
        rl = Rollouts(api, ns, log=log)
        log(f"lane b: {app.name} running on base {before.base_version}")
        apply(api, ns, before.text)
        ro = rl.wait(name, healthy(), 180)
        old_hash = ro["status"]["stableRS"]
        rec = recorder.Recorder(api, ns, name, evidence_dir / f"first-deploy{timeline.TIMELINE_SUFFIX}",
                                audit_log=self.ctx.audit_log).start()
        promotes = 0
        try:
            ws.bump(app, CANDIDATE)
            after = ws.render(app)
            new_steps = _rollout_doc(after.text)["spec"]["strategy"]["canary"]["steps"]
            applied = apply(api, ns, after.text)
            rv = next((o["metadata"]["resourceVersion"] for o in applied if o["kind"] == "Rollout"), None)
            rec.mark("bump applied", rv=rv, base=CANDIDATE)
            log(f"lane b: applied the {CANDIDATE} render; steps {new_steps}")
            deadline = time.monotonic() + DEPLOY_TIMEOUT_S
            while True:
                ro = rl.wait(name, Predicate("Healthy at a new revision, or paused",
                                             lambda o: (healthy()(o) and o["status"].get("stableRS") != old_hash and
                                                        o["status"].get("stableRS") == o["status"].get("currentPodHash"))
                                             or paused()(o)), max(1.0, deadline - time.monotonic()))
                if ro["status"].get("phase") == "Healthy":
                    break
                res = rl.promote_and_wait(name)
                promotes += 1
                rec.mark("promote", rv=(res or {}).get("metadata", {}).get("resourceVersion"),
                         step=ro["status"].get("currentStepIndex"))
                log(f"lane b: plain promote through the pause at step {ro['status'].get('currentStepIndex')}")
            try:
                rec.wait_for("the route back to all-stable after reaching 100", _back_to_stable, 20)
            except WaitTimeout as e:       # the rows below say what the weights were
                log(f"lane b: {e}")
        finally:
            result = rec.stop()
        return self._deploy_rows(rec, result, ro, old_hash, new_steps, promotes, app.name)

    def _deploy_rows(self, rec, result, ro, old_hash, new_steps, promotes, app_name) -> list[dict]:
        d = timeline.derive(rec.records, ro["status"]["stableRS"], since_mark="bump applied", target="rs_spec")
        timeline.series_path(rec.out).write_text(json.dumps(d.series(
            f"lane b first deploy of {app_name} on base {CANDIDATE}"), indent=1))
        marks = {label: t for t, label in d.markers}
        weights = [[round(t - d.t0, 2), w] for t, w in d.canary_weight]
        t_promote = marks.get("promote")
        before_promote = [w for t, w in d.canary_weight if t_promote is None or t < t_promote]
        after_promote = [w for t, w in d.canary_weight if t_promote is not None and t >= t_promote]
        new_hash = ro["status"]["stableRS"]
        ev = str(rec.out)
        s = "first-deploy"
        ramp, final = self.expected("ramp_weight", 5), self.expected("final_weight", 100)
        return [
            self.row(s, "the bump is itself a deploy (chart version in the pod template labels)",
                     "new pod-template-hash", f"{old_hash} -> {new_hash}", PASS if new_hash != old_hash else FAIL,
                     evidence=ev, app=app_name, key="bump-deploys"),
            self.row(s, "the deployed Rollout walks the inherited steps (final setWeight removed)",
                     steps_text(NEW_STEPS), steps_text(new_steps), PASS if new_steps == NEW_STEPS else FAIL,
                     evidence=ev, app=app_name, key="inherited-steps"),
            self.row(s, "canary weight during the ramp (before the 10m pause is promoted)", ramp,
                     max(before_promote) if before_promote else None,
                     PASS if before_promote and max(before_promote) == ramp else FAIL, evidence=ev,
                     weights=weights, plain_promotes=promotes, recorder=result, key="ramp-weight"),
            self.row(s, "canary weight 100 after the last step, by the controller's own default", final,
                     max(after_promote) if after_promote else None,
                     PASS if after_promote and max(after_promote) == final and result["complete"] else FAIL,
                     evidence=ev, weights=weights, key="full-weight"),
            self.row(s, "Healthy at the new revision", "Healthy", ro["status"].get("phase"),
                     PASS if ro["status"].get("phase") == "Healthy" else FAIL, evidence=ev, key="healthy"),
            self.row(s, "background analysis during the first deploy", "analysis runs",
                     "off in the stage values layer", NOT_APPLICABLE,
                     reason="the stage values layer turns analysis off: lane B runs no Prometheus", key="analysis"),
        ]


def _back_to_stable(records: list[dict]) -> bool:
    weights = [w for _, w in timeline.derive(records, None, since_mark="bump applied").canary_weight]
    return 100 in weights and weights[-1] == 0


def _rollout_doc(text: str) -> dict:
    for d in docs(text):
        if d["kind"] == "Rollout":
            return d
    raise ValueError("the render has no Rollout")
