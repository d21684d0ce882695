"""The `drills` command."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import config, recorder
from .errors import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_OK, BadInput  # noqa: F401


def _err(msg: str) -> None:
    print(f"drills: {msg}", file=sys.stderr, flush=True)


# --- toolchain -------------------------------------------------------------------------------
def cmd_toolchain_build(args) -> int:
    from .toolchain import BuildError, Toolchain, UnknownVersion, components_for, resolve_controller_versions
    try:
        versions = resolve_controller_versions(args.controller)
    except UnknownVersion as e:
        raise BadInput(str(e))
    extras = _extras_arg(args.extra)
    tc = Toolchain()
    try:
        tc.ensure(components_for(versions, extras))
    except BuildError as e:
        _err(str(e))
        return EXIT_FAIL
    print(f"toolchain ready in {tc.root}: controllers {', '.join(versions)}")
    return EXIT_OK


def _extras_arg(spec: str | None) -> list[str]:
    from .toolchain.build import optional_components
    known = list(optional_components())
    extras = [e.strip() for e in (spec or "").split(",") if e.strip()]
    unknown = [e for e in extras if e not in known]
    if unknown:
        raise BadInput(f"--extra: unknown component(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return extras


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
    if args.api_port is not None and not 1024 <= args.api_port <= 65535:
        raise BadInput(f"--api-port {args.api_port}: give a port in 1024..65535")
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
    if args.keep_cluster:
        env["DRILLS_KEEP_CLUSTER"] = "1"
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
    live_target = args.kubeconfig or args.context or args.namespace or args.rollout
    live_only = [flag for flag, on in (("--dry-run", args.dry_run), ("--service-url", args.service_url),
                                       ("--sync-paused", args.sync_paused), ("--allow-context", args.allow_context),
                                       ("--container", args.container)) if on]
    if live_only and not live_target:
        raise BadInput(f"{', '.join(live_only)}: live mode only; name the live target with --kubeconfig/--context "
                       f"--namespace --rollout (the embedded job has nothing to dry-run)")
    if live_target:
        from .live import run_live
        return run_live(args)
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
MAX_PROBE_REPLICAS = 100
MAX_HOLD_SECONDS = 600.0


def _probe_spec(args):
    import math

    from .probe import ProbeSpec, parse_steps
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
    return ProbeSpec(steps=steps, replicas=args.replicas, min_pods=args.min_pods, routing=args.routing,
                     hold_seconds=args.hold, availability_control=args.availability_control == "on",
                     rollback_via=args.rollback_via, scale_down_delay=args.scale_down_delay)


def cmd_probe(args) -> int:
    from .cluster import ClusterError, ClusterInputError, EmbeddedCluster
    from .ledger import new_run_id
    from .probe import observation_dict, run_probe
    from .cluster.namespaces import drop_namespace, make_namespace, namespace_name
    from .safety import Interrupted, SignalGuard
    spec = _probe_spec(args)
    version = _controller_version_arg(args.controller)
    cl = EmbeddedCluster(log=_progress)
    with SignalGuard() as guard:
        try:
            cl.up(version)
        except ClusterInputError as e:
            raise BadInput(str(e).splitlines()[0])
        except ClusterError as e:
            _err(str(e))
            return EXIT_FAIL
        except Interrupted as e:
            guard.quiet()
            _err(f"probe {e} while the cluster started")
            return EXIT_INCONCLUSIVE
        api = cl.api_client()
        out_dir = config.reports_dir() / "probes" / new_run_id()
        ns = namespace_name("probe")
        obs = None
        try:
            make_namespace(api, ns)
            obs, _ = run_probe(api, ns, spec, out_dir, version, log=_progress,
                               audit_log=cl.status().get("audit_log"))
        except Interrupted as e:
            _err(f"probe {e}; its namespace {ns} is removed; evidence so far: {out_dir}")
            return EXIT_INCONCLUSIVE
        finally:
            guard.quiet()
            if not args.keep_namespace:
                drop_namespace(api, ns)
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
    import math
    import re
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)?", text.strip(), re.ASCII)
    if not m:
        raise BadInput(f"--duration {text!r}: use e.g. 90s, 5m")
    seconds = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if not math.isfinite(seconds) or not 0 < seconds <= 7 * 24 * 3600:
        raise BadInput(f"--duration {text!r}: give more than 0 and at most 7 days")
    return seconds


def _writable_out(path: str) -> Path:
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a"):
            pass
    except OSError as e:
        raise BadInput(f"--out {path}: cannot write there ({e.strerror or e})")
    return out


def _embedded_audit_log(kubeconfig: str) -> str | None:
    """The audit log of the embedded cluster whose kubeconfig this is (None for any other cluster)."""
    from .cluster import EmbeddedCluster
    folder = Path(kubeconfig).resolve().parent
    if folder.parent != config.clusters_dir().resolve():
        return None
    st = EmbeddedCluster(folder.name).state()
    return st.get("audit_log") if st else None


def cmd_watch(args) -> int:
    import time as _time

    from kubernetes.client.rest import ApiException

    from . import kube, timeline
    from .rollout import Rollouts, healthy
    from .safety import Interrupted, SignalGuard
    if not args.until_healthy and not args.duration:
        raise BadInput("give --until-healthy or --duration")
    duration = _parse_duration(args.duration) if args.duration else None
    out = _writable_out(args.out)
    kc, ctx = kube.resolve_kubeconfig(args.kubeconfig, args.context)
    api = kube.new_client(kc, ctx)
    try:
        Rollouts(api, args.namespace).get(args.rollout)
        exists = True
    except ApiException as e:
        if e.status != 404:
            raise kube.unreachable(e, api, f"reading rollout {args.namespace}/{args.rollout}") from None
        exists = False
    except Exception as e:
        raise kube.unreachable(e, api, f"reading rollout {args.namespace}/{args.rollout}") from None
    audit = args.audit_log or _embedded_audit_log(kc)
    if args.audit_log and not Path(args.audit_log).is_file():
        raise BadInput(f"--audit-log {args.audit_log}: no such file")
    rec = recorder.Recorder(api, args.namespace, args.rollout, out, audit_log=Path(audit) if audit else None).start()
    _progress(f"recording {args.namespace}/{args.rollout} to {out} (read-only)"
              + ("" if exists else "; it does not exist yet: recording from its creation")
              + "; Ctrl-C ends the recording")
    t0 = _time.monotonic()
    with SignalGuard() as guard:
        try:
            while True:
                if duration and _time.monotonic() - t0 >= duration:
                    break
                if args.until_healthy and _time.monotonic() - t0 > 2:
                    try:
                        ro = Rollouts(api, args.namespace).get(args.rollout)
                        if healthy()(ro) and ro["status"].get("stableRS") == ro["status"].get("currentPodHash"):
                            break
                    except ApiException as e:
                        if e.status != 404:
                            raise
                rec.stop_flag.wait(0.5)
        except Interrupted:
            _progress("recording ended by a signal")
        finally:
            guard.quiet()
    result = rec.stop()
    d = timeline.derive(rec.records, None)
    series_path = timeline.series_path(out)
    series = d.series(f"{args.namespace}/{args.rollout}")
    series_path.write_text(json.dumps(series, indent=1))
    summary = {"timeline": str(out), "series": str(series_path), "complete": result["complete"],
               "incomplete_reasons": result["reasons"], "notes": result["notes"],
               "audit_log_checked": result["audit_log_checked"],
               "audit_writes_checked": result["audit_writes_checked"],
               "peak_canary_weight_while_partial": d.peak_canary_weight_while_partial,
               "partial_window_observed": d.partial_window_observed,
               "exposure_seconds": round(d.exposure_seconds, 3),
               "exposure_windows": series["exposure"], "partial_windows": series["partial"],
               "canary_weights": series["canary_weight"]}
    print(json.dumps(summary, indent=2))
    return EXIT_OK if result["complete"] else EXIT_INCONCLUSIVE


# --- restore ------------------------------------------------------------------------------------
def cmd_restore(args) -> int:
    from . import kube
    from .cluster.embedded import pid_alive
    from .safety import Interrupted, Journal, SignalGuard, check_context, check_namespace, restore_with_guard
    j = Journal.load(Path(args.journal))
    if j.state == "restored":
        print(f"journal {j.path} was already restored ({j.data.get('restored_at', 'earlier')}): nothing to do")
        return EXIT_OK
    pid = j.data.get("pid")
    if isinstance(pid, int) and pid != os.getpid() and pid_alive(pid) and j.state == "open" and \
            "drills" in _cmdline(pid):
        raise BadInput(f"the drill that wrote {j.path} is still running (pid {pid}); it restores on exit "
                       f"(signal it once with SIGINT)")
    kc, ctx = j.data.get("kubeconfig"), j.data.get("context")
    if not kc or not ctx:
        raise BadInput(f"journal {j.path}: names no kubeconfig/context to restore on")
    check_context(ctx, embedded=False, allow=args.allow_context)
    api = kube.new_client(kc, ctx)
    for ns in sorted({k.split("/", 1)[0] for k in j.data["rollouts"]}):
        check_namespace(api, ns)
    with SignalGuard() as guard:
        try:
            ok = restore_with_guard(j, api, log=_progress, guard=guard)
        except Interrupted:
            return EXIT_INCONCLUSIVE
        finally:
            guard.quiet()
    return EXIT_OK if ok else EXIT_INCONCLUSIVE


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


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
    from .safety import Interrupted
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
