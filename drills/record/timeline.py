"""Derivations from a recorded timeline (drills.record.recorder writes it): records replayed in resourceVersion order
(all objects live in one etcd, so resourceVersions order changes across resources; arrival order does not),
the canary weight in force, the canary's availability, and the windows the drills assert on (partial
availability, exposure, the peak weight while partial, evidence that a rollback was inside the window).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .. import routers
from ..core.config import HASH_LABEL


TIMELINE_SUFFIX = ".timeline.jsonl"
SERIES_SUFFIX = ".series.json"


def series_path(timeline: Path | str) -> Path:
    """The one name of a timeline's derived series: x.timeline.jsonl (or x.jsonl) -> x.series.json."""
    p = Path(timeline)
    for suffix in (TIMELINE_SUFFIX, ".jsonl"):
        if p.name.endswith(suffix):
            return p.with_name(p.name[: -len(suffix)] + SERIES_SUFFIX)
    return p.with_name(p.name + SERIES_SUFFIX)


def load(path: Path) -> list[dict]:
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


# --- derivations --------------------------------------------------------------------------------------
def _rvkey(rec: dict, prev: int) -> int:
    try:
        return int(rec["rv"])
    except (TypeError, ValueError):
        return prev


def ordered(records: list[dict]) -> list[dict]:
    """Records in resourceVersion order; records without one (marks without rv) keep arrival order."""
    keyed = []
    prev = 0
    for r in sorted(records, key=lambda r: r["seq"]):
        if r["type"] in ("END", "GAP"):
            continue
        k = _rvkey(r, prev)
        prev = k
        keyed.append((k, r["seq"], r))
    keyed.sort(key=lambda x: (x[0], x[1]))
    return [r for _, _, r in keyed]


def weights_of(routes: dict[str, dict], rollout: dict) -> tuple[int | None, int | None]:
    """(canary, stable) weights in force: the Rollout's router reads them from its condensed route objects."""
    return routers.of_record(rollout).weights(routes, rollout) if routes else (None, None)


@dataclass
class Derived:
    canary_weight: list = field(default_factory=list)       # [t, weight]
    stable_weight: list = field(default_factory=list)
    canary_available: list = field(default_factory=list)    # [t, available, target]
    replicasets: dict = field(default_factory=dict)         # hash -> [[t, spec, ready, available]]
    rollout: list = field(default_factory=list)             # [t, step, phase, abort, promoteFull, stableRS]
    analysisruns: dict = field(default_factory=dict)         # name -> [[t, phase]]
    partial: list = field(default_factory=list)              # [t0, t1]
    exposure: list = field(default_factory=list)
    markers: list = field(default_factory=list)              # [t, label]
    peak_canary_weight_while_partial: int | None = None
    weights_while_partial: list = field(default_factory=list)
    # a partial-availability window: some but not all of the canary's target pods available.  Windows
    # (``partial``) and the peak also cover moments with none available (the controller then holds 0).
    partial_window_observed: bool = False
    exposure_seconds: float = 0.0
    rollback_in_window: bool = False
    window_evidence: list = field(default_factory=list)
    t0: float = 0.0
    t0_wall: float = 0.0
    end: float = 0.0

    def series(self, title: str, extra: dict | None = None) -> dict:
        rel = lambda rows: [[round(r[0] - self.t0, 3), *r[1:]] for r in rows]  # noqa: E731
        win = lambda ws: [[round(a - self.t0, 3), None if b is None else round(b - self.t0, 3)] for a, b in ws]  # noqa
        out = {"title": title, "t0_wall": self.t0_wall,
               "canary_weight": rel(self.canary_weight), "stable_weight": rel(self.stable_weight),
               "canary_available": rel(self.canary_available), "partial": win(self.partial),
               "exposure": win(self.exposure), "markers": rel(self.markers),
               "summary": {"peak_canary_weight_while_partial": self.peak_canary_weight_while_partial,
                           "partial_window_observed": self.partial_window_observed,
                           "exposure_seconds": round(self.exposure_seconds, 3),
                           "rollback_in_window": self.rollback_in_window}}
        if extra:
            out.update(extra)
        return out


def weight_on_partial(d: Derived) -> bool:
    """The controller's answer to the partial window is on record: a non-zero canary weight in force while the canary
    ReplicaSet is partial now.  (After a rollback the controller first writes its status with the revived hash and
    scales; it keeps the weight at 0 while the revived ReplicaSet has no available pod, and writes the weight only in
    a reconcile after the first one is available: partly available alone is not yet its answer.)"""
    return (bool(d.weights_while_partial) and d.weights_while_partial[-1][1] > 0 and bool(d.partial)
            and d.partial[-1][1] is None)


def derive(records: list[dict], canary_hash: str | None, since_mark: str | None = None,
           target: str = "rollout_replicas", until_mark: str | None = None) -> Derived:
    """Replay records in resourceVersion order.

    canary_hash: the ReplicaSet whose availability defines the windows (the revived one in a rollback);
      None = whatever the Rollout reports as currentPodHash.
    since_mark: windows only count after this mark (e.g. "rollback").
    target: "rollout_replicas" (at the end of steps: spec.replicas) or "rs_spec" (the canary ReplicaSet's
      own desired count, for mid-steps probes).
    """
    recs = ordered(records)
    d = Derived()
    if not recs:
        return d
    t_prev = -math.inf
    ro: dict = {}
    routes: dict[str, dict[str, dict]] = {}     # route kind -> name -> condensed object
    rs: dict[str, dict] = {}
    active = since_mark is None
    stopped = False
    cur_weight = cur_stable = None
    partial_since = exposure_since = None
    peak = None
    base = min(r["t"] for r in recs)
    d.t0, d.t0_wall = base, min(r["wall"] for r in recs)
    for r in recs:
        t = max(t_prev, r["t"])
        t_prev = t
        kind, obj = r["kind"], r["obj"]
        if kind == "Mark":
            d.markers.append([t, r["name"]])
            if since_mark and r["name"] == since_mark and not active:
                active = True
                d.t0, d.t0_wall = t, r["wall"]
            if until_mark and r["name"] == until_mark and active and not stopped:
                stopped = True
                if partial_since is not None:
                    d.partial[-1][1] = t
                    partial_since = None
                if exposure_since is not None:
                    d.exposure[-1][1] = t
                    d.exposure_seconds += t - exposure_since
                    exposure_since = None
            continue
        if kind == "Rollout" and r["type"] != "DELETED":
            ro = obj
            st = obj["status"]
            d.rollout.append([t, st["currentStepIndex"], st["phase"], st["abort"], st["promoteFull"], st["stableRS"]])
        elif kind == "ReplicaSet" and obj.get("hash"):
            if r["type"] == "DELETED":
                rs.pop(obj["hash"], None)
            else:
                rs[obj["hash"]] = obj
                d.replicasets.setdefault(obj["hash"], []).append(
                    [t, obj["spec_replicas"], obj["ready"], obj["available"]])
        elif kind in routers.ROUTE_KINDS:
            if r["type"] == "DELETED":
                routes.get(kind, {}).pop(r["name"], None)
            else:
                routes.setdefault(kind, {})[r["name"]] = obj
        elif kind == "AnalysisRun" and r["type"] != "DELETED":
            d.analysisruns.setdefault(r["name"], []).append([t, obj.get("phase")])
        elif kind == "Event" and active and obj.get("reason") == "SkipSteps":
            d.window_evidence.append(f"SkipSteps event: {obj.get('message')}")
        # current weights
        if ro:
            c, s = weights_of(routes.get(routers.of_record(ro).route_kind, {}), ro)
            if c is not None and c != cur_weight:
                cur_weight = c
                d.canary_weight.append([t, c])
            if s is not None and s != cur_stable:
                cur_stable = s
                d.stable_weight.append([t, s])
        chash = canary_hash or (ro.get("status") or {}).get("currentPodHash")
        crs = rs.get(chash) if chash else None
        if not ro:
            continue
        avail = crs["available"] if crs else 0
        tgt = ro.get("replicas", 1) if target == "rollout_replicas" else (crs["spec_replicas"] if crs else 0)
        if not d.canary_available or d.canary_available[-1][1:] != [avail, tgt]:
            d.canary_available.append([t, avail, tgt])
        if not active or stopped:
            continue
        steps = ro.get("steps") or []
        if (kind == "Rollout" and ro["status"]["currentStepIndex"] == len(steps) and steps
                and crs is not None and avail < tgt and ro["status"].get("currentPodHash") == chash):
            if not d.rollback_in_window:
                d.window_evidence.append(f"currentStepIndex jumped to {len(steps)} (end of steps) "
                                         f"while the revived ReplicaSet had {avail}/{tgt} available")
            d.rollback_in_window = True
        is_partial = crs is not None and tgt > 0 and avail < tgt
        if is_partial and avail > 0:
            d.partial_window_observed = True      # some, not all, of the canary's pods available
        if is_partial:
            if partial_since is None:
                partial_since = t
                d.partial.append([t, None])
            w = cur_weight or 0
            peak = w if peak is None else max(peak, w)
            if not d.weights_while_partial or d.weights_while_partial[-1][1] != w:
                d.weights_while_partial.append([t, w, avail, tgt])
        elif partial_since is not None:
            d.partial[-1][1] = t
            partial_since = None
        replicas = ro.get("replicas") or 1
        exposed = (cur_weight or 0) > 100.0 * avail / replicas + 1e-9 and chash is not None
        if exposed and exposure_since is None:
            exposure_since = t
            d.exposure.append([t, None])
        elif not exposed and exposure_since is not None:
            d.exposure[-1][1] = t
            d.exposure_seconds += t - exposure_since
            exposure_since = None
    d.end = t_prev
    if exposure_since is not None:
        d.exposure_seconds += t_prev - exposure_since
    d.peak_canary_weight_while_partial = peak if d.partial_window_observed else None
    return d


def exit_analysis(records: list[dict], revived_hash: str, replicas: int) -> dict:
    """From the mark 'promote --full': weight in force then, the highest weight until the revived
    ReplicaSet is fully available, and whether abort was cleared."""
    recs = ordered(records)
    weight = 0
    ro = None
    routes: dict[str, dict[str, dict]] = {}
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
        elif r["kind"] in routers.ROUTE_KINDS:
            if r["type"] == "DELETED":
                routes.get(r["kind"], {}).pop(r["name"], None)
            else:
                routes.setdefault(r["kind"], {})[r["name"]] = r["obj"]
            c, _ = weights_of(routes.get(routers.of_record(ro).route_kind, {}), ro) if ro else (None, None)
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
