"""``--verify K``: the prediction judged by the real controller (the rows are lane ``scan``'s, drills.lanes.scan).

Up to K distinct shapes (controller version, router and routing, steps, replicas, minPodsPerReplicaSet,
replicaProgressThreshold, dynamicStableScale) are picked so that every predicted rule the probe can run is
covered (one shape per rule first, the shape standing for the most Rollouts; then the most common others).
Each runs through the rollback probe (drills.drill.probe) on the embedded cluster at that version, on its own router
(Istio or nginx: drills.routers), in a namespace of its own, and becomes one comparison: predicted vs observed peak canary weight while the revived ReplicaSet is
partial, and the pods that carried it.  The shapes are probed side by side (PROBES_AT_ONCE at a time, each a
Rollout in a namespace of its own, as one controller drives many): a probe waits on pods turning Ready one by one
far more than it computes, so K shapes take about the time of the longest.  A shape is probed at fewer replicas when its replicas would make the
probe long, but only at a count whose prediction has the same rule, peak and exposure; pause durations are
shortened (they do not enter the rollback path: the index jumps past them).

An autoscaled Rollout whose maximum predicts otherwise than its current size (another rule, peak or exposure) is
judged at its autoscaler's maximum too (the size an incident's load scales it to): a shape of its own, at
``replicas`` = the maximum, after the rules are covered and before the other fillers; probed at the fewest
replicas (up to MAX_PROBE_REPLICAS_AT_MAX) whose prediction has the maximum's rule, peak and exposure, so an
exposure that opens only above the safe pod count is probed where it is open.
"""
from __future__ import annotations

import dataclasses
import json
import signal
import uuid
from pathlib import Path

from .. import routers
from ..cluster.namespaces import drop_namespace, make_namespace, namespace_name
from ..core.signals import Interrupted
from ..drill import together
from ..record.ledger import FAIL, INCONCLUSIVE, PASS
from ..drill.probe import run_probe
from ..drill.shapes import RolloutSpec
from .model import steps_text
from .predict import NOT_APPLICABLE_RULES, predict
from .records import Record

MAX_PROBE_REPLICAS = 4
MAX_PROBE_REPLICAS_AT_MAX = 64   # an autoscaler's maximum: the window opens above the safe pod count (2 / 5 % = 40)
HOLD_SECONDS = 15.0              # a shorter hold can end before the controller's write lands (TOOLCHAIN.md)
PROBE_PAUSE = "2s"
PROBE_STEP_FIELDS = {"setWeight", "pause", "setCanaryScale"}


@dataclasses.dataclass
class Shape:
    record: Record                 # the Rollout standing for the shape
    count: int                     # Rollouts with this shape
    probe_replicas: int
    at_max: bool = False           # the Rollout at its autoscaler's maximum (record.sizes["max"])

    @property
    def ro(self):
        if self.at_max:
            return dataclasses.replace(self.record.ro, replicas=self.record.ro.size_range[1])
        return self.record.ro

    @property
    def pred(self):
        """The prediction the shape judges: at the autoscaler's maximum, or at the Rollout's replicas."""
        return self.record.sizes["max"] if self.at_max else self.record.pred

    @property
    def label(self) -> str:
        ro = self.ro
        extra = (f", replicaProgressThreshold {ro.rpt['type']} {ro.rpt['value']}" if ro.rpt else "") + \
            (", dynamicStableScale" if ro.dss else "")
        return (f"{routed_by(ro)} {steps_text(ro.steps)} replicas {ro.replicas}"
                f"{' (autoscaler maximum)' if self.at_max else ''} minPods "
                f"{'-' if ro.min_pods is None else ro.min_pods}{extra}")


def not_verifiable(r: Record) -> str | None:
    if r.pred is None or r.facts is None:
        return "controller version unknown"
    if r.pred.rule in NOT_APPLICABLE_RULES:
        return f"not applicable ({r.pred.rule})"
    if probe_router(r.ro) is None:
        return f"the probe routes with Istio subsets or hosts, or nginx, not {r.ro.router or r.ro.routing}"
    if r.facts.cap:
        return "a source with the weight cap is not a built release"
    if r.ro.max_weight != 100:
        return f"the probe's Rollout has no maxTrafficWeight ({r.ro.max_weight} here)"
    if r.ro.dss:
        return "the probe sets scaleDownDelaySeconds, which dynamicStableScale forbids (InvalidSpec)"
    extra = sorted({k for s in r.ro.steps for k in s} - PROBE_STEP_FIELDS)
    if extra:
        return f"the probe runs setWeight, pause and setCanaryScale steps, not {', '.join(extra)}"
    return None


def _key(ro) -> tuple:
    return (ro.controller_version, ro.router, ro.routing, json.dumps(ro.steps, sort_keys=True), ro.replicas,
            ro.min_pods, json.dumps(ro.rpt, sort_keys=True), ro.dss, ro.max_weight)


def probe_replicas(r: Record, at_max: bool = False) -> int | None:
    """The replicas to probe at: the shape's own when small, else the fewest with the same prediction (at the
    autoscaler's maximum: up to MAX_PROBE_REPLICAS_AT_MAX)."""
    shape = Shape(r, 1, 0, at_max)
    ro, p = shape.ro, shape.pred
    limit = MAX_PROBE_REPLICAS_AT_MAX if at_max else MAX_PROBE_REPLICAS
    if ro.replicas <= MAX_PROBE_REPLICAS:
        return ro.replicas
    for n in range(3, min(limit, ro.replicas) + 1):
        q = predict(dataclasses.replace(ro, replicas=n), r.facts)
        if (q.rule, q.peak, q.exposed) == (p.rule, p.peak, p.exposed):
            return n
    return None


def pick(records: list[Record], k: int) -> tuple[list[Shape], list[str], dict]:
    """(shapes to probe, rules left uncovered, why other Rollouts are not verifiable).  Chosen: one shape per
    predicted rule first, then the autoscaled Rollouts at their maximum, then the most common others."""
    groups: dict[tuple, list[Record]] = {}
    skipped: dict[str, int] = {}
    for r in records:
        why = not_verifiable(r)
        if why:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        groups.setdefault((_key(r.ro), False), []).append(r)
        mx = r.sizes["max"] if r.sizes and r.ro.size_range[1] != r.ro.replicas else None
        if mx is None or (mx.rule, mx.peak, mx.exposed) == (r.pred.rule, r.pred.peak, r.pred.exposed):
            continue                 # no autoscaler, or its maximum predicts what the current size does
        if mx.rule in NOT_APPLICABLE_RULES:
            why = f"at the autoscaler's maximum only: not applicable ({mx.rule})"
            skipped[why] = skipped.get(why, 0) + 1
            continue
        groups.setdefault((_key(Shape(r, 1, 0, True).ro), True), []).append(r)
    shapes = []
    for (_, at_max), recs in groups.items():
        n = probe_replicas(recs[0], at_max)
        if n is None:
            why = ("at the autoscaler's maximum only: " if at_max else "") + \
                "no probe-sized replica count keeps the prediction"
            skipped[why] = skipped.get(why, 0) + len(recs)
            continue
        shapes.append(Shape(recs[0], len(recs), n, at_max))
    shapes.sort(key=lambda s: (s.at_max, -s.pred.exposed, -s.count, s.probe_replicas, s.label))
    rules: list[str] = []
    for s in shapes:
        if s.pred.rule not in rules:
            rules.append(s.pred.rule)
    chosen = [next(s for s in shapes if s.pred.rule == rule) for rule in rules][:k]
    chosen += [s for s in shapes if s.at_max and s not in chosen][:max(0, k - len(chosen))]
    chosen += [s for s in shapes if s not in chosen][:max(0, k - len(chosen))]
    covered = {s.pred.rule for s in chosen}
    return chosen, [r for r in rules if r not in covered], skipped


def probe_steps(steps: list) -> list:
    return [{"pause": {"duration": PROBE_PAUSE}} if "pause" in s and (s.get("pause") or {}).get("duration")
            else dict(s) for s in steps]


def probe_router(ro) -> str | None:
    """The router the probe routes a scanned Rollout with (None: one the probe has not)."""
    if ro.router == "istio" and ro.routing in ("subset", "host"):
        return "istio"
    return ro.router if ro.router in routers.NAMES and ro.router != "istio" else None


def routed_by(ro) -> str:
    return ro.routing if ro.router in ("istio", "") else ro.router


def probe_spec(shape: Shape) -> RolloutSpec:
    ro = shape.ro
    router = probe_router(ro) or "istio"
    extra = {"replicaProgressThreshold": dict(ro.rpt)} if ro.rpt else {}
    name = f"scan-{uuid.uuid4().hex[:5]}"
    return RolloutSpec(steps=probe_steps(ro.steps), replicas=shape.probe_replicas, min_pods=ro.min_pods or 1,
                       router=router, routing=ro.routing if router == "istio" else None,
                       rollback_window=max(ro.rollback_window or 1, 1), hold_seconds=HOLD_SECONDS,
                       name=name, extra_canary=extra, image_v1=f"registry.local/{name}:v1",
                       image_v2=f"registry.local/{name}:v2")


PROBES_AT_ONCE = 4
STOP_S = together.STOP_S   # an interrupted verify: how long the probes may take to unwind (holds, recordings, namespace)


def run_shapes(api, shapes: list[Shape], version: str, evidence_dir: Path, audit_log=None, log=None,
               controller_log: Path | None = None, at_once: int = PROBES_AT_ONCE) -> list:
    """run_shape for every shape, up to ``at_once`` side by side (drills.drill.together): the comparisons in the
    shapes' order, the exception in place of a shape whose probe (or its namespace) failed; the others are still
    probed.  Each probe's lines start with its Rollout's name.

    Interrupted (a signal's ``Interrupted``, or KeyboardInterrupt, comes to this thread), the probes are told to
    stop: each raises it at its next wait and unwinds through its own clean-up (holds released, recording stopped,
    namespace removed) while the cluster is still up; what is left after STOP_S is removed from here, and the
    interruption goes on (a second signal cuts the wait short)."""
    log = log or (lambda m: print(m, flush=True))
    results: list = [None] * len(shapes)
    specs = [probe_spec(s) for s in shapes]
    spaces: list[str] = []
    probes = together.Together("verify", log, at_once=max(1, int(at_once)), stop_s=STOP_S)

    def one(i: int, ns: str, reached) -> dict:
        name = specs[i].name
        return run_shape(api, shapes[i], version, evidence_dir, audit_log, lambda m: log(f"[{name}] {m}"),
                         controller_log, spec=specs[i], namespace=ns)

    try:
        for i, spec in enumerate(specs):
            probes.slot()
            ns = namespace_name(spec.name)
            spaces.append(ns)               # recorded first: a signal inside the create still finds it
            log(f"[{spec.name}] probe of {shapes[i].label} in namespace {ns}")
            try:
                make_namespace(api, ns)
            except Exception as e:          # this shape's failure, not the others'
                results[i] = e
                probes.release_slot()
                try:
                    drop_namespace(api, ns)     # a create that timed out may still have made it
                except Exception:
                    pass
                continue
            probes.start(f"{spec.name} (shape {i + 1})", one, i, ns, slotted=True)
        for i in range(len(specs)):
            if f"{specs[i].name} (shape {i + 1})" in probes:
                results[i] = probes.outcome(f"{specs[i].name} (shape {i + 1})")
    except BaseException as e:              # a signal, or this thread's own failure: no probe is left behind
        cause = e if isinstance(e, Interrupted) else Interrupted(
            signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM,
            None if isinstance(e, KeyboardInterrupt) else f"stopped: {type(e).__name__}: {e}")
        probes.stop(cause, leftovers=f"namespaces {', '.join(spaces)} and their availability holds (the cluster's "
                                     f"next `down` removes both)")
        for ns in spaces:                   # a probe that did not unwind in time (or never started) is removed here
            try:
                drop_namespace(api, ns)
            except Exception as err:        # the interruption is what the caller hears; what is left is said
                log(f"verify: namespace {ns} could not be removed ({err})")
        raise
    return results


def run_shape(api, shape: Shape, version: str, evidence_dir: Path, audit_log=None, log=None,
              controller_log: Path | None = None, spec: RolloutSpec | None = None,
              namespace: str | None = None) -> dict:
    """Probe one shape on the cluster behind ``api`` (controller ``version``) and compare: a dict with the
    predicted and observed peak and pods, the verdict and its reason, and the evidence.  ``spec`` and
    ``namespace``: the probe's Rollout and its namespace when the caller made them (run_shapes); the namespace
    is removed at the end either way."""
    pred = shape.pred
    probed = predict(dataclasses.replace(shape.ro, replicas=shape.probe_replicas), shape.record.facts)
    spec = spec or probe_spec(shape)
    out = {"controller_version": version, "router": spec.router, "shape": shape.label, "rule": pred.rule, "rollouts": shape.count,
           "example": f"{shape.ro.source} {shape.ro.key}", "replicas": shape.ro.replicas,
           "at_max": shape.at_max, "probe_replicas": shape.probe_replicas, "predicted": probed.peak,
           "predicted_pods": probed.carrying,
           "observed": None, "observed_pods": None, "verdict": INCONCLUSIVE, "reason": None, "evidence": None,
           "weights_while_partial": None, "window_evidence": []}
    ns = namespace or make_namespace(api, namespace_name(spec.name))
    try:
        obs, _ = run_probe(api, ns, spec, Path(evidence_dir) / spec.name, version, log=log, audit_log=audit_log,
                           controller_log=controller_log)
    finally:
        drop_namespace(api, ns)
    peak = obs.peak_canary_weight_while_partial
    first = next((w for w in obs.weights_while_partial if w[1] == peak), None) if peak else None
    out.update(observed=peak, observed_pods=first[2] if first else None, evidence=obs.timeline,
               weights_while_partial=obs.weights_while_partial, window_evidence=obs.window_evidence)
    reason = obs.inconclusive_reason()
    if reason:
        out["reason"] = reason
    elif peak == probed.peak and (not peak or out["observed_pods"] == probed.carrying):
        out["verdict"] = PASS
    else:
        out["verdict"] = FAIL
        out["reason"] = (f"shape {shape.label} (probed at replicas {shape.probe_replicas}): predicted "
                         f"{probed.peak} on {probed.carrying} pod(s) by rule {pred.rule}, observed {peak} on "
                         f"{out['observed_pods']}: {obs.describe()}")
    return out
