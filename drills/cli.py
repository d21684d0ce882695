"""The `drills` command."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import config

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INCONCLUSIVE = 0, 1, 2, 3


class BadInput(Exception):
    """Bad input or a refused target: exit 2, nothing mutated."""


def _err(msg: str) -> None:
    print(f"drills: {msg}", file=sys.stderr, flush=True)


# --- toolchain -------------------------------------------------------------------------------
def cmd_toolchain_build(args) -> int:
    from .toolchain import BuildError, Toolchain, UnknownVersion, components_for, resolve_controller_versions
    try:
        versions = resolve_controller_versions(args.controller)
    except UnknownVersion as e:
        raise BadInput(str(e))
    extras = [e for e in (args.extra or "").split(",") if e]
    tc = Toolchain()
    try:
        tc.ensure(components_for(versions, extras))
    except BuildError as e:
        _err(str(e))
        return EXIT_FAIL
    print(f"toolchain ready in {tc.root}: controllers {', '.join(versions)}")
    return EXIT_OK


def cmd_toolchain_list(args) -> int:
    from .toolchain import Toolchain
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
def _controller_version_arg(spec: str | None) -> str:
    from .toolchain import UnknownVersion, resolve_controller_versions
    try:
        versions = resolve_controller_versions(spec)
    except UnknownVersion as e:
        raise BadInput(str(e))
    if len(versions) != 1:
        raise BadInput("cluster up takes one controller version")
    return versions[0]


def cmd_cluster_up(args) -> int:
    from .cluster import ClusterError, ClusterInputError, EmbeddedCluster
    from .toolchain import BuildError
    version = _controller_version_arg(args.controller)
    try:
        st = EmbeddedCluster().up(version, build=not args.no_build, api_port=args.api_port)
    except ClusterInputError as e:
        raise BadInput(str(e).splitlines()[0])
    except (ClusterError, BuildError) as e:
        _err(str(e))
        return EXIT_FAIL
    print(json.dumps({k: st[k] for k in ("ready", "controller_version", "kubeconfig", "api_server")}))
    return EXIT_OK


def cmd_cluster_status(args) -> int:
    from .cluster import EmbeddedCluster
    st = EmbeddedCluster().status()
    if args.json:
        print(json.dumps(st, indent=2))
    elif not st.get("ready") and "cluster" not in st:
        print("no embedded cluster")
    else:
        print(f"cluster {st['cluster']}: {'ready' if st['ready'] else 'NOT ready'}, controller "
              f"{st['controller_version']}, api {st['api_server']}, kubeconfig {st['kubeconfig']}")
        for p in st["processes"]:
            print(f"  {p['name']:<24} pid {p['pid']:<8} {'alive' if p['alive'] else 'dead':<6} "
                  f"ports {','.join(map(str, p.get('ports') or [])) or '-'}  log {p.get('log')}")
    return EXIT_OK if st.get("ready") else EXIT_FAIL


def cmd_cluster_down(args) -> int:
    from .cluster import EmbeddedCluster
    EmbeddedCluster().down()
    return EXIT_OK


# --- run ---------------------------------------------------------------------------------------
def cmd_run(args) -> int:
    from .runner import resolve_lanes, run, summary_table
    from .toolchain import UnknownVersion, resolve_controller_versions
    try:
        lanes = resolve_lanes(args.lanes)
    except ValueError as e:
        raise BadInput(str(e))
    env = {"DRILLS_AVAILABILITY_CONTROL": args.availability_control, "DRILLS_ROLLBACK_VIA": args.rollback_via}
    if args.controller_binary:
        from .controller_binary import ControllerBinaryError, inspect_binary
        try:
            info = inspect_binary(Path(args.controller_binary), Path(args.crds) if args.crds else None)
        except ControllerBinaryError as e:
            raise BadInput(str(e))
        versions = [info.nearest_release]
        env.update({"DRILLS_CONTROLLER_BINARY": str(info.path), "DRILLS_CRDS": str(info.crds_dir)})
        if args.source:
            from .branches import SourceMapError, find_branches, source_file
            try:
                env["DRILLS_SOURCE"] = str(find_branches(source_file(Path(args.source))).source)
            except (SourceMapError, OSError) as e:
                raise BadInput(str(e))
    elif args.source:
        raise BadInput("--source goes with --controller-binary (a release's lines come from its own module)")
    else:
        try:
            versions = resolve_controller_versions(args.controller)
        except UnknownVersion as e:
            raise BadInput(str(e))
    if args.kubeconfig or args.context or args.namespace or args.rollout:
        from .live import LiveRefused, run_live
        try:
            return run_live(args)
        except LiveRefused as e:
            raise BadInput(str(e))
    from .toolchain import BuildError, Toolchain, components_for
    try:
        Toolchain().ensure(components_for([] if args.controller_binary else versions,
                                          ["registry"] if "b" in lanes else []))
    except BuildError as e:
        _err(str(e))
        return EXIT_FAIL
    if args.controller_binary:
        # start it once before the lanes: a binary that does not run as a rollouts controller is bad input
        from .cluster import ClusterError, ClusterInputError, EmbeddedCluster
        try:
            EmbeddedCluster().up(versions[0], controller_binary=info.path, crds_dir=info.crds_dir,
                                 reported_version=info.reported)
        except ClusterInputError as e:
            raise BadInput(str(e))
        except ClusterError as e:
            if "rollouts controller" in str(e):
                raise BadInput(f"--controller-binary {info.path} does not start as a rollouts controller: {e}")
            _err(str(e))
            return EXIT_FAIL
    from .ledger import combine_exit_codes
    pytest_args = []
    variants = ["stage", "prod"] if args.variant == "both" else [args.variant]
    code = 0
    run_dir = None
    all_rows = []
    try:
        for variant in variants:
            env["DRILLS_LANE_A_VARIANT"] = variant
            lanes_v = lanes if variant == variants[0] else [k for k in lanes if k == "a"]
            if not lanes_v:
                continue
            c, run_dir, all_rows = run(versions, lanes_v, run_dir=run_dir, pytest_args=pytest_args, env_extra=env,
                                       tag="" if variant == "stage" else f"-{variant}")
            code = combine_exit_codes(code, c)
    finally:
        if not args.keep_cluster:
            from .cluster import EmbeddedCluster
            EmbeddedCluster().down(quiet=True)
    print(summary_table(all_rows))
    print(f"run folder: {run_dir}  report: {run_dir / 'report.html'}  matrix: {run_dir.parent / 'matrix.html'}")
    return code


# --- probe -------------------------------------------------------------------------------------
def cmd_probe(args) -> int:
    from .cluster import ClusterError, ClusterInputError, EmbeddedCluster
    from .ledger import new_run_id
    from .probe import ProbeSpec, observation_dict, parse_steps, run_probe
    from .pytest_plugin import _drop_namespace, _make_namespace, _ns_name
    try:
        steps = parse_steps(args.steps)
    except ValueError as e:
        raise BadInput(f"--steps: {e}")
    if not steps:
        raise BadInput("--steps: give at least one step")
    if args.replicas < 1 or args.min_pods < 1 or args.hold <= 0:
        raise BadInput("--replicas, --min-pods and --hold must be positive")
    version = _controller_version_arg(args.controller)
    spec = ProbeSpec(steps=steps, replicas=args.replicas, min_pods=args.min_pods, routing=args.routing,
                     hold_seconds=args.hold, availability_control=args.availability_control == "on",
                     rollback_via=args.rollback_via, scale_down_delay=args.scale_down_delay)
    cl = EmbeddedCluster(log=_progress)
    try:
        cl.up(version)
    except ClusterInputError as e:
        raise BadInput(str(e).splitlines()[0])
    except ClusterError as e:
        _err(str(e))
        return EXIT_FAIL
    api = cl.api_client()
    out_dir = config.reports_dir() / "probes" / new_run_id()
    ns = _ns_name("probe")
    _make_namespace(api, ns)
    try:
        obs, _ = run_probe(api, ns, spec, out_dir, version, log=_progress,
                           audit_log=cl.status().get("audit_log"))
    finally:
        if not args.keep_namespace:
            _drop_namespace(api, ns)
    reason = obs.inconclusive_reason()
    if args.json:
        d = observation_dict(obs, version, args.routing)
        d["inconclusive_reason"] = reason
        d["steps"] = args.steps
        print(json.dumps(d, indent=2))
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


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- watch --------------------------------------------------------------------------------------
def _parse_duration(text: str) -> float:
    import re
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", text.strip())
    if not m:
        raise BadInput(f"--duration {text!r}: use e.g. 90s, 5m")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def cmd_watch(args) -> int:
    import time as _time

    from kubernetes import config as kconfig
    from kubernetes.client.rest import ApiException

    from . import timeline
    from .rollout import Rollouts, healthy
    if not args.until_healthy and not args.duration:
        raise BadInput("give --until-healthy or --duration")
    duration = _parse_duration(args.duration) if args.duration else None
    try:
        api = kconfig.new_client_from_config(config_file=args.kubeconfig, context=args.context)
    except Exception as e:
        raise BadInput(f"kubeconfig: {e}")
    try:
        ro = Rollouts(api, args.namespace).get(args.rollout)
    except ApiException as e:
        raise BadInput(f"rollout {args.namespace}/{args.rollout}: {e.reason}")
    rec = timeline.Recorder(api, args.namespace, args.rollout, Path(args.out)).start()
    _progress(f"recording {args.namespace}/{args.rollout} to {args.out} (read-only); Ctrl-C ends the recording")
    t0 = _time.monotonic()
    try:
        while True:
            if duration and _time.monotonic() - t0 >= duration:
                break
            if args.until_healthy and _time.monotonic() - t0 > 2:
                ro = Rollouts(api, args.namespace).get(args.rollout)
                if healthy()(ro) and ro["status"].get("stableRS") == ro["status"].get("currentPodHash"):
                    break
            _time.sleep(0.5)
    except KeyboardInterrupt:
        _progress("recording ended by Ctrl-C")
    result = rec.stop()
    d = timeline.derive(rec.records, None)
    series = Path(str(args.out).replace(".jsonl", "") + ".series.json")
    series.write_text(json.dumps(d.series(f"{args.namespace}/{args.rollout}"), indent=1))
    summary = {"timeline": str(args.out), "series": str(series), "complete": result["complete"],
               "incomplete_reasons": result["reasons"],
               "peak_canary_weight_while_partial": d.peak_canary_weight_while_partial,
               "partial_window_observed": d.partial_window_observed,
               "exposure_seconds": round(d.exposure_seconds, 3),
               "exposure_windows": d.series("")["exposure"], "partial_windows": d.series("")["partial"],
               "canary_weights": d.series("")["canary_weight"]}
    print(json.dumps(summary, indent=2))
    return EXIT_OK if result["complete"] else EXIT_INCONCLUSIVE


# --- restore ------------------------------------------------------------------------------------
def cmd_restore(args) -> int:
    from kubernetes import config as kconfig

    from .safety import Journal, restore_with_guard
    try:
        j = Journal.load(Path(args.journal))
    except (FileNotFoundError, ValueError) as e:
        raise BadInput(str(e))
    from .safety import RefusedTarget, check_context
    try:
        check_context(j.data.get("context"), embedded=False, allow=args.allow_context)
    except RefusedTarget as e:
        raise BadInput(str(e))
    api = kconfig.new_client_from_config(config_file=j.data.get("kubeconfig"), context=j.data.get("context"))
    ok = restore_with_guard(j, api, log=_progress)
    return EXIT_OK if ok else EXIT_FAIL


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="drills", description="Rollback drills against Argo Rollouts canaries.")
    sub = p.add_subparsers(dest="command", required=True)

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

    from .report import add_report_parser
    add_report_parser(sub)
    from .renderdiff import add_render_diff_parser
    add_render_diff_parser(sub)

    rn = sub.add_parser("run", help="the main job: drills per controller version, into reports/<run-id>")
    rn.add_argument("--controller", default=None,
                    help=f"version(s), comma-separated, or 'all' ({', '.join(config.SUPPORTED_CONTROLLERS)}); "
                         f"default {config.DEFAULT_CONTROLLER}")
    rn.add_argument("--lanes", default=None, help="a,b,abort,order or all (default a,b)")
    rn.add_argument("--variant", choices=["stage", "prod", "both"], default="stage",
                    help="lane A fixture: the seed's stage shape, the prod-shaped one, or both")
    rn.add_argument("--availability-control", choices=["on", "off"], default="on")
    rn.add_argument("--rollback-via", choices=["gitops", "undo"], default="gitops")
    rn.add_argument("--controller-binary", default=None, help="run against a rollouts-controller you built")
    rn.add_argument("--crds", default=None, help="CRD folder for --controller-binary (default: nearest release)")
    rn.add_argument("--source", default=None,
                    help="source of --controller-binary (tree root, folder or rollout/trafficrouting.go): the "
                         "branch lines of lane order (without it: 'lines unknown')")
    rn.add_argument("--keep-cluster", action="store_true", help="leave the embedded cluster up afterwards")
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
    wa.set_defaults(func=cmd_watch)

    rs = sub.add_parser("restore", help="finish a restore from a drill's journal")
    rs.add_argument("--journal", required=True)
    rs.add_argument("--allow-context", action="append", default=[])
    rs.set_defaults(func=cmd_restore)

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
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INCONCLUSIVE


if __name__ == "__main__":
    sys.exit(main())
