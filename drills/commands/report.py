"""`drills report`: each run's report and the matrix, then the headline per controller version and the rows that fail
or show a hazard (drills.cli owns the arguments; drills.commands.main calls ``run``).  Rows are judged against their
evidence (drills.record.evidence).

It exits with the gate of what it reports, as the run that wrote it did (``gate``): a run folder's verdict
(drills.run.runner.verdict: its rows against their evidence and the gaps of its legs; a run stopped by a signal is
inconclusive), an upgrade check's folder its recorded classification exit (upgrade.json), several folders the worst
of theirs (2 > 1 > 3 > 0); ``--merge`` the merged run's verdict with every leg of the plan expected; without a run
folder, the rows the matrix shows (the newest per controller and assertion).  0 all pass, 1 a fail, 3 a leg
missing, unfinished or a row whose evidence fails (each named first on stdout, ``INCOMPLETE: ...``), 2 bad input
(a folder that does not exist, whose ledger or run.json does not read, or no run folder among those given)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..core import config, inputs
from ..reporting import console
from ..run import legs, runner
from ..record.answer import headlines, prevailing
from ..core.errors import EXIT_INCONCLUSIVE, EXIT_OK, BadInput, combine_exit_codes
from ..record.evidence import read_judged
from ..record.ledger import exit_code
from ..core.outputs import reports_folder
from ..reporting.report import write_matrix
from ..reporting.upgrade_report import UPGRADE_FILE
from ..reporting.viewmodel import is_run_dir


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
    rowless = [] if args.merge else _rowless(given)      # bad input (2) raised before anything is written
    dirs = [Path(d) for d in given if is_run_dir(Path(d))] if given else None
    if dirs is not None and not args.merge:
        code, missing = gate(dirs) if dirs else (EXIT_OK, [])   # checked before anything is written
        # a run that wrote run.json but no ledger.json recorded no row: inconclusive, never a pass
        code = combine_exit_codes(code, *([EXIT_INCONCLUSIVE] if rowless else []))
        missing = [f"{d}: the run wrote run.json but no ledger.json: no row recorded" for d in rowless] + missing
        if not args.json:
            for line in missing:
                print(f"INCOMPLETE: {line}")
        if not dirs:                        # no rows to report: the gate alone
            if args.json:
                print(json.dumps({"headlines": [], "failing_or_hazard": [], "matrix": None, "incomplete": missing,
                                  "exit": code}, indent=2))
            else:
                print("no rows")
            return code
    html_path, md_path = write_matrix(dirs if dirs is not None and not args.merge else None,
                                      config.reports_dir(), strict=True)
    rows = _report_rows(dirs)
    if dirs is None:                        # every run folder: the gate of the rows the matrix shows
        code = exit_code(rows)
    flagged = [r for r in rows if r.get("verdict") == "fail" or _hazard_seen(r)]
    if args.json:
        print(json.dumps({"headlines": headlines(rows), "failing_or_hazard": [_row_json(r) for r in flagged],
                          "matrix": {"html": str(html_path), "md": str(md_path)},
                          "incomplete": missing, "exit": code}, indent=2, default=str))
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


def _rowless(given: list[str]) -> list[Path]:
    """The folders given that are runs without rows (run.json, no ledger.json).  Bad input (one line, before
    anything is written): a folder that is no run folder (neither record), a run.json or ledger.json that is not a
    file, a run.json that does not read."""
    out = []
    for d in map(Path, given):
        if not d.is_dir():
            raise BadInput(f"{d}: not a folder, so not a run folder")
        for name in ("run.json", "ledger.json"):
            if (d / name).exists() and not (d / name).is_file():
                raise BadInput(f"{d / name}: not a file: not a run folder drills wrote")
        if not (d / "ledger.json").exists():
            if not (d / "run.json").exists():
                raise BadInput(f"{d}: not a run folder (no run.json and no ledger.json): no run folder to report")
            legs.read_run_meta(d)           # a run.json that does not read is bad input
            out.append(d)
    return out


def gate(dirs: list[Path]) -> tuple[int, list[str]]:
    """The exit of the runs that wrote these folders, and what they lack (named leg by leg): a run folder's verdict
    (its rows against their evidence, the gaps of its legs; stopped by a signal: inconclusive), an upgrade check's
    its classification's recorded exit; the worst of them (2 > 1 > 3 > 0)."""
    codes, missing = [], []
    for d in dirs:
        upgrade = _upgrade_exit(d)
        if upgrade is not None:
            codes.append(upgrade[0])
            missing += [f"{d}: {line}" if len(dirs) > 1 else line for line in upgrade[1]]
            continue
        if not (d / "run.json").is_file():       # a folder of the pytest plugin: which legs ran is not recorded
            codes.append(exit_code(read_judged(d)))
            continue
        code, lacking, _ = runner.verdict(d)     # a run stopped by a signal: inconclusive, said first
        codes.append(code)
        missing += [f"{d}: {line}" if len(dirs) > 1 else line for line in lacking]
    return combine_exit_codes(*codes), missing


def _upgrade_exit(d: Path) -> tuple[int, list[str]] | None:
    """An upgrade check's folder: the exit its classification recorded and what it named missing (None: not one)."""
    if not (d / UPGRADE_FILE).is_file():
        return None
    try:
        doc = inputs.load_json_file(d / UPGRADE_FILE, inputs.RECORD_BYTES, UPGRADE_FILE)
    except OSError as e:
        raise BadInput(f"{d / UPGRADE_FILE}: cannot read it ({e})") from None
    if not isinstance(doc, dict) or doc.get("exit") not in (0, 1, 2, 3) or isinstance(doc.get("exit"), bool):
        raise BadInput(f"{d / UPGRADE_FILE}: not an upgrade check's record (no exit 0..3)")
    lines = doc.get("missing") if isinstance(doc.get("missing"), list) else []
    return doc["exit"], [str(x) for x in lines]


def _hazard_seen(r: dict) -> bool:
    d = console.declared(r)
    return d["polarity"] == console.HAZARD and d["shows"] is True


def _report_rows(dirs: list[Path] | None) -> list[dict]:
    """The row that prevails per (controller, id) of the run folders the matrix merged (default: every one)."""
    from ..reporting.report import discover, readable, unique_runs
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
