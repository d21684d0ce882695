"""The `drills` command: every subcommand's arguments, and every error mapped to an exit code.

Exit codes of every drill command: 0 all pass, 1 a fail, 2 bad input or a refused target (nothing mutated),
3 inconclusive (drills.core.errors).  What each subcommand does is drills.commands (main, or a module of its
own).  Nothing in the package imports this module.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import sys
from pathlib import Path

import yaml

from .core import about, config
from . import routers
from .core.errors import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_OK, BadInput, err
from .core.pipes import readers_may_leave
from .core.signals import Interrupted, SignalGuard


# --- the subcommands' bodies (drills.commands) load when one runs: parsing, --help of one command and bad input
# cost no import of the drill machinery (the Kubernetes client, the lanes); the cluster, toolchain and restore
# commands never load it
class _Command:
    """``name`` of drills.commands.main; or ``name`` of a module of its own (``module``), given the progress line."""
    def __init__(self, name: str, module: str | None = None):
        self.name, self.module = name, module

    def __call__(self, args):
        if self.module:
            return getattr(importlib.import_module(f"drills.{self.module}"), self.name)(args, log=_progress)
        from .commands import main as commands
        return getattr(commands, self.name)(args)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class _LazyHelp(argparse.HelpFormatter):
    """Help texts that name the registry's lanes or the machine's default -j: filled in when help is shown."""
    def _get_help_string(self, action):
        text = super()._get_help_string(action) or ""
        if "{lanes}" in text or "{default_lanes}" in text:
            from . import lanes
            text = text.replace("{lanes}", ",".join(lanes.REGISTRY)).replace(
                "{default_lanes}", ",".join(lanes.DEFAULT_LANES))
        if "{jobs}" in text or "{mem_per_leg}" in text:
            from .run import runner
            text = text.replace("{jobs}", str(runner.default_jobs())).replace(
                "{mem_per_leg}", f"{runner.MEM_PER_LEG_GIB:g}")
        return text


class _LazyRawHelp(_LazyHelp, argparse.RawDescriptionHelpFormatter):
    pass


# --- kubectl's habits: -o json|yaml beside --json, --version, --reports-dir anywhere ---------------------------
OUTPUTS = ("json", "yaml")
REPORTS_DIR_HELP = "where run folders go (default: $DRILLS_REPORTS, else ./reports of the working directory)"


def _output(parser: argparse.ArgumentParser) -> None:
    """-o json|yaml beside a command's --json (yaml: the same document)."""
    parser.add_argument("-o", "--output", choices=OUTPUTS, default=None, help="json (as --json) or yaml")


def _reports_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reports-dir", default=argparse.SUPPRESS, metavar="DIR", help=REPORTS_DIR_HELP)


class _Version(argparse.Action):
    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(about.text(about.info()))
        parser.exit(0)


# --- the parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="drills", description="Rollback drills against Argo Rollouts canaries.")
    p.add_argument("--version", action=_Version, help="drills' version, commit and component versions, and exit")
    _reports_dir(p)
    sub = p.add_subparsers(dest="command", required=True)
    versions = ", ".join(config.SUPPORTED_CONTROLLERS)

    tc = sub.add_parser("toolchain", help="build and list the binaries drills runs")
    tcs = tc.add_subparsers(dest="sub", required=True)
    b = tcs.add_parser("build", help="build components from Go modules into the cache")
    b.add_argument("--controller", default=None,
                   help=f"Argo Rollouts version(s), comma-separated, or 'all' (default {config.DEFAULT_CONTROLLER})")
    b.add_argument("--extra", default="", help="optional components: registry,prometheus,kube-state-metrics")
    b.add_argument("-j", "--jobs", type=int, default=None,
                   help="components built at a time (default: DRILLS_BUILD_JOBS, else 2 on two cores or more); "
                        "each still downloads its modules before it takes one of the cache's build slots")
    b.add_argument("--reuse", default=None, metavar="DIR",
                   help="another drills cache (an image builder's cache mount, as the Containerfile uses): a "
                        "component built there the same way (module, version, fingerprint; the same Go and platform; each "
                        "binary's sha256 checked) "
                        "is copied from it instead of being compiled and linked again")
    b.set_defaults(func=_Command("cmd_toolchain_build", "commands.cluster"))
    ls = tcs.add_parser("list", help="what is built and what is supported")
    ls.add_argument("--json", action="store_true")
    _output(ls)
    ls.set_defaults(func=_Command("cmd_toolchain_list", "commands.cluster"))

    rn = sub.add_parser("run", help="the main job: drill legs on embedded clusters into reports/<run-id>, or live mode",
                        formatter_class=_LazyRawHelp,
                        description="A run is a list of legs, one per (controller version, lane, variant).")
    rn.add_argument("--controller", default=None, help=f"version(s), comma-separated, or 'all' ({versions}); "
                                                       f"default {config.DEFAULT_CONTROLLER}; in live mode the live "
                                                       f"controller's version (default: its image tag)")
    rn.add_argument("--lanes", default=None, help="{lanes} or all (default {default_lanes})")
    rn.add_argument("--variant", choices=config.VARIANT_MODES, default=None,
                    help="lane A fixture: the seed's stage shape (default), the prod-shaped one, or both")
    rn.add_argument("--router", default=None,
                    help=f"traffic router(s) the lanes' Rollouts are routed by: {', '.join(routers.NAMES)}, "
                         f"comma-separated, or all (default {routers.DEFAULT}); each lane runs on the routers it names")
    rn.add_argument("--availability-control", choices=["on", "off"], default=None, help="default on")
    rn.add_argument("--rollback-via", choices=["gitops", "undo"], default="gitops")
    rn.add_argument("-j", "--jobs", type=int, default=None,
                    help="legs at a time (default: what the machine holds: 3 per core, at most one per "
                         "{mem_per_leg} GiB of available memory, at most the number of legs; here {jobs})")
    rn.add_argument("--plan", action="store_true", help="print the legs the run would execute and start nothing "
                                                        "(in live mode: what it would do; no connection is opened)")
    rn.add_argument("--json", action="store_true", help="with --plan: JSON")
    _output(rn)
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
    live.add_argument("-n", "--namespace", default=None)
    live.add_argument("--rollout", default=None)
    live.add_argument("--allow-context", action="append", default=[])
    live.add_argument("--sync-paused", action="store_true", help="the Argo CD sync of this app is paused")
    live.add_argument("--dry-run", action="store_true", help="print every mutation, make none")
    live.add_argument("--service-url", default=None,
                      help="load target during the live drill: the stage service's URL (Locust, bounded)")
    live.add_argument("--duration", default=None,
                      help="with --lanes b: how long to watch for the next deploy (e.g. 30m; default 1h)")
    live.add_argument("--allow-other-changes", action="store_true",
                      help="drill even when the rollback target revision differs in more than the application "
                           "container's image (other containers, init containers, pod fields): only that image is "
                           "reverted, the rest is left as it is now (without it the drill refuses, exit 2)")
    live.add_argument("--container", default=None,
                      help="the application container (default: the only container, the one named like the Rollout "
                           "or its app.kubernetes.io/name label, else the only one that is not a known sidecar)")
    _reports_dir(rn)
    rn.set_defaults(func=_Command("cmd_run"))

    uc = sub.add_parser("upgrade-check", formatter_class=_LazyRawHelp,
                        help="a go/no-go for a controller upgrade: the same legs on a baseline and a candidate, "
                             "every row classified",
                        description="Runs the same legs on the baseline (--from) and the candidate (--to, or "
                                    "--to-binary for a controller you built), then pairs every (lane, step, "
                                    "assertion) row and classifies it: same, improved, regressed, changed, new, gone "
                                    "(by each assertion's declared direction, fixtures/upgrade/directions.yaml).\n"
                                    "Exit: 0 nothing regressed and no new hazard, 1 something regressed or the "
                                    "candidate shows a hazard the baseline lacks (whatever its class; named in the "
                                    "first lines), 3 a leg or pair inconclusive, 2 bad input.")
    uc.add_argument("--from", dest="from_", default=None, metavar="V",
                    help=f"the baseline release (default {config.DEFAULT_CONTROLLER})")
    uc.add_argument("--to", default=None, metavar="V", help="the candidate release")
    uc.add_argument("--to-binary", default=None, metavar="PATH", help="the candidate: a rollouts-controller you built")
    uc.add_argument("--source", default=None, help="source tree of --to-binary (its CRDs, its branch lines)")
    uc.add_argument("--crds", default=None, help="CRD folder of --to-binary")
    uc.add_argument("--lanes", default=None, help="{lanes} or all (default all)")
    uc.add_argument("--variant", choices=config.VARIANT_MODES, default="stage")
    uc.add_argument("-j", "--jobs", type=int, default=None, help="legs at a time (default as for drills run)")
    uc.add_argument("--runs", nargs="+", default=None, metavar="RUN_DIR",
                    help="classify rows already recorded in these run folders; run nothing")
    uc.add_argument("--json", action="store_true", help="the classification as JSON (upgrade.json)")
    _output(uc)
    _reports_dir(uc)
    uc.add_argument("--keep-cluster", action="store_true", help="leave the embedded clusters up afterwards")
    uc.set_defaults(func=_Command("cmd_upgrade_check"))

    pr = sub.add_parser("probe", help="one rollback inside rollbackWindow for any step list, on a fresh namespace")
    pr.add_argument("--steps", required=True, help='e.g. "5,pause:10s,100" (pause = indefinite); "none" or "" for '
                                                   "steps: []")
    pr.add_argument("--replicas", type=int, default=2)
    pr.add_argument("--min-pods", type=int, default=1, help="minPodsPerReplicaSet")
    pr.add_argument("--router", choices=list(routers.NAMES), default=routers.DEFAULT,
                    help=f"the traffic router the probe Rollout is routed by (default {routers.DEFAULT})")
    pr.add_argument("--routing", choices=["subset", "host"], default=None,
                    help="Istio: subsets of one Service (subset, default) or canaryService/stableService (host); "
                         "nginx routes by host only")
    pr.add_argument("--controller", default=None)
    pr.add_argument("--hold", type=float, default=config.DEFAULT_HOLD_SECONDS,
                    help="seconds each revived pod is held before it may turn Ready (default 15)")
    pr.add_argument("--availability-control", choices=["on", "off"], default="on")
    pr.add_argument("--rollback-via", choices=["gitops", "undo"], default="gitops")
    pr.add_argument("--scale-down-delay", type=int, default=5, help="scaleDownDelaySeconds of the probe Rollout")
    pr.add_argument("--release", choices=[config.PROBE_AFTER_WINDOW, config.PROBE_ONE_BY_ONE],
                    default=config.PROBE_AFTER_WINDOW,
                    help="the revived pods: one at a time until the weight decision is on record, then the rest "
                         "together (after-window, default), or one at a time throughout (one-by-one)")
    pr.add_argument("--rollback-timeout", type=float, default=None,
                    help="seconds the rollback may take to settle (default: scaled with the shape); when it runs "
                         "out the probe is inconclusive (exit 3) with its evidence")
    pr.add_argument("--expect", type=int, default=None, help="exit 1 unless the peak equals this weight")
    pr.add_argument("--scale-out", type=int, default=None, metavar="N",
                    help="once the rollback's weight decision is on record, scale the Rollout to N replicas through "
                         "its scale subresource (as an autoscaler does) while the revived pods are held, and report "
                         "what the controller did with the revived ReplicaSet's size and the weight")
    pr.add_argument("--scale-out-by", choices=["hpa", "subresource"], default=None,
                    help="who writes the scale-out: the cluster's real HPA controller, on an external metric the "
                         "drill raises (hpa, default), or the drill itself through the scale subresource")
    pr.add_argument("--keep-namespace", action="store_true")
    pr.add_argument("--json", action="store_true")
    _output(pr)
    _reports_dir(pr)
    pr.set_defaults(func=_Command("cmd_probe"))

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
    wa.set_defaults(func=_Command("cmd_watch"))

    rs = sub.add_parser("restore", help="finish a restore from a drill's journal")
    rs.add_argument("--journal", required=True)
    rs.add_argument("--allow-context", action="append", default=[])
    rs.add_argument("--release-lease", action="store_true",
                    help="give the Rollout up without restoring it: remove the lease this journal's drill left "
                         "(the way out when a restore refuses)")
    rs.set_defaults(func=_Command("cmd_restore", "commands.restore"))

    rd = sub.add_parser("render-diff", help="render an app with two base chart versions and list what changes")
    rd.add_argument("--app", required=True, help="the app (release name or Application name)")
    rd.add_argument("--env", required=True, help="environment: the apps/<env>.yaml list it is declared in")
    rd.add_argument("--from", dest="from_version", required=True, help="base chart version to render first")
    rd.add_argument("--to", dest="to_version", required=True, help="base chart version to compare with")
    rd.add_argument("--json", action="store_true", help="print JSON")
    _output(rd)
    rd.add_argument("--fleet", default=None, help="fleet folder (default: fixtures/fleet)")
    rd.add_argument("--apps-dir", default="apps", help="folder of the per-environment app lists, in the fleet")
    rd.add_argument("--charts", default=None, help="base chart source folders (default: fixtures/charts/base)")
    rd.set_defaults(func=_Command("cmd_render_diff"))

    rp = sub.add_parser("report", help="merge run folders into reports/matrix.html and reports/matrix.md; print the "
                                       "answer per controller",
                        description="Render each run's report and merge run folders into a controller-version x "
                                    "assertion matrix, then print the headline per controller version (does the "
                                    "prescription hold?) and the rows that fail or show a hazard. Default: every "
                                    "run folder under the reports directory. Entries that are not run folders are "
                                    "ignored. Exit: the gate of the run it reports, as that run exited: 0 all pass, "
                                    "1 a fail, 3 inconclusive (a row whose evidence is missing or fails, a leg "
                                    "missing, unfinished or stopped: each named first, INCOMPLETE: ...), 2 bad input "
                                    "(no such folder, an unreadable ledger or run.json, no run folder among those "
                                    "given). Several folders: the worst of them (2 > 1 > 3 > 0); an upgrade check's "
                                    "folder: its classification's exit; --merge: the merged run's, every leg of the "
                                    "plan expected; no RUN_DIR: the rows the matrix shows (the newest per controller "
                                    "and assertion).")
    rp.add_argument("run_dir", nargs="*", metavar="RUN_DIR", help="run folders (reports/<run-id>)")
    rp.add_argument("--merge", action="store_true",
                    help="merge shard run folders into one run folder (as if one machine had run them)")
    rp.add_argument("--json", action="store_true",
                    help="print the headline per controller and the failing or hazard rows as JSON")
    _output(rp)
    _reports_dir(rp)
    rp.set_defaults(func=_Command("cmd_report"))

    ln = sub.add_parser("lanes", help="the registered lanes: key, title, data folder, versions with expectations")
    ln.add_argument("--json", action="store_true")
    _output(ln)
    ln.set_defaults(func=_Command("cmd_lanes"))

    vr = sub.add_parser("version", help="drills' version, commit, where its data, reports and cache are, and the "
                                        "versions of the Go components it builds")
    vr.add_argument("--json", action="store_true")
    _output(vr)
    vr.set_defaults(func=about.cmd_version)

    sc = sub.add_parser("scan", help="predict every Rollout's rollback exposure; lint it in CI; --verify on the real "
                                     "controller",
                        description="Predict every Rollout's exposure to a rollback inside rollbackWindow (the peak "
                                    "canary weight while the revived ReplicaSet is partial, and the pods that carry "
                                    "it), lint the last rung, and give the fix wave.  Inputs: manifests, a fleet "
                                    "layout rendered with helm, live clusters (read-only).",
                        epilog="A folder with a Chart.yaml is a chart: it is rendered with helm (its values.yaml, "
                               "then --values) and its render scanned, never its templates read as YAML.  A file or "
                               "Rollout that cannot be read (not YAML, a field of the wrong type) is named with its "
                               "file and line, the scan goes on with the rest and exits 2 at the end.  Exit: 0 "
                               "clean, 1 a Rollout matched --fail-on (or a verification failed), 2 unreadable input "
                               "or no Rollout found, 3 a verification was inconclusive.")
    sc.add_argument("inputs", nargs="*", help="manifest files, folders or - (a helm template / kustomize / kubectl get "
                                              "-o yaml stream on standard input)")
    sc.add_argument("--fleet", default=None, nargs="?", const=str(config.fixtures_dir() / "fleet"), metavar="DIR",
                    help="a fleet layout (charts, value layers, apps/<env>.yaml) to render with helm; without DIR "
                         "the built-in fixture fleet")
    sc.add_argument("--env", default=None, help="fleet environments, comma-separated (default: every apps/<env>.yaml)")
    sc.add_argument("--app", action="append", default=[], help="only this fleet app (repeatable)")
    sc.add_argument("--charts", default=None, help="base chart source folders of the fleet (default: "
                                                   "fixtures/charts/base)")
    sc.add_argument("--values", action="append", default=[], metavar="FILE",
                    help="a values file for the charts among the inputs (folders with a Chart.yaml), after their own "
                         "values.yaml (repeatable, in order)")
    sc.add_argument("--kubeconfig", default=None, help="read Rollouts from live clusters (read-only)")
    sc.add_argument("--context", default=None, help="the kubeconfig context (default: the current one)")
    sc.add_argument("--all-contexts", action="store_true", help="every context of the kubeconfig")
    sc.add_argument("-n", "--namespace", default=None, help="live: only this namespace's Rollouts (default: every "
                                                            "namespace)")
    sc.add_argument("-A", "--all-namespaces", action="store_true", help="live: every namespace (the default)")
    sc.add_argument("-l", "--selector", default=None, help="live: only the Rollouts this label selector matches "
                                                           "(e.g. team=payments,tier!=batch)")
    sc.add_argument("--controller", default=None,
                    help=f"controller version(s) for manifests and fleet renders, comma-separated or 'all' (default "
                         f"{config.DEFAULT_CONTROLLER}; several: every Rollout is predicted on each, as before an "
                         f"upgrade); a cluster's own version is read from its argo-rollouts Deployment, unless "
                         f"--controller is given: it overrides what the cluster shows")
    sc.add_argument("--source", default=None, help="Argo Rollouts source tree of a user-built controller: the rules "
                                                   "are read from it instead of the release's module")
    sc.add_argument("--json", action="store_true", help="print JSON (one object per Rollout, the summary, clusters)")
    _output(sc)
    sc.add_argument("--sarif", default=None, metavar="FILE", help="also write SARIF 2.1.0 for code scanning")
    sc.add_argument("--junit", default=None, metavar="FILE", help="also write JUnit XML")
    sc.add_argument("--fail-on", default=None,
                    help="exit 1 when a Rollout has a lint error (lint) or is predicted exposed (exposed), "
                         "comma-separated, or none to only report. Default: lint,exposed, so a CI job that runs the "
                         "scan fails on what it finds unless it says otherwise")
    sc.add_argument("--allow-empty", action="store_true",
                    help="exit 0 when no Rollout is found (default: exit 2, since a mistyped path or an empty render "
                         "in CI must not pass as a clean scan)")
    sc.add_argument("--stdin-name", default=None, metavar="PATH",
                    help="the repository path of the manifests read from '-' (standard input), for messages and "
                         "SARIF locations (default: stdin.yaml in SARIF, <stdin> in messages)")
    sc.add_argument("--verify", type=int, default=0, metavar="K",
                    help="probe up to K distinct shapes on the real controller (embedded cluster) and record predicted "
                         "vs observed in the ledger (lane scan) of a run folder, with its report")
    sc.add_argument("--workers", type=int, default=None, help="parallel helm renders and manifest parsers (default: "
                                                              "CPU count)")
    _reports_dir(sc)
    sc.set_defaults(func=_Command("run", "commands.scan"))

    al = sub.add_parser("alerts", help="Prometheus alerting rules for the Rollouts it reads: a rollback stuck at the "
                                       "remaining rung, an aborted Rollout",
                        description="Write Prometheus alerting rules (a rules file promtool reads, or a "
                                    "PrometheusRule manifest) for every Rollout, read as drills scan reads them: "
                                    "RolloutStuckAtRemainingRung (the weight below 100 at the end of the steps while "
                                    "pods are unavailable, for longer than the Rollout's expected ramp with its "
                                    "margin) and RolloutAborted.  Standard output unless --out.")
    al.add_argument("inputs", nargs="*", help="manifest files, folders or - (a helm template / kustomize / kubectl get "
                                              "-o yaml stream on standard input)")
    al.add_argument("--fleet", default=None, help="a fleet layout to render with helm (as drills scan --fleet)")
    al.add_argument("--env", default=None, help="fleet environments, comma-separated (default: every one; a rules "
                                                "file is for one cluster, so give one)")
    al.add_argument("--app", action="append", default=[], help="only this fleet app (repeatable)")
    al.add_argument("--stdin-name", default=None, metavar="PATH", help="the path the manifests on '-' come from")
    al.add_argument("--out", default=None, metavar="FILE", help="write the rules here (never over an input)")
    al.add_argument("--format", default="rules", choices=["rules", "prometheusrule"],
                    help="a plain rules file (promtool check rules reads it) or a PrometheusRule manifest")
    al.add_argument("--readiness", default="30s",
                    help="the stated readiness time of one pod: scheduled, pulled, started, Ready (default 30s)")
    al.add_argument("--margin", type=float, default=0.5,
                    help="how much longer than the expected ramp the alert waits, as a fraction (default 0.5)")
    al.add_argument("--pods-at-once", type=int, default=None,
                    help="pods that turn Ready at a time (default: every pod of a wave together)")
    al.add_argument("--abort-for", default="1m", help="for: of RolloutAborted (default 1m)")
    al.add_argument("--interval", default=None, help="evaluation interval of the rule groups (default: Prometheus' "
                                                     "global one)")
    al.add_argument("--ksm-config", default=None, metavar="FILE",
                    help="also write the kube-state-metrics custom-resource-state config the rules need")
    al.set_defaults(func=_Command("run", "alerts.command"))

    cl = sub.add_parser("cluster", help="the embedded default cluster")
    cls = cl.add_subparsers(dest="sub", required=True)
    up = cls.add_parser("up", help="start (or reuse) the embedded cluster with controller V")
    up.add_argument("--controller", default=None, help=f"Argo Rollouts version (default {config.DEFAULT_CONTROLLER})")
    up.add_argument("--no-build", action="store_true", help="refuse (exit 2) instead of building missing binaries")
    up.add_argument("--api-port", type=int, default=None, help="kube-apiserver port on 127.0.0.1 (default: a free one)")
    up.set_defaults(func=_Command("cmd_cluster_up", "commands.cluster"))
    stp = cls.add_parser("status", help="is it up, which controller, where")
    stp.add_argument("--json", action="store_true")
    _output(stp)
    stp.set_defaults(func=_Command("cmd_cluster_status", "commands.cluster"))
    dn = cls.add_parser("down", help="stop every process of the cluster")
    dn.set_defaults(func=_Command("cmd_cluster_down", "commands.cluster"))
    return p


def main(argv: list[str] | None = None) -> int:
    with readers_may_leave():       # `drills ... | head`, `2>&1 | head`: the command ends as it would have
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return EXIT_BAD_INPUT if e.code not in (0, None) else EXIT_OK
    try:
        _apply_globals(args)
        with SignalGuard():     # SIGINT and SIGTERM end every command the same way, whatever it inherited
            return _dispatch(args)
    except BadInput as e:
        err(str(e))
        return EXIT_BAD_INPUT
    except (KeyboardInterrupt, Interrupted) as e:
        text = str(e)
        err(text if text.startswith("interrupted") else f"interrupted ({text})" if text else "interrupted")
        return EXIT_INCONCLUSIVE
    except Exception as e:   # a failure nobody anticipated: one line, the traceback on request
        if os.environ.get("DRILLS_DEBUG"):
            raise
        err(f"{type(e).__name__}: {' '.join(str(e).split())[:400]} (set DRILLS_DEBUG=1 for the traceback)")
        return EXIT_FAIL


# the commands that may start, use or take down an embedded cluster (scan only with --verify)
CLUSTER_COMMANDS = frozenset({"cluster", "run", "upgrade-check", "probe", "scan"})


def _apply_globals(args) -> None:
    """--reports-dir (for this process and every child: DRILLS_REPORTS), -o json (as --json), fixtures/ paths."""
    where = getattr(args, "reports_dir", None)
    if where is not None:
        path = Path(where).expanduser().absolute()
        if path.exists() and not path.is_dir():
            raise BadInput(f"--reports-dir {where}: not a folder")
        os.environ["DRILLS_REPORTS"] = str(path)
    if getattr(args, "output", None):
        args.json = True
    if getattr(args, "controller", None) is not None and not args.controller.strip():
        raise BadInput(f"--controller {args.controller!r}: give a version (or 'all'), or leave the flag out for the "
                       f"default ({config.DEFAULT_CONTROLLER}); an empty value is an unset variable, never the default")
    if args.command in CLUSTER_COMMANDS and (args.command != "scan" or getattr(args, "verify", None)):
        config.cluster_name()                       # a name that becomes a path: checked before anything is touched
        from .toolchain.locks import build_jobs, build_priority
        build_jobs()                                # and the settings of the builds it may start
        build_priority()
    for name in ("fleet", "charts"):          # fixtures/... outside a checkout: the built-in data
        if getattr(args, name, None):
            setattr(args, name, config.data_path(getattr(args, name)))


def _dispatch(args) -> int:
    """The subcommand; with -o yaml its JSON document comes out as YAML (anything else passes as it came)."""
    if getattr(args, "output", None) != "yaml":
        return args.func(args)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            code = args.func(args)
    except BaseException:
        sys.stdout.write(buf.getvalue())
        raise
    text = buf.getvalue()
    try:
        doc = json.loads(text)
    except ValueError:
        sys.stdout.write(text)
    else:
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True,
                                        width=4096))
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
