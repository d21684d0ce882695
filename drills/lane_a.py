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
from .ledger import FAIL, INCONCLUSIVE, PASS, UNVERIFIED, Ledger, describe_row
from .probe import Observation, ProbeSpec, RollbackDrill, steps_text
from .rollout import healthy_at

LANE = "a"
ASSERT_PEAK = "peak canary weight while the revived ReplicaSet is below its desired count"


def expectations(version: str) -> dict | None:
    data = yaml.safe_load((config.fixtures_dir() / "expectations" / "lane_a.yaml").read_text())
    return (data.get("versions") or {}).get(version)


class StepFailed(AssertionError):
    pass


class LaneLoad:
    """Locust load through the mesh emulator during each rollback of the lane (embedded cluster only).

    Per-pod capacity is set so the stable ReplicaSet carries the whole load comfortably while half the pods
    cannot: the BEFORE exposure (100 % on 1 of 2 pods) must show failures, AFTER (5 %) nearly none.
    """

    USERS, RATE_PER_USER, CAPACITY_RPS = 10, 4.0, 30.0     # 40 req/s offered; 30 req/s per Ready pod

    def __init__(self, cluster, namespace: str, name: str, folder: Path, log=None, url: str | None = None):
        """Embedded: a mesh emulator in front of the lane's Rollout.  Live (``url``): the stage service's URL
        the user named, with the live target rules of drills.load."""
        self.folder = Path(folder)
        self.log = log or (lambda m: None)
        self.mesh = None
        self.target = "embedded"
        if url:
            self.url, self.target = url, "live"
        else:
            from .mesh_server import MeshProcess
            self.mesh = MeshProcess(cluster.kubeconfig, namespace, name, name, capacity_rps=self.CAPACITY_RPS,
                                    folder=self.folder, register=cluster.register_process,
                                    unregister=cluster.unregister_process, seed=7)
            self.url = self.mesh.url
        self.run = None

    def start(self, label: str):
        from .load import start_load
        self.run = start_load(self.url, self.folder / label, users=self.USERS, rate_per_user=self.RATE_PER_USER,
                              run_time_s=240, name=label, target=self.target)
        time.sleep(5.0)      # the steady phase before the rollback

    def phases(self, ledger: Ledger, step: str, records: list[dict], revived_hash: str, settled: bool = True,
               exit_mark: str | None = None) -> tuple[list[dict], dict]:
        """Cut the load into phases from the timeline (steady: before the rollback; exposure: a non-zero
        weight on the partial ReplicaSet; exit: from ``exit_mark`` to full availability; settled: afterwards);
        ledger rows per phase."""
        d = timeline.derive(records, revived_hash, since_mark="rollback")
        rel = lambda t: None if t is None else t - d.t0  # noqa: E731
        first_weight = next((t for t, w, *_ in d.weights_while_partial if w > 0), None)
        partial_end = d.partial[-1][1] if d.partial else None
        mark = next((t for t, label in d.markers if label == exit_mark), None) if exit_mark else None
        now = rel(time.monotonic())
        phases = {"steady": (-5.0, 0.0)}
        if first_weight is not None:
            end = mark if mark is not None else (partial_end if partial_end else None)
            phases["exposure"] = (rel(first_weight), rel(end) if end is not None else now)
        if mark is not None:
            phases["exit"] = (rel(mark), rel(partial_end) if partial_end else now)
        if settled:
            phases["settled"] = (rel(partial_end) if partial_end else now, None)
        return self.finish(ledger, step, d, phases)

    def finish(self, ledger: Ledger, step: str, derived, phases_rel: dict) -> tuple[list[dict], dict]:
        from .load import load_thresholds, phase_stats, record_phase_rows
        time.sleep(3.0)      # a little of the settled phase
        self.run.stop()
        to_wall = lambda t: derived.t0_wall + t  # noqa: E731
        phases = {k: (to_wall(a), to_wall(b)) for k, (a, b) in phases_rel.items() if a is not None and b is not None
                  and b > a}
        if "settled" in phases_rel and phases_rel["settled"][0] is not None:
            phases["settled"] = (to_wall(phases_rel["settled"][0]), self.run.ended_at)
        stats = phase_stats(self.run.records(), phases)
        # thresholds are calibrated for the emulated mesh; against a live service the figures are recorded
        # as observations (`unverified`): what users saw, not a pass or fail of the drill
        thresholds = load_thresholds() if self.target == "embedded" else {}
        rows = record_phase_rows(ledger, LANE, step, stats, thresholds, self.run.records_path,
                                 emulated=self.target == "embedded")
        extra = {"phases": {k: [round(a - derived.t0_wall, 3), round(b - derived.t0_wall, 3)]
                            for k, (a, b) in phases.items()},
                 "load": {k: {"failure_ratio": v.get("failure_ratio"), "p95_ms": v.get("p95_ms"),
                              "requests": v.get("requests")} for k, v in stats.items()}}
        return rows, extra

    def close(self):
        if self.run:
            self.run.stop()
        if self.mesh:
            self.mesh.stop()


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
        self.load: LaneLoad | None = None
        self.cluster = None
        self.load_rows: list[dict] = []

    @classmethod
    def create(cls, api, namespace: str, evidence_dir: Path, ledger: Ledger, version: str, variant: str = "stage",
               availability_control: bool = True, rollback_via: str = "gitops", journal=None, log=None,
               audit_log: Path | None = None, cluster=None) -> "LaneA":
        fx_path = config.fixtures_dir() / "lane_a" / f"{variant}.yaml"
        spec, fx = ProbeSpec.from_fixture(fx_path, availability_control=availability_control,
                                          rollback_via=rollback_via)
        ev = Path(evidence_dir) / (f"lane-a-{variant}")
        drill = RollbackDrill(api, namespace, spec, ev, journal=journal, log=log, controller_version=version,
                              audit_log=audit_log)
        lane = cls(drill, fx, ledger, variant, version)
        lane.cluster = cluster
        return lane

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

    def assert_row(self, row: dict):
        msg = describe_row(row)
        # a tested version must pass; only a version without expectations may be `unverified`
        allowed = (PASS,) if self.expect is not None else (PASS, UNVERIFIED)
        assert row["verdict"] in allowed, msg

    def close(self):
        if self.load:
            self.load.close()
        self.drill.cleanup()

    # --- steps -------------------------------------------------------------------------------------
    def deploy_v1(self):
        self.drill.deploy_v1()
        if self.cluster is not None and self.variant == "stage":
            self.load = LaneLoad(self.cluster, self.drill.ns, self.drill.name, self.drill.evidence_dir / "load")

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
        if self.load:
            self.load.start("before")
        self.drill.start_rollback("before")
        self.done.add("before-ran")
        try:
            self.drill.wait_settled()
        finally:
            extra = self._load_phases("before", settled=True)
            obs = self.drill.finish(extra_series=extra)
        return self._record_peak("before", obs, (self.expect or {}).get("before"))

    def load_rows_checked(self) -> list[dict]:
        """The per-phase load rows of BEFORE and AFTER (the stage lane on the embedded cluster runs load)."""
        if self.load is None:
            if self.variant == "stage" and self.cluster is not None:
                raise StepFailed("no load ran during the stage lane")
            return []
        phases = {(r["step"], r["assertion"]) for r in self.load_rows}
        for step in ("before", "after"):
            if (step, "load.exposure.failure_ratio") not in phases:
                raise StepFailed(f"no load was measured in the {step} exposure phase")
        return self.load_rows

    def _load_phases(self, step: str, settled: bool = False, exit_mark: str | None = None) -> dict | None:
        """Cut the load into phases from the timeline so far (steady: before the rollback; exposure: a
        non-zero weight on the partial ReplicaSet; exit: from ``exit_mark`` to full availability; settled:
        afterwards); ledger rows per phase."""
        if not self.load or not self.load.run:
            return None
        rows, extra = self.load.phases(self.ledger, step, list(self.drill.recorder.records), self.drill.hash_v1,
                                       settled=settled, exit_mark=exit_mark)
        self.load_rows.extend(rows)
        return extra

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
        if self.load:
            self.load.start("after")
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
        extra = self._load_phases("after", settled=True, exit_mark="abort")
        obs = d.finish(extra_series=extra)
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
    series_path = timeline.series_path(d.recorder.out)
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
