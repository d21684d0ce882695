"""One record per Rollout (prediction, lint, safe pod count, wave), the fleet summary, the table and JSON."""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ..core import config
from . import autoscalers as scalers
from .advice import ERROR, WAVES, lint, safe_pod_count, wave
from .model import ScannedRollout, steps_text
from .predict import NOT_MODELLED, Prediction, not_modelled, predict
from .schema import seen_by_controller
from .sources import VersionFacts

UNKNOWN_CONTROLLER = "controller-unknown"


_vkey = config.version_key
version_order = config.version_order


@dataclass
class Record:
    ro: ScannedRollout
    facts: VersionFacts | None
    pred: Prediction | None
    findings: list = field(default_factory=list)
    safe: dict = field(default_factory=dict)
    wave: str = "-"
    not_modelled: list = field(default_factory=list)    # "not modelled: <what>" of this Rollout's prediction
    sizes: dict = field(default_factory=dict)            # autoscaled: autoscalers.sized() (min, max, close, window)
    size_basis: str | None = None                        # autoscaled: why `exposed` is predicted at this size

    @property
    def exposed(self) -> bool:
        """Exposed at the current size (autoscaled without spec.replicas: at the minimum, size_basis says so)."""
        return bool(self.pred and self.pred.exposed)

    @property
    def exposed_at_max(self) -> bool:
        """Exposed at the autoscaler's maximum (not autoscaled: its one size)."""
        return bool(self.sizes["max"].exposed) if self.sizes else self.exposed

    @property
    def lint_errors(self) -> list:
        return [f for f in self.findings if f.level == ERROR]

    def as_dict(self) -> dict:
        ro, p = self.ro, self.pred
        return {
            "namespace": ro.namespace, "name": ro.name, "source": ro.source,
            "file": ro.file, "line": ro.line, "origin": ro.origin,
            "controller_version": ro.controller_version or None,
            "routing": ro.routing, "router": ro.router or None, "strategy": ro.strategy,
            "steps": ro.steps, "steps_text": steps_text(ro.steps),
            "steps_file": ro.steps_file, "step_lines": ro.step_lines,
            "replicas": ro.replicas, "minPodsPerReplicaSet": ro.min_pods,
            "rollbackWindow": ro.rollback_window, "replicaProgressThreshold": ro.rpt,
            "dynamicStableScale": ro.dss, "maxTrafficWeight": ro.max_weight,
            "predicted_peak_weight": p.peak if p else None,
            "pods_carrying": p.carrying if p else None,
            "revived_first_size": p.first_size if p else None,
            "canary_target": p.target if p else None,
            "share_of_capacity": round(p.share, 4) if p and p.share is not None else None,
            "overload": round(p.overload, 2) if p and p.overload is not None else None,
            "exposed": self.exposed,
            **self._sizes_dict(),
            "promotes_while_partial": bool(p and p.promotes_while_partial),
            "rule": p.as_dict() if p else {"id": UNKNOWN_CONTROLLER, "text": unknown_text(ro), "lines": []},
            "controller_unknown": None if p or self.facts else unknown_why(ro),
            "notes": p.notes if p else [],
            "not_modelled": list(self.not_modelled),
            "crd_schema": [f.as_dict() for f in ro.schema_findings],
            "crd_schema_unavailable": ro.schema_unavailable,
            "lint": [f.as_dict() for f in self.findings],
            "safe_pod_count": self.safe.get("safe_pod_count"),
            "remaining_rung": self.safe.get("remaining_rung"),
            "brief_safe_pod_count": self.safe.get("brief_safe_pod_count"),
            "safe_pod_basis": self.safe.get("basis"),
            "canary_count": self.safe.get("canary_count"),
            "wave": self.wave, "wave_text": WAVES[self.wave],
            "facts_from": self.facts.derived_from if self.facts else None,
            "source_lines": (None if self.facts is None else
                             "lines unknown" if not self.facts.from_source else "from source"),
        }


    def _sizes_dict(self) -> dict:
        ro, sz = self.ro, self.sizes
        lo, hi = ro.size_range or (None, None)
        return {"autoscaler": scalers.describe_autoscaler(ro), "autoscaler_conflict": len(ro.autoscalers) > 1,
                "min_replicas": lo, "max_replicas": hi, "replicas_basis": self.size_basis,
                "exposed_at_min": bool(sz["min"].exposed) if sz else self.exposed,
                "exposed_at_max": self.exposed_at_max,
                "at_min": scalers.at_size(sz["min"], lo) if sz else None,
                "at_max": scalers.at_size(sz["max"], hi) if sz else None,
                "window": sz.get("window") if sz else None,
                "close_at_max": sz.get("close") if sz else None}


def unknown_why(ro: ScannedRollout) -> str:
    """Why the controller version of a Rollout is unknown (what its cluster showed)."""
    return (ro.origin or {}).get("controller_unknown") or "no controller version given or found"


def unknown_text(ro: ScannedRollout) -> str:
    return (f"the controller version is unknown ({unknown_why(ro)}): no exposure is predicted; give it with "
            f"--controller vX.Y.Z")


def evaluate(ro: ScannedRollout, facts: VersionFacts | None, cache: dict | None = None) -> Record:
    """The Rollout as that version's controller sees it (drills.scan.schema: its CRD prunes what it does not
    know), its prediction, safe pod count and wave (shared by Rollouts of one shape through ``cache``), what the
    prediction does not model, and the lint findings (each Rollout's own lines)."""
    if facts is None:           # no prediction without the version; the lint that does not depend on it still runs
        ro, basis = scalers.at_current(ro)
        return Record(ro, None, None, lint(ro, None), size_basis=basis)
    ro, basis = scalers.at_current(seen_by_controller(ro, facts.version, facts.root or None))
    key = (id(facts), ro.shape())
    hit = cache.get(key) if cache is not None else None
    if hit is None:
        pred = predict(ro, facts)
        hit = (pred, safe_pod_count(ro, facts), wave(ro, pred, facts))
        if cache is not None:
            cache[key] = hit
    pred, safe, wv = hit
    missing = not_modelled(ro, pred, facts)
    if ro.schema_unavailable and pred.peak is not None:
        missing.append(f"{NOT_MODELLED}the {facts.version} CRD schema (fields not checked: {ro.schema_unavailable})")
    sizes = scalers.sized(ro, facts, cache) if ro.autoscalers else {}
    return Record(ro, facts, pred, lint(ro, facts, safe), safe, wv, missing, sizes, basis)


# --- the summary ---------------------------------------------------------------------------------------
def unreadable_sources(records: list[Record]) -> dict[str, str]:
    """Controller version -> why its source could not be read (its rows' lines are unknown)."""
    return {r.facts.version: r.facts.derived_from for r in records if r.facts is not None and not r.facts.from_source}


def summary(records: list[Record]) -> dict:
    by_version: dict = defaultdict(Counter)
    by_wave: dict = defaultdict(Counter)
    rules: Counter = Counter()
    for r in records:
        v = r.ro.controller_version or "unknown"
        by_version[v]["rollouts"] += 1
        by_version[v]["exposed"] += r.exposed
        by_version[v]["lint_errors"] += bool(r.lint_errors)
        by_wave[r.wave][v] += 1
        rules[r.pred.rule if r.pred else UNKNOWN_CONTROLLER] += 1
    return {
        "rollouts": len(records), "exposed": sum(r.exposed for r in records),
        "lint_errors": sum(bool(r.lint_errors) for r in records),
        "by_version": {v: dict(c) for v, c in sorted(by_version.items(), key=lambda x: _vkey(x[0]))},
        "by_wave": {w: dict(sorted(c.items(), key=lambda x: _vkey(x[0]))) for w, c in sorted(by_wave.items())},
        "rules": dict(rules.most_common()),
        "sources_unreadable": dict(sorted(unreadable_sources(records).items(), key=lambda x: _vkey(x[0]))),
        "controller_unknown": sum(r.facts is None for r in records),
        "autoscaled": sum(bool(r.ro.autoscalers) for r in records),
        "exposed_at_max": sum(r.exposed_at_max for r in records),
        "autoscaler_conflicts": sum(len(r.ro.autoscalers) > 1 for r in records),
    }


# --- the table ----------------------------------------------------------------------------------------
def _size_cell(r: Record) -> str:
    """R, and an autoscaled Rollout's range (``20 [10..360]``; ``?`` when spec.replicas is absent)."""
    sizes = r.ro.size_range
    if not sizes:
        return str(r.ro.replicas)
    return f"{r.ro.replicas if r.ro.replicas_given else '?'} [{sizes[0]}..{sizes[1]}]"


def _at(pred, n: int) -> str:
    if pred.peak is None:
        return f"{n}: {pred.rule}"
    return (f"{n}: peak {pred.peak} on {pred.carrying if pred.carrying is not None else '-'} pod(s) "
            f"({_pct(pred.share)}){' EXPOSED' if pred.exposed else ''}")


def autoscaled_lines(records: list[Record], unjoined: list | None) -> list[str]:
    """The autoscaled Rollouts (the safe-pod check at the maximum, what closes it) and the unjoined autoscalers."""
    out = []
    scaled = [r for r in records if r.ro.autoscalers]
    if scaled:
        out += ["", "autoscaled (predicted at minReplicas, the current size and maxReplicas; the safe-pod check runs "
                    "at maxReplicas):"]
    for r in scaled:
        ro = r.ro
        who = (scalers.conflict_text(ro) if len(ro.autoscalers) > 1 else ro.autoscalers[0].describe())
        out.append(f"  {ro.source} {ro.key} ({ro.controller_version or '?'}): {who}")
        if r.size_basis:
            out.append(f"    {r.size_basis}")
        if not r.sizes:
            out.append("    not predicted at min and max: the controller version is unknown")
            continue
        lo, hi = ro.size_range
        out.append(f"    at min {_at(r.sizes['min'], lo)}; at max {_at(r.sizes['max'], hi)}: window "
                   f"{r.sizes['window']}")
        if r.sizes.get("close"):
            out.append(f"    at max: {r.sizes['close']['text']}")
        elif r.exposed_at_max:
            out.append("    at max: deleting the final setWeight 100 closes it")
    if unjoined:
        out += ["", f"{len(unjoined)} autoscaler(s) not joined to a Rollout:"]
        out += [f"  {u['source']} {u['kind']} {u['namespace']}/{u['name']}: {u['why']}" for u in unjoined]
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def unreadable_dict(e) -> dict:
    return {"file": e.file, "line": e.line, "problem": e.problem}


def table(records: list[Record], inventory: list | None = None, verification: list | None = None,
          stats: dict | None = None, unreadable: list | None = None, unjoined: list | None = None) -> str:
    cols = ["source", "rollout", "ctrl", "routing", "steps", "R", "M", "peak", "pods", "share", "rule", "lint",
            "wave"]
    rows = []
    for r in records:
        p = r.pred
        peak = "n/a" if p is None or p.peak is None else (f"{p.peak}!" if p.exposed else str(p.peak))
        rows.append([r.ro.source, r.ro.key, r.ro.controller_version or "?", r.ro.routing, steps_text(r.ro.steps),
                     _size_cell(r), "-" if r.ro.min_pods is None else str(r.ro.min_pods), peak,
                     "-" if not p or p.carrying is None else str(p.carrying), _pct(p.share if p else None),
                     p.rule if p else UNKNOWN_CONTROLLER, ",".join(sorted({f.rule for f in r.findings})) or "-",
                     r.wave])
    widths = [max(len(c), *(len(x[i]) for x in rows)) if rows else len(c) for i, c in enumerate(cols)]
    widths = [min(w, 48) for w in widths]
    fmt = lambda cells: "  ".join(c[:w].ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    out = [fmt(cols), fmt(["-" * w for w in widths])] + [fmt(x) for x in rows]
    out.append("peak = predicted peak canary weight while the revived ReplicaSet is partial after a rollback inside "
               "rollbackWindow ('!' = above the share of capacity the pods carrying it hold)")
    said = [r for r in records if r.not_modelled or r.ro.schema_findings]
    if said:
        out.append("")
        for r in said:
            who = f"{r.ro.source} {r.ro.key} ({r.ro.controller_version or '?'})"
            for f in r.ro.schema_findings:
                out.append(f"{who}: {f.message}")
            for what in r.not_modelled:
                out.append(f"{who}: {what}")
    out += autoscaled_lines(records, unjoined)
    if unreadable:
        out.append("")
        out.append(f"{len(unreadable)} input(s) could not be read (the scan went on without them; exit 2):")
        out += [f"  {e}" for e in unreadable]
    s = summary(records)
    out.append("")
    out.append(f"{s['rollouts']} Rollouts, {s['exposed']} exposed, {s['lint_errors']} with lint errors")
    if s["autoscaled"]:
        at_max = sum(r.exposed_at_max for r in records if r.ro.autoscalers)
        out.append(f"  autoscaled: {s['autoscaled']} Rollouts, {at_max} exposed at their maxReplicas"
                   + (f", {s['autoscaler_conflicts']} with conflicting autoscalers" if s["autoscaler_conflicts"] else "")
                   + (f", {len(unjoined)} autoscaler(s) unjoined" if unjoined else ""))
    if s["controller_unknown"]:
        whys = sorted({unknown_why(r.ro) for r in records if r.facts is None})
        out.append(f"  controller version UNKNOWN for {s['controller_unknown']} Rollout(s) ({'; '.join(whys)}): "
                   f"their exposure is not predicted (only the lint that does not depend on the version ran); give "
                   f"the version with --controller vX.Y.Z")
    for v, why in s["sources_unreadable"].items():
        out.append(f"  controller {v}: its source could not be read, so its rows say lines unknown ({why})")
    for v, c in s["by_version"].items():
        out.append(f"  controller {v}: {c.get('rollouts', 0)} Rollouts, {c.get('exposed', 0)} exposed")
    out.append("  fix waves (exposed components per wave and controller version):")
    for w, c in s["by_wave"].items():
        out.append(f"    wave {w} ({WAVES[w]}): " + ", ".join(f"{v} {n}" for v, n in c.items()))
    if stats:
        out.append("  " + ", ".join(f"{k} {v}" for k, v in stats.items()))
    if inventory:
        out.append("")
        out.append("clusters:")
        for inv in inventory:
            d = inv.as_dict()
            given = d.get("controller_given")
            out.append(f"  {d['context']}: controller {d['controller_version'] or 'not found'}"
                       f"{' (' + d['controller'] + ')' if d['controller'] else ''}"
                       + (f", version unknown: {d['controller_unknown']}" if d.get("controller_unknown") else "")
                       + (f", predicted on {', '.join(given)} (--controller)" if given else "")
                       + (f", namespace {d['namespace']}" if d.get("namespace") else "")
                       + (f", selector {d['selector']}" if d.get("selector") else "") + f", {d['rollouts']} Rollouts, "
                       f"{d['exposed']} exposed" + (f", ERROR {d['error']}" if d["error"] else ""))
    if verification:
        out.append("")
        out.append("verification on the real controller (predicted vs observed peak while partial):")
        for v in verification:
            pods = lambda n: "" if n is None else f" on {n} pod(s)"  # noqa: E731
            out.append(f"  {v['verdict']:<12} {v['controller_version']} {v['shape']} (probed at replicas "
                       f"{v['probe_replicas']}): predicted {v['predicted']}{pods(v['predicted_pods'])}, observed "
                       f"{v['observed']}{pods(v['observed_pods'])} [{v['rule']}]"
                       + (f" -- {v['reason']}" if v.get("reason") else ""))
    return "\n".join(out)


def to_json(records: list[Record], inventory: list | None = None, verification: list | None = None,
            stats: dict | None = None, facts: list | None = None, unreadable: list | None = None,
            unjoined: list | None = None) -> str:
    doc = {"rollouts": [r.as_dict() for r in records], "summary": summary(records),
           "autoscalers_unjoined": list(unjoined or [])}
    if unreadable:
        doc["unreadable"] = [unreadable_dict(e) for e in unreadable]
    if stats:
        doc["stats"] = stats
    if facts:
        doc["controller_facts"] = [f.as_dict() for f in facts]
    if inventory is not None:
        doc["clusters"] = [i.as_dict() for i in inventory]
    if verification is not None:
        doc["verification"] = verification
    return json.dumps(doc, indent=1, default=str)
