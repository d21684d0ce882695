"""The main job: run the lanes per controller version on a fresh embedded cluster each, into one run folder.

Each version runs the lane tests in its own pytest process (a clean process per cluster), all writing to
the same ledger.  At the end: a summary table, the run's report, the matrix, and ``reports/latest``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from . import config
from .ledger import FAIL, INCONCLUSIVE, combine_exit_codes, exit_code, new_run_id, read_rows

LANES = {"a": "lane_a", "b": "lane_b", "abort": "lane_abort", "order": "lane_order"}
DEFAULT_LANES = ("a", "b")


def resolve_lanes(spec: str | None) -> list[str]:
    if not spec:
        return list(DEFAULT_LANES)
    out = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        if item == "all":
            out.extend(k for k in LANES if k not in out)
        elif item in LANES:
            if item not in out:
                out.append(item)
        else:
            raise ValueError(f"unknown lane {item!r}: choose from {', '.join(LANES)} or all")
    missing = [k for k in out if not (config.project_root() / "lanes" / LANES[k]).is_dir()]
    if missing:
        raise ValueError(f"lane(s) {', '.join(missing)} are not in this checkout")
    return out


def link_latest(run_dir: Path) -> None:
    latest = run_dir.parent / "latest"
    tmp = run_dir.parent / ".latest.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(run_dir.name)
    os.replace(tmp, latest)


def run(versions: list[str], lanes: list[str], run_dir: Path | None = None, pytest_args: list[str] | None = None,
        env_extra: dict | None = None, log=None, tag: str = "") -> tuple[int, Path, list[dict]]:
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    run_id = run_dir.name if run_dir else new_run_id()
    run_dir = Path(run_dir or config.reports_dir() / run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    link_latest(run_dir)
    paths = [str(config.project_root() / "lanes" / LANES[k]) for k in lanes]
    rcs = {}
    t0 = time.monotonic()
    for i, v in enumerate(versions, 1):
        log(f"run {run_id}: [{i}/{len(versions)}] controller {v}: lanes {', '.join(lanes)}")
        cmd = [sys.executable, "-m", "pytest", "-p", "no:locust", "-q", "-rfE", "--no-header",
               "--controller", v, "--drills-run-dir", str(run_dir), "--drills-run-id", run_id,
               f"--junitxml={run_dir / f'junit-{v}{tag}.xml'}", "-o", "cache_dir=" + str(run_dir / ".pytest_cache"),
               *(pytest_args or []), *paths]
        env = dict(os.environ, **(env_extra or {}))
        tv = time.monotonic()
        rcs[v] = subprocess.call(cmd, cwd=str(config.project_root()), env=env)
        log(f"run {run_id}: controller {v} done in {time.monotonic() - tv:.0f}s (pytest exit {rcs[v]})")
    rows = read_rows(run_dir / "ledger.json")
    codes = [exit_code(rows)]
    for v, rc in rcs.items():
        if rc != 0 and exit_code([r for r in rows if r["controller_version"].startswith(v)]) == 0:
            codes.append(1)     # a step failed (or pytest could not run) before it could record a row
    code = combine_exit_codes(*codes)
    try:
        from .report import write_matrix, write_run_report
        write_run_report(run_dir)
        write_matrix(None, run_dir.parent)
    except Exception as e:  # the ledger is the record; a report failure is said, not hidden
        log(f"report: {type(e).__name__}: {e}")
        code = combine_exit_codes(code, 1)
    log(f"run {run_id}: {len(versions)} version(s) in {time.monotonic() - t0:.0f}s")
    return code, run_dir, rows


def summary_table(rows: list[dict]) -> str:
    versions = sorted({r["controller_version"] for r in rows}, key=_vkey)
    keys = []
    for r in rows:
        k = (r["lane"], r["step"], r["assertion"])
        if k not in keys:
            keys.append(k)
    cells = {}
    for r in rows:
        cells[(r["lane"], r["step"], r["assertion"], r["controller_version"])] = r
    lines = []
    head = f"{'lane/step':<14} {'assertion':<60} " + " ".join(f"{v:>18}" for v in versions)
    lines.append(head)
    lines.append("-" * len(head))
    for lane, step, assertion in keys:
        vals = []
        for v in versions:
            r = cells.get((lane, step, assertion, v))
            vals.append(f"{(r['verdict'] + ' ' + _short(r['observed'])) if r else '-':>18}")
        lines.append(f"{lane + '/' + step:<14} {assertion[:60]:<60} " + " ".join(vals))
    n_fail = sum(r["verdict"] == FAIL for r in rows)
    n_inc = sum(r["verdict"] == INCONCLUSIVE for r in rows)
    lines.append(f"{len(rows)} assertions: {sum(r['verdict'] == 'pass' for r in rows)} pass, {n_fail} fail, "
                 f"{n_inc} inconclusive, {sum(r['verdict'] in ('unverified', 'not_applicable') for r in rows)} "
                 f"unverified/not applicable")
    return "\n".join(lines)


def _short(v) -> str:
    s = str(v)
    return s if len(s) <= 8 else s[:7] + "…"


def _vkey(v: str):
    try:
        return config.version_tuple(v)
    except ValueError:
        return (999, 0, 0)
