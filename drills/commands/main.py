"""What each `drills` subcommand does with its parsed arguments (drills.cli owns the arguments and the exit
codes; only it imports this module)."""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

from ..core import config, provenance
from ..reporting import console
from ..kube import api as kube
from .. import lanes
from ..run import legs, runner
from . import report as report_command
from ..drill.autoscale import external_metrics_for
from ..alerts import command as alerts_command
from ..cluster import ClusterError, ClusterInputError, EmbeddedCluster
from ..cluster.embedded import audit_log_for
from ..cluster.external_metrics import ExternalMetricsError
from ..cluster.namespaces import drop_namespace, make_namespace, namespace_name
from ..core.errors import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_OK, BadInput, err
from ..charts.fleet import Fleet, base_sources, check_base_version
from ..charts.helm import Helm, HelmError
from ..kube.kubeconfig import files_of
from ..record.ledger import new_run_id
from ..core.outputs import check_output, reports_folder
from ..run.live import check_inputs as live_check_inputs, live_controller, run_live, run_live_b
from ..drill.probe import controller_log_of, observation_dict, run_probe
from ..record.recorder import watch_rollout
from ..charts.renderdiff import render_diff
from ..drill.safety import LEASE_ANNOTATION
from . import scan as scan_command
from ..drill.shapes import RolloutSpec
from ..core.signals import Interrupted, SignalGuard
from ..core.steps import parse_steps, steps_text
from ..toolchain import resolve_controller_versions
from .cluster import one_version as _one_version
from ..reporting.upgrade import changes_table
from ..record.swap_rows import line as swap_line
from ..run.upgrade_check import UPGRADE_FILE, upgrade_check, user_binary
from ..drill.watchdog import Watchdog, cluster_processes, processes_alive

MAX_PROBE_REPLICAS = 500       # the fleet's largest autoscaler maximum (360) with room; fake nodes hold them
DEFAULT_LIVE_B_S = 3600.0       # how long live lane B waits for the next deploy by default
MAX_HOLD_SECONDS = 600.0


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- run ---------------------------------------------------------------------------------------
def _binary(args) -> runner.Binary | None:
    if not args.controller_binary:
        for flag, given in (("--source", args.source), ("--crds", args.crds)):
            if given:
                raise BadInput(f"{flag} goes with --controller-binary (a release's lines and CRDs come from its own "
                               f"module)")
        return None
    return user_binary(args.controller_binary, args.crds, args.source, _progress)[0]


def _embedded_only(args) -> list[str]:
    """The flags of `drills run` that mean nothing in live mode (refused there, never silently ignored)."""
    return [flag for flag, on in (("--shard", args.shard is not None), ("-j", args.jobs is not None),
                                  ("--variant", args.variant is not None), ("--keep-cluster", args.keep_cluster),
                                  ("--durations", args.durations is not None),
                                  ("--availability-control", args.availability_control is not None),
                                  ("--controller-binary", args.controller_binary is not None),
                                  ("--crds", args.crds is not None), ("--source", args.source is not None),
                                  ("--router", args.router is not None)) if on]


def cmd_run(args) -> int:
    live_target = args.kubeconfig or args.context or args.namespace or args.rollout
    live_only = [flag for flag, on in (("--dry-run", args.dry_run), ("--service-url", args.service_url),
                                       ("--sync-paused", args.sync_paused), ("--allow-context", args.allow_context),
                                       ("--container", args.container), ("--duration", args.duration),
                                       ("--allow-other-changes", getattr(args, "allow_other_changes", False)))
                 if on]
    if live_only and not live_target:
        raise BadInput(f"{', '.join(live_only)}: live mode only; name the live target with --kubeconfig/--context "
                       f"--namespace --rollout (the embedded job has nothing to dry-run)")
    if live_target:
        embedded = _embedded_only(args)
        if embedded:
            raise BadInput(f"{', '.join(embedded)}: not for live mode (they shape the embedded run's legs and "
                           f"clusters); drop them, or drop the live target flags")
        args.controller = live_controller(args.controller)
    if args.jobs is not None and not 1 <= args.jobs <= 64:
        raise BadInput(f"-j {args.jobs}: give 1..64 legs at a time")
    keys = lanes.resolve(args.lanes)
    shard = legs.parse_shard(args.shard)
    if live_target:
        if keys != ["b"] and args.duration:
            raise BadInput("--duration goes with --lanes b (the read-only watch of the next deploy)")
        if keys not in (["a"], ["b"]) and args.lanes:
            raise BadInput(f"live mode runs lane a (the drill) or lane b (the watch of the next deploy), one at a "
                           f"time: --lanes {args.lanes}")
        duration = (_duration(args.duration) if args.duration else DEFAULT_LIVE_B_S) if keys == ["b"] else None
        if args.plan:                  # a plan opens no connection: the target's files are read, nothing is sent
            return _live_plan(args, "b" if keys == ["b"] else "a", duration)
        if not args.dry_run:
            reports_folder()
        if keys == ["b"]:
            return run_live_b(args, duration)
        return run_live(args)
    binary = _binary(args)
    ropts = legs.router_options(args.lanes, args.router)     # bad --router: exit 2 before anything is written
    if not args.plan:
        reports_folder()
    versions = [binary.release] if binary else resolve_controller_versions(args.controller)
    plan = legs.plan(versions, keys, args.variant or "stage", label=binary.label if binary else None,
                     **ropts)
    for line in legs.left_out(keys, plan, args.router):     # `all` lanes, some not in the plan: said, never hidden
        print(f"drills: {line}", file=sys.stderr)
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
    env = {"DRILLS_AVAILABILITY_CONTROL": args.availability_control or "on", "DRILLS_ROLLBACK_VIA": args.rollback_via}
    meta = {"plan_digest": doc["plan_digest"], "shard": doc["shard"], "total_legs": doc["total_legs"],
            "all_legs": [x.id for x in plan], **provenance.stamp(config.KUBERNETES_VERSION)}
    code, run_dir, rows = runner.run(chosen, jobs=args.jobs, env=env, binaries=[binary] if binary else [],
                                     keep_cluster=args.keep_cluster,
                                     meta=meta, log=_progress, durations=durations)
    for line in runner.verdict(run_dir)[1]:              # what the run lacks first: a leg killed, evidence missing
        print(f"INCOMPLETE: {line}")
    print(console.run_summary(rows, run_dir))           # the answer, then every row
    print(f"run folder: {run_dir}  report: {run_dir / 'report.html'}  matrix: {run_dir.parent / 'matrix.html'}")
    if binary:
        print(f"{binary.label} is a user-built controller: its rows are observations, not held to a release's "
              f"expectations; classify them against a baseline with: drills upgrade-check --from "
              f"{config.DEFAULT_CONTROLLER} --runs {run_dir} ... or run drills upgrade-check --to-binary")
    _say_interrupted(run_dir)
    return code


def _say_interrupted(run_dir: Path) -> None:
    """The last line of a run that a signal stopped (its run.json and report are written)."""
    sig = runner.interrupted_by(run_dir)
    if sig:
        err(f"interrupted by {sig}: the legs that ran were stopped and the run's clusters taken down; its rows are "
            f"no complete result (run.json: interrupted; {run_dir})")


def _live_plan(args, lane: str, duration: float | None) -> int:
    """`drills run --plan` with a live target: what the live run would do, from the command line and the target's
    files alone (kubeconfig, allowlist); no connection is opened, no credential plugin runs."""
    target = live_check_inputs(args)
    where = f"{target.namespace}/{target.rollout}"
    if lane == "b":
        steps = [f"read-only preflight of {where}: the namespace's opt-in label, the Rollout",
                 f"watch {where} read-only for its next deploy, up to {duration:.0f}s; check its steps no longer end "
                 f"in setWeight: 100, that it still reaches weight 100 and promotes Healthy"]
    else:
        steps = [f"read-only preflight of {where}: the namespace's opt-in label, lease, GitOps management, shape, "
                 f"health, the rollback target inside rollbackWindow",
                 f"annotate {where} with the lease {LEASE_ANNOTATION}",
                 "BEFORE: roll back the application container's image to the rollback target's (every other "
                 "container as it is now) and observe; a target revision that differs in more than that image is "
                 "refused" + (" (--allow-other-changes drills it, leaving those differences as they are)"
                              if not getattr(args, "allow_other_changes", False) else
                              " (--allow-other-changes: those differences are left as they are)"),
                 "cut the final setWeight: 100 from the steps",
                 "redeploy the current image, wait for the rollback target to be scaled to 0",
                 "AFTER: roll back again and observe",
                 "EXIT: redeploy, roll back once more, abort while the revived ReplicaSet is partly available, then "
                 "promote --full",
                 "restore: the pod template and the steps exactly as they were; release the lease"]
        if target.service_url:
            steps.insert(2, f"load {target.service_url} (bounded) during each observed phase")
    if args.dry_run:
        steps = [f"{s} (dry-run: the preflight reads, every mutation is printed, none is sent)" if i == 0 else s
                 for i, s in enumerate(steps)]
    leg = {"id": f"live/{lane}/{target.context}/{where}", "lane": lane, "variant": "live",
           "controller": args.controller or "the live controller's image tag", "shard": 1, "estimate_s": duration}
    doc = {"mode": "live", "dry_run": bool(args.dry_run), "kubeconfig": target.kubeconfig,
           "context": target.context, "namespace": target.namespace, "rollout": target.rollout, "lane": lane,
           "steps": steps, "legs": [leg], "total_legs": 1, "shard": None, "connections": 0}
    if args.json:
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    print(f"live plan: lane {lane} on {where}, context {target.context} ({target.kubeconfig}); nothing is sent "
          f"while planning")
    for i, s in enumerate(steps, 1):
        print(f"  {i}. {s}")
    return EXIT_OK


# --- upgrade-check ----------------------------------------------------------------------------------
def cmd_upgrade_check(args) -> int:
    reports_folder()
    code, run_dir, changes, sides = upgrade_check(args, _progress)
    if args.json:
        print((run_dir / UPGRADE_FILE).read_text() if (run_dir / UPGRADE_FILE).exists()
              else json.dumps({"baseline": sides.baseline, "candidate": sides.candidate, "exit": code}))
        _progress(f"run folder: {run_dir}")
    else:
        doc = json.loads((run_dir / UPGRADE_FILE).read_text()) if (run_dir / UPGRADE_FILE).exists() else {}
        # what decides the exit first: a new hazard (exit 1) before what the comparison lacks (no go without it)
        for line in doc.get("new_hazards") or []:
            print(line)
        if (doc.get("prescription_gate") or {}).get("exit"):     # the answer gates: no on the candidate, exit 1
            print(f"!! NO GO: {doc['prescription_gate']['why']}")
        for line in doc.get("missing") or []:
            print(f"!! INCOMPLETE: {line}")
        for h in doc.get("headlines") or []:
            print(h["text"])
        for e in doc.get("swap") or []:           # lane swap's verdicts on the pairs first, then the changes
            print(swap_line(e))
        print(changes_table(changes))
        if (doc.get("informational") or {}).get("rows"):
            print(f"informational: {doc['informational']['rule']}")
        print(f"run folder: {run_dir}  report: {run_dir / 'report.html'}  (changes in {run_dir / UPGRADE_FILE})")
    _say_interrupted(run_dir)
    return code


# --- probe -------------------------------------------------------------------------------------
def _probe_spec(args) -> RolloutSpec:
    try:
        steps = parse_steps(args.steps)
    except ValueError as e:
        raise BadInput(f"--steps: {e}")
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
    if args.rollback_timeout is not None and not (math.isfinite(args.rollback_timeout) and
                                                  0 < args.rollback_timeout <= 24 * 3600):
        raise BadInput(f"--rollback-timeout {args.rollback_timeout}: give seconds in (0, 86400]")
    if args.scale_out is not None and not args.replicas < args.scale_out <= MAX_PROBE_REPLICAS:
        raise BadInput(f"--scale-out {args.scale_out}: give more replicas than --replicas ({args.replicas}), at most "
                       f"{MAX_PROBE_REPLICAS}" + (f" (--replicas must be below {MAX_PROBE_REPLICAS} for a scale-out)"
                                                  if args.replicas >= MAX_PROBE_REPLICAS else ""))
    if args.scale_out is not None and args.availability_control != "on" or args.scale_out_by and args.scale_out is None:
        raise BadInput("--scale-out needs --availability-control on (the revived pods are held while it scales), and "
                       "--scale-out-by needs --scale-out")
    if args.expect is not None and not 0 <= args.expect <= 100:
        raise BadInput(f"--expect {args.expect}: a canary weight is 0..100")
    return RolloutSpec(steps=steps, replicas=args.replicas, min_pods=args.min_pods, routing=args.routing,
                       router=args.router, hold_seconds=args.hold, availability_control=args.availability_control == "on",
                       rollback_via=args.rollback_via, scale_down_delay=args.scale_down_delay)


def cmd_probe(args) -> int:
    spec = _probe_spec(args)
    version = _one_version(args.controller)
    reports_folder()
    cl = EmbeddedCluster(log=_progress)
    out_dir = config.reports_dir() / "probes" / new_run_id()
    with SignalGuard() as guard:
        try:
            cl.hold("drills probe")       # until the probe ends: nobody replaces the cluster under it
            cl.up(version)
            # both ReplicaSets at full size at once (a deploy, the rollback), a tenth more for the surge
            cl.ensure_pod_room(math.ceil(2.2 * max(spec.replicas, args.scale_out or 0)))
            api = cl.api_client()
            ns = make_namespace(api, namespace_name("probe"))
        except ClusterInputError as e:
            raise BadInput(str(e).splitlines()[0])
        except ClusterError as e:
            err(str(e))
            return EXIT_FAIL
        except Interrupted as e:
            guard.quiet()
            err(f"probe {e} before its Rollout existed")
            return EXIT_INCONCLUSIVE
        try:    # the cluster's processes watched: a probe without its controller or releaser stops at once
            st = cl.status()
            with Watchdog(guard, [processes_alive(cluster_processes(st))]), external_metrics_for(
                    cl, api, args.scale_out is not None and args.scale_out_by != "subresource", _progress) as metrics:
                obs, _ = run_probe(api, ns, spec, out_dir, version, log=_progress, audit_log=st.get("audit_log"),
                                   release=args.release, rollback_timeout=args.rollback_timeout,
                                   controller_log=controller_log_of(st), scale_out_to=args.scale_out,
                                   hpa_metrics=metrics)
        except ExternalMetricsError as e:
            err(f"probe: {e}: the HPA cannot read its metric (--scale-out-by subresource writes the scale itself)")
            return EXIT_INCONCLUSIVE
        except Interrupted as e:
            err(f"probe {e}; its namespace {ns} is removed; evidence so far: {out_dir}")
            return EXIT_INCONCLUSIVE
        finally:
            guard.quiet()
            if not args.keep_namespace:
                drop_namespace(api, ns)
    reason = obs.inconclusive_reason()
    if args.json:
        print(json.dumps(dict(observation_dict(obs, version, spec.routing, spec.router), inconclusive_reason=reason,
                              steps=args.steps, steps_list=spec.steps, scale_out=obs.extra.get("scale_out")),
                         indent=2))
    else:
        shown = steps_text(spec.steps) if spec.steps else ""
        print(f"controller {version}, {spec.router} routing {spec.routing}, steps [{shown}], replicas {args.replicas}, "
              f"minPodsPerReplicaSet {args.min_pods}")
        print(f"  peak canary weight while the revived ReplicaSet was partial: {obs.peak_canary_weight_while_partial}")
        print(f"  weights written while partial [t, weight, available, target]: {obs.weights_while_partial}")
        print(f"  canary weight series [t, weight]: {obs.canary_weights}")
        print(f"  exposure: {obs.exposure_seconds:.1f}s; inside rollbackWindow: {obs.rollback_in_window} "
              f"({'; '.join(obs.window_evidence) or 'no evidence'})")
        if obs.extra.get("scale_out"):
            print(f"  scale-out while partial: {obs.extra['scale_out']['said']}")
        print(f"  {'timeline' if obs.series else 'evidence'}: {obs.timeline}")
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


def cmd_watch(args) -> int:
    if not args.until_healthy and not args.duration:
        raise BadInput("give --until-healthy or --duration")
    duration = _duration(args.duration) if args.duration else None
    if args.audit_log and not Path(args.audit_log).is_file():
        raise BadInput(f"--audit-log {args.audit_log}: no such file")
    # checked, not created: nothing is written before the kubeconfig, its credentials and the target are
    out = check_output(args.out, "--out", inputs=[*files_of(args.kubeconfig), *([args.audit_log] if args.audit_log
                                                                             else [])])
    kc, ctx = kube.resolve_kubeconfig(args.kubeconfig, args.context)
    api = kube.new_client(kc, ctx)
    audit = args.audit_log or audit_log_for(kc)
    summary = watch_rollout(api, args.namespace, args.rollout, out, duration, args.until_healthy,
                            audit_log=Path(audit) if audit else None, progress=_progress)
    print(json.dumps(summary, indent=2))
    return EXIT_OK if summary["complete"] else EXIT_INCONCLUSIVE


# --- render-diff, report, lanes --------------------------------------------------------------------
def cmd_render_diff(args) -> int:
    fleet = Fleet(args.fleet, args.apps_dir)
    sources = base_sources(args.charts)
    fleet.app(args.app, args.env)                  # the app, its environment and both versions before helm is built
    for version in (args.from_version, args.to_version):
        check_base_version(version, sources)
    try:
        with Helm() as helm:
            d = render_diff(fleet, args.app, args.env, args.from_version, args.to_version, helm, sources=sources)
    except HelmError as e:
        err(str(e))
        return EXIT_FAIL
    print(json.dumps(d.to_dict(), indent=2, default=str) if args.json else d.format())
    return EXIT_OK


def cmd_report(args) -> int:
    return report_command.run(args, log=_progress)


def cmd_scan(args) -> int:
    return scan_command.run(args, log=_progress)


def cmd_alerts(args) -> int:
    return alerts_command.run(args, log=_progress)


def cmd_lanes(args) -> int:
    rows = lanes.describe()
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    for r in rows:
        print(f"{r['key']:<6} {r['title']}\n       data {r['data']}; tests {r['tests']}; versions "
              f"{', '.join(r['versions']) or 'none'}; routers {', '.join(r['routers'])}" + (
                  f"; unverified {', '.join(r['unverified'])}" if r["unverified"] else ""))
    return EXIT_OK


