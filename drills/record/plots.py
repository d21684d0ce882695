"""Timeline plots: one drill's canary weight against the canary's available share, exposure shaded.

A plot is drawn from a series file only (drills.record.timeline writes it beside the timeline):

    {"title": str, "t0_wall": float,
     "canary_weight": [[t, weight], ...], "stable_weight": [[t, weight], ...],
     "canary_available": [[t, available, target], ...],
     "partial": [[t_start, t_end|null], ...], "exposure": [[t_start, t_end|null], ...],
     "markers": [[t, label], ...],
     "phases": {name: [t0, t1]},                      (optional)
     "load": {phase: {"failure_ratio", "p95_ms", "requests"}},   (optional)
     "summary": {"peak_canary_weight_while_partial", "partial_window_observed", "exposure_seconds"}}

t is seconds since the rollback (t=0).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

EXPOSURE_LABEL = "exposure: weight > available share"
PARTIAL_LABEL = "partial: available < target"
EXPOSURE_COLOUR = "#e8112d"
PARTIAL_COLOUR = "#f6d55c"
WEIGHT_COLOUR = "#1f4e9c"
SHARE_COLOUR = "#2ca02c"


def num(v) -> float | None:
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
            if p and num(p[0]) is not None:
                ts.append(num(p[0]))
    for key in ("partial", "exposure"):
        for w in series.get(key) or []:
            ts.extend(x for x in (num(w[0]), num(w[1]) if len(w) > 1 else None) if x is not None)
    for w in (series.get("phases") or {}).values():
        if isinstance(w, (list, tuple)):
            ts.extend(x for x in map(num, w[:2]) if x is not None)
    if not ts:
        return 0.0, 1.0
    lo, hi = min(ts), max(ts)
    if hi <= lo:
        hi = lo + 1.0
    pad = 0.03 * (hi - lo)
    return lo - pad, hi + pad


def _steps(points, x_end: float) -> tuple[list[float], list[float]]:
    """[[t, v], ...] -> x, y for a steps-post line held to x_end."""
    pts = sorted(((num(p[0]), p[1]) for p in points if p and num(p[0]) is not None), key=lambda p: p[0])
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
        a = num(w[0])
        b = num(w[1]) if len(w) > 1 else None
        if a is None:
            continue
        out.append((a, x_end if b is None else b))
    return out


def pct(v) -> str:
    f = num(v)
    if f is None:
        return "n/a"
    return f"{f * 100:.1f}%"


def plot_series(series: dict, out_png: Path) -> Path:
    """Draw one drill's timeline: canary weight against canary availability share, exposure shaded."""
    from matplotlib.figure import (
        Figure,  # deferred: a heavy import, needed only when drawing
    )
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
        avail, target = num(p[1]), num(p[2])
        share = None if avail is None or not target else min(100.0, 100.0 * avail / target)
        share_pts.append([p[0], share])
    xs, ys = _steps(share_pts, x_hi)
    if xs:
        (h,) = ax.plot(xs, ys, drawstyle="steps-post", color=SHARE_COLOUR, lw=2.2, ls="--", zorder=4,
                       label="canary available share (100·available/target)")
        handles.append(h)
    xs, ys = _steps([[p[0], num(p[1])] for p in series.get("canary_weight") or [] if p and len(p) > 1], x_hi)
    if xs:
        (h,) = ax.plot(xs, ys, drawstyle="steps-post", color=WEIGHT_COLOUR, lw=2.8, zorder=5,
                       label="canary weight the controller wrote (%)")
        handles.insert(0, h)

    # action markers
    markers = sorted((m for m in series.get("markers") or [] if m and num(m[0]) is not None),
                     key=lambda m: num(m[0]))
    for i, m in enumerate(markers):
        t = num(m[0])
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
    exp_s = num(summary.get("exposure_seconds"))
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
            a = num(w[0])
            b = num(w[1]) if len(w) > 1 else None
            if a is None:
                continue
            b = x_hi if b is None else b
            strip.axvspan(a, b, ymin=0.05, ymax=0.95, color=palette[i % len(palette)], lw=0)
            stats = load.get(name) or {}
            text = name
            if stats:
                fr = stats.get("failure_ratio")
                text += f"\nfail {pct(fr)}"
                if num(stats.get("p95_ms")) is not None:
                    text += f" · p95 {num(stats['p95_ms']):.0f} ms"
            bad = (num((stats or {}).get("failure_ratio")) or 0) > 0
            strip.text((max(a, x_lo) + min(b, x_hi)) / 2, 0.5, text, ha="center", va="center", fontsize=8.5,
                       fontweight="bold" if bad else "normal", color="#8b0000" if bad else "#222222",
                       clip_on=True)
        strip.set_ylim(0, 1)
        strip.set_yticks([])
        strip.set_ylabel("phase", rotation=0, ha="right", va="center")
        strip.set_xlabel("seconds since rollback (t = 0)")
        for t in (num(m[0]) for m in markers):
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


def plot_paths(paths: dict[str, list | None], title: str, out_png: Path) -> Path:
    """Weight paths side by side, one panel each (t = 0: the action of the panel), for one version."""
    from matplotlib.figure import (
        Figure,  # deferred: a heavy import, needed only when drawing
    )

    names = list(paths)
    fig = Figure(figsize=(3.2 * max(1, len(names)), 3.6), dpi=100)
    axes = fig.subplots(1, max(1, len(names)), sharey=True, squeeze=False)[0]
    for ax, name in zip(axes, names):
        pts = [[num(p[0]), num(p[1])] for p in paths.get(name) or [] if p and len(p) > 1]
        x_hi = max([p[0] for p in pts if p[0] is not None] + [10.0]) + 5.0
        xs, ys = _steps(pts, x_hi)
        if xs:
            ax.plot(xs, ys, drawstyle="steps-post", color=WEIGHT_COLOUR, lw=2.4)
        else:
            ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes, color="#777777")
        ax.axvline(0, color="#333333", ls=":", lw=1.2)
        ax.set_title(name, fontsize=11, fontweight="bold")
        ax.set_ylim(-3, 103)
        ax.set_yticks([0, 25, 50, 75, 100])
        ax.grid(True, axis="y", color="#dddddd", lw=0.8)
        ax.set_xlabel("seconds since the escape")
    axes[0].set_ylabel("canary weight (%)")
    fig.suptitle(title, fontsize=12, fontweight="bold")
    fig.subplots_adjust(left=0.06, right=0.99, top=0.83, bottom=0.16, wspace=0.08)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_png.with_name(out_png.name + ".tmp.png")
    fig.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, out_png)
    return out_png


def plot_pair(sides: dict[str, dict | None], title: str, out_png: Path) -> Path:
    """Two controllers' timelines of one drill side by side on one scale (baseline, then candidate): canary
    weight against the canary's available share, partial and exposure windows shaded, t = 0 the rollback."""
    from matplotlib.figure import (
        Figure,  # deferred: a heavy import, needed only when drawing
    )

    names = list(sides)
    fig = Figure(figsize=(6.0 * max(1, len(names)), 4.4), dpi=100)
    axes = fig.subplots(1, max(1, len(names)), sharey=True, squeeze=False)[0]
    for ax, name in zip(axes, names):
        series = sides[name]
        if not series:
            ax.text(0.5, 0.5, "no timeline on this side", ha="center", va="center", transform=ax.transAxes,
                    color="#777777")
            ax.set_xticks([])
            ax.set_title(name, fontsize=11, fontweight="bold")
            continue
        x_lo, x_hi = _x_range(series)
        for a, b in _windows(series.get("partial"), x_hi):
            ax.axvspan(a, b, color=PARTIAL_COLOUR, alpha=0.35, lw=0, zorder=0)
        for a, b in _windows(series.get("exposure"), x_hi):
            ax.axvspan(a, b, facecolor=EXPOSURE_COLOUR, alpha=0.28, edgecolor=EXPOSURE_COLOUR, lw=1.0, zorder=1)
        share = []
        for p in series.get("canary_available") or []:
            if p and len(p) >= 3 and num(p[1]) is not None and num(p[2]):
                share.append([p[0], min(100.0, 100.0 * num(p[1]) / num(p[2]))])
        xs, ys = _steps(share, x_hi)
        if xs:
            ax.plot(xs, ys, drawstyle="steps-post", color=SHARE_COLOUR, lw=2.0, ls="--", zorder=4,
                    label="available share")
        xs, ys = _steps([[p[0], num(p[1])] for p in series.get("canary_weight") or [] if p and len(p) > 1], x_hi)
        if xs:
            ax.plot(xs, ys, drawstyle="steps-post", color=WEIGHT_COLOUR, lw=2.6, zorder=5, label="canary weight")
        ax.axvline(0, color="#333333", ls=":", lw=1.2)
        peak = (series.get("summary") or {}).get("peak_canary_weight_while_partial")
        ax.set_title(f"{name}" + (f" — peak while partial {peak}%" if peak is not None else ""), fontsize=11,
                     fontweight="bold")
        ax.set_xlim(x_lo, x_hi)
        ax.set_xlabel("seconds since rollback (t = 0)")
        ax.grid(True, axis="y", color="#dddddd", lw=0.8)
    axes[0].set_ylim(-3, 103)
    axes[0].set_yticks([0, 25, 50, 75, 100])
    axes[0].set_ylabel("% (weight / available share)")
    handles, labels = axes[-1].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=len(handles), fontsize=9, frameon=False)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    fig.subplots_adjust(left=0.06, right=0.99, top=0.84, bottom=0.2, wspace=0.06)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_png.with_name(out_png.name + ".tmp.png")
    fig.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, out_png)
    return out_png
