"""Lane `order`: the discriminating probes of the branch order in reconcileTrafficRouting, as runbook steps.

Each probe is a Rollout of its own (fixtures/branch_order/probes.yaml) in the lane's namespace; each gives
one ledger row (lane `order`) whose assertion names that version's own lines (drills.branches), whose
expected value comes from fixtures/branch_order/expectations.yaml, and whose evidence is the timeline.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import yaml

from drills import branches, config, timeline
from drills.ledger import FAIL, INCONCLUSIVE, NOT_APPLICABLE, PASS, UNVERIFIED, Ledger, describe_row
from drills.probe import REASON_INCOMPLETE, ProbeSpec, RollbackDrill, steps_text
from drills.rollout import Predicate, healthy, paused

LANE = "order"
STEP_END, STEP_MID, STEP_HAZARD = "end-of-steps", "mid-steps", "hazard-replica-progress-threshold"
FIXTURES = config.fixtures_dir() / "branch_order"
APP_LABEL = "app.kubernetes.io/name"


def probes() -> dict:
    return yaml.safe_load((FIXTURES / "probes.yaml").read_text())


def expectations(version: str) -> dict:
    data = yaml.safe_load((FIXTURES / "expectations.yaml").read_text())
    return (data.get("versions") or {}).get(version) or {}


def spec_of(fx: dict) -> ProbeSpec:
    return ProbeSpec(steps=fx["steps"], replicas=fx["replicas"], min_pods=fx["minPodsPerReplicaSet"],
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


class LaneOrder:
    def __init__(self, api, namespace: str, evidence_dir: Path, ledger: Ledger, version: str,
                 branch_map: branches.BranchMap | None, crds_dir: Path | None, audit_log=None, log=None,
                 source_note: str = ""):
        self.api = api
        self.ns = namespace
        self.ev = Path(evidence_dir) / "lane-order"
        self.ledger = ledger
        self.version = version
        self.bm = branch_map
        self.crds_dir = crds_dir
        self.audit_log = audit_log
        self.log = log or (lambda m: print(m, flush=True))
        self.fx = probes()
        self.expect = expectations(version)
        self.source_note = source_note
        self.drills: dict[str, RollbackDrill] = {}
        self.namespaces: list[str] = []
        self.ns_prefix = "order"
        self.done: set[str] = set()

    # --- plumbing -----------------------------------------------------------------------------------
    def drill(self, key: str) -> RollbackDrill:
        """One Rollout per probe, each in a namespace of its own (the recorder's audit-log check covers every
        VirtualService of its namespace)."""
        if key not in self.drills:
            from drills.pytest_plugin import _make_namespace, _ns_name
            ns = _ns_name(f"{self.ns_prefix}-{self.fx[key]['name']}")
            _make_namespace(self.api, ns)
            self.namespaces.append(ns)
            self.drills[key] = RollbackDrill(self.api, ns, spec_of(self.fx[key]), self.ev, log=self.log,
                                             controller_version=self.version, audit_log=self.audit_log)
        return self.drills[key]

    def step(self, name: str, fn, needs: str | None = None):
        if needs and needs not in self.done:
            raise AssertionError(f"step {name!r} cannot run: its prerequisite {needs!r} did not complete")
        out = fn()
        self.done.add(name)
        return out

    def close(self):
        from drills.pytest_plugin import _drop_namespace
        for d in self.drills.values():
            d.cleanup()
        for ns in self.namespaces:
            _drop_namespace(self.api, ns)

    def _lines(self) -> dict:
        if not self.bm:
            return {"branch_lines": branches.LINES_UNKNOWN, "source_note": self.source_note}
        return {"branch_lines": {branches.BACKWARD: self.bm.backward_search, branches.MID: self.bm.mid_steps,
                                 branches.END: self.bm.end_of_steps},
                "branch_source_order": self.bm.order, "source": self.bm.source, "source_sha256": self.bm.sha256}

    @staticmethod
    def assert_row(row: dict, allowed=(PASS, UNVERIFIED)):
        assert row["verdict"] in allowed, describe_row(row)

    # --- (a) end-of-steps ------------------------------------------------------------------------------
    def end_of_steps_deploy(self):
        d = self.drill("end_of_steps")
        d.deploy_v1()
        d.deploy_v2()
        d.wait_scaled_to_zero(d.hash_v1)

    def end_of_steps_rollback(self) -> dict:
        d = self.drill("end_of_steps")
        d.start_rollback(f"order-{STEP_END}")
        try:
            d.wait_settled()
        finally:
            obs = d.finish()
        exp = self.expect.get("end_of_steps") or {}
        verdict, reason = obs.verdict(exp.get("expected"))
        return self.ledger.record(
            LANE, STEP_END, branches.order_assertion(self.bm, branches.END), exp.get("expected"),
            obs.peak_canary_weight_while_partial, verdict, evidence=obs.timeline, reason=reason,
            probe="rollback inside rollbackWindow, final rung not 100", steps=steps_text(d.spec.steps),
            replicas=d.spec.replicas, opposite_order_would_show=exp.get("opposite"),
            partial_window_observed=obs.partial_window_observed, window_evidence=obs.window_evidence,
            weights_while_partial=obs.weights_while_partial, series=Path(obs.series).name,
            series_text=obs.describe(), revived_replicaset=obs.revived_hash, **self._lines())

    # --- (b) mid-steps ---------------------------------------------------------------------------------
    def mid_steps_deploy_v1(self):
        self.drill("mid_steps").deploy_v1()

    def mid_steps_deploy_v2(self) -> dict:
        d = self.drill("mid_steps")
        fx = self.fx["mid_steps"]
        spec = d.spec
        idx = int(fx["higher_rung_index"])
        rung = int(spec.steps[idx]["setWeight"])
        target = rung_count(rung, spec.replicas, spec.min_pods)
        label = f"order-{STEP_MID}"
        d.run_label = label
        rec = timeline.Recorder(self.api, d.ns, d.name, self.ev / f"{label}.timeline.jsonl",
                                audit_log=self.audit_log).start()
        d.recorder = rec
        hid = d.availability.hold(d.ns, {APP_LABEL: d.name}, spec.hold_seconds, batch=False)
        d.holds.append(hid)
        time.sleep(1.0)   # ReplicaSets compared by creation time (1 s precision)
        res = d.ro.set_image(d.name, spec.image_v2)
        rec.mark("deploy", rv=(res or {}).get("metadata", {}).get("resourceVersion"))
        self.log(f"  deploy v2, steps [{steps_text(spec.steps)}], new pods held {spec.hold_seconds:.0f}s each")
        error = None
        hash_v2 = None
        try:
            n_steps = len(spec.steps)
            d.ro.wait(d.name, Predicate(f"paused on the indefinite pause (step {idx + 1})",
                                        lambda o: paused()(o) and (o.get("status") or {}).get("currentStepIndex")
                                        == idx + 1), 60 + 4 * spec.hold_seconds * target, progress=d._progress)
            # the rung itself is written once the canary ReplicaSet is at its count
            d.wait_canary_weight(rung, 60, f"(the rung of step {idx}) once the canary ReplicaSet is complete")
            hash_v2 = d.ro.get(d.name)["status"]["currentPodHash"]
            d.availability.unhold(hid)
            d.holds.remove(hid)
            # taken by the controller, else promoted again as the plugin would (drills.rollout.promote_and_wait)
            d.ro.promote_and_wait(d.name, 120, on_send=d.mark, progress=d._progress)
            ro = d.ro.wait(d.name, Predicate("Healthy at v2", lambda o: healthy()(o) and
                                             o["status"].get("stableRS") == o["status"].get("currentPodHash")
                                             == hash_v2), 180, progress=d._progress)
            assert n_steps == len(ro["spec"]["strategy"]["canary"]["steps"])
            d.wait_canary_weight(0, 60, "(all traffic back on the new stable)")
        except (AssertionError, TimeoutError) as e:
            error = str(e)
        finally:
            for h in list(d.holds):
                d.availability.unhold(h)
            d.holds = []
            result = rec.stop()
            d.recorder = None
        recs = rec.records
        if hash_v2 is None:
            hash_v2 = next((r["obj"]["status"].get("currentPodHash") for r in reversed(timeline.ordered(recs))
                            if r["kind"] == "Rollout"), None)
        der = timeline.derive(recs, hash_v2, since_mark="deploy", target="rs_spec", until_mark="promote")
        short, short_seconds = weights_while_short_at(der, target)
        observed = max((w for _, w, _, _ in short), default=None)
        title = f"{label}: deploy v2, steps [{steps_text(spec.steps)}], replicas {spec.replicas} ({self.version})"
        series_path = rec.out.with_name(rec.out.name.replace(".timeline.jsonl", ".series.json"))
        series_path.write_text(json.dumps(der.series(title), indent=1))
        exp = self.expect.get("mid_steps") or {}
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
            verdict, reason = UNVERIFIED, "no expectation for this controller version"
        else:
            verdict = PASS if observed == exp["expected"] else FAIL
        rel = lambda rows: [[round(r[0] - der.t0, 2), *r[1:]] for r in rows]  # noqa: E731
        series_text = (f"weights in force while the canary ReplicaSet was short of {target} at step {idx} "
                       f"[t, weight, available, target]: {rel(short)} ({short_seconds:.1f}s short); canary weight "
                       f"series {rel(der.canary_weight)}")
        return self.ledger.record(
            LANE, STEP_MID, branches.order_assertion(self.bm, branches.MID), exp.get("expected"), observed, verdict,
            evidence=str(rec.out), reason=reason, probe="normal deploy reaching a higher rung while the canary "
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

    def _hazard_assertion(self, spec: ProbeSpec, last_rung: int) -> str:
        rpt = spec.extra_canary.get("replicaProgressThreshold") or self.fx["hazard_replica_progress_threshold"][
            "extra_canary"]["replicaProgressThreshold"]
        return (f"prescription [{steps_text(spec.steps)}] keeps the weight at the last rung ({last_rung}) with "
                f"replicaProgressThreshold {{type: {rpt['type']}, value: {rpt['value']}}}"
                + (f" (backward search :{self.bm.backward_search}, end-of-steps :{self.bm.end_of_steps})"
                   if self.bm else f" ({branches.LINES_UNKNOWN})"))

    def hazard(self) -> dict:
        fx = self.fx["hazard_replica_progress_threshold"]
        spec = spec_of(fx)
        from drills.probe import last_set_weight
        last_rung = last_set_weight(spec.steps)
        exp = self.expect.get("hazard_replica_progress_threshold") or {}
        applicable, where = self.hazard_applicable()
        if not applicable:
            return self.ledger.record(LANE, STEP_HAZARD, self._hazard_assertion(spec, last_rung), last_rung, None,
                                      NOT_APPLICABLE, reason=where, steps=steps_text(spec.steps), **self._lines())
        d = self.drill("hazard_replica_progress_threshold")
        d.deploy_v1()
        d.deploy_v2()
        d.wait_scaled_to_zero(d.hash_v1)
        d.start_rollback(f"order-{STEP_HAZARD}")
        try:
            d.wait_settled()
        finally:
            obs = d.finish()
        # The row asserts what this controller does (the expectation file: upstream's peak); the report
        # calls the version out whenever that peak is above the prescription's last rung.
        expected = exp.get("upstream_peak")
        verdict, reason = obs.verdict(expected)
        return self.ledger.record(
            LANE, STEP_HAZARD, self._hazard_assertion(spec, last_rung), expected,
            obs.peak_canary_weight_while_partial, verdict, evidence=obs.timeline, reason=reason, last_rung=last_rung,
            crd=where, steps=steps_text(spec.steps), extra_canary=spec.extra_canary,
            upstream_expected_peak=exp.get("upstream_peak"), known_hazard=bool(exp.get("known_hazard")),
            prescription_holds=(obs.peak_canary_weight_while_partial is not None and
                                obs.peak_canary_weight_while_partial <= last_rung),
            partial_window_observed=obs.partial_window_observed, window_evidence=obs.window_evidence,
            weights_while_partial=obs.weights_while_partial, series=Path(obs.series).name,
            series_text=obs.describe(), revived_replicaset=obs.revived_hash, **self._lines())
