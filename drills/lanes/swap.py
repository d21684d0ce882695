"""Lane ``swap`` — the controller upgrade itself, under live Rollouts, on one embedded cluster (a version pair).

Under the ``from`` controller the lane brings one Rollout into each state a fleet has (STATES): Healthy with the
previous revision scaled to 0 inside rollbackWindow; paused at ``pause: {}``; paused on a timed pause; aborted; a
rollback in progress with the revived ReplicaSet partly available (its other pods held un-Ready).  Then it upgrades
as a chart upgrade does (drills.cluster.swap: the new CRDs applied, the old controller stopped, the new one started
with the same flags) while the flight recorder of every Rollout runs, and records what moved:

- ReplicaSets the new controller creates, and the revision it writes, for a template nobody changed;
- pauses added or removed, the step index, abort kept or lost;
- every canary weight written after the swap, against the share the available pods hold;
- the seconds until the new controller has reconciled each Rollout (its log's "Reconciliation completed").

Verdicts have directions (as upgrade-check declares them): a new ReplicaSet or revision for an unchanged template,
a new pause, a lost abort, a weight above both the weight before and the available share, or a Rollout the new
controller does not reconcile are regressions (``fail``); a log line alone is not.  A regression the lane's
expectation file names for the pair (with its upstream reference) is still a ``fail`` row: the gate says it, the
lane's test accepts it as the lane working.

Then, under ``to``: the next rollback of the Healthy Rollout (does it revive the ReplicaSet the old controller left
inside the window, and what weight while it is partial), and what ``from`` left paused, promoted to its end.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..cluster.namespaces import drop_namespace, make_namespace, namespace_name
from ..cluster.swap import swap_controller
from ..core import config
from ..toolchain import resolve_controller_versions
from ..core.wait import WaitTimeout, hold_for, until
from ..drill.kit import ALL_STABLE_WITHIN_S, DrillRollout
from ..drill.shapes import RolloutSpec
from ..kube.rollout import HASH_LABEL, REVISION_ANNOTATION, Predicate, aborted, healthy, healthy_at, paused
from ..record import timeline
from ..record import swap_rows
from ..record.controller_log import SyncLog
from .. import routers
from ..record.ledger import FAIL, INCONCLUSIVE, PASS
from .base import LaneContext, Runbook, StepFailed, step
from ..core import fastyaml

STATES = ("healthy", "paused", "timed-pause", "aborted", "rollback")
STEPS = {
    "healthy": [{"setWeight": 5}, {"pause": {"duration": "10s"}}, {"setWeight": 100}],
    "paused": [{"setWeight": 20}, {"pause": {}}, {"setWeight": 100}],
    "timed-pause": [{"setWeight": 20}, {"pause": {"duration": "1h"}}, {"setWeight": 100}],
    "aborted": [{"setWeight": 20}, {"pause": {}}, {"setWeight": 100}],
    "rollback": [{"setWeight": 5}, {"pause": {"duration": "10s"}}, {"setWeight": 100}],
}
TEMPLATE_ENV = "stage"       # the fixture fleet's environment whose renders give the template Rollouts
TEMPLATE_KINDS = ("Rollout", "Service") + routers.OBJECT_KINDS   # what a render brings that a Rollout uses
RECONCILE_WITHIN_S = 60.0    # the new controller reconciles every Rollout within this, or it does not settle
KEEP_LOG_BYTES = 4 << 20     # the new controller's log kept as evidence: at most its last 4 MiB since the swap
AFTER_SWAP_S = 15.0          # evidence window once every Rollout was reconciled: what the new controller writes next
ABORT_TAKEN_S = 20.0         # a controller takes an abort within this, or it is announced again
NEXT_S = 240.0               # a Rollout the new controller finishes (promoted, rolled back) settles within this

def pair_key(frm: str, to: str) -> str:
    """The key of a version pair: the leg's and the expectation file's."""
    return f"{frm}->{to}"


@dataclass
class Snapshot:
    """A Rollout and its ReplicaSets as stored at one moment."""
    phase: str | None
    step: int | None
    abort: bool
    pauses: list
    revision: str | None
    weight: int | None
    stable: str | None
    current: str | None
    replicasets: dict = field(default_factory=dict)      # hash -> {"replicas", "available", "revision"}
    status: dict = field(default_factory=dict)

    @classmethod
    def of(cls, d: DrillRollout) -> "Snapshot":
        ro = d.ro.get(d.name)
        st = ro.get("status") or {}
        rss = {}
        for rs in d.ro.owned_replicasets(ro):
            h = (rs.metadata.labels or {}).get(HASH_LABEL)
            rss[h] = {"replicas": rs.spec.replicas, "available": (rs.status.available_replicas or 0),
                      "revision": (rs.metadata.annotations or {}).get(REVISION_ANNOTATION)}
        w = (((st.get("canary") or {}).get("weights") or {}).get("canary") or {}).get("weight")
        return cls(phase=st.get("phase"), step=st.get("currentStepIndex"), abort=bool(st.get("abort")),
                   pauses=sorted(p.get("reason") for p in st.get("pauseConditions") or []),
                   revision=(ro["metadata"].get("annotations") or {}).get(REVISION_ANNOTATION), weight=w,
                   stable=st.get("stableRS"), current=st.get("currentPodHash"), replicasets=rss,
                   status={k: v for k, v in st.items() if k not in ("conditions",)})


class LaneSwap(Runbook):
    key = swap_rows.LANE
    title = "The controller upgrade under live Rollouts: what the new controller does with the old one's state"
    estimate_s = 190.0
    uses_helm = True

    def __init__(self, ctx: LaneContext):
        to = ctx.options.get("swap_to")
        self.to = resolve_controller_versions(to)[0] if to else None     # an unknown version: BadInput, before all
        super().__init__(ctx)
        entry = self.expectation_versions().get(self.pair) if self.to else None
        self.verified = bool(entry) and not entry.get("unverified") and not ctx.options.get("user_built")
        self.expectations = (entry or {}) if self.verified else {}
        self.drills: dict[str, DrillRollout] = {}
        self.before: dict[str, Snapshot] = {}
        self.after: dict[str, Snapshot] = {}
        self.sync_log = SyncLog({})           # the new controller's log: reconciled, sync errors, hash changes
        self.swap_info: dict = {}
        self.controller_log: Path | None = None
        self.controller_log_cut = 0                 # bytes of the new controller's log left out of the kept copy
        self.namespaces: dict[str, str] = {}
        self.swapping = False
        # what a caller may narrow or add (the framework's own tests: a break injected into the swap): the states
        # made (STATES and "templates"), the new controller's extra flags, what runs while no controller runs
        self.states = tuple(ctx.options.get("swap_states") or (*STATES, "templates"))
        self.controller_args = list(ctx.options.get("swap_controller_args") or ())
        self.between = ctx.options.get("swap_between")

    @property
    def pair(self) -> str:
        return pair_key(self.ctx.version, self.to or "?")

    def known(self, state: str, assertion: str) -> str | None:
        """The upstream reference the expectation file gives for a regression it knows on this pair."""
        return (self.expectations.get("known_regressions") or {}).get(f"{state}/{assertion}")

    def _namespace(self, state: str) -> str:
        """Each state in a namespace of its own, as each service of a fleet is (a recording proves itself against
        the audit log's route writes of its namespace: another Rollout's there would be counted as missed)."""
        ns = make_namespace(self.ctx.api, namespace_name(f"swap-{state}"))
        self.namespaces[state] = ns
        return ns

    def _drill(self, state: str, spec: RolloutSpec | None = None, namespace: str | None = None) -> DrillRollout:
        c = self.ctx
        spec = spec or RolloutSpec(steps=STEPS[state], replicas=2, min_pods=1, name=state, router=c.router,
                                   image_v1=f"registry.local/{state}:v1", image_v2=f"registry.local/{state}:v2",
                                   rollback_via="gitops")
        log_path = Path(c.cluster.folder) / "logs" / "rollouts-controller.log" if c.cluster is not None else None
        d = DrillRollout(c.api, namespace or self._namespace(state), spec, self.evidence / state, log=c.log,
                         controller_version=c.name, audit_log=c.audit_log, controller_log=log_path)
        self.drills[state] = d
        return d

    @property
    def evidence(self) -> Path:
        """This pair's folder: two pairs from one version (v1.8.2->v1.8.5, v1.8.2->v1.10.2) share the version's."""
        return Path(self.ctx.evidence_dir) / self.key / re.sub(r"[^A-Za-z0-9.]+", "-", self.pair)

    # --- given: the states under the old controller --------------------------------------------------------
    @step()
    def given_states(self) -> dict[str, Snapshot]:
        if not self.to:
            raise StepFailed("lane swap needs the version to swap to (drills run --lanes swap plans the pairs; "
                             "pytest: --drills-swap-to VERSION)")
        if self.ctx.cluster is None:
            raise StepFailed("lane swap replaces the controller of an embedded cluster; a live cluster's controller "
                             "is the platform's to upgrade")
        if self.ctx.options.get("user_built") or self.to == self.ctx.version:
            raise StepFailed(f"lane swap runs on a pair of two releases, not {self.pair} (a user-built controller is "
                             f"not swapped in or out)")
        for state in [x for x in STATES if x in self.states]:
            self.ctx.log(f"swap {self.pair}: {state} under {self.ctx.version}")
            d = self._drill(state)
            d.deploy_v1()
            if state in ("healthy", "rollback"):
                d.deploy_v2()
                d.wait_scaled_to_zero(d.hash_v1)
            else:
                d.space_replicasets()
                d.ro.set_image(d.name, d.spec.image_v2, container=d.spec.container)
                d.ro.wait(d.name, Predicate("paused at step 1", lambda o: paused()(o) and
                                            o["status"].get("currentStepIndex") == 1), 120, progress=d.progress)
            if state == "aborted":
                self._abort(d)
            if state == "rollback":
                rec = d.start_rollback("swap")
                d.wait_partial_weight()
                d.freeze_revived()                 # partly available across the swap: the rest held un-Ready
                rec.mark("frozen")
            else:
                d.record("swap")
        if "templates" in self.states:
            self._templates()
        for state, d in self.drills.items():
            self.before[state] = Snapshot.of(d)
        return self.before

    def _templates(self) -> None:
        """One Rollout per service of the fixture chart (its stage render, with the real helm: pod template,
        labels, strategy as the fleet runs them), first revision Healthy: state ``template-<service>``."""
        import tempfile
        import yaml
        from ..charts.fleet import Fleet, base_dependency, render_app
        from ..charts.helm import Helm
        from ..drill.manifests import apply
        fleet, helm = Fleet(config.fixtures_dir() / "fleet"), Helm()
        c = self.ctx
        try:
            with tempfile.TemporaryDirectory(prefix="drills-swap-") as tmp:
                for app in fleet.apps(TEMPLATE_ENV):
                    r = render_app(fleet, app, base_dependency(fleet.chart_dir(app)).version, helm, tmp)
                    objs = [o for o in fastyaml.safe_load_all(r.text) if o and o.get("kind") in TEMPLATE_KINDS]
                    ro = next((o for o in objs if o["kind"] == "Rollout"), None)
                    if ro is None:
                        continue                  # a service deployed as a Deployment: nothing to swap under
                    state = f"template-{app.name}"
                    c.log(f"swap {self.pair}: {state} ({app.name}'s {TEMPLATE_ENV} render) under {c.version}")
                    ns = self._namespace(state)
                    for o in objs:
                        o["metadata"]["namespace"] = ns
                    apply(c.api, ns, yaml.safe_dump_all(objs))
                    spec = RolloutSpec(steps=ro["spec"]["strategy"]["canary"].get("steps") or [],
                                       replicas=ro["spec"].get("replicas") or 1, name=ro["metadata"]["name"],
                                       router=c.router, container=ro["spec"]["template"]["spec"]["containers"][0]["name"])
                    d = self._drill(state, spec, ns)
                    d.ro.wait(d.name, healthy(), 180, progress=d.progress)
                    d.record("swap")
        finally:
            helm.close()

    def _abort(self, d: DrillRollout) -> None:
        """Abort, until the controller took it (the canary weight back to 0).  A controller before v1.10.0 can lose
        the abort in its cache as it loses a promote (drills.kube.rollout: the write-back); the stored Rollout is
        then announced again (``resync``), said, and waited for once more."""
        done = Predicate("aborted, the canary weight back to 0", lambda o: aborted()(o) and _weight(o) == 0)
        d.ro.abort(d.name)
        try:
            d.ro.wait(d.name, done, ABORT_TAKEN_S, progress=d.progress)
            return
        except WaitTimeout as e:
            self.ctx.log(f"swap {self.pair}: the controller did not take the abort within {ABORT_TAKEN_S:g}s ({e}); "
                         f"announcing the stored Rollout again")
        d.ro.resync(d.name, "abort")
        d.ro.wait(d.name, done, 120, progress=d.progress)

    # --- when: the chart upgrade replaces the controller --------------------------------------------------
    @step("given_states")
    def swap(self) -> dict:
        for d in self.drills.values():
            d.recording.mark("swap")
        self.swapping = True                     # from here on close() puts the controller it found back
        self.swap_info = swap_controller(self.ctx.cluster, self.to, log=self.ctx.log, extra_args=self.controller_args,
                                         between=self.between)
        started = time.time()                    # the new controller's start
        logfile, offset = Path(self.swap_info["log"]), self.swap_info["log_offset"]
        self.sync_log = SyncLog({(d.ns, d.name): state for state, d in self.drills.items()},
                                routers.get(self.ctx.router))

        def seen() -> dict:
            return self.sync_log.read(logfile.read_bytes()[offset:].decode(errors="replace"), time.time() - started)

        try:
            until(f"controller {self.to} to reconcile every Rollout of the lane (its log's Reconciliation completed)",
                  seen, lambda r: set(r) >= set(self.drills), timeout=RECONCILE_WITHIN_S, interval=0.2,
                  describe=lambda r: f"reconciled: {sorted(r)}")
        except WaitTimeout as e:
            self.ctx.log(f"swap {self.pair}: {e}")
        hold_for(AFTER_SWAP_S, "what the new controller writes once it has reconciled every Rollout")
        seen()                                   # the counts over the whole log since the start
        self.controller_log = self._keep_log(logfile, offset)
        for state, d in self.drills.items():
            self.after[state] = Snapshot.of(d)
            d.recording.mark("settled")
        return self.swap_info

    def _keep_log(self, logfile: Path, offset: int) -> Path:
        """What the new controller said since its start (its first KEEP_LOG_BYTES: the syncs the ``reconciled`` rows
        count come first), kept beside the timelines (the cluster's own log goes with the cluster); a cut is said in
        the rows (``controller_log_cut``: the bytes left out)."""
        dest = self.evidence / f"controller-{self.to}.log"
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(logfile, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(offset)
            dest.write_bytes(fh.read(KEEP_LOG_BYTES))
        self.controller_log_cut = max(0, size - offset - KEEP_LOG_BYTES)
        return dest

    # --- then: what moved, with directions -----------------------------------------------------------------
    @step("swap")
    def verdicts(self) -> list[dict]:
        rows = []
        for state, d in self.drills.items():
            rows += self._state_rows(state, d)
        return rows

    def _state_rows(self, state: str, d: DrillRollout) -> list[dict]:
        b, a = self.before[state], self.after[state]
        rec = d.recording
        rec.rec.catch_up()
        result = rec.stop()               # the audit log's check of every route write: the recording is whole, or not
        complete, reasons = result["complete"], result["reasons"]
        records = rec.rec.records
        derived = timeline.derive(records, d.hash_v1 if state == "rollback" else b.current, since_mark="swap")
        evidence = str(rec.path)
        common = dict(evidence=evidence, pair=self.pair, state=state, controller_from=self.ctx.version,
                      controller_to=self.to, step_index=[b.step, a.step], phase=[b.phase, a.phase],
                      hash_changed_log_lines=self.sync_log.hash_changed.get(state, 0), swap=self.swap_info.get("seconds"))
        rows = []

        def row(assertion: str, expected, observed, regression: bool | None, why: str, **extra):
            if regression is None or not complete:
                verdict, reason = INCONCLUSIVE, (why if regression is None else
                                                 "the recording across the swap is incomplete: "
                                                 + "; ".join(reasons or ["no reason given"]))
            elif regression:
                ref = self.known(state, assertion)
                verdict, reason = FAIL, why + (f" (known on {self.pair}: {ref})" if ref else "")
            else:
                verdict, reason = PASS, None
            rows.append(self.row(state, assertion, expected, observed, verdict, reason=reason, **common, **extra))

        new_rs = sorted(set(a.replicasets) - set(b.replicasets))
        made = sorted(set(derived.replicasets) - set(b.replicasets))
        created = sorted(set(new_rs) | set(made))
        row("no-new-replicaset", [], created, bool(created),
            f"controller {self.to} created ReplicaSet(s) {created} for a template nobody changed",
            replicasets_before=b.replicasets, replicasets_after=a.replicasets)
        row("revision-kept", b.revision, a.revision, a.revision != b.revision,
            f"the revision moved {b.revision} -> {a.revision} with no change of template")
        added, removed = sorted(set(a.pauses) - set(b.pauses)), sorted(set(b.pauses) - set(a.pauses))
        row("no-new-pause", b.pauses, a.pauses, bool(added),
            f"controller {self.to} added pause(s) {added}", pauses_removed=removed)
        if b.pauses:           # a paused Rollout that resumes by itself after the upgrade has moved on its own
            row("pause-kept", b.pauses, a.pauses, bool(removed) or a.step != b.step,
                f"controller {self.to} removed pause(s) {removed} (step {b.step} -> {a.step})")
        if state == "aborted":
            row("abort-kept", True, a.abort, not a.abort, f"the abort was lost across the swap ({a.phase})")
        t_swap = next((t for t, label in derived.markers if label == "swap"), None)
        weights = [w for t, w in derived.canary_weight if t_swap is not None and t >= t_swap]
        # a rollback in flight may move up to what its available pods hold; anything else holds its weight
        share = _available_share(a, d.hash_v1, d.spec.replicas) if state == "rollback" else 0
        ceiling = max(b.weight or 0, share)
        peak = max(weights, default=b.weight or 0)
        row("weight-not-raised", f"<= {ceiling}", peak, None if t_swap is None else peak > ceiling,
            "the recording has no swap marker: the weights after the swap are unknown" if t_swap is None else
            f"controller {self.to} wrote a canary weight of {peak} over both the weight before ({b.weight}) and the "
            f"share the available pods hold ({share})", weights_after_swap=weights, available_share=share)
        log = self.sync_log
        took = log.reconciled.get(state)
        row("reconciled", f"<= {RECONCILE_WITHIN_S:g}s", took, took is None or took > RECONCILE_WITHIN_S,
            f"controller {self.to} did not reconcile the Rollout within {RECONCILE_WITHIN_S:g}s (a sync without an "
            f"error: {log.error_count.get(state, 0)} sync error(s) logged)",
            status_rewritten=_changed(b.status, a.status), controller_log=str(self.controller_log),
            controller_log_cut=self.controller_log_cut,
            sync_errors=log.errors.get(state, [])[:5], guard_delays=log.guard_delays.get(state, 0))
        return rows

    # --- then: under the new controller, the next rollback and what the old one left paused ------------------
    @step("verdicts")
    def next_rollback(self) -> list[dict]:
        """The Healthy Rollout rolled back to v1 under ``to``: the ReplicaSet the old controller left at 0 inside the
        window is revived (the fast rollback), or the hash moved and a new one walks the steps."""
        d = self.drills["healthy"]
        rec = d.start_rollback("next-rollback")
        back = Predicate("Healthy at the v1 image", lambda o: healthy()(o) and _image(o) == d.spec.image_v1 and
                         o["status"].get("stableRS") == o["status"].get("currentPodHash"))
        settled = None
        try:
            d.ro.wait(d.name, back, NEXT_S, progress=d.progress)
            _all_stable(rec, self.ctx.log)
        except WaitTimeout as e:
            settled = f"the rollback under {self.to} did not settle within {NEXT_S:g}s: {e}"
        obs = rec.finish()
        snap = Snapshot.of(d)
        new = sorted(set(snap.replicasets) - set(self.after["healthy"].replicasets))
        common = dict(evidence=str(rec.path), pair=self.pair, state="healthy", controller_from=self.ctx.version,
                      controller_to=self.to, new_replicasets=new)
        rows = []
        if settled or not obs.complete:
            rows.append(self.row("healthy", "rollback-revives-old-replicaset", d.hash_v1, snap.stable, INCONCLUSIVE,
                                 reason=settled or obs.inconclusive_reason(), **common))
        else:
            regression = snap.stable != d.hash_v1 or bool(new)
            ref = self.known("healthy", "rollback-revives-old-replicaset")
            rows.append(self.row(
                "healthy", "rollback-revives-old-replicaset", d.hash_v1, snap.stable, FAIL if regression else PASS,
                reason=(f"the rollback under {self.to} did not revive {d.hash_v1} (stable {snap.stable}, new {new}): "
                        f"the fast rollback became a new revision" + (f" (known on {self.pair}: {ref})" if ref else ""))
                if regression else None, **common))
        expected = self.expected("rollback_peak_weight")
        verdict, reason = obs.verdict(expected, self.no_expectation)
        rows.append(self.row("healthy", "rollback-peak-weight-while-partial", expected,
                             obs.peak_canary_weight_while_partial, verdict, reason=reason, **common))
        return rows

    @step("verdicts")
    def finish_what_from_started(self) -> list[dict]:
        """Under ``to``: the paused Rollouts promoted to their end, the held rollback released; each Healthy."""
        rows = []
        for state in ("paused", "timed-pause", "rollback"):
            d = self.drills[state]
            rec = d.record("finish")
            if state == "rollback":
                d.release_holds()
                want = d.hash_v1
            else:
                d.ro.promote(d.name, full=True)
                want = self.after[state].current
            try:
                ro = d.ro.wait(d.name, healthy_at(want), NEXT_S, progress=d.progress)
                got, verdict, reason = ro["status"].get("stableRS"), PASS, None
                _all_stable(rec, self.ctx.log)
            except WaitTimeout as e:
                last = e.last if isinstance(e.last, dict) else {}
                got, verdict, reason = (last.get("status") or {}).get("stableRS"), FAIL, str(e)
            rec.rec.catch_up()
            result = rec.stop()
            if verdict == PASS and not result["complete"]:
                verdict, reason = INCONCLUSIVE, "the recording is incomplete: " + "; ".join(result["reasons"])
            rows.append(self.row(state, "finishes-under-new-controller", want, got, verdict, reason=reason,
                                 evidence=str(rec.path), pair=self.pair, state=state,
                                 controller_from=self.ctx.version, controller_to=self.to))
        return rows

    def close(self) -> None:
        """The holds released, the recordings stopped, the controller the lane found put back (its CRDs too, also
        after a swap that stopped half-way: no controller running, or the new CRDs served), then the namespaces
        removed: the cluster's next tests meet the version it was started with."""
        try:
            for d in self.drills.values():
                try:
                    d.cleanup()
                except Exception as e:           # the other drills' cleanups and the swap-back still run
                    self.ctx.log(f"swap {self.pair}: a drill's cleanup failed: {type(e).__name__}: {e}")
        finally:            # a signal during the cleanups too: the controller the lane found goes back
            try:
                if self.swapping and self.ctx.cluster is not None:
                    self.ctx.log(f"swap {self.pair}: putting controller {self.ctx.version} back")
                    swap_controller(self.ctx.cluster, self.ctx.version, log=self.ctx.log)
                    self.ctx.cluster.update_state(swapped_from=None)
            finally:
                for ns in self.namespaces.values():
                    try:
                        drop_namespace(self.ctx.api, ns)
                    except Exception as e:       # the next one goes too; the cluster's own cleanup takes the rest
                        self.ctx.log(f"swap {self.pair}: namespace {ns} not removed: {e}")

    @classmethod
    def expectation_keys(cls) -> list[str]:
        """Every pair lane swap may run on: the neighbouring upgrades of the supported versions, the fleet's
        planned upgrade, and each one's downgrade."""
        ups = config.swap_pairs(config.SUPPORTED_CONTROLLERS)
        return [pair_key(a, b) for a, b in ups] + [pair_key(b, a) for a, b in ups]


def _all_stable(rec, log) -> None:
    """Once Healthy, the controller's last route write (all traffic on the stable) on the recording before it stops:
    a recording stopped before that write would lack it (the audit log has it)."""
    try:
        rec.wait("canary weight 0 in the route (all traffic on the stable again)",
                 lambda d: bool(d.canary_weight) and d.canary_weight[-1][1] == 0, ALL_STABLE_WITHIN_S,
                 canary_hash=None, since_mark=None)
    except WaitTimeout as e:          # the recording says what the weights were
        log(f"  .. {e}")


def _image(ro: dict, container: str = "app") -> str | None:
    spec = (ro.get("spec") or {}).get("template", {}).get("spec") or {}
    return next((c.get("image") for c in spec.get("containers") or [] if c.get("name") == container), None)


def _weight(ro: dict) -> int | None:
    return ((((ro.get("status") or {}).get("canary") or {}).get("weights") or {}).get("canary") or {}).get("weight")


def _available_share(s: Snapshot, canary_hash: str | None, replicas: int) -> int:
    """The share of traffic the canary's available pods hold, in percent of the Rollout's replicas; 0 when the
    canary is the stable (a Healthy Rollout has no canary to send traffic to)."""
    if canary_hash is None or canary_hash == s.stable:
        return 0
    rs = s.replicasets.get(canary_hash) or {}
    return min(100, round(100 * (rs.get("available") or 0) / max(1, replicas)))


def _changed(before: dict, after: dict) -> dict:
    """Status fields the new controller rewrote: key -> [before, after]."""
    keys = sorted(set(before) | set(after))
    return {k: [before.get(k), after.get(k)] for k in keys if before.get(k) != after.get(k)}
