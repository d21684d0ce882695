"""Autoscalers that own a Rollout's size, and the rollback exposure at the sizes they allow.

Read from the same objects the Rollouts come from (manifests, chart and fleet renders, live clusters, read-only):
``autoscaling/v2`` HorizontalPodAutoscalers (``autoscaling/v1`` and ``v2beta*`` have the same three fields) and
KEDA ``ScaledObject``s (``keda.sh/v1alpha1``) whose ``scaleTargetRef.kind`` is ``Rollout``.  Defaults as the APIs
have them: an HPA's ``minReplicas`` 1 (``maxReplicas`` is required); a ScaledObject's ``minReplicaCount`` 0 and
``maxReplicaCount`` 100, its ``scaleTargetRef`` ``apiVersion`` apps/v1 and ``kind`` Deployment.  An autoscaler of
anything else (a Deployment) is not the scan's.  A field of the wrong type, a negative count, a maximum of 0, a
minimum above the maximum, an HPA without ``maxReplicas`` or with ``minReplicas`` 0 is unreadable input, as a
Rollout's are (file and line, exit 2).  A ``scaleTargetRef.kind`` that is "Rollout" in another case or with spaces is
read and reported unjoined: the API matches kinds exactly.

Joined: same namespace, ``scaleTargetRef.name``, kind Rollout, apiVersion ``argoproj.io/...``, within one scope
(one cluster context, one app's render in a fleet, the manifests: the autoscaler's own file first, then all of
them).  An autoscaler whose Rollout is not among those read, or whose apiVersion is not argoproj.io's, is
``unjoined`` (reported, never dropped).  Two autoscalers on one Rollout are a ``conflict``: neither is picked, the
range either allows (the lowest minimum, the highest maximum) is predicted and the row says so.

Sizes: the current size is ``spec.replicas`` (on a live cluster, what the autoscaler last wrote).  A manifest
without ``spec.replicas`` (the autoscaler owns it) has no current size: ``exposed`` is predicted at the minimum and
the row says so.  A spec.replicas outside the autoscaler's range is predicted where the autoscaler moves it (the
nearer bound), and the row says so; a Rollout at 0 under HPAs only stays at 0 (an HPA does not scale a target at
zero).  The predictions at the minimum and the maximum are predict.py's rules at those sizes.  At the
maximum the safe-pod check runs on the remaining rung (the steps after the prescription); when that rung is
exposed there, the two numbers that would close it:

- the remaining rung at most X: X = maxTrafficWeight x pods that first carry it at the maximum / maxReplicas,
  rounded DOWN to 0.01 (a rung at most X is safe); ``setweight_at_most`` is the largest whole setWeight the rules
  predict safe (None: none of at least 1 is);
- minPodsPerReplicaSet at least Y: the smallest floor the rules predict safe, ceil(rung x maxReplicas /
  maxTrafficWeight) under the UpdateHash guard (rounded UP); without the guard the first available pod carries the
  rung, so no floor closes it (None, said).

Beside X, the brief's floor-only formula (minPodsPerReplicaSet x maxTrafficWeight / maxReplicas, rounded down),
which is X when the floor, not the first rung, sizes the revived ReplicaSet at the maximum.
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass, field

from ..core import config
from .model import ScanInputError, ScannedRollout, _int, _mapping, last_set_weight_step, prescribed
from .predict import Prediction, predict
from .sources import VersionFacts

HPA, KEDA = "HorizontalPodAutoscaler", "ScaledObject"
KINDS = (HPA, KEDA)
GROUPS = {HPA: "autoscaling", KEDA: "keda.sh"}
FIELDS = {HPA: ("minReplicas", "maxReplicas"), KEDA: ("minReplicaCount", "maxReplicaCount")}
DEFAULT_MIN = {HPA: 1, KEDA: 0}
DEFAULT_MAX = {KEDA: 100}                       # an HPA's maxReplicas is required
KEDA_TARGET = ("apps/v1", "Deployment")         # a ScaledObject's scaleTargetRef defaults
ROLLOUT_GROUP = config.ARGO_GROUP
MANIFESTS = "manifests"
CLOSE_SEARCH = 1000                             # floors tried above the computed one before giving up


def scope_of(origin: dict) -> str:
    """Where a Rollout or an autoscaler was read: a cluster context, one app's render, or the manifests."""
    if origin.get("cluster"):
        return f"cluster:{origin['cluster']}"
    if origin.get("env") is not None and origin.get("app") is not None:
        return f"fleet:{origin['env']}/{origin['app']}"
    return MANIFESTS


@dataclass
class Autoscaler:
    kind: str
    namespace: str
    name: str
    target: str                        # scaleTargetRef.name
    target_api: str                    # scaleTargetRef.apiVersion ("" when an HPA leaves it out)
    min_replicas: int
    max_replicas: int
    defaulted: list = field(default_factory=list)    # the counts the API's defaults gave
    source: str = ""
    file: str | None = None
    line: int | None = None
    origin: dict = field(default_factory=dict)
    target_kind: str = "Rollout"       # scaleTargetRef.kind as written (another case of "Rollout": never joined)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def scope(self) -> str:
        return scope_of(self.origin)

    @property
    def rollout_api(self) -> bool:
        return self.target_api.split("/")[0] == ROLLOUT_GROUP and "/" in self.target_api

    def describe(self) -> str:
        d = f", {'; '.join(self.defaulted)}" if self.defaulted else ""
        return f"{self.kind} {self.key} (min {self.min_replicas}, max {self.max_replicas}{d})"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "namespace": self.namespace, "name": self.name,
                "target": {"apiVersion": self.target_api or None, "kind": self.target_kind, "name": self.target},
                "min_replicas": self.min_replicas, "max_replicas": self.max_replicas, "defaulted": self.defaulted,
                "source": self.source, "file": self.file, "line": self.line}


def from_object(obj: dict, source: str, file: str | None = None, line: int | None = None, lines: dict | None = None,
                default_namespace: str = "default", origin: dict | None = None) -> Autoscaler | None:
    """An HPA or ScaledObject whose target is a Rollout -> Autoscaler; None for any other object or target.  A field
    the scan reads with the wrong type or an impossible value raises ScanInputError naming the field and line."""
    kind, api = obj.get("kind"), obj.get("apiVersion")
    if kind not in KINDS or not isinstance(api, str) or api.split("/")[0] != GROUPS[kind]:
        return None
    lines = lines or {}

    def at(*path):
        return lines.get(path, line)
    md = _mapping(obj.get("metadata"), f"{kind} metadata", file, at("metadata"))
    name = md.get("name")
    if not isinstance(name, str) or not name:
        raise ScanInputError(f"{kind} without metadata.name (found {name!r})"[:300], file, line)
    namespace = md.get("namespace") or default_namespace
    if not isinstance(namespace, str):
        raise ScanInputError(f"{kind} {name}: metadata.namespace must be a string, found {namespace!r}"[:300], file,
                             at("metadata", "namespace"))
    spec = _mapping(obj.get("spec"), f"{kind} {name}: spec", file, at("spec"))
    ref = spec.get("scaleTargetRef")
    if not isinstance(ref, dict):
        raise ScanInputError(f"{kind} {name}: spec.scaleTargetRef must be a mapping (apiVersion, kind, name), found "
                             f"{ref!r}"[:300], file, at("spec", "scaleTargetRef"))
    t_api = ref.get("apiVersion", KEDA_TARGET[0] if kind == KEDA else "")
    t_kind = ref.get("kind", KEDA_TARGET[1] if kind == KEDA else None)
    t_name = ref.get("name")
    for what, v in (("kind", t_kind), ("name", t_name), ("apiVersion", t_api or "-")):
        if not isinstance(v, str) or not v:
            raise ScanInputError(f"{kind} {name}: spec.scaleTargetRef.{what} must be a string, found {v!r}"[:300],
                                 file, at("spec", "scaleTargetRef", what))
    if t_kind.strip().lower() != "rollout":
        return None
    t_api = t_api or ""
    lo_f, hi_f = FIELDS[kind]
    defaulted = []
    lo = spec.get(lo_f)
    if lo is None:
        lo = DEFAULT_MIN[kind]
        defaulted.append(f"{lo_f} {lo} by default")
    else:
        # an HPA's minReplicas 0 needs the alpha HPAScaleToZero gate: the API refuses it everywhere else
        lo = _int(lo, f"{kind} {name}: spec.{lo_f}", file, at("spec", lo_f), minimum=1 if kind == HPA else 0)
    hi = spec.get(hi_f)
    if hi is None and kind == HPA:
        raise ScanInputError(f"{kind} {name}: spec.maxReplicas is required", file, at("spec"))
    if hi is None:
        hi = DEFAULT_MAX[kind]
        defaulted.append(f"{hi_f} {hi} by default")
    else:
        hi = _int(hi, f"{kind} {name}: spec.{hi_f}", file, at("spec", hi_f), minimum=1)    # both APIs: at least 1
    if lo > hi:
        raise ScanInputError(f"{kind} {name}: spec.{lo_f} {lo} is above spec.{hi_f} {hi}", file,
                             at("spec", lo_f) if spec.get(lo_f) is not None else at("spec", hi_f))
    return Autoscaler(kind, namespace, name, t_name, t_api, lo, hi, defaulted, source, file, line, dict(origin or {}),
                      target_kind=t_kind)


# --- the join ---------------------------------------------------------------------------------------------------
def join(rollouts: list[ScannedRollout], autoscalers: list[Autoscaler]) -> list[dict]:
    """Each autoscaler added to its Rollouts' ``autoscalers`` (every copy of a Rollout predicted on several versions);
    returns the unjoined ones, each with why."""
    by_key: dict = defaultdict(list)
    for ro in rollouts:
        by_key[(scope_of(ro.origin), ro.namespace, ro.name)].append(ro)
    unjoined = []
    for a in autoscalers:
        if a.target_kind != "Rollout":
            unjoined.append(dict(a.as_dict(), why=f"scaleTargetRef.kind {a.target_kind!r} is not 'Rollout': kinds are "
                                                  f"case-sensitive, so the {a.kind} finds no target and scales "
                                                  f"nothing"))
            continue
        if not a.rollout_api:
            unjoined.append(dict(a.as_dict(), why=f"scaleTargetRef.apiVersion {a.target_api or '(absent)'} is not "
                                                  f"{ROLLOUT_GROUP}/v1alpha1: the {a.kind} cannot scale the Rollout "
                                                  f"{a.namespace}/{a.target}"))
            continue
        ros = by_key.get((a.scope, a.namespace, a.target), [])
        if a.scope == MANIFESTS:
            ros = [ro for ro in ros if ro.file == a.file] or ros
        if not ros:
            unjoined.append(dict(a.as_dict(), why=f"names Rollout {a.namespace}/{a.target}, which is not among the "
                                                  f"Rollouts read"))
            continue
        for ro in ros:
            if a not in ro.autoscalers:
                ro.autoscalers = ro.autoscalers + [a]
    return unjoined


# --- sizes ------------------------------------------------------------------------------------------------------
def at_current(ro: ScannedRollout) -> tuple[ScannedRollout, str | None]:
    """The Rollout at the size ``exposed`` is predicted at, and why that size (None: not autoscaled)."""
    sizes = ro.size_range
    if sizes is None:
        return ro, None
    if ro.replicas_given:
        what = "the live spec.replicas, as the autoscaler last set it" if ro.origin.get("cluster") else "spec.replicas"
        lo, hi = sizes
        if ro.replicas == 0 and all(a.kind == HPA for a in ro.autoscalers):
            return ro, (f"current size 0 ({what}): an HPA leaves a target at zero alone (scaling is disabled until "
                        f"something else scales it up)")
        if not lo <= ro.replicas <= hi:
            size = min(max(ro.replicas, lo), hi)
            return (dataclasses.replace(ro, replicas=size),
                    f"{what} {ro.replicas} is outside the autoscaler's range {lo}..{hi}: the autoscaler moves it to "
                    f"{size} at its next sync, so exposed is predicted at {size}")
        return ro, f"current size {ro.replicas} ({what})"
    return (dataclasses.replace(ro, replicas=sizes[0]),
            f"spec.replicas absent (the autoscaler owns it): the current size is unknown from manifests, so exposed "
            f"is predicted at minReplicas {sizes[0]}")


def _with_rung(steps: list, i: int, w: int) -> list:
    out = list(steps)
    out[i] = dict(out[i], setWeight=w)
    return out


def closing(ro: ScannedRollout, facts: VersionFacts) -> dict | None:
    """At ``ro.replicas`` (the maximum): the remaining rung's exposure and the two numbers that would close it, or
    None when the remaining rung is not exposed there."""
    cut = prescribed(ro.steps)
    i, rung = last_set_weight_step(cut)
    if i is None:
        return None
    r = dataclasses.replace(ro, steps=cut, step_lines=[])
    p = predict(r, facts)
    if not p.exposed or not p.carrying:
        return None
    R, W = r.replicas, r.max_weight
    x = (W * p.carrying * 100 // R) / 100
    sw = next((w for w in range(rung - 1, 0, -1)
               if not predict(dataclasses.replace(r, steps=_with_rung(cut, i, w)), facts).exposed), None)
    guard = facts.guard and r.routing == "subset"
    y = None
    if guard:
        start = max((r.min_pods or 0) + 1, math.ceil(rung * R / W) - 1)
        y = next((m for m in range(start, min(R, start + CLOSE_SEARCH) + 1)
                  if not predict(dataclasses.replace(r, min_pods=m), facts).exposed), None)
    floor = r.min_pods or 1
    brief = (floor * W * 100 // R) / 100
    how = (f"the remaining rung {rung} at {R} replicas lands on {p.carrying} pod(s): it closes with the remaining rung "
           f"at most {x:.2f} % (rounded down; whole setWeight: "
           f"{sw if sw is not None else 'none of at least 1'}; the brief's {floor}/{R}x100 = {brief:.2f} %)")
    how += (f" or minPodsPerReplicaSet at least {y} (rounded up)" if y is not None else
            "; no minPodsPerReplicaSet closes it: without the UpdateHash guard the first available pod carries the "
            "rung" if not guard else "; no minPodsPerReplicaSet up to the maximum closes it")
    return {"replicas": R, "remaining_rung": rung, "pods_carrying": p.carrying, "rule": p.rule,
            "rung_at_most": x, "setweight_at_most": sw, "min_pods_at_least": y, "brief_rung_at_most": brief,
            "text": how}


def at_size(pred: Prediction, replicas: int) -> dict:
    return {"replicas": replicas, "predicted_peak_weight": pred.peak, "pods_carrying": pred.carrying,
            "share_of_capacity": round(pred.share, 4) if pred.share is not None else None,
            "rule": pred.rule, "exposed": pred.exposed}


def window(at_min: bool, at_max: bool, lo: int, hi: int) -> str:
    state = lambda e: "open" if e else "closed"  # noqa: E731
    if at_min == at_max:
        return f"{state(at_min)} at minReplicas {lo} and at maxReplicas {hi}"
    return f"{state(at_min)} at minReplicas {lo}, {state(at_max)} at maxReplicas {hi}"


def sized(ro: ScannedRollout, facts: VersionFacts, cache: dict | None = None) -> dict:
    """The predictions at the autoscaler's minimum and maximum, the window between them and, at the maximum, what
    would close the remaining rung."""
    lo, hi = ro.size_range
    out = {}
    for what, n in (("min", lo), ("max", hi)):
        r = dataclasses.replace(ro, replicas=n)
        key = ("size", what, id(facts), r.shape())       # at the maximum the entry also holds the closing numbers
        hit = cache.get(key) if cache is not None else None
        if hit is None:
            hit = (predict(r, facts), closing(r, facts) if what == "max" else None)
            if cache is not None:
                cache[key] = hit
        out[what], close = hit
        if what == "max":
            out["close"] = close
    out["window"] = window(out["min"].exposed, out["max"].exposed, lo, hi)
    return out


def describe_autoscaler(ro: ScannedRollout) -> dict | None:
    """The ``autoscaler`` of a Rollout's JSON: the one autoscaler, or the conflict (every one, none picked)."""
    if not ro.autoscalers:
        return None
    if len(ro.autoscalers) == 1:
        return ro.autoscalers[0].as_dict()
    lo, hi = ro.size_range
    return {"conflict": True, "autoscalers": [a.as_dict() for a in ro.autoscalers], "min_replicas": lo,
            "max_replicas": hi, "text": conflict_text(ro)}


def conflict_text(ro: ScannedRollout) -> str:
    lo, hi = ro.size_range
    return (f"{len(ro.autoscalers)} autoscalers target this Rollout ({', '.join(a.describe() for a in ro.autoscalers)})"
            f": they fight over spec.replicas; none is picked, the range either allows ({lo}..{hi}) is predicted")
