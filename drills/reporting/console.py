"""What `drills run` and `drills report` print: the headline per controller first, with its evidence, then the rows
as a table that wraps at word boundaries (never cuts a value mid-word, never prints a Python repr); load rows
fold into one line per phase."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

from ..record.answer import HAZARD, HOLDS, controller_label, declared, headlines, keyer  # noqa: F401  (for commands)
from ..record.ledger import FAIL, INCONCLUSIVE, PASS, finite_number

VERDICT_TEXT = {"not_applicable": "n/a"}
SIGNS = {(HOLDS, True): "✓", (HOLDS, False): "✗", (HAZARD, True): "⚠"}
LEGEND = "✓ the prescription held · ✗ it did not · ⚠ exposure seen (the incident reproduced, or a version hazard)"


def text(v) -> str:
    """A value as a person reads it: numbers short, mappings as 'key: value', lists as JSON."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "true" if v else "false"
    f = finite_number(v)
    if f is not None:
        return f"{f:.4g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {text(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return json.dumps(v, default=str, separators=(", ", ": "))
    return " ".join(str(v).split())


def headline_lines(rows: list[dict], run_dir: Path | None = None) -> list[str]:
    """One line per controller, each followed by the evidence it rests on."""
    out = []
    for h in headlines(rows):
        out.append(h["text"])
        for ref in h["evidence"]:
            if ref.get("evidence"):
                where = Path(run_dir) / ref["evidence"] if run_dir and not Path(ref["evidence"]).is_absolute() \
                    else Path(ref["evidence"])
                out.append(f"    {ref['label']}: {where}")
    return out


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    d = declared(r)
    sign = SIGNS.get((d["polarity"], d["shows"]), "")
    verdict = VERDICT_TEXT.get(r["verdict"], r["verdict"])
    return f"{verdict} {text(r.get('observed'))}" + (f" {sign}" if sign else "")


def _grid(head: list[str], body: list[list[str]], widths: list[int]) -> list[str]:
    def wrap(t: str, w: int) -> list[str]:
        return textwrap.wrap(t, w, break_long_words=False, break_on_hyphens=False) or [""]
    lines = []
    for row in [head, *body]:
        parts = [wrap(c, w) for c, w in zip(row, widths)]
        for i in range(max(len(p) for p in parts)):
            lines.append("  ".join((p[i] if i < len(p) else "").ljust(w) for p, w in zip(parts, widths)).rstrip())
        if row is head:
            lines.append("-" * min(sum(widths) + 2 * (len(widths) - 1), 200))
    return lines


def summary_table(rows: list[dict], width: int | None = None) -> str:
    """Every assertion once (its id), one column per controller; load rows as one line per phase."""
    cols = [h["controller"] for h in headlines(rows)]
    key = keyer(rows)
    cells: dict[tuple, dict] = {}
    order: list[tuple] = []
    for r in rows:
        a = str(r.get("assertion") or "")
        if a.startswith("load."):        # load.<phase>.<metric>: the phase is the line, both metrics in its cell
            k = (r["lane"], r["step"], "load " + a.split(".")[1])
        else:
            k = (r["lane"], r["step"], key(r))
        if k not in order:
            order.append(k)
        cells.setdefault(k, {}).setdefault(controller_label(r), []).append(r)
    width = width or max(100, shutil.get_terminal_size((140, 24)).columns)
    lw = min(40, max([len(f"{k[0]}/{k[1]}") for k in order] + [9]))
    aw = max(30, min(64, width - lw - 2 - len(cols) * 24))          # the assertion, then the values share the rest
    vw = max(22, (width - lw - aw - 2) // max(1, len(cols)) - 2)
    widths = [lw, aw, *[vw] * len(cols)]
    body = []
    for k in order:
        by_col = cells[k]
        first = next(iter(by_col.values()))[0]
        label = k[2] if k[2].startswith("load ") else str(first.get("assertion"))
        vals = []
        for c in cols:
            got = by_col.get(c) or []
            if k[2].startswith("load "):
                vals.append("; ".join(f"{str(r['assertion']).rsplit('.', 1)[-1]} {_cell(r)}" for r in got) or "-")
            else:
                vals.append(_cell(got[-1] if got else None))
        body.append([f"{k[0]}/{k[1]}", label, *vals])
    lines = _grid(["lane/step", "assertion", *cols], body, widths)
    n = {v: sum(r.get("verdict") == v for r in rows) for v in (PASS, FAIL, INCONCLUSIVE)}
    lines.append(f"{len(rows)} assertions: {n[PASS]} pass, {n[FAIL]} fail, {n[INCONCLUSIVE]} inconclusive, "
                 f"{len(rows) - sum(n.values())} unverified/not applicable")
    lines.append(LEGEND)
    return "\n".join(lines)


def run_summary(rows: list[dict], run_dir: Path | None = None) -> str:
    """The console summary of a run: the answer first, then the table."""
    return "\n".join([*headline_lines(rows, run_dir), "", summary_table(rows)])
