"""The predicted peak canary weight while the revived ReplicaSet is partial, for a rollback inside
rollbackWindow, per Rollout and controller version.

What the controller does, pass by pass (lines: that version's own source, sources.py):

1. template-change pass: the status is reset; the index jumps to len(steps) here only if the revived
   ReplicaSet still has replicas (``skip-steps``).  A ReplicaSet scaled to 0 is not active, so the index is 0.
2. next pass, index 0: zero available -> weight 0 (``zero-available``); the revived ReplicaSet is sized from
   the setWeight at index 0 (``first-size``): n0 = max(ceil(w0 x R / maxW), M) (``ceil``, ``min-pods``), 0 when
   steps[0] is not a setWeight (a leading pause), R when w0 = 100.  At the end of that pass the index jumps to
   len(steps) (``jump``).
3. later passes, index = len(steps): the target is the whole Rollout, T = max(R, M) (v1.10: M capped at R).
   While the canary is short of T the backward search (``backward-search``) finds the LAST setWeight of the
   list.  Whether that weight reaches the VirtualService while the canary is partial depends on the guard:
   - Istio subset routing, v1.8+ (``guard``): UpdateHash refuses while any ReplicaSet with replicas > 0 is not
     fully available, so the only partial moment a weight is written is when the revived ReplicaSet is full at
     its first size n0 (then it is scaled to T and the guard holds again).  n0 = 0 or n0 >= R: never.
   - host routing, other routers, and v1.7.x: no guard; the weight is written once one pod is available.
   - replicaProgressThreshold (v1.9+): once met, AtDesiredReplicaCountsForCanary is true and the end-of-steps
     branch writes MaxTrafficWeight (``rpt-at-desired``, ``end-of-steps``); the promotion gate promotes too.
   - a source with weightFromAvailableReplicas (``cap``) caps the weight to the available share.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..drill.branches import BACKWARD, END
from ..core.steps import last_set_weight
from .model import ScannedRollout
from .sources import VersionFacts

# rule ids
NOT_CANARY, BASIC, NO_WINDOW, SINGLE = "not-canary", "basic-canary", "no-rollback-window", "single-replica"
EMPTY, FULL_FIRST, FIRST_SIZE, FIRST_POD = "empty-steps", "subset-full-first", "subset-first-size", "first-pod"
NO_SETWEIGHT, RPT, CAPPED = "no-setweight", "rpt-end-of-steps", "capped"
INVALID, REJECTED = "invalid-spec", "crd-rejected"
NOT_APPLICABLE_RULES = (NOT_CANARY, BASIC, NO_WINDOW, SINGLE, INVALID, REJECTED)
NOT_MODELLED = "not modelled: "
# what a step at index 0 does besides its weight and size (the only step a rollback inside rollbackWindow runs:
# the pass at index 0 ends with the jump to len(steps)); none of it is in the predicted weight
_STEP0 = {
    "setHeaderRoute": "requests matching its headers go to the canary service from the pass at index 0 until the "
                      "promotion, outside the canary weight",
    "setMirrorRoute": "requests it mirrors go to the canary service from the pass at index 0, outside the canary "
                      "weight",
    "experiment": "the Experiment it starts on the pass at index 0 and that Experiment's own traffic weights",
    "plugin": "what the step plugin does on the pass at index 0",
}


@dataclass
class Prediction:
    rule: str
    text: str
    peak: int | None                 # predicted peak canary weight while partial (None: no partial window)
    carrying: int | None             # revived pods available when the peak is first written
    target: int | None               # canary pods at the end of steps
    first_size: int | None           # revived ReplicaSet's first size (steps[0])
    exposed: bool
    lines: list = field(default_factory=list)     # sources.Line
    promotes_while_partial: bool = False
    notes: list = field(default_factory=list)
    max_weight: int = 100
    replicas: int = 0

    @property
    def share(self) -> float | None:
        """Share of the Rollout's capacity that carries the peak (carrying / replicas)."""
        if self.carrying is None or not self.replicas:
            return None
        return self.carrying / self.replicas

    @property
    def overload(self) -> float | None:
        """How many times its share the carrying pods take: (peak / max weight) / share."""
        if not self.peak or not self.share:
            return None
        return (self.peak / self.max_weight) / self.share

    def as_dict(self) -> dict:
        return {"id": self.rule, "text": self.text, "lines": [ln.ref() for ln in self.lines]}


def floor_min_pods(ro: ScannedRollout, count: int, facts: VersionFacts) -> int:
    """CheckMinPodsPerReplicaSet: 0 stays 0; no floor without minPodsPerReplicaSet or trafficRouting."""
    if count == 0 or ro.min_pods is None or ro.routing == "none":
        return count
    m = min(ro.min_pods, ro.replicas) if facts.min_pods_capped else ro.min_pods
    return max(count, m)


def to_pods(ro: ScannedRollout, weight: int) -> int:
    return math.ceil(weight * ro.replicas / ro.max_weight)


def first_size(ro: ScannedRollout, facts: VersionFacts) -> tuple[int, str]:
    """The revived ReplicaSet's size on the pass at index 0, and how it was computed: GetCanaryReplicasOrWeight at
    index 0 takes steps[0]'s setCanaryScale (UseSetCanaryScale: its replicas as they are, else its weight), unless
    it says matchTrafficWeight or sets neither; then the setWeight of steps[0] (GetCurrentSetWeight), else 0."""
    s0 = ro.steps[0] if ro.steps else {}
    R, M = ro.replicas, ro.min_pods
    scs = s0.get("setCanaryScale") if isinstance(s0.get("setCanaryScale"), dict) else None
    if scs is not None and not scs.get("matchTrafficWeight") and scs.get("replicas") is not None:
        return int(scs["replicas"]), f"setCanaryScale replicas {scs['replicas']} at steps[0]"
    if scs is not None and not scs.get("matchTrafficWeight") and scs.get("weight") is not None:
        w = int(scs["weight"])
    elif "setWeight" in s0:
        w = int(s0["setWeight"])
    else:
        what = "+".join(s0) or "absent"
        return 0, f"steps[0] is {what}, not a setWeight: 0 (sized at the end of steps)"
    n = floor_min_pods(ro, to_pods(ro, w), facts)
    floor = f", {M}" if M is not None and w else ""
    return n, f"max(ceil({w}x{R}/{ro.max_weight}){floor}) = {n}"


def _rpt_met(ro: ScannedRollout, available: int, target: int) -> bool:
    t = ro.rpt or {}
    value = int(t.get("value", -1))
    if value < 0:
        return available >= target
    if t.get("type") == "Percent":
        return target == 0 or available * 100 >= value * target
    return available >= value


def _cap(weight: int, available: int, ro: ScannedRollout) -> int:
    """The capped weight (PR #4852): capped to max x available / replicas when the canary cannot carry it."""
    if available < (weight * ro.replicas) // ro.max_weight:
        return (ro.max_weight * available) // ro.replicas
    return weight


def _na(rule: str, text: str, ro: ScannedRollout, facts: VersionFacts, *keys: str) -> Prediction:
    return Prediction(rule, text, None, None, None, None, False, facts.refs(*keys), max_weight=ro.max_weight,
                      replicas=ro.replicas)


def predict(ro: ScannedRollout, facts: VersionFacts) -> Prediction:
    R, maxW = ro.replicas, ro.max_weight
    if ro.rejected:
        fields = ", ".join(f.where for f in ro.schema_findings if f.kind == "rejected")
        return _na(REJECTED, f"the {facts.version} CRD schema rejects {fields}: the apiserver refuses the Rollout, "
                             "so the controller never sees it", ro, facts)
    if ro.strategy != "canary":
        return _na(NOT_CANARY, f"{ro.strategy} strategy: no canary steps", ro, facts)
    if ro.invalid:
        return _na(INVALID, f"{'; '.join(ro.invalid)}: the controller refuses the spec (InvalidSpec, "
                            f"{facts.line('step-one-of').ref()}) and reconciles nothing", ro, facts, "step-one-of")
    if ro.spec_invalid:
        return _na(INVALID, f"{'; '.join(ro.spec_invalid)}: the controller refuses the spec (InvalidSpec) and "
                            f"reconciles nothing", ro, facts)
    if ro.routing == "none":
        return _na(BASIC, "no trafficRouting: a basic canary has no weight to write (traffic follows pod "
                          "counts)", ro, facts)
    if ro.dss and ro.scale_down_delay is not None:
        return _na(INVALID, "dynamicStableScale with scaleDownDelaySeconds: the controller refuses the spec "
                            f"(InvalidSpec, {facts.line('dss-scaledown').ref()}) and reconciles nothing", ro, facts,
                   "dss-scaledown")
    if not ro.rollback_window:
        return _na(NO_WINDOW, "no rollbackWindow: a rollback walks the steps from 0 (and its own analysis "
                              "may abort it)", ro, facts, "in-window")
    if R <= 1:
        return _na(SINGLE, f"replicas {R}: the revived ReplicaSet has no partly available moment", ro, facts)
    target = floor_min_pods(ro, R, facts)
    rpt_on = bool(facts.rpt and ro.rpt)
    notes = []
    if ro.rpt and not facts.rpt:
        notes.append(f"replicaProgressThreshold is not in the {facts.version} CRD: the apiserver drops it")
    if ro.dss:
        notes.append("dynamicStableScale: the weight is the same (its cap is only in the PromoteFull branch); "
                     "after the write the stable is scaled down to the remaining weight (no warm standby)")
    if not ro.steps:
        promotes = rpt_on and any(_rpt_met(ro, a, target) for a in range(1, R))
        if promotes:
            notes.append("replicaProgressThreshold: promoted while partial (the stable moves to the revived "
                         "ReplicaSet before it is full)")
        return Prediction(EMPTY, "steps: [] -- no step index, so no branch after the zero-available one "
                                 f"({facts.line('zero-available').ref()}) writes a weight; 0 until promotion",
                          0, None, target, target, False, facts.refs("zero-available", "first-size"),
                          promotes_while_partial=promotes, notes=notes, max_weight=maxW, replicas=R)
    guard = facts.guard and ro.routing == "subset"
    n0, how = first_size(ro, facts)
    w_last = last_set_weight(ro.steps)
    levels = ([n0] if 1 <= n0 < R else []) if guard else list(range(1, R))
    base = ["first-size", "ceil", "min-pods", "jump"]
    if guard and not levels:
        return Prediction(FULL_FIRST, f"revived ReplicaSet first sized {how} -- already its full target; the "
                                      f"UpdateHash guard ({facts.line('guard').ref()}) holds SetWeight until all "
                                      f"{target} are available: weight 0 while partial",
                          0, None, target, n0, False, facts.refs(*base, "guard", "zero-available"),
                          notes=notes, max_weight=maxW, replicas=R)
    best = None                       # (weight, available, by-rpt)
    for a in levels:
        by_rpt = rpt_on and _rpt_met(ro, a, target)
        w = maxW if by_rpt else w_last
        if facts.cap:
            w = _cap(w, a, ro)
        if best is None or w > best[0]:
            best = (w, a, by_rpt)
    peak, carrying, by_rpt = best
    if peak == 0:
        return Prediction(NO_SETWEIGHT, "no setWeight for the backward search "
                                        f"({facts.line(BACKWARD).ref()}) to find: weight stays 0",
                          0, None, target, n0, False, facts.refs(BACKWARD), notes=notes, max_weight=maxW,
                          replicas=R)
    exposed = peak * R > maxW * carrying
    if guard:
        where = (f"on the pass where the revived ReplicaSet, first sized {how}, is fully available at that size: "
                 f"only then does the UpdateHash guard ({facts.line('guard').ref()}) let SetWeight through, and "
                 f"it holds the weight there until all {target} are available")
        keys = base + ["guard"]
    else:
        if ro.routing == "host":
            why = "no UpdateHash guard on host routing (canaryService/stableService)"
        elif ro.routing == "other":
            why = f"no UpdateHash guard on {ro.router} routing"
        elif facts.guard_kind == "dr-only":
            why = (f"{facts.version}'s UpdateHash ({facts.line('guard-log').ref()}) only delays the DestinationRule "
                   f"switch and returns no error, so SetWeight still runs")
        else:
            why = f"no UpdateHash guard in {facts.version}"
        where = (f"as soon as one revived pod is available ({facts.line('zero-available').ref()} no longer holds "
                 f"it): {why}")
        keys = base + ["zero-available"] + (["guard-log"] if facts.guard_kind == "dr-only" and
                                           ro.routing == "subset" else [])
    if by_rpt:
        rule = RPT
        text = (f"replicaProgressThreshold {ro.rpt.get('type')} {ro.rpt.get('value')} is met at {carrying} of "
                f"{target}: at desired counts ({facts.line('rpt-at-desired').ref()}), so the end-of-steps branch "
                f"({facts.line(END).ref()}) writes {maxW} {where}; the promotion gate "
                f"({facts.line('rpt-promote').ref()}) promotes while partial")
        keys = keys + ["rpt-at-desired", END, "rpt-promote"]
    else:
        rule = FIRST_SIZE if guard else FIRST_POD
        text = f"backward search ({facts.line(BACKWARD).ref()}) picks the last setWeight {w_last} {where}"
        keys = keys + [BACKWARD]
    if facts.cap:
        rule, text = CAPPED, text + f"; the weight is capped to the available share ({facts.line('cap').ref()})"
        keys.append("cap")
    return Prediction(rule, text, peak, carrying, target, n0, exposed, facts.refs(*keys),
                      promotes_while_partial=by_rpt, notes=notes, max_weight=maxW, replicas=R)


def not_modelled(ro: ScannedRollout, pred: Prediction, facts: VersionFacts) -> list[str]:
    """What the controller does on this Rollout's rollback that the prediction leaves out, each as
    ``not modelled: <what>`` (nothing for a rule that predicts no weight)."""
    if pred.peak is None:
        return []
    out = []
    s0 = ro.steps[0] if ro.steps else {}
    for k, why in _STEP0.items():
        if k in s0:
            out.append(f"{NOT_MODELLED}{k} at steps[0]: {why}")
    if (ro.background_analysis or "analysis" in s0) and not facts.skips_analysis_in_window:
        what = "background analysis" if ro.background_analysis else "the analysis at steps[0]"
        out.append(f"{NOT_MODELLED}{what}: {facts.version} does not skip analysis for a rollback inside "
                   f"rollbackWindow (its reconcileAnalysisRuns, {facts.line('analysis-reconcile').ref()}, has no such condition), so an AnalysisRun "
                   "that fails aborts the rollback; the prediction assumes none does")
    return out
