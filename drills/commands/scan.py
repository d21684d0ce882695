"""`drills scan`: what the command does with its parsed arguments (drills.cli owns the arguments, drills.commands.main
calls ``run``).  ``--verify K`` runs lane ``scan`` (drills.lanes.scan) on the scanned set, one embedded cluster per
controller version, into a run folder with its report."""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

from ..core import config
from ..core.errors import combine_exit_codes
from ..core.inputs import InputError
from ..charts.fleet import base_sources
from ..charts.helm import Helm, HelmError
from ..core.outputs import check_distinct, check_output, reports_folder
from ..record.ledger import INCONCLUSIVE, Ledger, exit_code, new_run_id
from ..toolchain import resolve_controller_versions
from ..scan.charts import scan_charts
from ..scan.charts import split as split_charts
from ..scan.autoscalers import join
from ..scan.ci import write_junit, write_sarif
from ..scan.fleet import FleetScan
from ..scan.model import ScanInputError
from ..scan.readers import ReadResult, manifest_paths, read_manifests
from ..scan.records import evaluate, table, to_json, unknown_why, version_order
from ..scan.sources import SourceMapError, facts_for

FAIL_ON = ("exposed", "lint", "none")
# The default gates: a CI job that runs `drills scan` fails on what it finds (a lint error or a predicted exposure)
# unless it says otherwise; `--fail-on none` only reports.
DEFAULT_FAIL_ON = "lint,exposed"


def _fail_on(text: str) -> set[str]:
    items = {t.strip() for t in (DEFAULT_FAIL_ON if text is None else text).split(",") if t.strip()}
    bad = items - set(FAIL_ON)
    if not items:
        raise ScanInputError(f"--fail-on {text!r}: empty (an unset CI variable?); choose exposed, lint "
                             f"(comma-separated) or none: an empty gate is never taken for none")
    if bad:
        raise ScanInputError(f"--fail-on {text!r}: choose exposed, lint (comma-separated) or none")
    return items - {"none"}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _live(args) -> bool:
    """A live scan: a cluster named, or kubectl's -n/-A/-l (the current context, as kubectl reads it)."""
    return bool(args.kubeconfig or args.context or args.all_contexts or getattr(args, "namespace", None)
                or getattr(args, "all_namespaces", False) or getattr(args, "selector", None))


def _check(args) -> None:
    if not (args.inputs or args.fleet or _live(args)):
        raise ScanInputError("nothing to scan: give manifests (files, folders or -), --fleet DIR, or a cluster "
                             "(--kubeconfig/--context/--all-contexts, -n/-A/-l)")
    if getattr(args, "namespace", None) and getattr(args, "all_namespaces", False):
        raise ScanInputError("-n/--namespace and -A/--all-namespaces: give one")
    if args.verify < 0:
        raise ScanInputError(f"--verify {args.verify}: K must be >= 0")
    if args.verify:
        config.cluster_name()          # $DRILLS_CLUSTER names the cluster folder the probes use: a plain name
    if args.workers is not None and not 1 <= args.workers <= 64:
        raise ScanInputError(f"--workers {args.workers}: give 1..64")
    if args.source and not Path(args.source).is_dir():
        raise ScanInputError("--source: not a folder", args.source)
    if args.context and args.all_contexts:
        raise ScanInputError("--context and --all-contexts: give one")
    for v in getattr(args, "values", None) or []:
        if not Path(v).is_file():
            raise ScanInputError("--values: no such file", v)
    stdin_name = getattr(args, "stdin_name", None)
    if stdin_name is not None and ("-" not in (args.inputs or []) or not stdin_name.strip()
                                   or "\n" in stdin_name):
        raise ScanInputError("--stdin-name names the manifests read from standard input: give a path with '-'")


def _check_outputs(args) -> None:
    """--sarif and --junit checked before anything is read or written: writable, not an input, not inside a run
    folder, not the same file (drills.core.outputs)."""
    if args.sarif is None and args.junit is None:
        return
    files = manifest_paths(args.inputs) if args.inputs else []
    if args.kubeconfig or args.context or args.all_contexts:
        from ..kube.kubeconfig import files_of  # the Kubernetes client: a live scan's only
        files += files_of(args.kubeconfig)
    folders = [i for i in args.inputs if i != "-" and Path(i).is_dir()]
    whole = [d for d in (args.fleet, args.charts, args.source) if d]
    for flag, path in (("--sarif", args.sarif), ("--junit", args.junit)):
        if path is not None:
            check_output(path, flag, inputs=files, input_folders=folders, whole_folders=whole)
    check_distinct({"--sarif": args.sarif, "--junit": args.junit})


def _write(path: str, writer, *what, **kw) -> None:
    Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    writer(*what, path, **kw)


def run(args, stdout=None, stdin=None, log=_log) -> int:
    out = stdout or sys.stdout
    _check(args)
    fail_on = _fail_on(args.fail_on)
    _check_outputs(args)
    if args.verify:
        reports_folder()
    versions = resolve_controller_versions(args.controller)
    facts_cache: dict = {}

    def facts(v):
        if v not in facts_cache:
            try:
                facts_cache[v] = facts_for(v, args.source) if v else None
            except (SourceMapError, OSError, InputError) as e:
                raise ScanInputError(f"--source: {e}") from None
        return facts_cache[v]
    for v in versions:
        facts(v)
    t0 = time.monotonic()
    workers = args.workers or os.cpu_count() or 1
    specs, stats, inventory, scope, scalers = [], {}, None, [], []
    bad: list[ScanInputError] = []             # inputs that could not be read: the scan goes on, exit 2 at the end
    if args.inputs:
        plain, charts = split_charts(args.inputs)
        values = getattr(args, "values", None) or []
        if values and not charts:
            raise ScanInputError("--values applies to charts (folders with a Chart.yaml): none among the inputs")
        res = read_manifests(plain, versions[0], stdin=stdin, workers=workers,
                             stdin_name=getattr(args, "stdin_name", None)) if plain else ReadResult()
        stats["manifest_files"] = res.files
        if charts:
            scan_charts(charts, values, versions[0], result=res)
            stats["charts_rendered"] = sum(c.rendered for c in charts)
            skipped = [c for c in charts if c.skipped]
            if skipped:
                stats["charts_not_rendered"] = len(skipped)
                for c in skipped:
                    log(f"drills scan: chart {c.root} not rendered: {c.skipped}")
        specs += res.rollouts
        scalers += res.autoscalers
        bad += res.unreadable
        scope.append(", ".join(args.inputs)[:80])
    if args.fleet:
        res = _fleet(args, versions[0], stats, workers)
        specs += res.rollouts
        scalers += res.autoscalers
        bad += res.unreadable
        scope.append(f"fleet {args.fleet}" + (f" ({args.env})" if args.env else ""))
    if len(versions) > 1:                      # manifests and renders: each Rollout on every version asked for
        specs = [dataclasses.replace(ro, controller_version=v) for ro in specs for v in versions]
    unreadable = []
    if _live(args):
        from ..scan.live import contexts, read_cluster  # the Kubernetes client: a live scan's only
        inventory = []
        for kc, ctx in contexts(args.kubeconfig, args.context, args.all_contexts):
            # --controller overrides the version the cluster shows
            inv = read_cluster(kc, ctx, namespace=getattr(args, "namespace", None),
                               selector=getattr(args, "selector", None),
                               controllers=versions if args.controller else None)
            inventory.append(inv)
            if inv.error:
                unreadable.append(f"context {ctx}: {inv.error}")
            specs += inv.specs
            scalers += inv.autoscalers
            scope.append(f"cluster {ctx}")
    if bad and not specs:                      # nothing read at all: each reason, the last one as the error
        for u in unreadable:
            log(f"drills: cannot read {u}")
        for e in bad[:-1]:
            log(f"drills: {e}")
        raise bad[-1]
    if not specs and not unreadable and not getattr(args, "allow_empty", False):
        # a mistyped path or an empty render in CI must not pass as a clean scan
        raise ScanInputError(f"no Rollout found in {'; '.join(scope) or 'the input'} (pass --allow-empty when none "
                             f"is expected)")
    unjoined = join(specs, scalers)            # HPAs and ScaledObjects on their Rollouts (every version's copy)
    shapes: dict = {}
    records = [evaluate(ro, facts(ro.controller_version or None), shapes) for ro in specs]
    for inv in inventory or []:
        inv.exposed = sum(r.exposed for r in records if r.ro.origin.get("cluster") == inv.context)
    stats.update(rollouts=len(records), shapes=sum(1 for k in shapes if k[0] != "size"), seconds=round(time.monotonic() - t0, 2))
    if bad:
        stats["unreadable"] = len(bad)
    verification = None
    code = 0
    if args.verify:
        verification, run_dir, vcode = verify_run(records, args.verify, "scan of " + "; ".join(scope), log)
        stats["verify_run"] = str(run_dir)
        if not verification:
            stats["verify"] = "inconclusive: nothing verified (exit 3; why on stderr and in the run folder)"
        code = combine_exit_codes(code, vcode)
    used_facts = [f for f in facts_cache.values() if f is not None]
    # (a reader such as `head` that closes the pipe: drills.core.pipes, for every command; the exit code still counts)
    if args.json:
        print(to_json(records, inventory, verification, stats, used_facts, unreadable=bad, unjoined=unjoined),
              file=out)
    else:
        print(table(records, inventory, verification, stats, unreadable=bad, unjoined=unjoined), file=out)
    out.flush()
    if args.sarif:
        _write(args.sarif, write_sarif, records, unreadable=bad, unjoined=unjoined)
    if args.junit:
        _write(args.junit, lambda recs, path: write_junit(recs, path, verification), records)
    gated, said = gate(records, fail_on)
    code = combine_exit_codes(code, gated)
    for line in said:
        log(line)
    for u in unreadable:
        log(f"drills: cannot read {u}")
    for e in bad:
        log(f"drills: cannot read {e}")
    return combine_exit_codes(code, 2) if unreadable or bad else code


def gate(records: list, fail_on: set[str]) -> tuple[int, list[str]]:
    """The exit code of the gates asked for, and what makes it inconclusive: 1 for a lint error (``lint``) or a
    predicted exposure (``exposed``: at the current size, or at an autoscaler's maximum); 3 with ``exposed`` when the controller version of a Rollout is unknown (its
    exposure cannot be predicted: no version is no evidence of none), naming how to give it."""
    code, said = 0, []
    if "exposed" in fail_on and any(r.exposed or r.exposed_at_max or (r.pred and r.pred.promotes_while_partial)
                                  for r in records):
        code = combine_exit_codes(code, 1)
    if "lint" in fail_on and any(r.lint_errors for r in records):
        code = combine_exit_codes(code, 1)
    unknown = [r for r in records if r.facts is None]
    if unknown and "exposed" in fail_on:
        code = combine_exit_codes(code, 3)
        whys = "; ".join(sorted({unknown_why(r.ro) for r in unknown}))
        said.append(f"drills scan: inconclusive: the controller version of {len(unknown)} Rollout(s) is unknown "
                    f"({whys}), so their exposure is not predicted; give the version the controller runs with "
                    f"--controller vX.Y.Z (or --fail-on lint to gate on the lint alone)")
    return code, said


def _fleet(args, version: str, stats: dict, workers: int) -> ReadResult:
    envs = [e.strip() for e in args.env.split(",") if e.strip()] if args.env else None
    sources = base_sources(args.charts) if args.charts else None
    t0 = time.monotonic()
    try:
        helm = Helm()
    except HelmError as e:
        raise ScanInputError(str(e)) from None
    with helm:
        fs = FleetScan(args.fleet, envs, args.app, version, helm, workers=workers, sources=sources)
        res = fs.run()
    stats.update({f"fleet_{k}": v for k, v in fs.stats.items()})
    stats["fleet_seconds"] = round(time.monotonic() - t0, 2)
    return res


def verify_run(records: list, k: int, scope: str, log) -> tuple[list[dict], Path, int]:
    """Lane scan on the scanned set: per controller version, the summary rows, then (on the embedded cluster at
    that version) the picked shapes probed.  Returns the comparisons, the run folder and its exit code."""
    # the drill machinery (the cluster, the lanes, the report), imported by a --verify only
    from ..cluster import EmbeddedCluster, remains
    from ..lanes.base import LaneContext
    from ..lanes.scan import LaneScan
    from ..reporting.report import write_matrix, write_run_report
    from ..scan.verify import pick
    shapes, uncovered, skipped = pick(records, k)
    if uncovered:
        log(f"verify: rules not covered with K={k}: {', '.join(uncovered)}")
    for why, n in skipped.items():
        log(f"verify: {n} Rollout(s) not verifiable: {why}")
    run_id = new_run_id()
    run_dir = config.reports_dir() / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    comparisons: list[dict] = []
    for version in version_order({r.ro.controller_version for r in records if r.facts is not None}):
        mine = [s for s in shapes if s.ro.controller_version == version]
        ctx = LaneContext(api=None, namespace="", evidence_dir=run_dir / version, ledger=Ledger(
            run_dir, run_id, target="embedded", controller_version=version), version=version, log=log)
        lane = LaneScan(ctx).use([r for r in records if r.ro.controller_version == version], scope, mine)
        lane.summary()
        if not mine:
            continue
        cluster = EmbeddedCluster(log=log)
        was_up = bool(cluster.status().get("ready")) and cluster.controller_version == version
        try:
            cluster.hold("drills scan --verify")
            if not was_up:                       # this scan's: a scan killed before its down leaves it marked
                remains.mark(cluster.name, run_id)
            cluster.up(version)
            ctx.api, ctx.cluster, ctx.audit_log = cluster.api_client(), cluster, cluster.status().get("audit_log")
            lane.verify()
        finally:
            comparisons += lane.comparisons
            cluster.release()
            if not was_up and "left_up" not in cluster.down(quiet=True, if_unused=True):
                remains.unmark(cluster.name)
    code = exit_code([c for c in comparisons])
    if not comparisons:                 # nothing probed is no evidence for the prediction, never a clean verify
        why = nothing_verified(k, skipped, uncovered, shapes)
        Ledger(run_dir, run_id, target="embedded", controller_version="unknown").record(
            "scan", "verify", "shapes of the scan verified on the real controller", f">= 1 (K={k})", 0, INCONCLUSIVE,
            reason=why, key="verified")
        log(f"verify: inconclusive: {why}")
        code = combine_exit_codes(code, 3)
    write_run_report(run_dir)
    write_matrix(None, run_dir.parent)
    log(f"verify: run folder {run_dir}, report {run_dir / 'report.html'}")
    return comparisons, run_dir, code


def nothing_verified(k: int, skipped: dict, uncovered: list[str], shapes: list) -> str:
    """Why --verify K verified nothing: what kept each Rollout out."""
    if shapes:
        return f"none of the {len(shapes)} picked shape(s) was probed"
    parts = [f"{n} Rollout(s) not verifiable: {why}" for why, n in skipped.items()]
    if uncovered:
        parts.append(f"rules not covered with K={k}: {', '.join(uncovered)}")
    return (f"--verify {k} could verify nothing: " + ("; ".join(parts) or "no Rollout to verify")
            + (" (give the controller version with --controller)" if "controller version unknown" in skipped else ""))
