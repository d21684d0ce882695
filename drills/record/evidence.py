"""A pass needs its evidence: each row judged against the evidence it names, where a run, a merge, a report or an
upgrade-check reads rows.

A ``pass`` (or ``unverified``: an observation without an expectation) row whose evidence is

- missing (no such file or folder),
- outside the run folder it was recorded in (or the folders a classification was read from),
- empty, or truncated (a JSON document that does not parse; a JSON Lines file whose last line is cut short or
  does not parse; a flight-recorder timeline without its closing ``END`` record: the recording never completed,
  or whose ``seq`` numbers skip: records cut from its middle), or incomplete by its own word (a timeline whose
  ``END`` record says ``"complete": false``, its reasons named), or
- from another leg or run (a timeline whose ``END`` record names a leg or run id that is not the row's; a row
  whose ``run_id`` is not the run folder's, run.json ``run_id``: spliced in from another run; in a merged folder,
  a row whose ``shard_run_id`` is none of the shards')

is ``inconclusive``, its reason naming the evidence (``evidence missing: <path>``); so is such a row that names no
evidence at all (every lane names what each row was judged on: a recording, or the observation it read back,
``Runbook.observation``).  The recorded verdict stays on the row as ``recorded_verdict``.  A ``fail`` keeps its
verdict (a fail is never hidden).  Judging is idempotent: a judged row judges the same.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..core import inputs
from .ledger import INCONCLUSIVE, PASS, UNVERIFIED, read_rows

JUDGED = (PASS, UNVERIFIED)          # the verdicts that claim an observation stands on its evidence
TIMELINE_SUFFIX = ".timeline.jsonl"  # drills.record.timeline's (layer 3): the recorder closes every timeline with END
TAIL_BYTES = 1 << 20                 # how much of a JSON Lines file's end is read to find its last record
OWN_RECORDS = ("ledger.json", "run.json", "report.html", "report.md")   # the run's record, never its evidence


def roots_of(run_dir: Path) -> list[Path]:
    """Where a run folder's evidence may live: the folder, and the run folders a classification read its rows
    from (run.json ``classified_from``: `upgrade-check --runs` leaves the evidence where it was recorded)."""
    run_dir = Path(run_dir)
    out = [run_dir]
    try:
        meta = inputs.load_json_file(run_dir / "run.json", inputs.RECORD_BYTES, "run.json")
    except (OSError, inputs.BadInput):
        return out
    extra = meta.get("classified_from") if isinstance(meta, dict) else None
    return out + [Path(p) for p in extra if isinstance(p, str)] if isinstance(extra, list) else out


def run_ids_of(run_dir: Path) -> dict | None:
    """Which runs a run folder's rows may come from (None: not recorded, nothing to check): ``run_id`` the ids a
    row's ``run_id`` may be (the folder's run.json ``run_id``; a classification's, each folder it was read from),
    ``shard_run_id`` those its ``shard_run_id`` may be (a merge's run.json ``shard_run_ids``), or None."""
    def meta_of(d: Path):
        try:
            m = inputs.load_json_file(Path(d) / "run.json", inputs.RECORD_BYTES, "run.json")
        except (OSError, inputs.BadInput, RecursionError):
            return None
        return m if isinstance(m, dict) else None
    meta = meta_of(run_dir)
    if meta is None or not isinstance(meta.get("run_id"), str):
        return None
    ids = {meta["run_id"]}
    extra = meta.get("classified_from")
    for d in extra if isinstance(extra, list) else []:
        other = meta_of(Path(d)) if isinstance(d, str) else None
        if other is None or not isinstance(other.get("run_id"), str):
            return None                # a folder that does not say which run it is: its rows cannot be told apart
        ids.add(other["run_id"])
    shards = meta.get("shard_run_ids")
    ok = isinstance(shards, list) and shards and all(isinstance(x, str) for x in shards)
    return {"run_id": ids, "shard_run_id": set(shards) if ok else None}


def foreign(row: dict, run_ids: dict | None) -> str | None:
    """Why a row is not this run folder's own (another run's row spliced into its ledger), None when it is."""
    if not run_ids:
        return None
    mine, shard = row.get("run_id"), row.get("shard_run_id")
    if isinstance(mine, str) and mine not in run_ids["run_id"]:
        return (f"a row from another run: recorded by run {mine[:80]}, the run folder is run "
                f"{', '.join(sorted(run_ids['run_id']))} (its evidence is another run's)")
    if run_ids.get("shard_run_id") and isinstance(shard, str) and shard not in run_ids["shard_run_id"]:
        return (f"a row from another run: recorded by run {shard[:80]}, which is none of the merged shards "
                f"({', '.join(sorted(run_ids['shard_run_id']))})")
    return None


def _inside(path: Path, roots: list[Path]) -> bool:
    """Whether a resolved path lies in one of the (resolved) roots."""
    for root in roots:
        try:
            path.relative_to(root)
            return True
        except ValueError:
            continue
    return False


def _resolved_roots(roots: list[Path], cache: dict | None) -> tuple[list[Path], set[Path]]:
    """The roots resolved, and the run folders' own records (resolved): once per judging of a ledger."""
    key = ("\0roots", *map(str, roots))
    if cache is not None and key in cache:
        return cache[key]
    real = []
    for r in roots:
        try:
            real.append(r.resolve())
        except (OSError, RuntimeError):
            continue
    own = set(real)
    for r in roots:
        for m in OWN_RECORDS:
            try:
                own.add((r / m).resolve())
            except (OSError, RuntimeError):
                continue
    if cache is not None:
        cache[key] = (real, own)
    return real, own


def _last_line(path: Path) -> tuple[bytes, bool]:
    """The last non-empty line of a file and whether the file ends with a newline."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - TAIL_BYTES))
        tail = fh.read()
    lines = [x for x in tail.split(b"\n") if x.strip()]
    return (lines[-1] if lines else b""), tail.endswith(b"\n")


def _seq_gap(path: Path) -> str | None:
    """Where a timeline's ``seq`` numbers skip (records cut from it), None when they run on one by one.  The
    recorder numbers every record it writes, END included; records without a ``seq`` (a timeline written by
    another tool) are not counted."""
    prev = None
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if b'"seq"' not in line:
                continue
            try:
                seq = json.loads(line).get("seq")
            except (ValueError, AttributeError):
                return f"line {n} is not a whole record"
            if isinstance(seq, bool) or not isinstance(seq, int):
                continue
            if prev is not None and seq != prev + 1:
                return f"its seq numbers skip from {prev} to {seq} at line {n}: records are missing"
            prev = seq
    return None


def problem(row: dict, run_dir: Path, roots: list[Path] | None = None, cache: dict | None = None) -> str | None:
    """Why a row's evidence cannot carry its verdict (None: it can)."""
    ev = row.get("evidence")
    if not ev:                     # nothing to look at: the verdict stands on nothing
        return "no evidence named: the row says what it observed, not where"
    if not isinstance(ev, str):
        return f"evidence is not a path: {str(ev)[:80]}"
    try:
        p = Path(ev) if Path(ev).is_absolute() else Path(run_dir) / ev
    except (ValueError, TypeError):
        return f"evidence is not a path: {ev[:80]!r}"
    key = (str(p), str(row.get("leg") or ""), str(row.get("shard_run_id") or row.get("run_id") or ""))
    if cache is not None and key in cache:
        return cache[key]
    try:
        out = _problem(p, row, *_resolved_roots([Path(x) for x in (roots or [run_dir])], cache))
    except (OSError, ValueError, RecursionError) as e:     # a name the filesystem refuses, a record nested too deep
        out = f"evidence unreadable: {str(p)[:200]} ({type(e).__name__})"
    if cache is not None:
        cache[key] = out
    return out


def _problem(p: Path, row: dict, roots: list[Path], own: set[Path]) -> str | None:
    """``roots`` resolved; ``own``: the run folders' own records and the folders themselves, resolved."""
    try:
        real = p.resolve()
    except (OSError, RuntimeError):
        return f"evidence missing: {p}"
    if not real.exists():
        return f"evidence missing: {p}"
    if not _inside(real, roots):
        return f"evidence outside the run folder: {p}"
    if real in own:
        return f"evidence is the run folder's own record, not an observation: {p}"
    try:
        if real.is_dir():
            return None if any(real.iterdir()) else f"evidence empty: {p}"
        if real.stat().st_size == 0:
            return f"evidence empty: {p}"
        if real.name.endswith(".json"):
            if real.stat().st_size > inputs.RECORD_BYTES:
                return f"evidence too large to check: {p} (over {inputs.RECORD_BYTES >> 20} MiB)"
            try:
                json.loads(real.read_bytes())
            except ValueError:
                return f"evidence truncated: {p} (not a whole JSON document)"
            except RecursionError:
                return f"evidence unreadable: {p} (nested too deep)"
            return None
        if not real.name.endswith(".jsonl"):
            return None
        last, newline = _last_line(real)
        skipped = _seq_gap(real) if real.name.endswith(TIMELINE_SUFFIX) else None
    except OSError as e:
        return f"evidence unreadable: {p} ({e.strerror or e})"
    try:
        rec = json.loads(last)
    except ValueError:
        return f"evidence truncated: {p} (its last line is not a whole record)"
    if not newline:
        return f"evidence truncated: {p} (its last line is not a whole record)"
    if not real.name.endswith(TIMELINE_SUFFIX):
        return None
    if not isinstance(rec, dict) or rec.get("type") != "END":
        return f"evidence truncated: {p} (the recording has no END record: it never completed)"
    if skipped:
        return f"evidence truncated: {p} ({skipped})"
    obj = rec.get("obj") if isinstance(rec.get("obj"), dict) else {}
    if obj.get("complete") is False:
        reasons = obj.get("reasons") if isinstance(obj.get("reasons"), list) else []
        said = "; ".join(str(x)[:200] for x in reasons[:3]) + (f" and {len(reasons) - 3} more" if len(reasons) > 3
                                                               else "")
        return f"evidence incomplete: {p} (the recording says it is incomplete: {said or 'no reason given'})"
    leg, run_id = obj.get("leg"), obj.get("run_id")
    if leg and row.get("leg") and leg != row.get("leg"):
        return f"evidence from another leg: {p} (recorded by leg {leg}, the row's leg is {row.get('leg')})"
    mine = row.get("shard_run_id") or row.get("run_id")
    if run_id and mine and run_id != mine:
        return f"evidence from another run: {p} (recorded by run {run_id}, the row's run is {mine})"
    return None


def judge(row: dict, run_dir: Path, roots: list[Path] | None = None, cache: dict | None = None,
          run_ids: dict | None = None) -> dict:
    """The row as its evidence allows: a pass (or unverified) row whose evidence fails, or that another run
    recorded (``run_ids``: run_ids_of the folder), is inconclusive."""
    if row.get("verdict") not in JUDGED:
        return row
    why = foreign(row, run_ids) or problem(row, run_dir, roots, cache)
    if why is None:
        return row
    return dict(row, verdict=INCONCLUSIVE, reason=why, recorded_verdict=row.get("verdict"), shows=None)


def judge_rows(rows: list[dict], run_dir: Path, roots: list[Path] | None = None) -> list[dict]:
    roots = roots or roots_of(run_dir)
    run_ids = run_ids_of(run_dir)
    cache: dict = {}
    return [judge(r, run_dir, roots, cache, run_ids) for r in rows]


def read_judged(run_dir: Path) -> list[dict]:
    """A run folder's rows, each judged against its evidence."""
    return judge_rows(read_rows(Path(run_dir) / "ledger.json"), Path(run_dir))


def leg_stamp() -> dict:
    """What a leg's recordings say of where they were made (the runner sets DRILLS_LEG and DRILLS_RUN_ID for
    each leg's pytest): the fields a timeline's END record carries."""
    return {k: v for k, v in (("leg", os.environ.get("DRILLS_LEG")), ("run_id", os.environ.get("DRILLS_RUN_ID")))
            if v}
