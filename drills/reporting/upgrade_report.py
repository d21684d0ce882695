"""The report's sections on controller changes: an upgrade check's change table with both timelines of each
changed drill in one picture (from run_dir/upgrade.json, written by drills.run.upgrade_check), and the matrix's
history of what changed from one tested release to the next (drills.reporting.upgrade's classes)."""
from __future__ import annotations

from pathlib import Path

from ..core import inputs
from ..core.config import SUPPORTED_CONTROLLERS
from ..core.errors import BadInput
from ..record.plots import plot_pair
from .upgrade import REGRESSED, SAME, classify_neighbours
from .viewmodel import cell, fmt_value, href, md_target, rel, series_of


# --- an upgrade check's changes -----------------------------------------------------------------------------
UPGRADE_FILE = "upgrade.json"          # written by drills.run.upgrade_check beside the ledger


def _side_series(run_dir: Path, rows: list[dict], side: dict | None, lane: str, step: str) -> dict | None:
    """One side's timeline of a drill: its row's own series, else one of a row of the same drill and controller."""
    if not side:
        return None
    for ev in [side.get("evidence")] + [r.get("evidence") for r in rows if r.get("lane") == lane and
                                        r.get("step") == step and
                                        r.get("controller_version") == side.get("controller_version") and
                                        (r.get("router") or "istio") == (side.get("router") or "istio") and
                                        r.get("controller_sha256") == side.get("controller_sha256")]:
        sp = series_of(run_dir, ev)
        if sp is not None:
            try:
                data = inputs.load_json_file(sp, inputs.RECORD_BYTES, "series")
            except (OSError, BadInput):
                continue
            if isinstance(data, dict):
                return data
    return None


def upgrade_section(run_dir: Path, rows: list[dict]) -> dict | None:
    """The change table of run_dir/upgrade.json, changes first, then both timelines of each changed drill."""
    try:
        doc = inputs.load_json_file(run_dir / UPGRADE_FILE, inputs.RECORD_BYTES, UPGRADE_FILE)
    except (OSError, BadInput):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("changes"), list):
        return None
    base, cand = str(doc.get("baseline")), str(doc.get("candidate"))
    table_rows, figures, drawn = [], [], set()
    changed = [c for c in doc["changes"] if isinstance(c, dict) and c.get("class") != "same"]
    for c in changed:
        b, k = c.get("baseline") or {}, c.get("candidate") or {}
        words = str(c.get("words") or "")
        table_rows.append([cell(str(c.get("class")), strong=c.get("class") in ("regressed", "new") or
                                bool(c.get("danger"))),
                           cell(str(c.get("lane"))), cell(str(c.get("step"))),
                           cell("no row" if not b else fmt_value(b.get("observed")), verdict=b.get("verdict"), obs=True),
                           cell("no row" if not k else fmt_value(k.get("observed")), verdict=k.get("verdict"), obs=True),
                           cell(str(c.get("assertion"))), cell(words, strong=bool(c.get("danger")))])
        drill = (str(c.get("lane")), str(c.get("step")))
        if drill in drawn:
            continue
        pair = {f"{base} (baseline)": _side_series(run_dir, rows, c.get("baseline"), *drill),
                f"{cand} (candidate)": _side_series(run_dir, rows, c.get("candidate"), *drill)}
        if any(pair.values()):
            drawn.add(drill)
            png = run_dir / "upgrade" / f"{drill[0]}-{drill[1]}.png"
            try:
                plot_pair(pair, f"lane {drill[0]} · {drill[1]}: {base} → {cand}", png)
            except (ValueError, TypeError, KeyError, IndexError):      # a malformed series: no picture
                continue
            figures.append({"figure": {"src": href(png, run_dir), "src_md": md_target(png, run_dir),
                                       "caption": f"lane {drill[0]}, {drill[1]}: both controllers' timelines",
                                       "series_href": href(png, run_dir), "series_href_md": md_target(png, run_dir),
                                       "series_label": rel(png, run_dir), "load": None}})
    counts = doc.get("counts") or {}
    callouts = [f"{c.get('lane')}/{c.get('step')}: {c.get('words')}" for c in changed if c.get("danger")]
    if doc.get("crd_warning"):
        callouts.append(f"CRDs: {doc['crd_warning']}")
    intro = (f"Baseline {base}, candidate {cand}"
             + (f" (user-built, sha256 {str(doc.get('candidate_sha256'))[:12]})" if doc.get("candidate_sha256") else "")
             + ": " + ", ".join(f"{n} {k}" for k, n in counts.items()) + f"; exit {doc.get('exit')}."
             + (f" Of these, {doc['informational']['rows']} are load figures: {doc['informational']['rule']}."
                if isinstance(doc.get("informational"), dict) and doc["informational"].get("rows") else ""))
    items = [{"table": {"columns": ["class", "lane", "step", base, cand, "assertion", "what changed"],
                        "rows": table_rows}}] if table_rows else []
    swap = _swap_table(doc.get("swap"))
    callouts += [f"swap {e.get('pair')} {e.get('state')}: {e.get('verdict')}" for e in doc.get("swap") or []
                 if isinstance(e, dict) and e.get("verdict") not in ("pass", None)]
    return {"title": f"Upgrade check: {base} → {cand}", "intro": intro, "callouts": callouts,
            "empty": None if items or swap else "No change: every paired row is the same.",
            "items": swap + items + figures}


def _swap_table(entries) -> list[dict]:
    """Lane swap's verdicts, one line per (pair, state): what the new controller did with the old one's state."""
    rows = []
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or not isinstance(e.get("assertions"), dict):
            continue
        asserts = {str(k): a for k, a in e["assertions"].items() if isinstance(a, dict)}
        bad = {k: a for k, a in asserts.items() if a.get("verdict") != "pass"}
        rows.append([cell(str(e.get("verdict")), verdict=e.get("verdict"), strong=e.get("verdict") == "fail"),
                     cell(str(e.get("pair"))), cell(str(e.get("state"))),
                     cell("; ".join(f"{k} {fmt_value(a.get('observed'))}" for k, a in asserts.items())),
                     cell("; ".join(f"{k}: {a.get('verdict')}" + (f" ({a['reason']})" if a.get("reason") else "")
                                    for k, a in bad.items()) or "nothing moved the wrong way")])
    return [{"table": {"columns": ["swap", "pair", "state", "observed", "what moved"], "rows": rows}}] if rows else []


def neighbours_section(rows: list[dict]) -> dict | None:
    """What changed from each tested release to the next (drills.reporting.upgrade's classes), for the newest rows."""
    steps = classify_neighbours(rows, [v for v in SUPPORTED_CONTROLLERS])
    if not steps:
        return None
    out = []
    for st in steps:
        counts = st.counts()
        shown = [ch for ch in st.changes if ch.cls != SAME]
        summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no rows"
        detail = "; ".join(f"{ch.cls}: {ch.lane}/{ch.step} — {ch.words}" for ch in shown) or "nothing changed"
        out.append([cell(f"{st.from_column} → {st.to_column}", strong=any(ch.cls == REGRESSED or ch.danger or
                                                                          ch.new_hazard for ch in shown)),
                    cell(summary), cell(fmt_value(detail, 600))])
    return {"title": "What changed from one tested release to the next", "callouts": [],
            "intro": "Each release's newest rows against the previous release's, paired and classified as drills "
                     "upgrade-check does (same, improved, regressed, changed, new, gone, inconclusive).",
            "empty": None, "items": [{"table": {"columns": ["releases", "classes", "changes"], "rows": out,
                                                "head_col": True}}]}
