"""One record per Rollout (prediction, lint, safe pod count, wave), the fleet summary, the table and JSON."""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from .. import config
from .advice import ERROR, WAVES, lint, safe_pod_count, wave
from .model import ScannedRollout, steps_text
from .predict import NOT_MODELLED, Prediction, not_modelled, predict
from .schema import seen_by_controller
from .sources import VersionFacts

UNKNOWN_CONTROLLER = "controller-unknown"


def _vkey(v: str):
    """Versions in release order (a build suffix ignored; unknown last)."""
    try:
        return (0, config.version_tuple(str(v).split("+")[0]), str(v))
    except ValueError:
        return (1, (0, 0, 0), str(v))


def version_order(versions) -> list[str]:
    return sorted(versions, key=_vkey)


@dataclass
class Record:
    ro: ScannedRollout
    facts: VersionFacts | None
    pred: Prediction | None
    findings: list = field(default_factory=list)
    safe: dict = field(default_factory=dict)
    wave: str = "-"
    not_modelled: list = field(default_factory=list)    # "not modelled: <what>" of this Rollout's prediction

    @property
    def exposed(self) -> bool:
        return bool(self.pred and self.pred.exposed)

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
        return Record(ro, None, None, lint(ro, None))
    ro = seen_by_controller(ro, facts.version, facts.root or None)
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
    return Record(ro, facts, pred, lint(ro, facts, safe), safe, wv, missing)


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
    }


# --- the table ----------------------------------------------------------------------------------------
def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def unreadable_dict(e) -> dict:
    return {"file": e.file, "line": e.line, "problem": e.problem}


def table(records: list[Record], inventory: list | None = None, verification: list | None = None,
          stats: dict | None = None, unreadable: list | None = None) -> str:
    cols = ["source", "rollout", "ctrl", "routing", "steps", "R", "M", "peak", "pods", "share", "rule", "lint",
            "wave"]
    rows = []
    for r in records:
        p = r.pred
        peak = "n/a" if p is None or p.peak is None else (f"{p.peak}!" if p.exposed else str(p.peak))
        rows.append([r.ro.source, r.ro.key, r.ro.controller_version or "?", r.ro.routing, steps_text(r.ro.steps),
                     str(r.ro.replicas), "-" if r.ro.min_pods is None else str(r.ro.min_pods), peak,
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
    if unreadable:
        out.append("")
        out.append(f"{len(unreadable)} input(s) could not be read (the scan went on without them; exit 2):")
        out += [f"  {e}" for e in unreadable]
    s = summary(records)
    out.append("")
    out.append(f"{s['rollouts']} Rollouts, {s['exposed']} exposed, {s['lint_errors']} with lint errors")
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
            stats: dict | None = None, facts: list | None = None, unreadable: list | None = None) -> str:
    doc = {"rollouts": [r.as_dict() for r in records], "summary": summary(records)}
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
