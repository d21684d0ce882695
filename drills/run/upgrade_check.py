"""`drills upgrade-check`: the same legs on a baseline controller and a candidate, then every row classified.

The candidate is a release (``--to V``) or a controller the user built (``--to-binary PATH``, labelled by what
it reports and its sha256, its CRDs from ``--crds`` or ``--source``).  Both sides run as legs of one run (in
parallel when the machine holds it: one embedded cluster per side), into one run folder, ledger and report;
``--runs RUN_DIR...`` classifies rows already recorded instead of running anything.  The classification
(drills.reporting.upgrade) goes into ``upgrade.json`` beside the ledger, which the run's report turns into its first
section: the table of changes, then both timelines of each changed drill in one picture.

Exit: 2 bad input (or a leg refused its target), 1 something regressed or the candidate shows a hazard the
baseline lacks (whatever its class), 3 a pair or a leg inconclusive, 0.  Coverage is part of the verdict: a leg
that could not start, was killed, did not finish (pytest exit other than 0, or 1 without a failing row) or recorded
no row, a side without rows, and a row of the baseline the candidate lacks make it inconclusive unless something
gates harder; every row is judged against its evidence first (drills.record.evidence).  ``upgrade.json`` opens with the
answer per side (drills.record.answer's headline), the new hazards and what is missing; the console prints what is
missing first, then the new hazards.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core import config, provenance
from .. import lanes
from . import legs, runner
from ..reporting import upgrade
from ..record.answer import HOLDS, NO, declared, headline
from ..drill.branches import SourceMapError, find_branches, source_file
from ..drill.controller_binary import ControllerBinaryError, inspect_binary
from ..core.errors import EXIT_BAD_INPUT, EXIT_INCONCLUSIVE, BadInput, combine_exit_codes
from ..record.evidence import read_judged
from ..record.ledger import NOT_APPLICABLE, new_run_id
from ..record import swap_rows as swap
from ..reporting.report import write_matrix, write_run_report
from .run_folder import distinct, interruption
from ..reporting.upgrade_report import UPGRADE_FILE
from ..reporting.viewmodel import is_run_dir
from ..toolchain import resolve_controller_versions



@dataclass
class Sides:
    baseline: str                          # a release
    candidate: str                         # a release, or a user-built controller's label
    binary: runner.Binary | None = None
    sha256: str | None = None              # the user-built controller's
    router: str = "istio"                  # both sides' rows are observed through one router

    def _routed(self, row: dict) -> bool:
        return (row.get("router") or "istio") == self.router

    def is_baseline(self, row: dict) -> bool:
        return row.get("controller_version") == self.baseline and not row.get("controller_sha256") and \
            self._routed(row)

    def is_candidate(self, row: dict) -> bool:
        if self.sha256:
            return row.get("controller_sha256") == self.sha256 and self._routed(row)
        return row.get("controller_version") == self.candidate and not row.get("controller_sha256") and \
            self._routed(row)


def user_binary(path: str, crds: str | None, source: str | None,
                log: Callable[[str], None] | None = None) -> tuple[runner.Binary, str]:
    """A user-built controller for a run (its nearest release only for the cluster's toolchain), and its sha256."""
    try:
        info = inspect_binary(Path(path), Path(crds) if crds else None, Path(source) if source else None)
        tree = find_branches(source_file(Path(source))).source if source else None
    except (ControllerBinaryError, SourceMapError, OSError) as e:
        raise BadInput(str(e)) from None
    if info.crd_warning and log:
        log(f"warning: {info.crd_warning}")
    # named by what it is (its version plus its commit), apart from every release whatever version it reports
    return runner.Binary(path=info.path, crds=info.crds_dir, reported=info.reported, label=info.name,
                         source=Path(tree) if tree else None, release=info.nearest_release,
                         crd_warning=info.crd_warning, sha256=info.sha256), info.sha256


def one_release(flag: str, spec: str) -> str:
    versions = resolve_controller_versions(spec)
    if len(versions) != 1 or "," in spec or spec.strip() == "all":
        raise BadInput(f"{flag} {spec!r}: give one controller version")
    return versions[0]


def sides_of(args, log: Callable[[str], None]) -> Sides:
    if bool(args.to) == bool(args.to_binary):
        raise BadInput("give the candidate as --to V (a release) or --to-binary PATH (a controller you built), "
                       "one of them")
    if (args.source or args.crds) and not args.to_binary:
        raise BadInput("--source and --crds go with --to-binary (a release's CRDs and lines come from its module)")
    baseline = one_release("--from", args.from_ or config.DEFAULT_CONTROLLER)
    if args.to:
        candidate = one_release("--to", args.to)
        if candidate == baseline:
            raise BadInput(f"--from and --to are both {baseline}: nothing to compare")
        return Sides(baseline, candidate)
    binary, sha = user_binary(args.to_binary, args.crds, args.source, log)
    return Sides(baseline, binary.label, binary, sha)


def swap_pairs(sides: Sides) -> list[str]:
    """The pairs lane swap runs on in an upgrade check: the upgrade, then its downgrade (the rollback plan of a
    failed controller upgrade).  A user-built candidate is not swapped in (its chart is the user's)."""
    if sides.binary:
        return []
    return [f"{sides.baseline}->{sides.candidate}", f"{sides.candidate}->{sides.baseline}"]


def swap_legs(sides: Sides, keys: list[str], mode: str) -> list[legs.Leg]:
    if swap.LANE not in keys:
        return []
    return [legs.Leg(a, swap.LANE, variant, to=b) for a, b in (p.split("->") for p in swap_pairs(sides))
            for variant in legs.lane_variants(swap.LANE, mode)]


def interleave(a: list[legs.Leg], b: list[legs.Leg]) -> list[legs.Leg]:
    """Baseline and candidate legs alternately, so both sides' clusters start at once."""
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i:i + 1] + b[i:i + 1]
    return out


def classify_run(run_dir: Path, rows: list[dict], sides: Sides, lane_keys: list[str], inconclusive_legs: int = 0,
                 gaps: list[str] = (), swap_expected: bool = False) -> tuple[int, list[upgrade.Change]]:
    """Classify the rows; ``gaps``: what the legs lack (each one inconclusive), named first in upgrade.json's
    ``missing`` with each side without rows and each baseline row the candidate lacks; ``swap_expected``: lane swap
    was asked for (named, run, or found in the folders): a pair of it without rows is missing too."""
    swapped = swap.swap_rows(rows, set(swap_pairs(sides))) if swap.LANE in lane_keys else []
    if swap_expected and swap.LANE in lane_keys:
        have = {swap.pair_of(r) for r in swapped}
        gaps = [*gaps, *(f"lane swap: no row for the pair {p} (drills upgrade-check --from {sides.baseline} --to "
                         f"{sides.candidate} runs both directions)" for p in swap_pairs(sides) if p not in have)]
    mine = [r for r in rows if r.get("lane") in lane_keys and r.get("lane") != swap.LANE]
    base = [r for r in mine if sides.is_baseline(r)]
    cand = [r for r in mine if sides.is_candidate(r)]
    if not base and not cand and not swapped:
        raise BadInput(f"no rows of {sides.baseline} or {sides.candidate} for lanes {', '.join(lane_keys)} in "
                       f"{run_dir}")
    changes = upgrade.classify(base, cand)
    compared = [k for k in lane_keys if k != swap.LANE]          # lanes whose rows pair up across the sides
    missing_sides = [name for name, got in ((sides.baseline, base), (sides.candidate, cand)) if not got] \
        if compared else []
    heads = [headline(base, sides.baseline), headline(cand, sides.candidate)]
    # the gate follows the answer: a candidate on which the prescription does not hold is no go, whichever row
    # says so (a load figure of AFTER's users included, informational as a change class)
    answer = prescription_gate(heads[1], cand)
    code = combine_exit_codes(upgrade.exit_code(changes, inconclusive_legs + len(gaps) + len(missing_sides)),
                              answer["exit"], swap.gate(swapped))
    lacking = upgrade.missing_on_candidate(changes)
    missing = [*gaps, *(f"{name}: no row for lanes {', '.join(lane_keys)}" for name in missing_sides)]
    missing += [f"{r.get('controller_name') or r.get('controller_version')} {r.get('id') or r.get('assertion')}: "
                f"{r.get('recorded_verdict')} -> inconclusive, {r.get('reason')}"
                for r in [r for r in base + cand if r.get("recorded_verdict")][:MISSING_SHOWN]]
    if lacking:
        missing.append(f"{len(lacking)} row(s) of the baseline {sides.baseline} missing on the candidate "
                       f"{sides.candidate}: " + ", ".join(str(c.id) for c in lacking[:MISSING_SHOWN])
                       + (f" and {len(lacking) - MISSING_SHOWN} more" if len(lacking) > MISSING_SHOWN else ""))
    doc = {"headlines": heads,
           "new_hazards": upgrade.hazard_lines(changes), "missing": missing,
           "baseline": sides.baseline, "candidate": sides.candidate, "candidate_sha256": sides.sha256,
           "candidate_binary": str(sides.binary.path) if sides.binary else None,
           "crd_warning": sides.binary.crd_warning if sides.binary else None,
           "lanes": lane_keys, "counts": upgrade.count_classes(changes), "exit": code,
           "gate": "every row but a load figure gates the exit: a regressed row or a new hazard 1, an inconclusive "
                   "pair, leg or a baseline row the candidate lacks 3; and the answer gates: the prescription does "
                   "not hold on the candidate (its headline: no, whichever row says so, a load figure included) 1",
           "prescription_gate": answer,
           "informational": upgrade.informational(changes),
           "swap": swap.summarise(swapped),
           "inconclusive_legs": inconclusive_legs + len(gaps), "sides_without_rows": missing_sides,
           "changes": [c.as_dict() for c in sorted(changes, key=upgrade._sort_key)]}
    tmp = run_dir / (UPGRADE_FILE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(run_dir / UPGRADE_FILE)
    return code, changes


MISSING_SHOWN = 20      # ids of missing rows named one by one


def prescription_gate(head: dict, rows: list[dict]) -> dict:
    """What the candidate's headline (``head``, of ``rows``) says for the exit: 1 when the prescription does not
    hold on it (``no``: a ``holds`` row shows it failing, whatever its assertion, a load figure included), with
    the ids of those rows; 0 otherwise (an open or unanswered headline is judged by the classes and the coverage)."""
    if head.get("holds") != NO:
        return {"holds": head.get("holds"), "exit": 0, "why": None, "rows": []}
    ids = list(dict.fromkeys(d["id"] for r, d in ((r, declared(r)) for r in rows)
                             if d["polarity"] == HOLDS and d["shows"] is False and r.get("verdict") != NOT_APPLICABLE))
    return {"holds": NO, "exit": 1, "rows": ids,
            "why": f"the prescription does not hold on the candidate {head.get('controller')} "
                   f"({', '.join(map(str, ids[:MISSING_SHOWN]))}): no go, whatever the change classes say"}


def _legs_of(meta: dict, sides: Sides, keys: list[str]) -> list[dict]:
    """The legs of a recorded run folder that ran these lanes on either side."""
    out = []
    for x in meta.get("legs") or []:
        leg_id, router = legs.split_router(str(x["id"]))
        router = x.get("router") or router
        parts = leg_id.rsplit("/", 2)
        lane = x.get("lane") or (parts[1] if len(parts) == 3 else None)
        controller = x.get("controller") or parts[0]
        if lane == swap.LANE:          # a swap leg belongs to the check when its pair is one of the check's
            pair = f"{controller}->{x['to']}" if x.get("to") else parts[0]
            if lane in keys and pair in swap_pairs(sides) and router == sides.router:
                out.append(x)
        elif lane in keys and controller in (sides.baseline, sides.candidate) and router == sides.router:
            out.append(x)
    return out


def _gaps(meta: dict, rows: list[dict]) -> list[str]:
    """What the legs lack (drills.run.legs.coverage) and, since a comparison needs both sides whole, every other leg
    whose pytest did not exit 0 (a test of it failed: what it did not record is unknown)."""
    gaps = legs.coverage(meta, rows)
    named = {g.leg for g in gaps}
    return [g.text for g in gaps] + [f"leg {x['id']}: pytest exit {x.get('rc')} (a test of the leg failed; its "
                                     f"rows may be incomplete)" for x in meta.get("legs") or []
                                     if x["id"] not in named and x.get("rc") not in (0, None)]


def _evidence_from(run_dir: Path, evidence):
    """A row's evidence as a path that holds from another run folder (the evidence stays where it was recorded)."""
    if not evidence or not isinstance(evidence, str) or Path(evidence).is_absolute():
        return evidence        # none, a path already, or no path at all (judged so: drills.record.evidence)
    return str((Path(run_dir) / str(evidence)).resolve())


def classification_folder(dirs: list[Path], sides: Sides, rows: list[dict]) -> Path:
    """The new run folder of `upgrade-check --runs`: the rows it classified (their evidence where it was recorded),
    what it read them from, and (by classify_run) upgrade.json and the report.  Never inside an input folder: the
    run folders it reads are left as they were."""
    run_id = new_run_id()
    run_dir = config.reports_dir() / run_id
    for d in dirs:
        try:
            run_dir.resolve().relative_to(d.resolve())
        except ValueError:
            continue
        raise BadInput(f"--runs {d}: the reports folder is inside it, so the classification would be written into "
                       f"an input run folder; set DRILLS_REPORTS elsewhere")
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "ledger.json").write_text(json.dumps(rows, indent=2, default=str))
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": run_id, "classified_from": [str(d) for d in dirs], "legs": [],
        "upgrade": {"baseline": sides.baseline, "candidate": sides.candidate}}, indent=1))
    return run_dir


def upgrade_check(args, log: Callable[[str], None]) -> tuple[int, Path, list[upgrade.Change], Sides]:
    keys = lanes.resolve(args.lanes or "all")
    if args.jobs is not None and not 1 <= args.jobs <= 64:
        raise BadInput(f"-j {args.jobs}: give 1..64 legs at a time")
    sides = sides_of(args, log)
    if args.runs:
        dirs = [Path(d) for d in args.runs]
        distinct(dirs, "--runs")             # one folder twice (or one inside another): its rows would count twice
        bad = [str(d) for d in dirs if not is_run_dir(d)]
        if bad:
            raise BadInput(f"--runs: not a run folder (no ledger.json): {', '.join(bad)}")
        # each folder's rows judged against the evidence where it was recorded, and the gaps of its legs
        rows, gaps, ran, planned = [], [], set(), set()
        for d in dirs:
            got = read_judged(d)
            rows += [dict(r, evidence=_evidence_from(d, r.get("evidence"))) for r in got]
            if not (d / "run.json").is_file():       # which legs ran, and how they ended, is unknown
                gaps.append(f"{d}: no run.json: which legs ran and how they ended is unknown")
                continue
            meta = legs.read_run_meta(d)
            if meta.get("classified_from"):
                raise BadInput(f"--runs {d}: a classification of upgrade-check, not a run folder: give the run "
                               f"folders it read ({', '.join(map(str, meta['classified_from']))})")
            mine = _legs_of(meta, sides, keys)
            stopped = interruption(meta)     # a run stopped by a signal: its rows are a part, never the answer
            gaps += [f"{d}: {stopped}"] if stopped else []
            gaps += [f"{d}: {g}" for g in _gaps(dict(meta, legs=mine), got)]
            ran |= {x["id"] for x in mine}
            planned |= {x["id"] for x in _legs_of({"legs": [{"id": i} for i in meta.get("all_legs") or []]},
                                                  sides, keys)}
            stray = [r for r in got if (sides.is_baseline(r) or sides.is_candidate(r)) and r.get("lane") in keys
                     and not any(legs.rows_of([r], x) for x in mine)]
            if stray:
                gaps.append(f"{d}: {len(stray)} row(s) of legs its run.json does not list (e.g. lane "
                            f"{stray[0].get('lane')}): which leg wrote them, and whether it finished, is unknown")
        gaps += [f"leg {i}: in the plan, run by none of the folders given" for i in sorted(planned - ran)]
        run_dir = classification_folder(dirs, sides, rows)
        named = swap.LANE in {t.strip() for t in (args.lanes or "").split(",")}
        try:
            code, changes = classify_run(run_dir, rows, sides, keys, gaps=gaps, swap_expected=named or any(
                r.get("lane") == swap.LANE for r in rows))
        except BadInput:
            shutil.rmtree(run_dir, ignore_errors=True)     # nothing to classify: no half-made folder is left
            raise
        write_run_report(run_dir)
        return code, run_dir, changes, sides
    base = legs.plan([sides.baseline], keys, args.variant)
    if sides.binary:
        cand = legs.plan([sides.binary.release], keys, args.variant, label=sides.binary.label)
    else:
        cand = legs.plan([sides.candidate], keys, args.variant)
    if swap.LANE in keys and sides.binary:
        if keys == [swap.LANE]:
            raise BadInput("--lanes swap: a user-built candidate is not swapped in (lane swap runs on a pair of "
                           "releases); give --to V, or other lanes")
        log("lane swap: a user-built candidate is not swapped in (lane swap runs on a pair of releases)")
    plan = swap_legs(sides, keys, args.variant) + interleave(base, cand)      # (the run starts the longest first)
    env = {"DRILLS_AVAILABILITY_CONTROL": "on", "DRILLS_ROLLBACK_VIA": "gitops"}
    meta = {"upgrade": {"baseline": sides.baseline, "candidate": sides.candidate}, "all_legs": [x.id for x in plan],
            **provenance.stamp(config.KUBERNETES_VERSION)}
    run_code, run_dir, rows = runner.run(plan, jobs=args.jobs, env=env, binaries=[sides.binary] if sides.binary else [],
                                         keep_cluster=args.keep_cluster, meta=meta, log=log)
    if run_code == EXIT_BAD_INPUT:
        return EXIT_BAD_INPUT, run_dir, [], sides
    if runner.interrupted_by(run_dir):      # no answer from a run that was stopped: its rows are a part
        return EXIT_INCONCLUSIVE, run_dir, [], sides
    # a leg that could not start, was killed, did not finish or recorded no row (drills.run.legs.coverage), and a leg
    # whose pytest failed while none of its rows did, leaves its side's evidence incomplete: inconclusive
    gaps = _gaps(legs.read_run_meta(run_dir), rows)
    code, changes = classify_run(run_dir, rows, sides, keys, gaps=gaps, swap_expected=bool(swap_pairs(sides)))
    write_run_report(run_dir)
    write_matrix(None, run_dir.parent)
    return code, run_dir, changes, sides
