"""`drills report`: each run's report and the matrix, then the headline per controller version and the rows that fail
or show a hazard (drills.cli owns the arguments; drills.commands calls ``run``).  Rows are judged against their
evidence (drills.evidence).  ``--merge`` exits with the merged run's verdict (drills.runner.verdict, every leg of
the plan expected): 3 when a leg is missing, did not finish or a row's evidence fails, each named on stdout
before anything else (``INCOMPLETE: ...``), 1 a fail, 0 all pass."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from . import config, console, runner
from .answer import headlines, prevailing
from .errors import EXIT_OK, BadInput
from .evidence import read_judged
from .outputs import reports_folder
from .report import write_matrix
from .viewmodel import is_run_dir


def _err(msg: str) -> None:
    print(f"drills: {msg}", file=sys.stderr, flush=True)


def run(args, log) -> int:
    given = list(args.run_dir or [])
    missing = [d for d in given if not Path(d).exists()]
    if missing:
        raise BadInput(f"no such run folder: {', '.join(map(str, missing))}")
    reports_folder()
    code, missing = EXIT_OK, []
    if args.merge:
        merged = runner.merge([Path(d) for d in given], log=log, report=False)     # the matrix writes its report
        # the merge's verdict, as if one machine had run every leg: what is missing first, then the folder
        code, missing, _ = runner.verdict(merged, whole=True)
        if not args.json:
            for line in missing:
                print(f"INCOMPLETE: {line}")
        print(merged)
        given = [str(merged)]
    for d in given:
        if not is_run_dir(Path(d)):
            _err(f"report: {d} is not a run folder (no ledger.json): ignored")
    dirs = [Path(d) for d in given if is_run_dir(Path(d))] if given else None
    html_path, md_path = write_matrix(dirs if dirs is not None and not args.merge else None,
                                      config.reports_dir(), strict=True)
    rows = _report_rows(dirs)
    flagged = [r for r in rows if r.get("verdict") == "fail" or _hazard_seen(r)]
    if args.json:
        print(json.dumps({"headlines": headlines(rows), "failing_or_hazard": [_row_json(r) for r in flagged],
                          "matrix": {"html": str(html_path), "md": str(md_path)},
                          **({"incomplete": missing, "exit": code} if args.merge else {})}, indent=2, default=str))
        return code
    print("\n".join(console.headline_lines(rows)) or "no rows")
    if flagged:
        print(f"\n{len(flagged)} row(s) failing or showing a hazard:")
        for r in flagged:
            d = console.declared(r)
            seen = (" — hazard seen" + (f" with {d['condition']}" if d["condition"] else "")) if _hazard_seen(r) else ""
            print(f"  {console.controller_label(r)}  {d['id']}: {r.get('verdict')}, observed "
                  f"{console.text(r.get('observed'))} (expected {console.text(r.get('expected'))}){seen}"
                  + (f"; evidence {r['evidence']}" if r.get("evidence") else ""))
    print(f"\nmatrix: {html_path}\n        {md_path}")
    return code


def _hazard_seen(r: dict) -> bool:
    d = console.declared(r)
    return d["polarity"] == console.HAZARD and d["shows"] is True


def _report_rows(dirs: list[Path] | None) -> list[dict]:
    """The row that prevails per (controller, id) of the run folders the matrix merged (default: every one)."""
    from .report import discover, readable, unique_runs
    runs = readable(unique_runs(discover(config.reports_dir()) if dirs is None else dirs), strict=False)
    rows = [r for d in runs for r in read_judged(d)]
    key = console.keyer(rows)
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(console.controller_label(r), []).append(r)
    # per controller, the row that prevails for each id: the newest run's, of one run's duplicates the worst verdict
    return [r for col in by.values() for _, r in sorted(prevailing(col, key).values(), key=lambda x: x[0])]


def _row_json(r: dict) -> dict:
    d = console.declared(r)
    return {"controller": console.controller_label(r), "id": d["id"], "lane": r.get("lane"), "step": r.get("step"),
            "assertion": r.get("assertion"), "polarity": d["polarity"], "shows": d["shows"],
            "condition": d["condition"], "expected": r.get("expected"), "observed": r.get("observed"),
            "verdict": r.get("verdict"), "reason": r.get("reason"), "evidence": r.get("evidence"),
            "run_id": r.get("run_id")}
