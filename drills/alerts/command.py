"""`drills alerts`: what the command does with its parsed arguments (drills.cli owns them, drills.commands.main calls
``run``).  The Rollouts are read exactly as `drills scan` reads them (drills.scan.readers for manifests and ``-``,
drills.scan.fleet for a fleet layout rendered with helm); the rules go to standard output, or to ``--out`` (never
over a file it read)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from ..core import config
from ..charts.helm import Helm, HelmError
from ..scan.fleet import FleetScan
from ..scan.model import ScanInputError
from ..scan.readers import STDIN, manifest_paths, read_manifests
from .metrics import KSM_CONFIG, NEEDS
from .ramp import AlertInputError, RampParams, parse_seconds
from .rules import render, rules_document

FORMATS = ("rules", "prometheusrule")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def params_of(args) -> RampParams:
    return RampParams(readiness_s=parse_seconds(args.readiness, "--readiness"), margin=float(args.margin),
                      pods_at_once=args.pods_at_once,
                      abort_for_s=parse_seconds(args.abort_for, "--abort-for")).check()


def _inputs_read(args) -> set[Path]:
    """Every file the command reads: an output there would overwrite an input."""
    files = {Path(p).resolve() for p in manifest_paths(args.inputs or []) if p != STDIN}
    if args.fleet and Path(args.fleet).is_dir():
        files |= {p.resolve() for p in Path(args.fleet).rglob("*") if p.is_file()}
    return files


def _check_out(path: str | None, read: set[Path], what: str) -> Path | None:
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        raise AlertInputError(f"{what} {path}: a folder, not a file")
    if p.resolve() in read:
        raise AlertInputError(f"{what} {path}: it is one of the inputs; the rules never overwrite what they are "
                              f"read from")
    if not p.resolve().parent.is_dir():
        raise AlertInputError(f"{what} {path}: no such folder {p.parent}")
    return p


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_rollouts(args, stdin=None, log=_log) -> tuple[list, list[str]]:
    """(ScannedRollouts, scope) from the manifests and the fleet, as `drills scan` reads them."""
    version = config.DEFAULT_CONTROLLER          # the rules do not depend on the controller version
    specs, scope = [], []
    if args.inputs:
        res = read_manifests(args.inputs, version, stdin=stdin, stdin_name=getattr(args, "stdin_name", None))
        specs += res.rollouts
        scope.append(", ".join(args.inputs))
    if args.fleet:
        envs = [e.strip() for e in args.env.split(",") if e.strip()] if args.env else None
        try:
            helm = Helm()
        except HelmError as e:
            raise ScanInputError(str(e)) from None
        with helm:
            specs += FleetScan(args.fleet, envs, args.app, version, helm, workers=os.cpu_count() or 1).run().rollouts
        scope.append(f"fleet {args.fleet}" + (f" ({args.env})" if args.env else ""))
    return specs, scope


def header(n: int, scope: list[str], params: RampParams, fmt: str) -> str:
    p = "all" if params.pods_at_once is None else str(params.pods_at_once)
    return "\n".join([
        f"drills alerts ({fmt}): {n} Rollout(s) read from {'; '.join(scope)}",
        f"expected ramp: readiness {params.readiness_s:g}s per pod, {p} pod(s) at a time, margin "
        f"{params.margin * 100:g} % (formula in each rule's annotations and the README)",
        "metrics the stuck rule needs: " + "; ".join(NEEDS["stuck"]),
        "scrape both sources with honor_labels: true (their samples carry the Rollout's namespace and name)",
    ])


def run(args, stdout=None, stdin=None, log=_log) -> int:
    out = stdout or sys.stdout
    if not (args.inputs or args.fleet):
        raise ScanInputError("nothing to read: give manifests (files, folders or -) or --fleet DIR")
    if args.format not in FORMATS:
        raise AlertInputError(f"--format {args.format!r}: choose {' or '.join(FORMATS)}")
    params = params_of(args)
    interval = parse_seconds(args.interval, "--interval") if args.interval else None
    if interval is not None and not 0 < interval <= 3600:
        raise AlertInputError(f"--interval {args.interval!r}: give seconds, > 0 and at most an hour")
    read = _inputs_read(args)
    out_path = _check_out(args.out, read, "--out")
    ksm_path = _check_out(getattr(args, "ksm_config", None), read, "--ksm-config")
    if out_path is not None and ksm_path is not None and out_path.resolve() == ksm_path.resolve():
        raise AlertInputError("--out and --ksm-config name the same file")
    specs, scope = read_rollouts(args, stdin, log)
    if not specs:
        raise ScanInputError(f"no Rollout found in {'; '.join(scope) or 'the input'}")
    doc, notes = rules_document(specs, params, interval)
    for n in notes:
        log(f"alerts: {n}")
    text = render(doc, args.format, header(len(doc["groups"]), scope, params, args.format))
    if out_path is None:
        out.write(text)
        out.flush()
    else:
        _write(out_path, text)
        log(f"alerts: {sum(len(g['rules']) for g in doc['groups'])} rule(s) for {len(doc['groups'])} Rollout(s) "
            f"written to {out_path}")
    if ksm_path is not None:
        _write(ksm_path, yaml.safe_dump(KSM_CONFIG, sort_keys=False))
        log(f"alerts: the kube-state-metrics custom-resource-state config the rules need written to {ksm_path}")
    return 0
