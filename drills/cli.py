"""The `drills` command: every subcommand's arguments, and every error mapped to an exit code.

Exit codes of every drill command: 0 all pass, 1 a fail, 2 bad input or a refused target (nothing mutated),
3 inconclusive (drills.errors).  Nothing in the package imports this module.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

from . import config, kube, lanes, legs, runner
from .branches import SourceMapError, find_branches, source_file
from .cluster import ClusterError, ClusterInputError, EmbeddedCluster
from .cluster.embedded import audit_log_for
from .cluster.namespaces import drop_namespace, make_namespace, namespace_name
from .controller_binary import ControllerBinaryError, inspect_binary
from .errors import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_OK, BadInput
from .fleet import Fleet, base_sources
from .helm import Helm, HelmError
from .ledger import new_run_id
from .live import run_live
from .probe import observation_dict, run_probe
from .recorder import watch_rollout
from .renderdiff import render_diff
from .report import is_run_dir, write_matrix
from .safety import restore_journal
from .shapes import RolloutSpec
from .signals import Interrupted, SignalGuard
from .steps import parse_steps
from .toolchain import BuildError, Toolchain, components_for, resolve_controller_versions
from .toolchain.build import optional_components

MAX_PROBE_REPLICAS = 100
MAX_HOLD_SECONDS = 600.0


def _err(msg: str) -> None:
    print(f"drills: {msg}", file=sys.stderr, flush=True)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- toolchain -------------------------------------------------------------------------------
def _extras_arg(spec: str | None) -> list[str]:
    known = list(optional_components())
    extras = [e.strip() for e in (spec or "").split(",") if e.strip()]
    unknown = [e for e in extras if e not in known]
    if unknown:
        raise BadInput(f"--extra: unknown component(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return extras


def cmd_toolchain_build(args) -> int:
    versions = resolve_controller_versions(args.controller)
    tc = Toolchain()
    try:
        tc.ensure(components_for(versions, _extras_arg(args.extra)))
    except BuildError as e:
        _err(str(e))
        return EXIT_FAIL
    print(f"toolchain ready in {tc.root}: controllers {', '.join(versions)}")
    return EXIT_OK


def cmd_toolchain_list(args) -> int:
    rows = Toolchain().listing()
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    print(f"{'component':<12} {'version':<10} {'built':<6} {'supported':<9} path")
    for r in rows:
        print(f"{r['component']:<12} {r['version']:<10} {'yes' if r['built'] else 'no':<6} "
              f"{'yes' if r['supported'] else 'no':<9} {r['path'] or ''}")
    return EXIT_OK


# --- cluster ----------------------------------------------------------------------------------
def _one_version(spec: str | None) -> str:
    versions = resolve_controller_versions(spec)
    if len(versions) != 1:
        raise BadInput("give one controller version")
    return versions[0]


def cmd_cluster_up(args) -> int:
    if args.api_port is not None and not 1024 <= args.api_port <= 65535:
        raise BadInput(f"--api-port {args.api_port}: give a port in 1024..65535")
    version = _one_version(args.controller)
    try:
        st = EmbeddedCluster().up(version, build=not args.no_build, api_port=args.api_port)
    except ClusterInputError as e:
        raise BadInput(str(e).splitlines()[0])
    except (ClusterError, BuildError) as e:
        _err(str(e))
        return EXIT_FAIL
    print(json.dumps({k: st.get(k) for k in ("ready", "controller_version", "kubeconfig", "api_server")}))
    return EXIT_OK


def cmd_cluster_status(args) -> int:
    st = EmbeddedCluster().status()
    if args.json:
        print(json.dumps(st, indent=2))
    elif "processes" not in st:
        print(st.get("error") or "no embedded cluster")
    else:
        print(f"cluster {st['cluster']}: {'ready' if st['ready'] else 'NOT ready'}, controller "
              f"{st['controller_version']}, api {st['api_server']}, kubeconfig {st['kubeconfig']}")
        for p in st["processes"]:
            print(f"  {p['name']:<24} pid {p['pid']:<8} {'alive' if p['alive'] else 'dead':<6} "
                  f"ports {','.join(map(str, p.get('ports') or [])) or '-'}  log {p.get('log')}")
    return EXIT_OK if st.get("ready") else EXIT_FAIL


def cmd_cluster_down(args) -> int:
    EmbeddedCluster().down()
    return EXIT_OK


# --- run ---------------------------------------------------------------------------------------
def _binary(args) -> runner.Binary | None:
    if not args.controller_binary:
        for flag, given in (("--source", args.source), ("--crds", args.crds)):
            if given:
                raise BadInput(f"{flag} goes with --controller-binary (a release's lines and CRDs come from its own "
                               f"module)")
        return None
    try:
        info = inspect_binary(Path(args.controller_binary), Path(args.crds) if args.crds else None)
        source = find_branches(source_file(Path(args.source))).source if args.source else None
    except (ControllerBinaryError, SourceMapError, OSError) as e:
        raise BadInput(str(e)) from None
    return runner.Binary(path=info.path, crds=info.crds_dir, reported=info.reported, label=info.version,
                         source=Path(source) if source else None, release=info.nearest_release)


def cmd_run(args) -> int:
    live_target = args.kubeconfig or args.context or args.namespace or args.rollout
    live_only = [flag for flag, on in (("--dry-run", args.dry_run), ("--service-url", args.service_url),
                                       ("--sync-paused", args.sync_paused), ("--allow-context", args.allow_context),
                                       ("--container", args.container)) if on]
    if live_only and not live_target:
        raise BadInput(f"{', '.join(live_only)}: live mode only; name the live target with --kubeconfig/--context "
                       f"--namespace --rollout (the embedded job has nothing to dry-run)")
    if args.jobs is not None and not 1 <= args.jobs <= 64:
        raise BadInput(f"-j {args.jobs}: give 1..64 legs at a time")
    keys = lanes.resolve(args.lanes)
    shard = legs.parse_shard(args.shard)
    binary = _binary(args)
    if live_target:
        return run_live(args)
    versions = [binary.release] if binary else resolve_controller_versions(args.controller)
    plan = legs.plan(versions, keys, args.variant, label=binary.label if binary else None)
    durations = legs.read_durations(Path(args.durations) if args.durations else None)
    doc = legs.plan_document(plan, durations, shard, args.durations or str(legs.durations_file()))
    if args.plan:
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            for leg in doc["legs"]:
                print(f"{leg['id']:<40} shard {leg['shard']}  ~{leg['estimate_s']:.0f}s")
            print(f"{len(doc['legs'])} of {doc['total_legs']} leg(s); plan {doc['plan_digest']}")
        return EXIT_OK
    chosen = [x for x in plan if x.id in {d["id"] for d in doc["legs"]}]
    env = {"DRILLS_AVAILABILITY_CONTROL": args.availability_control, "DRILLS_ROLLBACK_VIA": args.rollback_via}
    if binary:
        env.update({"DRILLS_CONTROLLER_BINARY": str(binary.path), "DRILLS_CRDS": str(binary.crds)})
        if binary.source:
            env["DRILLS_SOURCE"] = str(binary.source)
    meta = {"plan_digest": doc["plan_digest"], "shard": doc["shard"], "total_legs": doc["total_legs"],
            "all_legs": [x.id for x in plan]}
    code, run_dir, rows = runner.run(chosen, jobs=args.jobs, env=env, binary=binary, keep_cluster=args.keep_cluster,
                                     meta=meta, log=_progress)
    print(runner.summary_table(rows))
    print(f"run folder: {run_dir}  report: {run_dir / 'report.html'}  matrix: {run_dir.parent / 'matrix.html'}")
    return code


# --- probe -------------------------------------------------------------------------------------
def _probe_spec(args) -> RolloutSpec:
    try:
        steps = parse_steps(args.steps)
    except ValueError as e:
        raise BadInput(f"--steps: {e}")
    if not steps:
        raise BadInput("--steps: give at least one step")
    if not 1 <= args.replicas <= MAX_PROBE_REPLICAS:
        raise BadInput(f"--replicas {args.replicas}: give 1..{MAX_PROBE_REPLICAS} (--replicas, --min-pods and --hold "
                       f"must be positive)")
    if not 1 <= args.min_pods <= args.replicas:
        raise BadInput(f"--min-pods {args.min_pods}: give 1..--replicas ({args.replicas}); more pods than replicas "
                       f"would never become available (--min-pods must be positive)")
    if not (math.isfinite(args.hold) and 0 < args.hold <= MAX_HOLD_SECONDS):
        raise BadInput(f"--hold {args.hold}: give seconds in (0, {MAX_HOLD_SECONDS:.0f}] (--hold must be positive)")
    if not 0 <= args.scale_down_delay <= 3600:
        raise BadInput(f"--scale-down-delay {args.scale_down_delay}: give 0..3600 seconds")
    return RolloutSpec(steps=steps, replicas=args.replicas, min_pods=args.min_pods, routing=args.routing,
                       hold_seconds=args.hold, availability_control=args.availability_control == "on",
                       rollback_via=args.rollback_via, scale_down_delay=args.scale_down_delay)


def cmd_probe(args) -> int:
    spec = _probe_spec(args)
    version = _one_version(args.controller)
    cl = EmbeddedCluster(log=_progress)
    out_dir = config.reports_dir() / "probes" / new_run_id()
    with SignalGuard() as guard:
        try:
            cl.up(version)
            api = cl.api_client()
            ns = make_namespace(api, namespace_name("probe"))
        except ClusterInputError as e:
            raise BadInput(str(e).splitlines()[0])
        except ClusterError as e:
            _err(str(e))
            return EXIT_FAIL
        except Interrupted as e:
            guard.quiet()
            _err(f"probe {e} before its Rollout existed")
            return EXIT_INCONCLUSIVE
        try:
            obs, _ = run_probe(api, ns, spec, out_dir, version, log=_progress, audit_log=cl.status().get("audit_log"))
        except Interrupted as e:
            _err(f"probe {e}; its namespace {ns} is removed; evidence so far: {out_dir}")
            return EXIT_INCONCLUSIVE
        finally:
            guard.quiet()
            if not args.keep_namespace:
                drop_namespace(api, ns)
    reason = obs.inconclusive_reason()
    if args.json:
        print(json.dumps(dict(observation_dict(obs, version, args.routing), inconclusive_reason=reason,
                              steps=args.steps), indent=2))
    else:
        print(f"controller {version}, routing {args.routing}, steps [{args.steps}], replicas {args.replicas}, "
              f"minPodsPerReplicaSet {args.min_pods}")
        print(f"  peak canary weight while the revived ReplicaSet was partial: {obs.peak_canary_weight_while_partial}")
        print(f"  weights written while partial [t, weight, available, target]: {obs.weights_while_partial}")
        print(f"  canary weight series [t, weight]: {obs.canary_weights}")
        print(f"  exposure: {obs.exposure_seconds:.1f}s; inside rollbackWindow: {obs.rollback_in_window} "
              f"({'; '.join(obs.window_evidence) or 'no evidence'})")
        print(f"  timeline: {obs.timeline}")
        if reason:
            print(f"  INCONCLUSIVE: {reason}")
    if reason:
        return EXIT_INCONCLUSIVE
    if args.expect is not None:
        return EXIT_OK if obs.peak_canary_weight_while_partial == args.expect else EXIT_FAIL
    return EXIT_OK


# --- watch, restore --------------------------------------------------------------------------------
def _duration(text: str) -> float:
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)?", text.strip(), re.ASCII)
    if not m:
        raise BadInput(f"--duration {text!r}: use e.g. 90s, 5m")
    seconds = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if not math.isfinite(seconds) or not 0 < seconds <= 7 * 24 * 3600:
        raise BadInput(f"--duration {text!r}: give more than 0 and at most 7 days")
    return seconds


def _writable(path: str) -> Path:
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a"):
            pass
    except OSError as e:
        raise BadInput(f"--out {path}: cannot write there ({e.strerror or e})")
    return out


def cmd_watch(args) -> int:
    if not args.until_healthy and not args.duration:
        raise BadInput("give --until-healthy or --duration")
    duration = _duration(args.duration) if args.duration else None
    if args.audit_log and not Path(args.audit_log).is_file():
        raise BadInput(f"--audit-log {args.audit_log}: no such file")
    out = _writable(args.out)
    kc, ctx = kube.resolve_kubeconfig(args.kubeconfig, args.context)
    api = kube.new_client(kc, ctx)
    audit = args.audit_log or audit_log_for(kc)
    summary = watch_rollout(api, args.namespace, args.rollout, out, duration, args.until_healthy,
                            audit_log=Path(audit) if audit else None, progress=_progress)
    print(json.dumps(summary, indent=2))
    return EXIT_OK if summary["complete"] else EXIT_INCONCLUSIVE


def cmd_restore(args) -> int:
    return EXIT_OK if restore_journal(Path(args.journal), args.allow_context, log=_progress) else EXIT_INCONCLUSIVE


# --- render-diff, report, lanes --------------------------------------------------------------------
def cmd_render_diff(args) -> int:
    try:
        with Helm() as helm:
            d = render_diff(Fleet(args.fleet, args.apps_dir), args.app, args.env, args.from_version, args.to_version,
                            helm, sources=base_sources(args.charts))
    except HelmError as e:
        _err(str(e))
        return EXIT_FAIL
    print(json.dumps(d.to_dict(), indent=2, default=str) if args.json else d.format())
    return EXIT_OK


def cmd_report(args) -> int:
    given = list(args.run_dir or [])
    missing = [d for d in given if not Path(d).exists()]
    if missing:
        raise BadInput(f"no such run folder: {', '.join(map(str, missing))}")
    if args.merge:
        merged = runner.merge([Path(d) for d in given], log=_progress)
        print(merged)
        given = [str(merged)]
    for d in given:
        if not is_run_dir(Path(d)):
            _err(f"report: {d} is not a run folder (no ledger.json): ignored")
    html_path, md_path = write_matrix([Path(d) for d in given] if given and not args.merge else None,
                                      config.reports_dir(), strict=True)
    print(html_path)
    print(md_path)
    return EXIT_OK


def cmd_lanes(args) -> int:
    rows = lanes.describe()
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    for r in rows:
        print(f"{r['key']:<6} {r['title']}\n       data {r['data']}; tests {r['tests']}; versions "
              f"{', '.join(r['versions']) or 'none'}" + (f"; unverified {', '.join(r['unverified'])}"
                                                        if r["unverified"] else ""))
    return EXIT_OK


# --- the parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="drills", description="Rollback drills against Argo Rollouts canaries.")
    sub = p.add_subparsers(dest="command", required=True)
    versions = ", ".join(config.SUPPORTED_CONTROLLERS)

    tc = sub.add_parser("toolchain", help="build and list the binaries drills runs")
    tcs = tc.add_subparsers(dest="sub", required=True)
    b = tcs.add_parser("build", help="build components from Go modules into the cache")
    b.add_argument("--controller", default=None,
                   help=f"Argo Rollouts version(s), comma-separated, or 'all' (default {config.DEFAULT_CONTROLLER})")
    b.add_argument("--extra", default="", help="optional components: registry,prometheus")
    b.set_defaults(func=cmd_toolchain_build)
    ls = tcs.add_parser("list", help="what is built and what is supported")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_toolchain_list)

    rn = sub.add_parser("run", help="the main job: drill legs on embedded clusters into reports/<run-id>, or live mode",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="A run is a list of legs, one per (controller version, lane, variant).")
    rn.add_argument("--controller", default=None, help=f"version(s), comma-separated, or 'all' ({versions}); "
                                                       f"default {config.DEFAULT_CONTROLLER}")
    rn.add_argument("--lanes", default=None, help=f"{','.join(lanes.REGISTRY)} or all (default "
                                                  f"{','.join(lanes.DEFAULT_LANES)})")
    rn.add_argument("--variant", choices=legs.VARIANT_MODES, default="stage",
                    help="lane A fixture: the seed's stage shape, the prod-shaped one, or both")
    rn.add_argument("--availability-control", choices=["on", "off"], default="on")
    rn.add_argument("--rollback-via", choices=["gitops", "undo"], default="gitops")
    rn.add_argument("-j", "--jobs", type=int, default=None,
                    help="legs at a time (default: what the machine holds: 3 per core, at most one per "
                         f"{runner.MEM_PER_LEG_GIB:g} GiB of available memory, at most the number of legs; here "
                         f"{runner.default_jobs()})")
    rn.add_argument("--plan", action="store_true", help="print the legs the run would execute and start nothing")
    rn.add_argument("--json", action="store_true", help="with --plan: JSON")
    rn.add_argument("--shard", default=None, help="I/N: run shard I of N (legs balanced by measured durations)")
    rn.add_argument("--durations", default=None,
                    help="leg durations to balance shards with (JSON: leg id -> seconds; default: the cache's)")
    rn.add_argument("--controller-binary", default=None, help="run against a rollouts-controller you built")
    rn.add_argument("--crds", default=None, help="CRD folder for --controller-binary")
    rn.add_argument("--source", default=None,
                    help="source tree of --controller-binary (its CRDs, and the branch lines of lane order)")
    rn.add_argument("--keep-cluster", action="store_true", help="leave the embedded clusters up afterwards")
    live = rn.add_argument_group("live mode (a stage Rollout, under the safety rules)")
    live.add_argument("--kubeconfig", default=None)
    live.add_argument("--context", default=None)
    live.add_argument("--namespace", default=None)
    live.add_argument("--rollout", default=None)
    live.add_argument("--allow-context", action="append", default=[])
    live.add_argument("--sync-paused", action="store_true", help="the Argo CD sync of this app is paused")
    live.add_argument("--dry-run", action="store_true", help="print every mutation, make none")
    live.add_argument("--service-url", default=None,
                      help="load target during the live drill: the stage service's URL (Locust, bounded)")
    live.add_argument("--container", default=None,
                      help="the application container (default: the only container, the one named like the Rollout "
                           "or its app.kubernetes.io/name label, else the only one that is not a known sidecar)")
    rn.set_defaults(func=cmd_run)

    pr = sub.add_parser("probe", help="one rollback inside rollbackWindow for any step list, on a fresh namespace")
    pr.add_argument("--steps", required=True, help='e.g. "5,pause:10s,100" (pause = indefinite)')
    pr.add_argument("--replicas", type=int, default=2)
    pr.add_argument("--min-pods", type=int, default=1, help="minPodsPerReplicaSet")
    pr.add_argument("--routing", choices=["subset", "host"], default="subset")
    pr.add_argument("--controller", default=None)
    pr.add_argument("--hold", type=float, default=config.DEFAULT_HOLD_SECONDS,
                    help="seconds each revived pod is held before it may turn Ready (default 15)")
    pr.add_argument("--availability-control", choices=["on", "off"], default="on")
    pr.add_argument("--rollback-via", choices=["gitops", "undo"], default="gitops")
    pr.add_argument("--scale-down-delay", type=int, default=5, help="scaleDownDelaySeconds of the probe Rollout")
    pr.add_argument("--expect", type=int, default=None, help="exit 1 unless the peak equals this weight")
    pr.add_argument("--keep-namespace", action="store_true")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_probe)

    wa = sub.add_parser("watch", help="record a live Rollout (read-only) and print the derived windows")
    wa.add_argument("-n", "--namespace", required=True)
    wa.add_argument("rollout")
    wa.add_argument("--kubeconfig", default=None)
    wa.add_argument("--context", default=None)
    g = wa.add_mutually_exclusive_group()
    g.add_argument("--until-healthy", action="store_true")
    g.add_argument("--duration", default=None, help="e.g. 90s, 5m")
    wa.add_argument("--out", required=True, help="timeline JSONL file")
    wa.add_argument("--audit-log", default=None,
                    help="the apiserver's audit log, to prove the recording complete (found by itself for the "
                         "embedded cluster)")
    wa.set_defaults(func=cmd_watch)

    rs = sub.add_parser("restore", help="finish a restore from a drill's journal")
    rs.add_argument("--journal", required=True)
    rs.add_argument("--allow-context", action="append", default=[])
    rs.set_defaults(func=cmd_restore)

    rd = sub.add_parser("render-diff", help="render an app with two base chart versions and list what changes")
    rd.add_argument("--app", required=True, help="the app (release name or Application name)")
    rd.add_argument("--env", required=True, help="environment: the apps/<env>.yaml list it is declared in")
    rd.add_argument("--from", dest="from_version", required=True, help="base chart version to render first")
    rd.add_argument("--to", dest="to_version", required=True, help="base chart version to compare with")
    rd.add_argument("--json", action="store_true", help="print JSON")
    rd.add_argument("--fleet", default=None, help="fleet folder (default: fixtures/fleet)")
    rd.add_argument("--apps-dir", default="apps", help="folder of the per-environment app lists, in the fleet")
    rd.add_argument("--charts", default=None, help="base chart source folders (default: fixtures/charts/base)")
    rd.set_defaults(func=cmd_render_diff)

    rp = sub.add_parser("report", help="merge run folders into reports/matrix.html and reports/matrix.md",
                        description="Render each run's report and merge run folders into a controller-version x "
                                    "assertion matrix. Default: every run folder under the reports directory. "
                                    "Entries that are not run folders are ignored.")
    rp.add_argument("run_dir", nargs="*", metavar="RUN_DIR", help="run folders (reports/<run-id>)")
    rp.add_argument("--merge", action="store_true",
                    help="merge shard run folders into one run folder (as if one machine had run them)")
    rp.set_defaults(func=cmd_report)

    ln = sub.add_parser("lanes", help="the registered lanes: key, title, data folder, versions with expectations")
    ln.add_argument("--json", action="store_true")
    ln.set_defaults(func=cmd_lanes)

    cl = sub.add_parser("cluster", help="the embedded default cluster")
    cls = cl.add_subparsers(dest="sub", required=True)
    up = cls.add_parser("up", help="start (or reuse) the embedded cluster with controller V")
    up.add_argument("--controller", default=None, help=f"Argo Rollouts version (default {config.DEFAULT_CONTROLLER})")
    up.add_argument("--no-build", action="store_true", help="refuse (exit 2) instead of building missing binaries")
    up.add_argument("--api-port", type=int, default=None, help="kube-apiserver port on 127.0.0.1 (default: a free one)")
    up.set_defaults(func=cmd_cluster_up)
    stp = cls.add_parser("status", help="is it up, which controller, where")
    stp.add_argument("--json", action="store_true")
    stp.set_defaults(func=cmd_cluster_status)
    dn = cls.add_parser("down", help="stop every process of the cluster")
    dn.set_defaults(func=cmd_cluster_down)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return EXIT_BAD_INPUT if e.code not in (0, None) else EXIT_OK
    try:
        return args.func(args)
    except BadInput as e:
        _err(str(e))
        return EXIT_BAD_INPUT
    except (KeyboardInterrupt, Interrupted) as e:
        _err(f"interrupted ({e})" if str(e) else "interrupted")
        return EXIT_INCONCLUSIVE
    except Exception as e:   # a failure nobody anticipated: one line, the traceback on request
        if os.environ.get("DRILLS_DEBUG"):
            raise
        _err(f"{type(e).__name__}: {' '.join(str(e).split())[:400]} (set DRILLS_DEBUG=1 for the traceback)")
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
