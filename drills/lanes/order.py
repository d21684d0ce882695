"""Lane ``order``: the branch order in reconcileTrafficRouting, proven per controller version (one test per step).

In reconcileTrafficRouting the backward search ("not at desired replica counts": keep the previous setWeight)
must be evaluated before the mid-steps branch (GetCurrentSetWeight) and the end-of-steps branch
(MaxTrafficWeight); the prescription (delete the final setWeight) is only safe while it is.  Each probe is a
Rollout of its own (fixtures/lanes/order/probes.yaml) in a namespace of its own; each gives one row whose
assertion names that version's own lines (drills.drill.branches, read from its source, never typed in).

(a) end-of-steps: steps [5, pause 10s, 50], roll back inside rollbackWindow -> 50 while the revived
    ReplicaSet is partial (100 would mean end-of-steps first).
(b) mid-steps: replicas 4, steps [25, pause 10s, 75, pause], new pods held -> 25 while the canary
    ReplicaSet is short at the 75 rung (75 would mean mid-steps first).
(c) hazard: the prescription [5, pause 10s] plus replicaProgressThreshold {type: Pods, value: 1}, roll back
    inside the window -> the weight while partial, against the last rung (5); not applicable where the
    version's Rollout CRD lacks the field.
(d) scale-out: the prescription [5, pause 10s], replicas 4, a rollback inside the window, then the Rollout scaled
    to 8 while the revived pods are held, by the cluster's real HPA controller on an external metric the drill
    raises (drills.drill.autoscale; on a cluster other than the embedded one, the drill writes the scale subresource
    itself, and the row says so) -> the weight while partial against the last rung (5), and what the controller
    did with the revived ReplicaSet's size.

The four probes need nothing from each other: they start together at the lane's first probe step and run side by
side (drills.drill.together), one controller driving the four Rollouts; each step reads its probe's result (or the
point it waits for) and records its row, so the leg takes about as long as its longest probe (the scale-out).
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from ..drill import branches
from ..record import timeline
from ..record.answer import condition_of
from ..drill.autoscale import HPAScaleOut, external_metrics_for
from ..cluster.namespaces import drop_namespace, make_namespace, namespace_name
from ..core.config import version_order
from ..drill.kit import REASON_INCOMPLETE, DrillRollout, Observation
from ..drill.probe import release_rest, wait_window_decided
from ..drill.probe import scale_out as scale_out_while_held
from ..record.ledger import FAIL, HAZARD, HOLDS, INCONCLUSIVE, NOT_APPLICABLE, PASS, UNVERIFIED, finite_number
from ..kube.rollout import Predicate, healthy, paused
from ..drill.shapes import RolloutSpec
from ..core.steps import last_set_weight, steps_text
from ..toolchain import Toolchain
from ..core.wait import WaitTimeout
from ..drill.together import Together, raising
from .base import LaneContext, Runbook, drop_namespaces, step

STEP_END, STEP_MID, STEP_HAZARD = "end-of-steps", "mid-steps", "hazard-replica-progress-threshold"
STEP_SCALE_OUT = "scale-out-while-partial"
DEPLOYED, V1_DEPLOYED = "v1 and v2 deployed, v1 scaled down", "v1 deployed"
APP_LABEL = "app.kubernetes.io/name"
# the matrix's branch-order section: column label -> the step it is read from
ORDER_COLUMNS = (("before end-of-steps", STEP_END), ("before mid-steps", STEP_MID), ("hazards", STEP_HAZARD),
                 ("scale-out while partial", STEP_SCALE_OUT))


def spec_of(fx: dict) -> RolloutSpec:
    return RolloutSpec(steps=fx["steps"], replicas=fx["replicas"], min_pods=fx["minPodsPerReplicaSet"],
                     rollback_window=fx["rollbackWindowRevisions"], scale_down_delay=fx["scaleDownDelaySeconds"],
                     hold_seconds=fx["hold_seconds"], name=fx["name"], image_v1=fx["images"]["v1"],
                     image_v2=fx["images"]["v2"], extra_canary=dict(fx.get("extra_canary") or {}))


def rung_count(weight: int, replicas: int, min_pods: int) -> int:
    """Canary replicas at a setWeight with traffic routing: max(ceil(W*R/100), minPodsPerReplicaSet)."""
    n = math.ceil(weight * replicas / 100)
    return max(n, min_pods) if n else 0


def weights_while_short_at(d: timeline.Derived, target: int) -> tuple[list, float]:
    """Weights in force while the canary ReplicaSet's desired count is ``target`` and it is short of it.

    From the derived series (resourceVersion order): [[t, weight, available, target]], and the total time."""
    events = sorted([(t, 0, ("avail", a, tg)) for t, a, tg in d.canary_available] +
                    [(t, 1, ("weight", w)) for t, w in d.canary_weight], key=lambda e: (e[0], e[1]))
    weight, avail, tgt = 0, None, None
    out, total, since = [], 0.0, None
    for t, _, ev in events:
        if ev[0] == "avail":
            avail, tgt = ev[1], ev[2]
        else:
            weight = ev[1]
        short = tgt == target and avail is not None and avail < target
        if short:
            if since is None:
                since = t
            if not out or out[-1][1:] != [weight, avail, tgt]:
                out.append([t, weight, avail, tgt])
        elif since is not None:
            total += t - since
            since = None
    if since is not None:
        total += d.end - since
    return out, total


class LaneOrder(Runbook):
    key = "order"
    estimate_s = 180.0
    title = "branch order: the backward search before mid-steps and end-of-steps, per version's source"

    def __init__(self, ctx: LaneContext):
        super().__init__(ctx)
        self.fx = self.data("probes.yaml")
        self.ev = Path(ctx.evidence_dir) / "lane-order"
        opts = ctx.options
        self.source_note = "" if opts.get("source") or not opts.get("user_built") else \
            "user-built controller without --source"
        self.bm = branches.branch_map_for(ctx.version, user_built=bool(opts.get("user_built")), source=opts.get("source"))
        # the CRDs the cluster runs with (a user-built controller's from --crds or --source), else the release's
        installed = (ctx.cluster.status().get("crd_source") if ctx.cluster is not None else None)
        self.crds_dir = Path(opts.get("crds") or installed or Toolchain().ensure_crds(ctx.version))
        self.drills: dict[str, DrillRollout] = {}

    # --- plumbing -------------------------------------------------------------------------------------
    def drill(self, key: str) -> DrillRollout:
        """One Rollout per probe, each in a namespace of its own (the recorder's audit-log check covers every
        route object of its namespace)."""
        if key not in self.drills:
            ns = namespace_name(f"order-{self.fx[key]['name']}")
            self.namespaces.append(ns)          # recorded first: a signal inside the create still finds it
            make_namespace(self.ctx.api, ns)
            self.drills[key] = DrillRollout(self.ctx.api, ns, spec_of(self.fx[key]), self.ev,
                                            log=self.together().lines_of(key, f"[{self.fx[key]['name']}] "),
                                            controller_version=self.ctx.name, audit_log=self.ctx.audit_log)
        return self.drills[key]

    def started_probes(self) -> Together:
        """The lane's probes, started at its first probe step, side by side (each Rollout in a namespace of its own,
        made here in this thread); the hazard probe only where the version's CRD has the field.  A probe that cannot
        be set up fails its own step, not the others'."""
        t = self.together()
        if "end_of_steps" not in t:
            jobs = {"end_of_steps": self._end_of_steps_probe, "mid_steps": self._mid_steps_probe,
                    "scale_out": self._scale_out_probe}
            try:
                if self.hazard_applicable()[0]:
                    jobs["hazard_replica_progress_threshold"] = self._hazard_probe
            except Exception as e:          # the hazard step's own failure (it asks again, and meets this)
                jobs["hazard_replica_progress_threshold"] = raising(e)
            for key, fn in jobs.items():
                if getattr(fn, "failed", None) is not None:     # already a failure (together.raising)
                    continue
                try:
                    d = self.drill(key)
                except Exception as e:      # its namespace not made: raised in its own step
                    jobs[key] = raising(e)
                    continue
                d.log(f"probe {key} in namespace {d.ns}")
                jobs[key] = functools.partial(self._unwinding, d, fn)
            self.run_together(jobs)
        return t

    @staticmethod
    def _unwinding(d: DrillRollout, fn, reached):
        """A probe that stops (told to, or failing) releases its holds and stops its recording itself: the probes
        unwind side by side, before the lane removes their namespaces."""
        try:
            return fn(reached)
        except BaseException:
            try:
                d.cleanup()
            except Exception as e:          # the probe's own failure is what its step hears
                d.log(f"clean-up after the probe stopped failed ({type(e).__name__}: {e})")
            raise

    def close(self) -> None:
        stuck = self.stop_probes(leftovers=f"namespaces {', '.join(self.namespaces)} (the cluster's next `down` "
                                           f"removes them)")
        for key, d in self.drills.items():
            if key in stuck:            # still running: its holds and recording go with its namespace
                continue
            try:
                d.cleanup()
            except Exception as e:
                self.ctx.log(f"order: the clean-up of probe {key} failed ({e})")
        drop_namespaces(self.ctx.api, self.namespaces, self.ctx.log)

    def _lines(self) -> dict:
        if not self.bm:
            return {"branch_lines": branches.LINES_UNKNOWN, "source_note": self.source_note}
        return {"branch_lines": {branches.BACKWARD: self.bm.backward_search, branches.MID: self.bm.mid_steps,
                                 branches.END: self.bm.end_of_steps},
                "branch_source_order": self.bm.order, "source": self.bm.source, "source_sha256": self.bm.sha256}

    def _rollback_observation(self, d: DrillRollout, label: str) -> Observation:
        rec = d.start_rollback(label)
        stopped = None
        try:
            d.wait_settled()
        except WaitTimeout as e:
            stopped = f"the rollback did not settle: {e}"
        d.release_holds()
        return rec.finish(stopped_early=stopped)

    # --- the source map -------------------------------------------------------------------------------
    @step()
    def source_map(self) -> branches.BranchMap | None:
        """The three branches found by their code in this version's trafficrouting.go (None: lines unknown)."""
        return self.bm

    # --- (a) end-of-steps -------------------------------------------------------------------------------
    def _end_of_steps_probe(self, reached) -> Observation:
        d = self.drills["end_of_steps"]
        d.deploy_v1()
        d.deploy_v2()
        d.wait_scaled_to_zero(d.hash_v1)
        reached(DEPLOYED)
        return self._rollback_observation(d, f"order-{STEP_END}")

    @step()
    def end_of_steps_deploy(self) -> None:
        self.started_probes().wait("end_of_steps", DEPLOYED)

    @step("end_of_steps_deploy")
    def end_of_steps_rollback(self) -> dict:
        obs = self.started_probes().wait("end_of_steps")
        d = self.drills["end_of_steps"]
        exp = self.expected("end_of_steps") or {}
        verdict, reason = obs.verdict(exp.get("expected"), self.no_expectation)
        peak = obs.peak_canary_weight_while_partial
        # the backward search first keeps the last setWeight of the list (50); end-of-steps first writes 100
        return self.row(
            STEP_END, branches.order_assertion(self.bm, branches.END), exp.get("expected"),
            peak, verdict, evidence=obs.timeline, reason=reason, key="branch-order", polarity=HOLDS,
            shows=None if peak is None else peak == last_set_weight(d.spec.steps),
            probe="rollback inside rollbackWindow, final rung not 100", steps=steps_text(d.spec.steps),
            replicas=d.spec.replicas, opposite_order_would_show=exp.get("opposite"),
            partial_window_observed=obs.partial_window_observed, window_evidence=obs.window_evidence,
            weights_while_partial=obs.weights_while_partial, series=Path(obs.series).name,
            series_text=obs.describe(), revived_replicaset=obs.revived_hash, **self._lines())

    # --- (b) mid-steps ----------------------------------------------------------------------------------
    @step()
    def mid_steps_deploy_v1(self) -> None:
        self.started_probes().wait("mid_steps", V1_DEPLOYED)

    @step("mid_steps_deploy_v1")
    def mid_steps_deploy_v2(self) -> dict:
        return self.row(**self.started_probes().wait("mid_steps"))

    def _mid_steps_probe(self, reached) -> dict:
        """Deploys v1, then v2 with its new pods held: the row's fields (the step records it)."""
        d = self.drills["mid_steps"]
        d.deploy_v1()
        reached(V1_DEPLOYED)
        fx = self.fx["mid_steps"]
        spec = d.spec
        idx = int(fx["higher_rung_index"])
        rung = int(spec.steps[idx]["setWeight"])
        target = rung_count(rung, spec.replicas, spec.min_pods)
        label = f"order-{STEP_MID}"
        rec = d.record(label)
        hid = d.hold({APP_LABEL: d.name}, spec.hold_seconds, batch=False)
        d.space_replicasets()
        res = d.ro.set_image(d.name, spec.image_v2, container=spec.container)
        rec.mark("deploy", res)
        d.log(f"  deploy v2, steps [{steps_text(spec.steps)}], new pods held {spec.hold_seconds:.0f}s each")
        error = None
        hash_v2 = None
        try:
            n_steps = len(spec.steps)
            d.ro.wait(d.name, Predicate(f"paused on the indefinite pause (step {idx + 1})",
                                        lambda o: paused()(o) and (o.get("status") or {}).get("currentStepIndex")
                                        == idx + 1), 60 + 4 * spec.hold_seconds * target, progress=d.progress)
            # the rung itself is written once the canary ReplicaSet is at its count
            rec.wait_weight(rung, 60, f"(the rung of step {idx}) once the canary ReplicaSet is complete")
            hash_v2 = d.ro.get(d.name)["status"]["currentPodHash"]
            d.release(hid)
            # taken by the controller, else promoted again as the plugin would (drills.kube.rollout.promote_and_wait)
            d.ro.promote_and_wait(d.name, 120, on_send=rec.mark, progress=d.progress)
            ro = d.ro.wait(d.name, Predicate("Healthy at v2", lambda o: healthy()(o) and
                                             o["status"].get("stableRS") == o["status"].get("currentPodHash")
                                             == hash_v2), 180, progress=d.progress)
            assert n_steps == len(ro["spec"]["strategy"]["canary"]["steps"])
            rec.wait_weight(0, 60, "(all traffic back on the new stable)")
        except AssertionError as e:          # WaitTimeout included: the evidence so far is kept
            error = str(e)
        finally:
            d.release_holds()
            result = rec.stop()
        recs = rec.records()
        if hash_v2 is None:
            hash_v2 = next((r["obj"]["status"].get("currentPodHash") for r in reversed(timeline.ordered(recs))
                            if r["kind"] == "Rollout"), None)
        der = timeline.derive(recs, hash_v2, since_mark="deploy", target="rs_spec", until_mark="promote")
        short, short_seconds = weights_while_short_at(der, target)
        observed = max((w for _, w, _, _ in short), default=None)
        title = f"{label}: deploy v2, steps [{steps_text(spec.steps)}], replicas {spec.replicas} ({self.ctx.name})"
        series_path = rec.series_path()
        series_path.write_text(json.dumps(der.series(title), indent=1))
        exp = self.expected("mid_steps") or {}
        reason = None
        if error:
            reason = f"the deploy did not complete: {error}"
        elif not result["complete"]:
            reason = f"{REASON_INCOMPLETE}: {'; '.join(result['reasons'])}"
        elif not short:
            reason = (f"no window observed where the canary ReplicaSet was short of {target} "
                      f"(the count of the rung {rung}) at step {idx}")
        if reason:
            verdict = INCONCLUSIVE
        elif exp.get("expected") is None:
            verdict, reason = UNVERIFIED, self.no_expectation
        else:
            verdict = PASS if observed == exp["expected"] else FAIL
        rel = lambda rows: [[round(r[0] - der.t0, 2), *r[1:]] for r in rows]  # noqa: E731
        series_text = (f"weights in force while the canary ReplicaSet was short of {target} at step {idx} "
                       f"[t, weight, available, target]: {rel(short)} ({short_seconds:.1f}s short); canary weight "
                       f"series {rel(der.canary_weight)}")
        return dict(
            step=STEP_MID, assertion=branches.order_assertion(self.bm, branches.MID), expected=exp.get("expected"),
            observed=observed, verdict=verdict, evidence=str(rec.path), reason=reason, key="branch-order",
            polarity=HOLDS,
            # the backward search first keeps the previous rung while the canary is short of the higher one
            shows=None if observed is None else observed < rung, probe="normal deploy reaching a higher rung while the canary "
            "ReplicaSet is short", steps=steps_text(spec.steps), replicas=spec.replicas, higher_rung=rung,
            higher_rung_index=idx, canary_target_at_rung=target, opposite_order_would_show=exp.get("opposite"),
            short_seconds=round(short_seconds, 2), weights_while_short=rel(short),
            peak_canary_weight_while_partial=der.peak_canary_weight_while_partial, series=series_path.name,
            series_text=series_text, canary_replicaset=hash_v2, **self._lines())

    # --- (c) hazard: replicaProgressThreshold -----------------------------------------------------------
    def hazard_applicable(self) -> tuple[bool, str]:
        field = self.fx["hazard_replica_progress_threshold"]["field"]
        has, where = branches.crd_has_canary_field(self.crds_dir, field)
        return has, (f"{field} is not in spec.strategy.canary of this version's Rollout CRD schema ({where})"
                     if not has else where)

    def _hazard_assertion(self, spec: RolloutSpec, last_rung: int) -> str:
        rpt = spec.extra_canary.get("replicaProgressThreshold") or self.fx["hazard_replica_progress_threshold"][
            "extra_canary"]["replicaProgressThreshold"]
        return (f"prescription [{steps_text(spec.steps)}] keeps the weight at the last rung ({last_rung}) with "
                f"replicaProgressThreshold {{type: {rpt['type']}, value: {rpt['value']}}}"
                + (f" (backward search :{self.bm.backward_search}, end-of-steps :{self.bm.end_of_steps})"
                   if self.bm else f" ({branches.LINES_UNKNOWN})"))

    def _hazard_probe(self, reached) -> Observation:
        d = self.drills["hazard_replica_progress_threshold"]
        d.deploy_v1()
        d.deploy_v2()
        d.wait_scaled_to_zero(d.hash_v1)
        return self._rollback_observation(d, f"order-{STEP_HAZARD}")

    @step()
    def hazard(self) -> dict:
        fx = self.fx["hazard_replica_progress_threshold"]
        spec = spec_of(fx)
        last_rung = last_set_weight(spec.steps)
        exp = self.expected("hazard_replica_progress_threshold") or {}
        applicable, where = self.hazard_applicable()
        if not applicable:
            return self.row(STEP_HAZARD, self._hazard_assertion(spec, last_rung), last_rung, None, NOT_APPLICABLE,
                            reason=where, key="peak-weight", polarity=HAZARD,
                            condition=condition_of(spec.extra_canary), steps=steps_text(spec.steps), **self._lines())
        obs = self.started_probes().wait("hazard_replica_progress_threshold")
        # The row asserts what this controller does (the expectation file: upstream's peak); the report
        # calls the version out whenever that peak is above the prescription's last rung.
        expected = exp.get("upstream_peak")
        verdict, reason = obs.verdict(expected, self.no_expectation)
        peak = obs.peak_canary_weight_while_partial
        # a hazard of the version: with the field set, the weight while partial goes above the last rung
        return self.row(
            STEP_HAZARD, self._hazard_assertion(spec, last_rung), expected,
            peak, verdict, evidence=obs.timeline, reason=reason, key="peak-weight", polarity=HAZARD,
            shows=None if peak is None else peak > last_rung, condition=condition_of(spec.extra_canary),
            last_rung=last_rung,
            crd=where, steps=steps_text(spec.steps), extra_canary=spec.extra_canary,
            upstream_expected_peak=exp.get("upstream_peak"), known_hazard=bool(exp.get("known_hazard")),
            prescription_holds=(obs.peak_canary_weight_while_partial is not None and
                                obs.peak_canary_weight_while_partial <= last_rung),
            partial_window_observed=obs.partial_window_observed, window_evidence=obs.window_evidence,
            weights_while_partial=obs.weights_while_partial, series=Path(obs.series).name,
            series_text=obs.describe(), revived_replicaset=obs.revived_hash, **self._lines())

    # --- (d) a scale-out while the revived ReplicaSet is partial ---------------------------------------------
    def _scale_out_probe(self, reached) -> tuple[Observation, dict, str | None]:
        fx = self.fx["scale_out"]
        d = self.drills["scale_out"]
        d.deploy_v1()
        d.deploy_v2()
        d.wait_scaled_to_zero(d.hash_v1)
        embedded = self.ctx.cluster is not None
        with external_metrics_for(self.ctx.cluster, self.ctx.api, embedded, d.log) as metrics:
            hpa = None if metrics is None else HPAScaleOut(self.ctx.api, metrics, d.ns, d.name, d.spec.replicas,
                                                           fx["scale_out_to"], log=d.log)
            try:
                if hpa is not None:
                    hpa.start()
                rec = d.start_rollback(f"order-{STEP_SCALE_OUT}")
                stopped, did = None, {}
                try:
                    wait_window_decided(d, d.settle_timeout())
                    did = scale_out_while_held(d, fx["scale_out_to"], hpa)
                    release_rest(d)
                    d.wait_settled()
                except WaitTimeout as e:
                    stopped = f"the rollback with its scale-out did not settle: {e}"
                d.release_holds()
                return rec.finish(extra={"scale_out": did}, stopped_early=stopped), did, stopped
            finally:
                if hpa is not None:
                    hpa.stop()

    @step()
    def scale_out(self) -> dict:
        """The prescription, a rollback inside the window, and the Rollout scaled out through its scale
        subresource while the revived pods are held: the weight while partial, before and after, against the last
        rung; the row says what the controller did with the revived ReplicaSet's size and the weight."""
        fx = self.fx["scale_out"]
        obs, did, stopped = self.started_probes().wait("scale_out")
        d = self.drills["scale_out"]
        last_rung = last_set_weight(d.spec.steps)
        exp = self.expected("scale_out") or {}
        embedded = self.ctx.cluster is not None
        if not did.get("revived_resized") and not stopped:
            stopped = "the controller never resized the revived ReplicaSet after the scale-out: nothing was observed"
        verdict, reason = obs.verdict(exp.get("expected"), self.no_expectation)
        if stopped and verdict != INCONCLUSIVE:
            verdict, reason = INCONCLUSIVE, stopped
        peak = obs.peak_canary_weight_while_partial
        return self.row(
            STEP_SCALE_OUT, f"a scale-out {d.spec.replicas} -> {fx['scale_out_to']} "
            f"{'by the HPA controller' if embedded else 'through the scale subresource'} while the revived "
            f"ReplicaSet is partial: the weight stays at the last rung ({last_rung})",
            exp.get("expected"), peak, verdict, evidence=obs.timeline, reason=reason, key="peak-weight",
            polarity=HOLDS, shows=None if peak is None else peak <= last_rung, last_rung=last_rung,
            steps=steps_text(d.spec.steps), replicas=d.spec.replicas, scaled_to=fx["scale_out_to"],
            controller_did=did.get("said"), scale_out=did, written_by=did.get("written_by"),
            partial_window_observed=obs.partial_window_observed, window_evidence=obs.window_evidence,
            weights_while_partial=obs.weights_while_partial, series=Path(obs.series).name,
            series_text=obs.describe(), revived_replicaset=obs.revived_hash)

    # --- the matrix -------------------------------------------------------------------------------------
    @classmethod
    def report_sections(cls, cells: dict, out_dir: Path | None = None) -> list[dict]:
        """The branch-order table (one row per version, the three probes as columns) with a call-out for every
        version on which the prescription no longer keeps the weight at the last rung."""
        versions = version_order({v for v, _, _ in cells})
        if not versions:
            return []
        callouts, rows = [], []
        for v in versions:
            for (cv, s, a), r in sorted(cells.items()):
                if cv != v or s != STEP_HAZARD or r.get("verdict") == NOT_APPLICABLE:
                    continue
                obs, last = finite_number(r.get("observed")), finite_number((r.get("details") or {}).get("last_rung", r.get("expected")))
                if obs is not None and last is not None and obs > last:
                    callouts.append(f"{v}: the prescription no longer keeps the weight at the last rung — {a}: "
                                    f"observed {r.get('observed')} > last rung {last:g} (verdict {r.get('verdict')}, "
                                    f"run {r.get('run_id')}).")
            rows.append([v, *[[r for (cv, s, _), r in sorted(cells.items()) if cv == v and s == col]
                              for _, col in ORDER_COLUMNS]])
        return [{"title": "Branch order", "columns": ["controller version", *[c for c, _ in ORDER_COLUMNS]],
                 "rows": rows, "callouts": callouts,
                 "note": "Lines are read from each version's own rollout/trafficrouting.go."}]



