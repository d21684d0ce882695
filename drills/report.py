"""Human reports: timeline plots, the per-run report and the controller-version x assertion matrix.

Inputs are run folders, reports/<run-id>/, each holding ledger.json (drills.ledger) and the evidence the
rows point at.  A row's evidence may name a `<name>.timeline.jsonl` (raw watch events) or the derived
`<name>.series.json` beside it; plots are drawn from the series only:

    {"title": str, "t0_wall": float,
     "canary_weight": [[t, weight], ...], "stable_weight": [[t, weight], ...],
     "canary_available": [[t, available, target], ...],
     "partial": [[t_start, t_end|null], ...], "exposure": [[t_start, t_end|null], ...],
     "markers": [[t, label], ...],
     "phases": {name: [t0, t1]},                      (optional)
     "load": {phase: {"failure_ratio", "p95_ms", "requests"}},   (optional)
     "summary": {"peak_canary_weight_while_partial", "partial_window_observed", "exposure_seconds"}}

t is seconds since the rollback (t=0).  Each plot is written once per series as `<name>.png` beside it and
redrawn only when the series is newer than the picture.

`drills report [RUN_DIR...]` writes reports/matrix.html and reports/matrix.md and refreshes each run's
report.html / report.md on the way.
"""
from __future__ import annotations

import html
import json
import math
import os
import sys
from pathlib import Path
from urllib.parse import quote

from .ledger import LedgerError, read_rows

EMULATION_NOTE = "Load figures come from an emulated mesh on the embedded cluster."
WEIGHT_NOTE = ("The drill reproduces the canary weight the controller writes, "
               "not the production pod arithmetic (brief §14.4).")

EXPOSURE_LABEL = "exposure: weight > available share"
PARTIAL_LABEL = "partial: available < target"

EXPOSURE_COLOUR = "#e8112d"
PARTIAL_COLOUR = "#f6d55c"
WEIGHT_COLOUR = "#1f4e9c"
SHARE_COLOUR = "#2ca02c"

VERDICT_COLOURS = {
    "pass": "#1e7b34", "fail": "#c0182a", "inconclusive": "#b36b00",
    "unverified": "#5a5a5a", "not_applicable": "#7a7a9a",
}
VERDICT_TEXT = {"not_applicable": "not applicable"}

LANE_ORDER = ("a", "b", "abort", "order")

# branch-order section: column label -> the `order` lane step it is read from
ORDER_COLUMNS = (
    ("before end-of-steps", "end-of-steps"),
    ("before mid-steps", "mid-steps"),
    ("hazards", "hazard-replica-progress-threshold"),
)
HAZARD_STEP = "hazard-replica-progress-threshold"

TIMELINE_SUFFIX = ".timeline.jsonl"
SERIES_SUFFIX = ".series.json"


# ----------------------------------------------------------------------------------------------
# plot
# ----------------------------------------------------------------------------------------------
def _num(v) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(float(v)) else None
    if isinstance(v, str):
        try:
            f = float(v.strip().rstrip("%"))
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def _x_range(series: dict) -> tuple[float, float]:
    ts: list[float] = []
    for key in ("canary_weight", "stable_weight", "canary_available", "markers"):
        for p in series.get(key) or []:
            if p and _num(p[0]) is not None:
                ts.append(_num(p[0]))
    for key in ("partial", "exposure"):
        for w in series.get(key) or []:
            ts.extend(x for x in (_num(w[0]), _num(w[1]) if len(w) > 1 else None) if x is not None)
    for w in (series.get("phases") or {}).values():
        if isinstance(w, (list, tuple)):
            ts.extend(x for x in map(_num, w[:2]) if x is not None)
    if not ts:
        return 0.0, 1.0
    lo, hi = min(ts), max(ts)
    if hi <= lo:
        hi = lo + 1.0
    pad = 0.03 * (hi - lo)
    return lo - pad, hi + pad


def _steps(points, x_end: float) -> tuple[list[float], list[float]]:
    """[[t, v], ...] -> x, y for a steps-post line held to x_end."""
    pts = sorted(((_num(p[0]), p[1]) for p in points if p and _num(p[0]) is not None), key=lambda p: p[0])
    xs = [t for t, _ in pts]
    ys = [v if v is not None else math.nan for _, v in pts]
    if xs and xs[-1] < x_end:
        xs.append(x_end)
        ys.append(ys[-1])
    return xs, ys


def _windows(windows, x_end: float) -> list[tuple[float, float]]:
    out = []
    for w in windows or []:
        if not w:
            continue
        a = _num(w[0])
        b = _num(w[1]) if len(w) > 1 else None
        if a is None:
            continue
        out.append((a, x_end if b is None else b))
    return out


def _pct(v) -> str:
    f = _num(v)
    if f is None:
        return "n/a"
    return f"{f * 100:.1f}%"


def plot_series(series: dict, out_png: Path) -> Path:
    """Draw one drill's timeline: canary weight against canary availability share, exposure shaded."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    out_png = Path(out_png)
    x_lo, x_hi = _x_range(series)
    phases = {k: v for k, v in (series.get("phases") or {}).items() if isinstance(v, (list, tuple)) and v}
    load = series.get("load") or {}

    fig = Figure(figsize=(11, 6.2 if phases else 5.4), dpi=100)
    if phases:
        gs = fig.add_gridspec(2, 1, height_ratios=(5, 1), hspace=0.08)
        ax = fig.add_subplot(gs[0])
        strip = fig.add_subplot(gs[1], sharex=ax)
    else:
        ax, strip = fig.add_subplot(1, 1, 1), None

    handles = []
    # partial windows, then exposure windows on top of them
    for a, b in _windows(series.get("partial"), x_hi):
        ax.axvspan(a, b, color=PARTIAL_COLOUR, alpha=0.35, lw=0, zorder=0)
    if series.get("partial"):
        handles.append(Patch(facecolor=PARTIAL_COLOUR, alpha=0.35, label=PARTIAL_LABEL))
    exposure = _windows(series.get("exposure"), x_hi)
    for a, b in exposure:
        ax.axvspan(a, b, facecolor=EXPOSURE_COLOUR, alpha=0.28, edgecolor=EXPOSURE_COLOUR, lw=1.2, zorder=1)
        ax.text((a + b) / 2, 50, f"EXPOSURE\n{b - a:.1f} s", ha="center", va="center", fontsize=10,
                fontweight="bold", color="#8b0000", zorder=6, clip_on=True,
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=EXPOSURE_COLOUR, alpha=0.85))
    if exposure:
        handles.append(Patch(facecolor=EXPOSURE_COLOUR, alpha=0.28, edgecolor=EXPOSURE_COLOUR,
                             label=EXPOSURE_LABEL))

    # canary availability share, canary weight
    share_pts = []
    for p in series.get("canary_available") or []:
        if not p or len(p) < 3:
            continue
        avail, target = _num(p[1]), _num(p[2])
        share = None if avail is None or not target else min(100.0, 100.0 * avail / target)
        share_pts.append([p[0], share])
    xs, ys = _steps(share_pts, x_hi)
    if xs:
        (h,) = ax.plot(xs, ys, drawstyle="steps-post", color=SHARE_COLOUR, lw=2.2, ls="--", zorder=4,
                       label="canary available share (100·available/target)")
        handles.append(h)
    xs, ys = _steps([[p[0], _num(p[1])] for p in series.get("canary_weight") or [] if p and len(p) > 1], x_hi)
    if xs:
        (h,) = ax.plot(xs, ys, drawstyle="steps-post", color=WEIGHT_COLOUR, lw=2.8, zorder=5,
                       label="canary weight in VirtualService (%)")
        handles.insert(0, h)

    # action markers
    markers = sorted((m for m in series.get("markers") or [] if m and _num(m[0]) is not None),
                     key=lambda m: _num(m[0]))
    for i, m in enumerate(markers):
        t = _num(m[0])
        label = str(m[1]) if len(m) > 1 else ""
        ax.axvline(t, color="#333333", ls=":", lw=1.3, zorder=3)
        ax.text(t, 103 + (6 if i % 2 else 0), f" {label}", rotation=0, ha="left", va="bottom", fontsize=8.5,
                color="#222222", zorder=7, clip_on=False)

    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(-3, 103)
    ax.set_yticks([0, 25, 50, 75, 100])
    ax.set_ylabel("% (weight / available share)")
    ax.grid(True, axis="y", color="#dddddd", lw=0.8, zorder=0)
    ncol = 2 if len(handles) > 3 else max(1, len(handles))
    legend_rows = -(-len(handles) // ncol)
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.005), ncol=ncol,
               fontsize=9, frameon=False, handlelength=2.2, columnspacing=1.4)

    summary = series.get("summary") or {}
    peak = summary.get("peak_canary_weight_while_partial")
    observed = summary.get("partial_window_observed")
    bits = []
    if observed is False:
        bits.append("no partial-availability window observed")
    elif peak is not None:
        bits.append(f"peak canary weight while partial: {peak}%")
    exp_s = _num(summary.get("exposure_seconds"))
    if exp_s is not None:
        bits.append(f"exposure {exp_s:.1f} s" if exp_s > 0 or exposure else "no exposure")
    title = str(series.get("title") or out_png.stem)
    fig.suptitle(title, fontsize=13, fontweight="bold", y=0.985)
    if bits:
        fig.text(0.5, 0.925, " · ".join(bits), ha="center", fontsize=10.5,
                 color="#8b0000" if exposure else "#222222")

    if strip is not None:
        palette = ("#c6dbef", "#fcbba1", "#c7e9c0", "#dadaeb", "#fdd0a2", "#d9d9d9")
        for i, (name, w) in enumerate(phases.items()):
            a = _num(w[0])
            b = _num(w[1]) if len(w) > 1 else None
            if a is None:
                continue
            b = x_hi if b is None else b
            strip.axvspan(a, b, ymin=0.05, ymax=0.95, color=palette[i % len(palette)], lw=0)
            stats = load.get(name) or {}
            text = name
            if stats:
                fr = stats.get("failure_ratio")
                text += f"\nfail {_pct(fr)}"
                if _num(stats.get("p95_ms")) is not None:
                    text += f" · p95 {_num(stats['p95_ms']):.0f} ms"
            bad = (_num((stats or {}).get("failure_ratio")) or 0) > 0
            strip.text((max(a, x_lo) + min(b, x_hi)) / 2, 0.5, text, ha="center", va="center", fontsize=8.5,
                       fontweight="bold" if bad else "normal", color="#8b0000" if bad else "#222222",
                       clip_on=True)
        strip.set_ylim(0, 1)
        strip.set_yticks([])
        strip.set_ylabel("phase", rotation=0, ha="right", va="center")
        strip.set_xlabel("seconds since rollback (t = 0)")
        for t in (_num(m[0]) for m in markers):
            strip.axvline(t, color="#333333", ls=":", lw=1.0)
        ax.tick_params(labelbottom=False)
    else:
        ax.set_xlabel("seconds since rollback (t = 0)")

    fig.subplots_adjust(left=0.07, right=0.98, top=0.83,
                        bottom=(0.1 + 0.038 * legend_rows) if strip is not None else (0.11 + 0.044 * legend_rows))
    out_png.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_png.with_name(out_png.name + ".tmp.png")
    fig.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, out_png)
    return out_png


# ----------------------------------------------------------------------------------------------
# run folders and evidence
# ----------------------------------------------------------------------------------------------
def is_run_dir(path: Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / "ledger.json").is_file()


def _evidence_path(run_dir: Path, evidence) -> Path | None:
    if not evidence:
        return None
    p = Path(str(evidence))
    return p if p.is_absolute() else run_dir / p


def _series_path(run_dir: Path, evidence) -> Path | None:
    """The .series.json for a row's evidence (itself, or the sibling of a .timeline.jsonl)."""
    p = _evidence_path(run_dir, evidence)
    if p is None:
        return None
    name = p.name
    if name.endswith(SERIES_SUFFIX):
        cand = p
    elif name.endswith(TIMELINE_SUFFIX):
        cand = p.with_name(name[: -len(TIMELINE_SUFFIX)] + SERIES_SUFFIX)
    else:
        cand = p.with_name(p.stem + SERIES_SUFFIX)
    return cand if cand.is_file() else None


def _png_for(run_dir: Path, series_path: Path) -> Path:
    base = series_path.name[: -len(SERIES_SUFFIX)]
    try:
        series_path.resolve().relative_to(run_dir.resolve())
        return series_path.with_name(base + ".png")
    except ValueError:  # evidence kept outside the run folder: draw into the run folder
        return run_dir / "plots" / (base + ".png")


def _load_series(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _ensure_plot(run_dir: Path, series_path: Path, cache: dict) -> tuple[Path | None, dict | None]:
    key = str(series_path.resolve())
    if key in cache:
        return cache[key]
    series = _load_series(series_path)
    png = None
    if series is not None:
        png = _png_for(run_dir, series_path)
        if not png.is_file() or png.stat().st_mtime < series_path.stat().st_mtime:
            try:
                plot_series(series, png)
            except (ValueError, TypeError, KeyError, IndexError):   # a malformed series: no picture
                png = None
    cache[key] = (png, series)
    return cache[key]


def _rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), Path(start).resolve())).as_posix()


def _href(path: Path, start: Path) -> str:
    return quote(_rel(path, start))


def _md_link_target(path: Path, start: Path) -> str:
    rel = _rel(path, start)
    return f"<{rel}>" if any(c in rel for c in " ()<>") else rel


# ----------------------------------------------------------------------------------------------
# formatting
# ----------------------------------------------------------------------------------------------
def _fmt_value(v, limit: int = 80) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        text = f"{v:.3f}".rstrip("0").rstrip(".") if math.isfinite(v) else str(v)
    elif isinstance(v, str):
        text = v
    else:
        text = json.dumps(v, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _verdict_text(v) -> str:
    return VERDICT_TEXT.get(v, str(v or "—"))


def _verdict_html(v) -> str:
    colour = VERDICT_COLOURS.get(v, "#444444")
    return (f'<span class="verdict v-{html.escape(str(v))}" style="background:{colour}">'
            f"{html.escape(_verdict_text(v))}</span>")


def _md_cell(text) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _version_key(v: str):
    from .config import version_tuple
    try:
        return (0, version_tuple(v), v)
    except (ValueError, TypeError):
        return (1, (0, 0, 0), str(v))


def _column(row: dict) -> str:
    """Matrix column of a row: its version, plus the binary's sha256 for a user-built controller."""
    v = str(row.get("controller_version") or "unknown")
    sha = row.get("controller_sha256")
    return f"{v} (sha256 {str(sha)[:12]})" if sha else v


def _column_key(col: str):
    v, _, rest = col.partition(" ")
    return (_version_key(v), rest)


def _lane_key(lane: str):
    lane = str(lane)
    return (LANE_ORDER.index(lane), lane) if lane in LANE_ORDER else (len(LANE_ORDER), lane)


def _has_load(rows: list[dict], series: list[dict]) -> bool:
    if any(s.get("load") for s in series):
        return True
    for r in rows:
        d = r.get("details")
        if isinstance(d, dict) and any(k in d for k in ("load", "failure_ratio", "p95_ms")):
            return True
    return False


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1200px;
     color:#1b1b1b;padding:0 16px}
h1{font-size:1.5em;margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.92em}
th,td{border:1px solid #d0d0d0;padding:4px 8px;vertical-align:top;text-align:left}
th{background:#f3f3f3}
.verdict{color:#fff;border-radius:3px;padding:1px 7px;font-weight:600;white-space:nowrap;font-size:.9em}
.note{background:#f7f7f2;border-left:4px solid #999;padding:6px 12px;margin:6px 0}
.callout{background:#fdecea;border-left:4px solid #c0182a;padding:6px 12px;margin:6px 0}
.small{color:#555;font-size:.85em} .obs{font-family:ui-monospace,Menlo,monospace;font-size:.9em}
figure{margin:12px 0 24px} figure img{max-width:100%;border:1px solid #ddd}
figcaption{color:#444;font-size:.9em}
"""


def _html_page(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def _load_table_rows(load: dict) -> list[tuple[str, str, str, str]]:
    out = []
    for phase, s in load.items():
        s = s or {}
        p95 = _num(s.get("p95_ms"))
        out.append((str(phase), _pct(s.get("failure_ratio")), "n/a" if p95 is None else f"{p95:.1f}",
                    _fmt_value(s.get("requests"))))
    return out


# ----------------------------------------------------------------------------------------------
# per-run report
# ----------------------------------------------------------------------------------------------
def write_run_report(run_dir: Path) -> tuple[Path, Path]:
    """Write run_dir/report.html and run_dir/report.md from run_dir/ledger.json and its evidence."""
    run_dir = Path(run_dir)
    rows = read_rows(run_dir / "ledger.json")
    return _write_run_report(run_dir, rows, {})


def _write_run_report(run_dir: Path, rows: list[dict], cache: dict) -> tuple[Path, Path]:
    run_ids = sorted({str(r.get("run_id")) for r in rows if r.get("run_id")}) or [run_dir.name]
    targets = sorted({str(r.get("target")) for r in rows if r.get("target")})
    columns = sorted({_column(r) for r in rows}, key=_column_key)

    # groups: version -> lane -> rows (ledger order kept inside a group)
    groups: dict[str, dict[str, list[dict]]] = {}
    for r in rows:
        groups.setdefault(_column(r), {}).setdefault(str(r.get("lane") or "—"), []).append(r)

    plots: dict[str, tuple[Path, dict, Path]] = {}   # series path -> (png, series, series path)
    row_series: list[str | None] = []
    for r in rows:
        sp = _series_path(run_dir, r.get("evidence"))
        if sp is None:
            row_series.append(None)
            continue
        png, series = _ensure_plot(run_dir, sp, cache)
        key = str(sp.resolve())
        if png is not None and key not in plots:
            plots[key] = (png, series, sp)
        row_series.append(key if png is not None else None)
    series_of = {id(r): k for r, k in zip(rows, row_series)}

    counts: dict[str, int] = {}
    for r in rows:
        counts[str(r.get("verdict"))] = counts.get(str(r.get("verdict")), 0) + 1
    notes = [WEIGHT_NOTE]
    if _has_load(rows, [p[1] for p in plots.values()]):
        notes.insert(0, EMULATION_NOTE)

    title = f"Drill report — run {', '.join(run_ids)}"
    h: list[str] = [f"<h1>{html.escape(title)}</h1>",
                    "<table class=\"meta\">",
                    f"<tr><th>run id</th><td>{html.escape(', '.join(run_ids))}</td></tr>",
                    f"<tr><th>target</th><td>{html.escape(', '.join(targets) or '—')}</td></tr>",
                    f"<tr><th>controller versions</th><td>{html.escape(', '.join(columns) or '—')}</td></tr>",
                    "<tr><th>verdicts</th><td>"
                    + " ".join(f"{_verdict_html(v)} {n}" for v, n in sorted(counts.items())) + "</td></tr>",
                    "</table>"]
    h += [f'<p class="note">{html.escape(n)}</p>' for n in notes]
    m: list[str] = [f"# {title}", "",
                     f"- **run id:** {', '.join(run_ids)}",
                     f"- **target:** {', '.join(targets) or '—'}",
                     f"- **controller versions:** {', '.join(columns) or '—'}",
                     "- **verdicts:** " + ", ".join(f"{_verdict_text(v)} {n}" for v, n in sorted(counts.items())),
                     ""]
    m += [f"> {n}\n" for n in notes]
    if not rows:
        h.append("<p>The ledger has no rows.</p>")
        m.append("The ledger has no rows.\n")

    shown: set[str] = set()
    for col in columns:
        for lane in sorted(groups.get(col, {}), key=_lane_key):
            lrows = groups[col][lane]
            h.append(f"<h2>{html.escape(col)} · lane {html.escape(lane)}</h2>")
            m.append(f"## {col} · lane {lane}\n")
            h.append("<table><tr><th>step</th><th>assertion</th><th>expected</th><th>observed</th>"
                     "<th>verdict</th><th>reason</th><th>evidence</th></tr>")
            m.append("| step | assertion | expected | observed | verdict | reason | evidence |")
            m.append("|---|---|---|---|---|---|---|")
            for r in lrows:
                ev = r.get("evidence")
                ev_html, ev_md = "—", "—"
                if ev:
                    ep = _evidence_path(run_dir, ev)
                    ev_html = f'<a href="{_href(ep, run_dir)}">{html.escape(str(ev))}</a>'
                    ev_md = f"[{_md_cell(ev)}]({_md_link_target(ep, run_dir)})"
                    sk = series_of.get(id(r))
                    if sk:
                        png = plots[sk][0]
                        ev_html += f' · <a href="{_href(png, run_dir)}">plot</a>'
                        ev_md += f" · [plot]({_md_link_target(png, run_dir)})"
                reason = r.get("reason") or ""
                h.append("<tr>" + "".join(f"<td>{c}</td>" for c in (
                    html.escape(str(r.get("step") or "")), html.escape(str(r.get("assertion") or "")),
                    f'<span class="obs">{html.escape(_fmt_value(r.get("expected")))}</span>',
                    f'<span class="obs">{html.escape(_fmt_value(r.get("observed")))}</span>',
                    _verdict_html(r.get("verdict")), html.escape(str(reason)), ev_html)) + "</tr>")
                m.append("| " + " | ".join(_md_cell(c) for c in (
                    r.get("step") or "", r.get("assertion") or "", _fmt_value(r.get("expected")),
                    _fmt_value(r.get("observed")), _verdict_text(r.get("verdict")), reason)) + f" | {ev_md} |")
            h.append("</table>")
            m.append("")
            # the timelines these rows point at, each drawn once in the report
            for r in lrows:
                sk = series_of.get(id(r))
                if not sk or sk in shown:
                    continue
                shown.add(sk)
                png, series, sp = plots[sk]
                cap = str(series.get("title") or sp.name)
                h.append(f'<figure><img src="{_href(png, run_dir)}" alt="{html.escape(cap)}">'
                         f"<figcaption>{html.escape(cap)} — series "
                         f'<a href="{_href(sp, run_dir)}">{html.escape(_rel(sp, run_dir))}</a></figcaption></figure>')
                m.append(f"![{_md_cell(cap)}]({_md_link_target(png, run_dir)})\n")
                m.append(f"*{cap}* — series [{_rel(sp, run_dir)}]({_md_link_target(sp, run_dir)})\n")
                load = series.get("load") or {}
                if load:
                    lt = _load_table_rows(load)
                    h.append("<table><tr><th>phase</th><th>failure ratio</th><th>p95 ms</th><th>requests</th></tr>"
                             + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in t) + "</tr>"
                                       for t in lt) + "</table>")
                    m.append("| phase | failure ratio | p95 ms | requests |")
                    m.append("|---|---|---|---|")
                    m += ["| " + " | ".join(_md_cell(c) for c in t) + " |" for t in lt]
                    m.append("")

    html_path = _write(run_dir / "report.html", _html_page(title, h))
    md_path = _write(run_dir / "report.md", "\n".join(m).rstrip() + "\n")
    return html_path, md_path


# ----------------------------------------------------------------------------------------------
# matrix
# ----------------------------------------------------------------------------------------------
def _discover(reports_root: Path) -> list[Path]:
    if not reports_root.is_dir():
        return []
    return [p for p in sorted(reports_root.iterdir()) if is_run_dir(p)]


def _readable(runs: list[Path], strict: bool) -> list[Path]:
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


def _unique_runs(paths) -> list[Path]:
    seen, out = set(), []
    for p in paths:
        p = Path(p)
        if not is_run_dir(p):
            continue
        key = p.resolve()
        if key in seen:
            continue
        seen.add(key)
        out.append(p)
    return out


def _newer(row: dict, order: int) -> tuple:
    return (str(row.get("recorded_at") or ""), str(row.get("run_id") or ""), order)


def write_matrix(run_dirs: list[Path] | None, reports_root: Path, strict: bool = False) -> tuple[Path, Path]:
    """Merge run folders into reports_root/matrix.html and matrix.md (version x assertion, branch order).

    run_dirs None: every folder under reports_root with a ledger.json.  Entries that are not run folders
    are ignored; a folder reached twice (the `latest` link) counts once.  Each run's own report is
    refreshed on the way, so every cell can link its plot.
    """
    reports_root = Path(reports_root)
    runs = _readable(_unique_runs(_discover(reports_root) if run_dirs is None else run_dirs),
                     strict=run_dirs is not None and strict)

    cache: dict = {}
    run_info: list[dict] = []
    # (row key, column) -> (sort key, row, run_dir, png)
    cells: dict[tuple[str, str], tuple[tuple, dict, Path, Path | None]] = {}
    row_keys: dict[str, tuple] = {}      # "lane/step/assertion" -> sort key
    order_cells: dict[tuple[str, str], dict[str, tuple[tuple, dict, Path, Path | None]]] = {}
    any_load = False
    seq = 0
    for run_dir in runs:
        rows = read_rows(run_dir / "ledger.json")
        rep_html, rep_md = _write_run_report(run_dir, rows, cache)
        run_ids = sorted({str(r.get("run_id")) for r in rows if r.get("run_id")}) or [run_dir.name]
        run_info.append({"dir": run_dir, "run_ids": run_ids, "html": rep_html, "md": rep_md,
                         "targets": sorted({str(r.get("target")) for r in rows if r.get("target")}),
                         "columns": sorted({_column(r) for r in rows}, key=_column_key), "rows": len(rows)})
        series_seen = []
        for r in rows:
            seq += 1
            sp = _series_path(run_dir, r.get("evidence"))
            png, series = _ensure_plot(run_dir, sp, cache) if sp else (None, None)
            if series:
                series_seen.append(series)
            lane, step, assertion = (str(r.get(k) or "—") for k in ("lane", "step", "assertion"))
            rk = f"{lane}/{step}/{assertion}"
            row_keys.setdefault(rk, (_lane_key(lane), seq))
            col = _column(r)
            entry = (_newer(r, seq), r, run_dir, png)
            if (rk, col) not in cells or entry[0] > cells[(rk, col)][0]:
                cells[(rk, col)] = entry
            if lane == "order":
                slot = order_cells.setdefault((col, step), {})
                if assertion not in slot or entry[0] > slot[assertion][0]:
                    slot[assertion] = entry
        any_load = any_load or _has_load(rows, series_seen)

    columns = sorted({c for _, c in cells}, key=_column_key)
    matrix_rows = sorted(row_keys, key=lambda k: row_keys[k])
    notes = ([EMULATION_NOTE] if any_load else []) + [WEIGHT_NOTE]

    def ev_link(row: dict, run_dir: Path, png: Path | None) -> tuple[str, str]:
        if png is not None:
            return (f'<a href="{_href(png, reports_root)}">plot</a>',
                    f"[plot]({_md_link_target(png, reports_root)})")
        ep = _evidence_path(run_dir, row.get("evidence"))
        if ep is not None:
            return (f'<a href="{_href(ep, reports_root)}">evidence</a>',
                    f"[evidence]({_md_link_target(ep, reports_root)})")
        return "", ""

    def cell(entry) -> tuple[str, str]:
        _, r, run_dir, png = entry
        link_h, link_m = ev_link(r, run_dir, png)
        obs = _fmt_value(r.get("observed"), 40)
        rid = str(r.get("run_id") or run_dir.name)
        tip = f"expected {_fmt_value(r.get('expected'))}" + (f" — {r['reason']}" if r.get("reason") else "")
        reason = _fmt_value(r["reason"], 70) if r.get("reason") else ""
        hc = (f'<span title="{html.escape(tip)}">{_verdict_html(r.get("verdict"))} '
              f'<span class="obs">{html.escape(obs)}</span></span>'
              + (f" {link_h}" if link_h else "")
              + (f'<br><span class="small">{html.escape(reason)}</span>' if reason else "")
              + f'<br><span class="small">run {html.escape(rid)}</span>')
        mc = f"**{_verdict_text(r.get('verdict'))}** {_md_cell(obs)}" + (f" {link_m}" if link_m else "") \
             + (f" ({_md_cell(reason)})" if reason else "") + f" <sub>run {_md_cell(rid)}</sub>"
        return hc, mc

    title = "Drills — controller version × assertion matrix"
    h: list[str] = [f"<h1>{html.escape(title)}</h1>"]
    h += [f'<p class="note">{html.escape(n)}</p>' for n in notes]
    m: list[str] = [f"# {title}", ""] + [f"> {n}\n" for n in notes]

    # runs
    h.append("<h2>Runs</h2>")
    m.append("## Runs\n")
    if not run_info:
        h.append("<p>No run folders found.</p>")
        m.append("No run folders found.\n")
    else:
        h.append("<table><tr><th>run</th><th>target</th><th>controller versions</th><th>rows</th>"
                 "<th>report</th></tr>")
        m.append("| run | target | controller versions | rows | report |")
        m.append("|---|---|---|---|---|")
        for ri in run_info:
            h.append(f"<tr><td>{html.escape(', '.join(ri['run_ids']))}</td>"
                     f"<td>{html.escape(', '.join(ri['targets']))}</td>"
                     f"<td>{html.escape(', '.join(ri['columns']))}</td><td>{ri['rows']}</td>"
                     f'<td><a href="{_href(ri["html"], reports_root)}">html</a> · '
                     f'<a href="{_href(ri["md"], reports_root)}">md</a></td></tr>')
            m.append(f"| {_md_cell(', '.join(ri['run_ids']))} | {_md_cell(', '.join(ri['targets']))} | "
                     f"{_md_cell(', '.join(ri['columns']))} | {ri['rows']} | "
                     f"[html]({_md_link_target(ri['html'], reports_root)}) · "
                     f"[md]({_md_link_target(ri['md'], reports_root)}) |")
        h.append("</table>")
        m.append("")

    # version x assertion
    h.append("<h2>Controller version × assertion</h2>")
    m.append("## Controller version × assertion\n")
    h.append('<p class="small">Cell: verdict, observed value, the evidence plot and the run it comes from; '
             "when several runs recorded the same assertion for a version, the newest row wins.</p>")
    m.append("Cell: verdict, observed value, the evidence plot and the run it comes from; when several runs "
             "recorded the same assertion for a version, the newest row wins.\n")
    if matrix_rows:
        h.append("<table><tr><th>lane/step/assertion</th>"
                 + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr>")
        m.append("| lane/step/assertion | " + " | ".join(_md_cell(c) for c in columns) + " |")
        m.append("|---|" + "---|" * len(columns))
        for rk in matrix_rows:
            hs, ms = [], []
            for c in columns:
                e = cells.get((rk, c))
                if e is None:
                    hs.append("—")
                    ms.append("—")
                else:
                    hc, mc = cell(e)
                    hs.append(hc)
                    ms.append(mc)
            h.append(f"<tr><th>{html.escape(rk)}</th>" + "".join(f"<td>{x}</td>" for x in hs) + "</tr>")
            m.append(f"| {_md_cell(rk)} | " + " | ".join(ms) + " |")
        h.append("</table>")
        m.append("")
    else:
        h.append("<p>No ledger rows.</p>")
        m.append("No ledger rows.\n")

    # branch order
    h.append("<h2>Branch order</h2>")
    m.append("## Branch order\n")
    order_versions = sorted({c for c, _ in order_cells}, key=_column_key)
    if not order_versions:
        h.append("<p>No branch-order rows (lane <code>order</code>) in these runs.</p>")
        m.append("No branch-order rows (lane `order`) in these runs.\n")
    else:
        callouts = []
        for v in order_versions:
            for _, r, _, _ in (order_cells.get((v, HAZARD_STEP)) or {}).values():
                # the prescription's promise is the last rung (kept in the row's details); the row's own
                # expected value may be upstream's known behaviour
                obs = _num(r.get("observed"))
                exp = _num((r.get("details") or {}).get("last_rung", r.get("expected")))
                if r.get("verdict") != "not_applicable" and obs is not None and exp is not None and obs > exp:
                    callouts.append((v, r, obs, exp))
        for v, r, obs, exp in callouts:
            text = (f"{v}: the prescription no longer keeps the weight at the last rung — "
                    f"{r.get('assertion')}: observed {_fmt_value(r.get('observed'))} > last rung "
                    f"{_fmt_value(exp)} (verdict {_verdict_text(r.get('verdict'))}, "
                    f"run {r.get('run_id')}).")
            h.append(f'<p class="callout"><strong>{html.escape(text)}</strong></p>')
            m.append(f"**{_md_cell(text)}**\n")
        h.append("<table><tr><th>controller version</th>"
                 + "".join(f"<th>{html.escape(lbl)}</th>" for lbl, _ in ORDER_COLUMNS) + "</tr>")
        m.append("| controller version | " + " | ".join(lbl for lbl, _ in ORDER_COLUMNS) + " |")
        m.append("|---|" + "---|" * len(ORDER_COLUMNS))
        for v in order_versions:
            hs, ms = [], []
            for _, step in ORDER_COLUMNS:
                slot = order_cells.get((v, step)) or {}
                if not slot:
                    hs.append("—")
                    ms.append("—")
                    continue
                ph, pm = [], []
                for assertion in sorted(slot):
                    hc, mc = cell(slot[assertion])
                    ph.append(f'<span class="small">{html.escape(assertion)}</span><br>{hc}')
                    pm.append(f"{_md_cell(assertion)}: {mc}")
                hs.append("<hr>".join(ph))
                ms.append("<br>".join(pm))
            label = html.escape(v)
            mlabel = _md_cell(v)
            if any(c[0] == v for c in callouts):
                label, mlabel = f"<strong>{label} ⚠</strong>", f"**{mlabel} ⚠**"
            h.append(f"<tr><th>{label}</th>" + "".join(f"<td>{x}</td>" for x in hs) + "</tr>")
            m.append(f"| {mlabel} | " + " | ".join(ms) + " |")
        h.append("</table>")
        m.append("")

    html_path = _write(reports_root / "matrix.html", _html_page(title, h))
    md_path = _write(reports_root / "matrix.md", "\n".join(m).rstrip() + "\n")
    return html_path, md_path


# ----------------------------------------------------------------------------------------------
# command
# ----------------------------------------------------------------------------------------------
def add_report_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="merge run folders into reports/matrix.html and reports/matrix.md",
        description="Render each run's report and merge run folders into a controller-version x assertion "
                    "matrix. Default: every run folder under the reports directory. Entries that are not "
                    "run folders are ignored.")
    p.add_argument("run_dir", nargs="*", metavar="RUN_DIR", help="run folders (reports/<run-id>)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from .errors import BadInput
    from .config import reports_dir

    given = list(getattr(args, "run_dir", None) or [])
    missing = [d for d in given if not Path(d).exists()]
    if missing:
        raise BadInput(f"no such run folder: {', '.join(map(str, missing))}")
    not_runs = [d for d in given if not is_run_dir(Path(d))]
    for d in not_runs:
        print(f"drills: report: {d} is not a run folder (no ledger.json): ignored", file=sys.stderr, flush=True)
    html_path, md_path = write_matrix([Path(d) for d in given] if given else None, reports_dir(), strict=True)
    print(html_path)
    print(md_path)
    return 0
