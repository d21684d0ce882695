"""Human reports: the per-run report and the controller-version x assertion matrix.

Both pages open with the answer: one headline per controller version ("prescription holds on v1.8.2: yes
(BEFORE 100 on 1 of 2 pods → AFTER 5; exit Healthy)", drills.record.answer) with links to its evidence; every row then
says what it means for the prescription beside its verdict, and load rows fold under their phase.

Inputs are run folders, reports/<run-id>/, each holding ledger.json (drills.record.ledger) and the evidence its rows
point at (each row judged against it, drills.record.evidence: a pass whose evidence is missing shows inconclusive); a
row whose evidence is a timeline gets the plot of that timeline's series (drills.record.plots), drawn once
and redrawn only when the series is newer than the picture.  Both pages are one view model (a title, meta
lines, notes, and sections of tables and figures, each table's columns declared once) rendered by the Jinja2
templates in drills/templates/ to HTML and Markdown.  Lane-specific sections come from the lanes themselves
(``Runbook.report_sections``): this module knows no lane by name.

`drills report [RUN_DIR...]` writes reports/matrix.html and reports/matrix.md and refreshes each run's
report.html / report.md on the way.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from ..record import timeline
from ..record.answer import WORST_FIRST, controller_label, keyer, strip_line_refs
from .answer_view import headline_items, is_load, load_fold, mark
from ..core import config
from ..record.evidence import read_judged
from ..lanes import LANES
from ..record.ledger import LedgerError, read_rows
from ..record.plots import num, pct, plot_series
from .upgrade_report import neighbours_section, upgrade_section
from .viewmodel import cell, evidence_path, fmt_value, href, is_run_dir, link, md_target, rel, series_of

EMULATION_NOTE = "Load figures come from an emulated mesh on the embedded cluster."
WEIGHT_NOTE = ("The drill reproduces the canary weight the controller writes, not the production pod arithmetic: "
               "the stage-shaped Rollout runs 2 pods, so a partial ReplicaSet is 1 of 2 pods (the prod-shaped "
               "variant, --variant prod, runs the production sizes).")
VERDICT_COLOURS = {"pass": "#1e7b34", "fail": "#c0182a", "inconclusive": "#b36b00", "unverified": "#5a5a5a",
                   "not_applicable": "#7a7a9a"}
VERDICT_TEXT = {"not_applicable": "not applicable"}
LANE_KEYS = tuple(lane.key for lane in LANES)
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"     # drills/templates
CSS = (TEMPLATES / "page.css").read_text()

_env = Environment(loader=FileSystemLoader(str(TEMPLATES)),
                   autoescape=select_autoescape(["html.j2"]), trim_blocks=False, lstrip_blocks=False,
                   keep_trailing_newline=True)
_env.filters["md"] = lambda t: str(t).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
_env.globals.update(colours=VERDICT_COLOURS, vtext=lambda v: VERDICT_TEXT.get(v, str(v or "—")), css=CSS)


# --- run folders, evidence and plots -------------------------------------------------------------------------
def _png_for(run_dir: Path, series: Path) -> Path:
    base = series.name[: -len(timeline.SERIES_SUFFIX)]
    try:
        series.resolve().relative_to(run_dir.resolve())
        return series.with_name(base + ".png")
    except ValueError:  # evidence kept outside the run folder: draw into the run folder
        return run_dir / "plots" / (base + ".png")


class Plots:
    """Plots drawn once per series (and again only when the series is newer than the picture)."""

    def __init__(self):
        self.cache: dict[str, tuple[Path | None, dict | None]] = {}

    def of(self, run_dir: Path, series: Path) -> tuple[Path | None, dict | None]:
        key = str(series.resolve())
        if key not in self.cache:
            try:
                data = json.loads(series.read_text())
            except (OSError, ValueError):
                data = None
            data = data if isinstance(data, dict) else None
            png = None
            if data is not None:
                png = _png_for(run_dir, series)
                if not png.is_file() or png.stat().st_mtime < series.stat().st_mtime:
                    try:
                        plot_series(data, png)
                    except (ValueError, TypeError, KeyError, IndexError):   # a malformed series: no picture
                        png = None
            self.cache[key] = (png, data)
        return self.cache[key]


# --- columns, versions, lanes --------------------------------------------------------------------------------
version_key = config.version_key


def column(row: dict) -> str:
    """Matrix column of a row: the release, or a user-built controller's name (its version plus its commit)."""
    return controller_label(row)


def column_key(col: str):
    v, _, rest = col.partition(" ")
    return (version_key(v), rest)


def lane_key(lane: str):
    return (LANE_KEYS.index(lane), lane) if lane in LANE_KEYS else (len(LANE_KEYS), str(lane))


def has_load(rows: list[dict], series: list[dict]) -> bool:
    if any(s.get("load") for s in series):
        return True
    return any(isinstance(r.get("details"), dict) and any(k in r["details"] for k in ("load", "failure_ratio",
                                                                                        "p95_ms")) for r in rows)


def load_table(load: dict) -> dict:
    rows = []
    for phase, s in load.items():
        s = s or {}
        p95 = num(s.get("p95_ms"))
        rows.append([cell(str(phase)), cell(pct(s.get("failure_ratio"))), cell("n/a" if p95 is None else f"{p95:.1f}"),
                     cell(fmt_value(s.get("requests")))])
    return {"columns": ["phase", "failure ratio", "p95 ms", "requests"], "rows": rows}


def figure(png: Path, series: dict, sp: Path, start: Path) -> dict:
    cap = str(series.get("title") or sp.name)
    load = series.get("load") or {}
    return {"src": href(png, start), "src_md": md_target(png, start), "caption": cap,
            "series_href": href(sp, start), "series_href_md": md_target(sp, start), "series_label": rel(sp, start),
            "load": load_table(load) if load else None}


def render(page: dict, html_path: Path, md_path: Path) -> tuple[Path, Path]:
    for path, tpl in ((html_path, "page.html.j2"), (md_path, "page.md.j2")):
        text = _env.get_template(tpl).render(page=page)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text.rstrip() + "\n", encoding="utf-8")
        os.replace(tmp, path)
    return html_path, md_path


def verdict_counts(rows: list[dict]) -> dict:
    counts: dict[str, int] = {}
    for r in rows:
        counts[str(r.get("verdict"))] = counts.get(str(r.get("verdict")), 0) + 1
    return dict(sorted(counts.items()))


def readable(runs: list[Path], strict: bool) -> list[Path]:
    """Run folders whose ledger reads; a bad one is said and skipped (strict: it is bad input)."""
    out = []
    for run_dir in runs:
        try:
            read_rows(run_dir / "ledger.json")
        except LedgerError as e:
            if strict:
                raise
            print(f"drills: report: skipping {run_dir}: {e}", file=sys.stderr, flush=True)
            continue
        out.append(run_dir)
    return out


def unique_runs(paths) -> list[Path]:
    seen, out = set(), []
    for p in paths:
        p = Path(p)
        if is_run_dir(p) and p.resolve() not in seen:
            seen.add(p.resolve())
            out.append(p)
    return out


def discover(reports_root: Path) -> list[Path]:
    return [p for p in sorted(reports_root.iterdir()) if is_run_dir(p)] if reports_root.is_dir() else []


# --- the run report ------------------------------------------------------------------------------------------
def write_run_report(run_dir: Path, plots: Plots | None = None) -> tuple[Path, Path]:
    """Write run_dir/report.html and run_dir/report.md from run_dir/ledger.json and its evidence."""
    run_dir = Path(run_dir)
    rows = read_judged(run_dir)          # a pass whose evidence fails shows inconclusive, saying why
    plots = plots or Plots()
    run_ids = sorted({str(r.get("run_id")) for r in rows if r.get("run_id")}) or [run_dir.name]
    columns = sorted({column(r) for r in rows}, key=column_key)
    shown_series, all_series = set(), []
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((column(r), str(r.get("lane") or "—")), []).append(r)
    sections = []
    for col, lane in sorted(groups, key=lambda k: (column_key(k[0]), lane_key(k[1]))):
        table_rows, figures = [], []
        for r in [r for r in groups[(col, lane)] if not is_load(r)]:
            ev = r.get("evidence")
            links, md_links = [], []
            sp = series_of(run_dir, ev)
            png, series = plots.of(run_dir, sp) if sp else (None, None)
            ev_path = evidence_path(run_dir, ev)          # None: no evidence, or none that is a path
            if ev_path is not None:
                h, m = link(str(ev), ev_path, run_dir)
                links.append(h)
                md_links.append(m)
                if png is not None:
                    h, m = link("plot", png, run_dir)
                    links.append(h)
                    md_links.append(m)
            if series is not None:
                all_series.append(series)
            if png is not None and str(sp.resolve()) not in shown_series:
                shown_series.add(str(sp.resolve()))
                figures.append({"figure": figure(png, series, sp, run_dir)})
            table_rows.append([cell(str(r.get("step") or "")), cell(str(r.get("assertion") or ""), title=r.get("id")),
                               cell(fmt_value(r.get("expected")), obs=True), cell(fmt_value(r.get("observed")), obs=True),
                               cell(verdict=r.get("verdict")), cell(mark(r) or None), cell(str(r.get("reason") or "")),
                               cell(None if ev_path is not None else fmt_value(ev, 80) if ev else "—", links=links,
                                    md_links=md_links)])
        fold = load_fold(groups[(col, lane)], lambda r: cell(fmt_value(r.get("observed")), verdict=r.get("verdict"),
                                                             obs=True, reason=r.get("reason"),
                                                             title=f"expected {fmt_value(r.get('expected'))}"))
        sections.append({"title": f"{col} · lane {lane}", "callouts": [], "items": [
            {"table": {"columns": ["step", "assertion", "expected", "observed", "verdict", "means", "reason",
                                   "evidence"], "rows": table_rows}}, *([fold] if fold else []), *figures]})
    if not rows:
        sections.append({"title": None, "callouts": [], "items": [], "empty": "The ledger has no rows."})
    upgrade = upgrade_section(run_dir, rows)
    if upgrade is not None:
        sections.insert(0, upgrade)
    counts = verdict_counts(rows)
    page = {"title": f"Drill report — run {', '.join(run_ids)}",
            "headlines": headline_items(rows, lambda r: evidence_path(run_dir, r.get("evidence")), run_dir),
            "meta": [("run id", cell(", ".join(run_ids))),
                     ("target", cell(", ".join(sorted({str(r.get("target")) for r in rows if r.get("target")})) or "—")),
                     ("controller versions", cell(", ".join(columns) or "—")),
                     ("verdicts", cell(", ".join(f"{VERDICT_TEXT.get(v, v)} {n}" for v, n in counts.items())
                                       or "—"))],
            "notes": ([EMULATION_NOTE] if has_load(rows, all_series) else []) + [WEIGHT_NOTE], "sections": sections}
    return render(page, run_dir / "report.html", run_dir / "report.md")


# --- the matrix ----------------------------------------------------------------------------------------------
def matrix_cell(entry: tuple, start: Path) -> dict:
    _, r, run_dir, png = entry
    if png is not None:
        h, m = link("plot", png, start)
    else:
        ep = evidence_path(run_dir, r.get("evidence"))
        h, m = link("evidence", ep, start) if ep is not None else (None, None)
    reason = fmt_value(r["reason"], 70) if r.get("reason") else None
    tip = f"expected {fmt_value(r.get('expected'))}" + (f" — {r['reason']}" if r.get("reason") else "")
    means = mark(r)
    return cell(fmt_value(r.get("observed"), 40) + (f" · {means}" if means else ""), verdict=r.get("verdict"),
                obs=True, links=[h] if h else [],
                md_links=[m] if m else [], reason=reason, run=str(r.get("run_id") or run_dir.name), title=tip,
                link_sep=" ")


def write_matrix(run_dirs: list[Path] | None, reports_root: Path, strict: bool = False) -> tuple[Path, Path]:
    """Merge run folders into reports_root/matrix.html and matrix.md (version x assertion, lane sections).

    run_dirs None: every folder under reports_root with a ledger.json.  Entries that are not run folders are
    ignored; a folder reached twice (the `latest` link) counts once.  Each run's own report is refreshed on the
    way, so every cell can link its plot.  When several runs recorded one assertion for one version, the newest
    row wins."""
    reports_root = Path(reports_root)
    runs = readable(unique_runs(discover(reports_root) if run_dirs is None else run_dirs),
                    strict=run_dirs is not None and strict)
    plots, run_info, cells, exact_cells, order, seq, any_load = Plots(), [], {}, {}, {}, 0, False
    labels: dict[tuple, str] = {}
    ledgers = {run_dir: read_judged(run_dir) for run_dir in runs}
    pair_key = keyer(*ledgers.values())
    for run_dir in runs:
        rows = ledgers[run_dir]
        rep_html, rep_md = write_run_report(run_dir, plots)
        run_info.append((run_dir, rows, rep_html, rep_md))
        series_seen = []
        for r in rows:
            seq += 1
            sp = series_of(run_dir, r.get("evidence"))
            png, series = plots.of(run_dir, sp) if sp else (None, None)
            if series:
                series_seen.append(series)
            # one line per assertion (its id) whatever sentence and source lines each version has for it
            exact = tuple(str(r.get(k) or "—") for k in ("lane", "step", "assertion"))
            key = (exact[0], exact[1], pair_key(r))
            order.setdefault(key, (lane_key(key[0]), seq))
            entry = ((str(r.get("recorded_at") or ""), str(r.get("run_id") or ""), seq), r, run_dir, png)
            labels.setdefault(key, f"{exact[0]}/{exact[1]}/{strip_line_refs(exact[2])}")
            for store, k in ((cells, key), (exact_cells, exact)):
                if (k, column(r)) not in store or _replaces(entry, store[(k, column(r))]):
                    store[(k, column(r))] = entry
        any_load = any_load or has_load(rows, series_seen)
    columns = sorted({c for _, c in cells}, key=column_key)
    runs_rows = []
    for run_dir, rows, rep_html, rep_md in run_info:
        ids = sorted({str(r.get("run_id")) for r in rows if r.get("run_id")}) or [run_dir.name]
        (hh, hm), (mh, mm) = link("html", rep_html, reports_root), link("md", rep_md, reports_root)
        runs_rows.append([cell(", ".join(ids)), cell(", ".join(sorted({str(r.get("target")) for r in rows
                                                                       if r.get("target")}))),
                          cell(", ".join(sorted({column(r) for r in rows}, key=column_key))), cell(str(len(rows))),
                          cell(None, links=[hh, mh], md_links=[hm, mm])])
    newest = [e[1] for e in cells.values()]
    keys = sorted(order, key=lambda k: order[k])
    any_row: dict[tuple, dict] = {}          # a row of each line (one pass: a line's rows are all load or none)
    for (k, _), e in cells.items():
        any_row.setdefault(k, e[1])
    matrix_rows = [[cell(labels[key]), *[matrix_cell(cells[(key, c)], reports_root) if (key, c) in cells
                                         else cell("—") for c in columns]]
                   for key in keys if not is_load(any_row[key])]
    load_rows = [[cell(labels[key]), *[matrix_cell(cells[(key, c)], reports_root) if (key, c) in cells
                                       else cell("—") for c in columns]]
                 for key in keys if is_load(any_row[key])]
    sections = [
        {"title": "Runs", "callouts": [], "empty": None if runs_rows else "No run folders found.",
         "items": [{"table": {"columns": ["run", "target", "controller versions", "rows", "report"],
                              "rows": runs_rows}}] if runs_rows else []},
        {"title": "Controller version × assertion", "callouts": [],
         "intro": "Cell: verdict, observed value, the evidence plot and the run it comes from; when several runs "
                  "recorded the same assertion for a version, the newest row wins.",
         "empty": None if matrix_rows else "No ledger rows.",
         "items": ([{"table": {"columns": ["lane/step/assertion", *columns], "rows": matrix_rows,
                               "head_col": True}}] if matrix_rows else [])
         + ([{"fold": {"summary": f"load per phase (emulated mesh): {len(load_rows)} row(s)", "items": [
             {"table": {"columns": ["lane/step/assertion", *columns], "rows": load_rows, "head_col": True}}]}}]
            if load_rows else [])},
    ]
    history = neighbours_section(newest)
    if history is not None:
        sections.append(history)
    for lane in LANES:
        lane_cells = {(c, k[1], k[2]): e[1] for (k, c), e in exact_cells.items() if k[0] == lane.key}
        entries = {(c, k[1], k[2]): e for (k, c), e in exact_cells.items() if k[0] == lane.key}
        for sec in lane.report_sections(lane_cells, reports_root):
            sections.append(_lane_section(sec, entries, reports_root))
    run_of = {id(e[1]): e[2] for e in cells.values()}
    page = {"title": "Drills — controller version × assertion matrix",
            "headlines": headline_items(newest, lambda r: evidence_path(run_of[id(r)], r.get("evidence")),
                                        reports_root),
            "meta": [],
            "notes": ([EMULATION_NOTE] if any_load else []) + [WEIGHT_NOTE], "sections": sections}
    return render(page, reports_root / "matrix.html", reports_root / "matrix.md")


def _replaces(new: tuple, old: tuple) -> bool:
    """Whether a row replaces another in its matrix cell: a newer run's row does; of one run's rows with one id,
    the worse verdict (drills.record.answer.prevailing), so a duplicated newer pass never hides a fail."""
    if str(new[1].get("run_id") or "") == str(old[1].get("run_id") or ""):
        rank = [WORST_FIRST.index(e[1].get("verdict")) if e[1].get("verdict") in WORST_FIRST else 0
                for e in (new, old)]
        if rank[0] != rank[1]:
            return rank[0] < rank[1]
    return new[0] > old[0]


def _lane_section(sec: dict, entries: dict, start: Path) -> dict:
    """A lane's section: its rows' cells become matrix cells (several rows in one cell become parts)."""
    rows = []
    flagged = {text.split(":", 1)[0] for text in sec.get("callouts") or []}
    for label, *groups in sec["rows"]:
        out = [cell(f"{label} ⚠" if label in flagged else label, strong=label in flagged)]
        for group in groups:
            parts = []
            for r in group:
                e = entries.get((label, r["step"], r["assertion"]))
                if e is not None:
                    parts.append((r["assertion"], matrix_cell(e, start)))
            out.append(cell(parts=parts) if parts else cell("—"))
        rows.append(out)
    items = [{"table": {"columns": sec["columns"], "rows": rows, "head_col": True}}] if rows else []
    for f in sec.get("figures") or []:
        png = Path(f["png"])
        items.append({"figure": {"src": href(png, start), "src_md": md_target(png, start), "caption": f["caption"],
                                 "series_href": href(png, start), "series_href_md": md_target(png, start),
                                 "series_label": rel(png, start), "load": None}})
    return {"title": sec["title"], "intro": sec.get("note"), "callouts": sec.get("callouts") or [],
            "empty": None if items else "No rows.", "items": items}
