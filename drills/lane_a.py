"""Lane A as a sequence of runbook steps over one ``RollbackDrill`` (two probes and an exit).

Each step returns the ledger row(s) it recorded; the lane's tests assert on them.  A step whose
prerequisite did not pass fails at once with that reason, and its row is recorded ``inconclusive``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from . import config, timeline
from .ledger import FAIL, INCONCLUSIVE, PASS, UNVERIFIED, Ledger
from .probe import Observation, ProbeSpec, RollbackDrill, steps_text
from .rollout import healthy_at

LANE = "a"
ASSERT_PEAK = "peak canary weight while the revived ReplicaSet is below its desired count"


def expectations(version: str) -> dict | None:
    data = yaml.safe_load((config.fixtures_dir() / "expectations" / "lane_a.yaml").read_text())
    return (data.get("versions") or {}).get(version)


class StepFailed(AssertionError):
    pass


class LaneA:
    def __init__(self, drill: RollbackDrill, fixture: dict, ledger: Ledger, variant: str, version: str):
        self.drill = drill
        self.fx = fixture
        self.ledger = ledger
        self.variant = variant
        self.version = version
        self.expect = expectations(version)
        self.done: set[str] = set()
        self.after_obs: Observation | None = None

    @classmethod
    def create(cls, api, namespace: str, evidence_dir: Path, ledger: Ledger, version: str, variant: str = "stage",
               availability_control: bool = True, rollback_via: str = "gitops", journal=None, log=None,
               audit_log: Path | None = None) -> "LaneA":
        fx_path = config.fixtures_dir() / "lane_a" / f"{variant}.yaml"
        spec, fx = ProbeSpec.from_fixture(fx_path, availability_control=availability_control,
                                          rollback_via=rollback_via)
        ev = Path(evidence_dir) / (f"lane-a-{variant}")
        drill = RollbackDrill(api, namespace, spec, ev, journal=journal, log=log, controller_version=version,
                              audit_log=audit_log)
        return cls(drill, fx, ledger, variant, version)

    # --- plumbing ----------------------------------------------------------------------------------
    def _assertion(self, text: str) -> str:
        return text if self.variant == "stage" else f"{text} [prod-shaped: replicas {self.fx['replicas']}, " \
                                                    f"minPodsPerReplicaSet {self.fx['minPodsPerReplicaSet']}]"

    def step(self, name: str, fn, needs: str | None = None):
        if needs and needs not in self.done:
            raise StepFailed(f"step {name!r} cannot run: its prerequisite {needs!r} did not complete")
        out = fn()
        self.done.add(name)
        return out

    @staticmethod
    def assert_row(row: dict):
        msg = (f"{row['lane']}/{row['step']}: {row['assertion']}: expected {row['expected']!r}, observed "
               f"{row['observed']!r}, verdict {row['verdict']}"
               + (f" ({row['reason']})" if row.get("reason") else "")
               + (f"; {row['details'].get('series_text')}" if (row.get("details") or {}).get("series_text") else ""))
        assert row["verdict"] in (PASS, UNVERIFIED), msg

    def close(self):
        self.drill.cleanup()

    # --- steps -------------------------------------------------------------------------------------
    def deploy_v1(self):
        self.drill.deploy_v1()

    def deploy_v2(self):
        self.drill.deploy_v2()

    def wait_v1_scaled_down(self):
        self.drill.wait_scaled_to_zero(self.drill.hash_v1)

    def _record_peak(self, step: str, obs: Observation, expected: int | None) -> dict:
        verdict, reason = obs.verdict(expected)
        return self.ledger.record(
            LANE, step, self._assertion(ASSERT_PEAK), expected, obs.peak_canary_weight_while_partial, verdict,
            evidence=obs.timeline, reason=reason, variant=self.variant,
            steps=steps_text(self.drill.spec.steps), rollback_via=self.drill.spec.rollback_via,
            partial_window_observed=obs.partial_window_observed, exposure_seconds=obs.exposure_seconds,
            window_evidence=obs.window_evidence, weights_while_partial=obs.weights_while_partial,
            series=Path(obs.series).name, series_text=obs.describe(), revived_replicaset=obs.revived_hash,
            availability_control=self.drill.spec.availability_control)

    def before(self) -> dict:
        self.drill.start_rollback("before")
        self.done.add("before-ran")
        try:
            self.drill.wait_settled()
        finally:
            obs = self.drill.finish()
        return self._record_peak("before", obs, (self.expect or {}).get("before"))

    def cut_steps(self) -> dict:
        steps = self.fx["steps_after"]
        self.drill.cut_steps(steps)
        ro = self.drill.ro.get(self.drill.name)
        observed = ro["spec"]["strategy"]["canary"]["steps"]
        ok = observed == steps and ro["status"].get("phase") == "Healthy"
        return self.ledger.record(LANE, "cut-steps", self._assertion("steps after the cut (final setWeight removed), "
                                                                      "Rollout Healthy"),
                                  steps_text(steps), steps_text(observed) + f" ({ro['status'].get('phase')})",
                                  PASS if ok else FAIL, variant=self.variant)

    def redeploy_v2(self):
        self.drill.deploy_v2()
        self.drill.wait_scaled_to_zero(self.drill.hash_v1)

    def after(self) -> dict:
        d = self.drill
        d.start_rollback("after")
        self.done.add("after-ran")
        # wait for the first non-zero weight while partial, then give the controller time to write more
        d.wait_partial_weight(timeout=max(60.0, 4 * d.spec.hold_seconds))
        time.sleep(min(5.0, d.spec.hold_seconds / 3))
        derived = timeline.derive(list(d.recorder.records), d.hash_v1, since_mark="rollback")
        obs = _snapshot(d, derived)
        self.after_obs = obs
        return self._record_peak("after", obs, (self.expect or {}).get("after"))

    def exit_promote_full(self) -> list[dict]:
        """Abort the AFTER rollback while the revived ReplicaSet is partial (the incident posture), then
        promote --full.  The controller may not act on the abort while the ReplicaSet is partial (the
        DestinationRule switch waits for full availability): what it did is recorded, not assumed."""
        d = self.drill
        rows = []
        res = d.ro.abort(d.name)
        d.mark("abort", res)
        time.sleep(1.0)
        now = d.current()
        partial_at_exit = bool(now.partial) and now.partial[-1][1] is None
        weight_after_abort = now.canary_weight[-1][1] if now.canary_weight else None
        res = d.ro.promote(d.name, full=True)
        d.mark("promote --full", res)
        try:
            d.ro.wait(d.name, healthy_at(d.hash_v1), 240, progress=d._progress)
            healthy_ok, healthy_err = True, None
        except AssertionError as e:
            healthy_ok, healthy_err = False, str(e)
        if healthy_ok:
            d.wait_settled(timeout=60)
        obs = d.finish()
        recs = timeline.load(Path(obs.timeline))
        ex = exit_analysis(recs, d.hash_v1, replicas=d.spec.replicas)
        ev = obs.timeline
        reason = None
        if res is None:
            reason = "promote --full had nothing to do: the rollback had already completed"
        elif not partial_at_exit:
            reason = "the revived ReplicaSet was no longer partial when promote --full was sent"
        elif not obs.complete:
            reason = f"timeline incomplete: {'; '.join(obs.incomplete_reasons)}"
        details = dict(variant=self.variant, weight_after_abort=weight_after_abort,
                       partial_at_promote_full=partial_at_exit, weights_after_promote_full=ex["weights_after"],
                       abort_seen_by_controller=ex["abort_effective"])

        def verdict(ok: bool) -> str:
            return INCONCLUSIVE if reason else (PASS if ok else FAIL)

        rows.append(self.ledger.record(
            LANE, "exit", self._assertion("promote --full clears abort"), False, ex["abort_after_promote_full"],
            verdict(ex["abort_after_promote_full"] is False), evidence=ev, reason=reason, **details))
        cap = ex["max_weight_until_available"]
        rows.append(self.ledger.record(
            LANE, "exit", self._assertion("weight never above its value at promote --full until the revived "
                                          "ReplicaSet is fully available"),
            f"<= {ex['weight_at_promote_full']}", cap,
            INCONCLUSIVE if reason or cap is None else (PASS if cap <= ex["weight_at_promote_full"] else FAIL),
            evidence=ev, reason=reason or (None if cap is not None else
                                           "the revived ReplicaSet never became fully available in the recording"),
            series_text=f"canary weights after promote --full: {ex['weights_after']}", **details))
        rows.append(self.ledger.record(
            LANE, "exit", self._assertion("Healthy at v1 after promote --full"), "Healthy, stableRS = v1",
            "Healthy, stableRS = v1" if healthy_ok else healthy_err, verdict(healthy_ok), evidence=ev,
            reason=reason, **details))
        return rows


def _pred_aborted():
    from .rollout import aborted
    return aborted()


def _snapshot(d: RollbackDrill, derived) -> Observation:
    """An observation of the run so far (the recorder keeps running for the exit)."""
    series_path = d.recorder.out.with_name(d.recorder.out.name.replace(".timeline.jsonl", ".series.json"))
    series_path.write_text(json.dumps(derived.series(f"{d.run_label}: rollback to v1, steps "
                                                     f"[{steps_text(d.spec.steps)}] ({d.version})"), indent=1))
    return Observation(
        label=d.run_label, peak_canary_weight_while_partial=derived.peak_canary_weight_while_partial,
        partial_window_observed=derived.partial_window_observed, exposure_seconds=round(derived.exposure_seconds, 3),
        rollback_in_window=derived.rollback_in_window or bool(derived.window_evidence),
        window_evidence=derived.window_evidence, complete=d.recorder.complete,
        incomplete_reasons=list(d.recorder.incomplete_reasons), timeline=str(d.recorder.out),
        series=str(series_path),
        weights_while_partial=[[round(a - derived.t0, 2), *b] for a, *b in derived.weights_while_partial],
        canary_weights=[[round(a - derived.t0, 2), w] for a, w in derived.canary_weight], revived_hash=d.hash_v1)


def exit_analysis(records: list[dict], revived_hash: str, replicas: int) -> dict:
    """From the mark 'promote --full': weight in force then, the highest weight until the revived
    ReplicaSet is fully available, and whether abort was cleared."""
    recs = timeline.ordered(records)
    weight = 0
    ro = None
    rs_avail = 0
    at_pf = None
    max_until = None
    abort_after = None
    weights_after = []
    reached = False
    abort_effective = False
    for r in recs:
        if r["kind"] == "Mark" and r["name"] == "promote --full":
            at_pf = weight
            max_until = weight
            continue
        if r["kind"] == "Rollout":
            ro = r["obj"]
            if at_pf is not None:
                abort_after = ro["status"]["abort"]
            if ro["status"]["abort"] and ro["status"].get("phase") == "Degraded":
                abort_effective = True
        elif r["kind"] == "ReplicaSet" and r["obj"].get("hash") == revived_hash:
            rs_avail = r["obj"]["available"]
        elif r["kind"] == "VirtualService" and ro:
            c, _ = timeline.canary_weight_of(r["obj"], ro)
            if c is not None:
                weight = c
                if at_pf is not None:
                    weights_after.append(c)
        if at_pf is not None and not reached:
            if rs_avail >= replicas:
                reached = True
            else:
                max_until = max(max_until, weight)
    return {"weight_at_promote_full": at_pf, "max_weight_until_available": max_until if reached else None,
            "abort_after_promote_full": abort_after, "weights_after": weights_after, "fully_available": reached,
            "abort_effective": abort_effective}
