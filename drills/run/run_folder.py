"""A run folder as a whole: its verdict (the rows judged against their evidence, with every gap of its legs), the
``latest`` link beside it, and shard run folders merged into one."""
from __future__ import annotations

import filecmp
import json
import os
import posixpath
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core import config
from ..record import evidence
from . import legs as legsmod
from ..core.errors import BadInput, combine_exit_codes
from ..record.ledger import exit_code, new_run_id, read_rows
from ..reporting.report import write_run_report


def link_latest(run_dir: Path) -> None:
    latest = run_dir.parent / "latest"
    tmp = run_dir.parent / ".latest.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(run_dir.name)
    os.replace(tmp, latest)


def verdict(run_dir: Path, whole: bool = False) -> tuple[int, list[str], list[dict]]:
    """A run folder's verdict: (exit code, what is missing, its rows judged against their evidence).  The rows'
    exit (drills.record.ledger) combined with every gap of its legs (drills.run.legs.coverage: a leg that could not start,
    was killed or did not finish, or recorded no row, is inconclusive; ``whole``: every leg of the plan is
    expected, as in a merge); what is missing is named leg by leg, then each row whose evidence fails."""
    run_dir = Path(run_dir)
    rows = evidence.read_judged(run_dir)
    meta = legsmod.read_run_meta(run_dir)
    gaps = legsmod.coverage(meta, rows, whole=whole)
    stopped = interruption(meta)
    lines = ([stopped] if stopped else []) + [g.text for g in gaps]
    judged = [r for r in rows if r.get("recorded_verdict")]
    lines += [f"{r.get('controller_name') or r.get('controller_version')} {r.get('id') or r.get('assertion')}: "
              f"{r.get('recorded_verdict')} -> inconclusive, {r.get('reason')}" for r in judged[:MISSING_SHOWN]]
    if len(judged) > MISSING_SHOWN:
        lines.append(f"... and {len(judged) - MISSING_SHOWN} more row(s) whose evidence fails (report.md)")
    return combine_exit_codes(exit_code(rows), *(g.code for g in gaps), *([3] if stopped else [])), lines, rows


def interruption(meta: dict) -> str | None:
    """What a run.json says of a signal that stopped the run (a merge: which shard), None when it ran to its end:
    its rows are a part, never a pass (inconclusive)."""
    if not meta.get("interrupted"):
        return None
    shards = meta.get("interrupted_shards") if isinstance(meta.get("interrupted_shards"), list) else []
    which = [f"shard {shown(x.get('folder'))}" + (f" (run {shown(x['run_id'])})" if x.get("run_id") else "")
             for x in shards if isinstance(x, dict)]
    return f"the run was interrupted ({shown(str(meta.get('signal') or 'a signal')[:80])}" + \
        (f"; {', '.join(which)}" if which else "") + ")"


MISSING_SHOWN = 20            # rows whose evidence fails, named one by one before "... and N more"


# --- shards merged into one run folder -------------------------------------------------------------------------
def merge(run_dirs: list[Path], dest: Path | None = None, log: Callable[[str], None] | None = None,
          report: bool = True) -> Path:
    """Merge shard run folders into one run folder, as if one machine had run every leg: the rows (run id
    rewritten to the merged run's, the shard's kept as ``shard_run_id``), the evidence folders, the JUnit files,
    the leg records.  Refused (bad input) when a folder is not a shard run folder, when the shards were cut from
    different plans, when a leg is in two shards, or when a shard carries rows of a leg it did not run (its
    run.json ``legs``); a leg of the plan no shard ran is said, and makes the merge's verdict
    (``verdict(dest, whole=True)``) inconclusive.  What each shard's folder holds besides its record is merged
    file by file (``plan_files``: one name in two shards, links, anything else); every refusal comes before the
    first byte is written, and a merge that fails while it writes removes the folder it made.  ``report``: write
    the merged folder's report (a caller that writes the matrix next, which writes every run's report, says
    False)."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if not run_dirs:
        raise BadInput("--merge: no run folder given: name the shards' run folders to merge")
    distinct(run_dirs, "--merge")
    metas = []
    for d in run_dirs:
        meta = legsmod.read_run_meta(Path(d))
        if not isinstance(meta.get("plan_digest"), str) or not meta["plan_digest"] \
                or not (Path(d) / "ledger.json").is_file():
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
            if owner is not None and not isinstance(owner, str):
                raise BadInput(f"{d}: a row of its ledger.json names a leg that is not a leg id ({shown(owner)[:80]}): "
                               f"refused")
            if owner not in {x["id"] for x in ran}:
                what = owner or f"of lane {r.get('lane')} on {r.get('controller_name') or r.get('controller_version')}"
                raise BadInput(f"{d}: it carries rows of leg {what}, which this shard did not run (its run.json "
                               f"legs: {', '.join(x['id'] for x in ran) or 'none'}): refused")
    planned = set(metas[0][1].get("all_legs") or seen)
    files = plan_files(metas, shard_rows, log)     # every refusal comes before the first byte is written
    if planned - set(seen):
        log(f"merge: leg(s) no shard ran: {', '.join(sorted(planned - set(seen)))}")
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        _write_files(files, dest)
        rows = []
        for d, _ in metas:
            rows += [dict(r, run_id=dest.name, shard_run_id=r.get("shard_run_id") or r.get("run_id"))
                     for r in shard_rows[d]]
        (dest / "ledger.json").write_text(json.dumps(rows, indent=2, default=str))
        stopped = [(d, m) for d, m in metas if m.get("interrupted")]
        shard_ids = [m.get("run_id") for _, m in metas]
        (dest / "run.json").write_text(json.dumps({
            "run_id": dest.name, "merged_from": [str(d) for d, _ in metas], "plan_digest": digests.pop(),
            "legs": [leg for _, m in metas for leg in m.get("legs") or []],
            "all_legs": sorted(planned),
            # the shards' own run ids (a row's shard_run_id is one of them: drills.record.evidence), when each says one
            **({"shard_run_ids": shard_ids} if all(isinstance(x, str) and x for x in shard_ids) else {}),
            # a shard stopped by a signal: the merged run was interrupted too (its verdict: inconclusive)
            **({"interrupted": True, "signal": ", ".join(sorted({str(m.get("signal") or "a signal")[:80]
                                                                 for _, m in stopped})),
                "interrupted_shards": [{"folder": str(d), "run_id": m.get("run_id"),
                                        "signal": m.get("signal")} for d, m in stopped]} if stopped else {})},
            indent=1))
        if report:
            write_run_report(dest)
    except BaseException:
        if created:                 # a merge that did not finish leaves no half-made folder
            shutil.rmtree(dest, ignore_errors=True)
        raise
    link_latest(dest)
    return dest


def distinct(run_dirs: list[Path], flag: str) -> None:
    """Refused (bad input): one folder given twice, or a folder inside another one given (its rows and files would
    be read twice)."""
    real: list[tuple[Path, Path]] = []
    for d in run_dirs:
        try:
            r = Path(d).resolve()
        except (OSError, RuntimeError):
            continue                     # a folder that cannot be resolved is refused by its own check
        for other, o in real:
            if r == o:
                raise BadInput(f"{flag}: {shown(d)} is given twice (as {shown(other)} too): give each run folder "
                               f"once")
            if r.is_relative_to(o) or o.is_relative_to(r):
                inner, outer = (d, other) if r.is_relative_to(o) else (other, d)
                raise BadInput(f"{flag}: {shown(inner)} is inside {shown(outer)}, also given: give run folders "
                               f"that do not hold one another")
        real.append((Path(d), r))


# --- the files of the shards, planned before the first byte is written -----------------------------------------
OWN_FILES = ("ledger.json", "ledger.json.lock", "run.json", "report.html", "report.md")   # written anew
# what a run keeps of its own machine (the logs of a cluster kept from a failed leg, the legs' pytest logs, plots
# drawn again from evidence): two shards may hold one name with different content, and both are kept
PER_SHARD_FOLDERS = ("clusters", "legs", "plots")
PER_SHARD_SUFFIXES = (".log", ".png")
MAX_SHARD_ENTRIES = 200_000     # files, folders and links of one shard folder
MAX_SHARD_DEPTH = 32            # folders nested in a shard folder


@dataclass(frozen=True)
class ShardEntry:
    """One entry of a shard folder: ``rel`` its path inside the folder (``/``-separated); ``kind`` file, dir or
    link; ``link`` for a link, where it points, relative to the link's folder (always inside the shard)."""
    shard: Path
    rel: str
    kind: str
    link: str | None = None

    @property
    def path(self) -> Path:
        return self.shard / self.rel


def shown(x) -> str:
    """A path as one line of a message (a name with a newline or a control character quoted)."""
    text = str(x)
    return text if text.isprintable() else repr(text)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def shard_entries(shard: Path) -> list[ShardEntry]:
    """Every entry of a shard folder but its own record (OWN_FILES), links never followed, under a budget of
    entries and depth.  Refused (bad input, named): a link that points outside the shard folder (its target would
    become part of the merged run's evidence), anything that is not a file, a folder or a link (a FIFO, a socket,
    a device), a folder that cannot be read."""
    shard = Path(shard)
    root = os.path.realpath(shard)
    out: list[ShardEntry] = []
    stack = [("", 0)]
    while stack:
        rel, depth = stack.pop()
        here = shard / rel if rel else shard
        try:
            with os.scandir(here) as it:
                items = sorted(it, key=lambda e: e.name)
        except OSError as e:
            raise BadInput(f"{shown(here)}: cannot read it ({e.strerror or type(e).__name__}): refused") from None
        for e in items:
            if not rel and e.name in OWN_FILES:
                continue
            r = f"{rel}/{e.name}" if rel else e.name
            if len(out) >= MAX_SHARD_ENTRIES:
                raise BadInput(f"{shown(shard)}: more than {MAX_SHARD_ENTRIES} files, folders and links: not a shard "
                               f"run folder drills run writes; refused")
            try:
                if e.is_symlink():
                    text = os.readlink(e.path)
                    target = os.path.realpath(e.path)
                    if not _within(target, root):
                        raise BadInput(f"{shown(shard)}: {shown(r)} is a link to {shown(text)}, outside the shard "
                                       f"folder: refused (a merge never takes in what lies outside the shards; "
                                       f"copy it into the shard or remove the link)")
                    out.append(ShardEntry(shard, r, "link", os.path.relpath(
                        target, os.path.dirname(os.path.join(root, r)))))
                elif e.is_dir(follow_symlinks=False):
                    if depth + 1 > MAX_SHARD_DEPTH:
                        raise BadInput(f"{shown(shard)}: {shown(r)}: folders nested deeper than {MAX_SHARD_DEPTH}: "
                                       f"refused")
                    out.append(ShardEntry(shard, r, "dir"))
                    stack.append((r, depth + 1))
                elif e.is_file(follow_symlinks=False):
                    out.append(ShardEntry(shard, r, "file"))
                else:
                    raise BadInput(f"{shown(shard)}: {shown(r)} is not a file, a folder or a link (a FIFO, a socket "
                                   f"or a device): refused")
            except OSError as err:
                raise BadInput(f"{shown(shard)}: {shown(r)}: cannot read it ({err.strerror or type(err).__name__}): "
                               f"refused") from None
    return out


def _evidence_names(shard: Path, rows: list[dict]) -> set[str]:
    """The paths a shard's rows name as their evidence, relative to the shard folder."""
    out = set()
    root = os.path.realpath(shard)
    for r in rows:
        ev = r.get("evidence")
        if not isinstance(ev, str) or not ev or "\0" in ev:
            continue
        if os.path.isabs(ev):
            for base in (str(shard), root):
                if _within(os.path.normpath(ev), os.path.normpath(base)):
                    ev = os.path.relpath(os.path.normpath(ev), os.path.normpath(base))
                    break
            else:
                continue
        ev = posixpath.normpath(ev.replace(os.sep, "/"))
        if ev != ".." and not ev.startswith("../"):
            out.add(ev)
    return out


def _same(a: ShardEntry, b: ShardEntry) -> bool:
    if a.kind != b.kind:
        return False
    if a.kind == "link":
        return a.link == b.link
    try:
        return a.path.stat().st_size == b.path.stat().st_size and filecmp.cmp(a.path, b.path, shallow=False)
    except OSError:
        return False


def _per_shard(rel: str) -> bool:
    return rel.split("/", 1)[0] in PER_SHARD_FOLDERS or rel.endswith(PER_SHARD_SUFFIXES)


def _shard_labels(metas: list[tuple[Path, dict]]) -> dict[Path, str]:
    """A name per shard for the files kept apart: its run id (or folder name), else shard<i>."""
    from ..core.names import is_plain_name
    labels: dict[Path, str] = {}
    for i, (d, m) in enumerate(metas, 1):
        name = next((x for x in (m.get("run_id"), d.name) if isinstance(x, str) and is_plain_name(x)), "")
        labels[d] = name if name and name not in labels.values() else f"shard{i}"
    return labels


def _apart(rel: str, label: str, taken: set[str]) -> str:
    """``clusters/c/controller.log`` of shard ``s1`` as ``clusters/c/controller.s1.log`` (a free name)."""
    head, _, name = rel.rpartition("/")
    stem, dot, suffix = name.rpartition(".") if "." in name.lstrip(".") else (name, "", "")
    for n in range(1, 1000):
        tag = label if n == 1 else f"{label}-{n}"
        new = f"{stem}.{tag}{dot}{suffix}" if dot else f"{name}.{tag}"
        new = f"{head}/{new}" if head else new
        if new not in taken:
            return new
    raise BadInput(f"{shown(rel)}: no free name to keep each shard's copy apart: refused")


def plan_files(metas: list[tuple[Path, dict]], shard_rows: dict[Path, list[dict]],
               log: Callable[[str], None]) -> list[tuple[str, ShardEntry]]:
    """What the merged folder gets of the shards' folders: (path in it, the entry it comes from), parents first.

    One name in several shards: identical content (or links to the same place) is kept once; different content is
    kept apart under a name per shard (``controller.<shard>.log``, said) when it is what a run keeps of its own
    machine (PER_SHARD_FOLDERS, PER_SHARD_SUFFIXES) and no row names it as evidence; any other difference (a row's
    evidence, a record, a file in one and a folder in another) is refused, naming both folders.  A link inside its
    shard is kept as a link (said); one that points outside is refused (``shard_entries``)."""
    by_rel: dict[str, list[ShardEntry]] = {}
    for d, _ in metas:
        for e in shard_entries(d):
            by_rel.setdefault(e.rel, []).append(e)
    evidence = set().union(*(_evidence_names(d, shard_rows.get(d, [])) for d, _ in metas))
    labels = _shard_labels(metas)
    taken, out, once, said = set(by_rel), [], 0, []
    for rel in sorted(by_rel):
        entries = by_rel[rel]
        kinds = {e.kind for e in entries}
        if "dir" in kinds:
            if kinds != {"dir"}:
                d_, o_ = next(e for e in entries if e.kind == "dir"), next(e for e in entries if e.kind != "dir")
                raise BadInput(f"{shown(rel)} is a folder in {shown(d_.shard)} and a {o_.kind} in "
                               f"{shown(o_.shard)}: the merge cannot tell which is the run's: refused")
            out.append((rel, entries[0]))
            continue
        differ = [e for e in entries[1:] if not _same(entries[0], e)]
        if not differ:
            out.append((rel, entries[0]))
            once += len(entries) > 1
            continue
        named = any(rel == ev or rel.startswith(ev + "/") for ev in evidence)
        if not _per_shard(rel) or named:
            raise BadInput(f"{shown(rel)} differs between {shown(entries[0].shard)} and {shown(differ[0].shard)}"
                           f"{' (a row names it as evidence)' if named else ''}: two shards' records of one name are "
                           f"never merged over each other; refused, nothing written")
        apart = []
        for e in entries:
            new = _apart(rel, labels[e.shard], taken)
            taken.add(new)
            apart.append(new)
            out.append((new, e))
        said.append(f"merge: {shown(rel)} differs between shards ({', '.join(shown(e.shard) for e in entries)}): "
                    f"each kept apart, as {', '.join(map(shown, apart))}")
    for line in said:          # said once nothing is refused
        log(line)
    for rel, e in out:
        if e.kind == "link":
            log(f"merge: {shown(e.shard)}: {shown(e.rel)} is a link inside the shard (to {shown(e.link)}): kept as "
                f"a link, as {shown(rel)}")
    if once:
        log(f"merge: {once} file(s) the same in several shards: kept once")
    return sorted(out, key=lambda x: x[0].count("/"))


def _write_files(files: list[tuple[str, ShardEntry]], dest: Path) -> None:
    for rel, e in files:
        target = dest / rel
        if e.kind == "dir":
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if e.kind == "link":
            if target.is_symlink() or target.exists():
                target.unlink()
            os.symlink(e.link, target)
        elif e.path.is_symlink() or not e.path.is_file():      # changed since it was planned: never followed
            raise BadInput(f"{shown(e.path)}: changed while the merge ran (now a link or gone): refused")
        else:
            shutil.copy2(e.path, target, follow_symlinks=False)
