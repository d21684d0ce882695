"""The answer in the report's view model: one headline per controller, first on the page with links to its
evidence; what each row means for the prescription (a mark beside its verdict); load rows folded, one line per
phase (drills.reporting.report and drills.reporting.upgrade_report render these)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..record.answer import HAZARD, HOLDS, controller_label, declared, headlines
from .viewmodel import cell, fmt_value, link

MARKS = {(HOLDS, True): "holds ✓", (HOLDS, False): "does not hold ✗", (HOLDS, None): "holds? no observation",
         (HAZARD, True): "hazard seen ⚠", (HAZARD, False): "hazard not seen", (HAZARD, None): "hazard? no observation"}


def mark(row: dict) -> str:
    """What the row says about the prescription, beside its verdict ('' for a neutral row)."""
    d = declared(row)
    return MARKS.get((d["polarity"], d["shows"]), "")


def is_load(row: dict) -> bool:
    return str(row.get("assertion") or "").startswith("load.")


def headline_items(rows: list[dict], evidence_of: Callable[[dict], Path | None], start: Path) -> list[dict]:
    """Each controller's headline with links to the rows it rests on: [{"text", "links", "md_links", "holds"}]."""
    by_ref = {(controller_label(r), str(r.get("run_id")), declared(r)["id"]): r for r in rows}
    out = []
    for h in headlines(rows):
        links, md_links = [], []
        for ref in h["evidence"]:
            row = by_ref.get((h["controller"], str(ref.get("run_id")), ref["id"]))
            p = evidence_of(row) if row is not None else None
            if p is not None:
                a, b = link(ref["label"], p, start)
                links.append(a)
                md_links.append(b)
        out.append({"text": h["text"], "holds": h["holds"], "links": links, "md_links": md_links})
    return out


def _phase_key(row: dict) -> tuple[str, str]:
    parts = str(row.get("assertion")).split(".")
    return str(row.get("step")), parts[1] if len(parts) > 2 else "?"


def load_fold(rows: list[dict], metric_cell: Callable[[dict], dict]) -> dict | None:
    """The load rows of a section folded under their phase: one line per (step, phase) with both figures."""
    load = [r for r in rows if is_load(r)]
    if not load:
        return None
    phases: dict[tuple[str, str], dict[str, dict]] = {}
    for r in load:
        phases.setdefault(_phase_key(r), {})[str(r["assertion"]).rsplit(".", 1)[-1]] = r
    table_rows = []
    for (step, phase), metrics in phases.items():
        any_row = next(iter(metrics.values()))
        details = any_row.get("details") or {}
        marks = "; ".join(m for m in (mark(r) for r in metrics.values()) if m)
        table_rows.append([cell(step), cell(phase),
                           *[metric_cell(metrics[m]) if m in metrics else cell("—") for m in ("failure_ratio",
                                                                                                "p95_ms")],
                           cell(fmt_value(details.get("requests"))), cell(marks or None)])
    verdicts: dict[str, int] = {}
    for r in load:
        verdicts[str(r.get("verdict"))] = verdicts.get(str(r.get("verdict")), 0) + 1
    summary = (f"load per phase (emulated mesh): {len(phases)} phase(s), "
               + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())))
    return {"fold": {"summary": summary, "items": [{"table": {
        "columns": ["step", "phase", "failure ratio", "p95 ms", "requests", "means"], "rows": table_rows}}]}}
