"""A run folder as a whole: its verdict (the rows judged against their evidence, with every gap of its legs), the
``latest`` link beside it, and shard run folders merged into one."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

from . import config, evidence
from . import legs as legsmod
from .errors import BadInput, combine_exit_codes
from .ledger import exit_code, new_run_id, read_rows
from .report import write_run_report


def link_latest(run_dir: Path) -> None:
    latest = run_dir.parent / "latest"
    tmp = run_dir.parent / ".latest.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(run_dir.name)
    os.replace(tmp, latest)


def verdict(run_dir: Path, whole: bool = False) -> tuple[int, list[str], list[dict]]:
    """A run folder's verdict: (exit code, what is missing, its rows judged against their evidence).  The rows'
    exit (drills.ledger) combined with every gap of its legs (drills.legs.coverage: a leg that could not start,
    was killed or did not finish, or recorded no row, is inconclusive; ``whole``: every leg of the plan is
    expected, as in a merge); what is missing is named leg by leg, then each row whose evidence fails."""
    run_dir = Path(run_dir)
    rows = evidence.read_judged(run_dir)
    gaps = legsmod.coverage(legsmod.read_run_meta(run_dir), rows, whole=whole)
    lines = [g.text for g in gaps]
    judged = [r for r in rows if r.get("recorded_verdict")]
    lines += [f"{r.get('controller_name') or r.get('controller_version')} {r.get('id') or r.get('assertion')}: "
              f"{r.get('recorded_verdict')} -> inconclusive, {r.get('reason')}" for r in judged[:MISSING_SHOWN]]
    if len(judged) > MISSING_SHOWN:
        lines.append(f"... and {len(judged) - MISSING_SHOWN} more row(s) whose evidence fails (report.md)")
    return combine_exit_codes(exit_code(rows), *(g.code for g in gaps)), lines, rows


MISSING_SHOWN = 20            # rows whose evidence fails, named one by one before "... and N more"


# --- shards merged into one run folder -------------------------------------------------------------------------
def merge(run_dirs: list[Path], dest: Path | None = None, log: Callable[[str], None] | None = None,
          report: bool = True) -> Path:
    """Merge shard run folders into one run folder, as if one machine had run every leg: the rows (run id
    rewritten to the merged run's, the shard's kept as ``shard_run_id``), the evidence folders, the JUnit files,
    the leg records.  Refused (bad input) when a folder is not a shard run folder, when the shards were cut from
    different plans, when a leg is in two shards, or when a shard carries rows of a leg it did not run (its
    run.json ``legs``); a leg of the plan no shard ran is said, and makes the merge's verdict
    (``verdict(dest, whole=True)``) inconclusive.  ``report``: write the merged folder's report (a caller that
    writes the matrix next, which writes every run's report, says False)."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    metas = []
    for d in run_dirs:
        meta = legsmod.read_run_meta(Path(d))
        if not meta.get("plan_digest") or not (Path(d) / "ledger.json").is_file():
            raise BadInput(f"{d}: not a shard run folder of drills run (its run.json names no plan, or it has no "
                           f"ledger.json): refused")
        metas.append((Path(d), meta))
    dest = Path(dest or config.reports_dir() / new_run_id())
    for d, _ in metas:       # the merged folder is never written into a folder it reads
        if dest.absolute().resolve().is_relative_to(d.resolve()):
            raise BadInput(f"{d}: the merged run folder ({dest}) would be inside it; set DRILLS_REPORTS elsewhere")
    plans = {json.dumps(sorted(m.get("all_legs") or [])) for _, m in metas}
    if len(plans) != 1:
        raise BadInput("the run folders' run.json list different legs of the plan (all_legs): they are not shards "
                       "of one plan")
    digests = {m.get("plan_digest") for _, m in metas}
    if len(digests) != 1:
        raise BadInput(f"the run folders come from different plans ({', '.join(sorted(map(str, digests)))}): plan "
                       f"every shard with the same legs and durations (drills run --plan --json, --durations)")
    seen: dict[str, Path] = {}
    for d, m in metas:
        for leg in m.get("legs") or []:
            if leg["id"] in seen:
                raise BadInput(f"leg {leg['id']} is in two run folders ({seen[leg['id']]} and {d})")
            seen[leg["id"]] = d
    shard_rows = {d: read_rows(d / "ledger.json") for d, _ in metas}
    for d, m in metas:            # a shard's rows are its own legs' rows: another leg's would override its shard's
        ran = m.get("legs") or []
        for r in shard_rows[d]:
            owner = r.get("leg") or next((x["id"] for x in ran if legsmod.rows_of([r], x)), None)
            if owner not in {x["id"] for x in ran}:
                what = owner or f"of lane {r.get('lane')} on {r.get('controller_name') or r.get('controller_version')}"
                raise BadInput(f"{d}: it carries rows of leg {what}, which this shard did not run (its run.json "
                               f"legs: {', '.join(x['id'] for x in ran) or 'none'}): refused")
    planned = set(metas[0][1].get("all_legs") or seen)
    if planned - set(seen):
        log(f"merge: leg(s) no shard ran: {', '.join(sorted(planned - set(seen)))}")
    dest.mkdir(parents=True, exist_ok=True)
    rows = []
    for d, _ in metas:
        for item in d.iterdir():
            if item.name in ("ledger.json", "ledger.json.lock", "run.json", "report.html", "report.md"):
                continue
            target = dest / item.name
            # links stay links (a link to anything outside a shard is never copied in: its evidence stays outside
            # the merged folder, and drills.evidence judges it so)
            if item.is_dir() and not item.is_symlink():
                shutil.copytree(item, target, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(item, target, follow_symlinks=False)
        rows += [dict(r, run_id=dest.name, shard_run_id=r.get("shard_run_id") or r.get("run_id"))
                 for r in shard_rows[d]]
    (dest / "ledger.json").write_text(json.dumps(rows, indent=2, default=str))
    (dest / "run.json").write_text(json.dumps({
        "run_id": dest.name, "merged_from": [str(d) for d, _ in metas], "plan_digest": digests.pop(),
        "legs": [leg for _, m in metas for leg in m.get("legs") or []],
        "all_legs": sorted(planned)}, indent=1))
    if report:
        write_run_report(dest)
    link_latest(dest)
    return dest
