"""The report's view model: table cells and the links a cell carries, and where a row's evidence and its
timeline's series are in a run folder (shared by drills.reporting.report and drills.reporting.upgrade_report)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from urllib.parse import quote

from ..record import timeline


# --- cells -------------------------------------------------------------------------------------------------
def cell(text=None, verdict=None, obs=False, links=(), md_links=None, reason=None, run=None, title=None,
         strong=False, parts=(), link_sep=" · ") -> dict:
    """One table cell of the view model (both templates render every field)."""
    return {"text": text, "verdict": verdict, "obs": obs, "links": list(links),
            "md_links": list(links if md_links is None else md_links), "reason": reason, "run": run,
            "title": title, "strong": strong, "parts": list(parts), "link_sep": link_sep, "link_sep_md": link_sep}


def fmt_value(v, limit: int = 80) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        text = f"{v:.3f}".rstrip("0").rstrip(".") if math.isfinite(v) else str(v)
    elif isinstance(v, str):
        text = v
    else:
        text = json.dumps(v, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- run folders and evidence -----------------------------------------------------------------------------
def is_run_dir(path: Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / "ledger.json").is_file()


def evidence_path(run_dir: Path, evidence) -> Path | None:
    """Where a row's evidence is (None: it names none, or names no path: drills.record.evidence judges it so)."""
    if not evidence or not isinstance(evidence, str) or "\0" in evidence:
        return None
    p = Path(evidence)
    return p if p.is_absolute() else run_dir / p


def series_of(run_dir: Path, evidence) -> Path | None:
    """The series file of a row's evidence (itself, or the series named for its timeline)."""
    p = evidence_path(run_dir, evidence)
    if p is None:
        return None
    cand = p if p.name.endswith(timeline.SERIES_SUFFIX) else timeline.series_path(p)
    try:
        return cand if cand.is_file() else None
    except (OSError, ValueError):          # a name the filesystem refuses (too long): no series to draw
        return None


# --- links -------------------------------------------------------------------------------------------------
def rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), Path(start).resolve())).as_posix()


def href(path: Path, start: Path) -> str:
    return quote(rel(path, start))


def md_target(path: Path, start: Path) -> str:
    r = rel(path, start)
    return f"<{r}>" if any(c in r for c in " ()<>") else r


def link(label: str, path: Path, start: Path) -> tuple[list, list]:
    r = rel(path, start)                 # resolved once for both formats
    return [label, quote(r)], [label, f"<{r}>" if any(c in r for c in " ()<>") else r]
