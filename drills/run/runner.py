"""The main job: a run's legs (drills.run.legs) executed on embedded clusters, concurrently, into one run folder.

One embedded cluster per controller version (named apart: ``<base>-v1-8-2``, ports free, all on 127.0.0.1),
brought up by the runner before the first leg of that version and taken down after its last one.  Each leg is
one pytest process over its lane's folder (lanes/<key>/), in namespaces of its own with its own holds, recorder
and load; every leg appends to the run's ledger (a file lock makes concurrent writers safe).  ``jobs`` legs run
at once.  Binaries build in the background while the legs whose binaries are ready already run.  The console
shows each leg's start and end and, every half minute, what runs and which leg is the slowest.

However the run ends it stops what it started.  Each leg's pytest runs in a process group of its own (a
signal to the run's group reaches the run, never a leg directly) and dies with the run; on SIGINT or SIGTERM the
run asks every running leg to stop (SIGINT: its teardown removes its namespaces, load and mesh), SIGKILLs the
group of a leg still running after LEG_STOP_GRACE_S, takes down the clusters it started, and writes run.json
(``interrupted``, the signal, each leg's state: done, interrupted or not started) and the report; exit 3.  A
second signal during that stops at once and says what is left.  A run killed outright (SIGKILL) cannot clean
up: its clusters carry its mark (drills.cluster.remains), and the next run or `cluster up` takes them down.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..core import config
from . import legs as legsmod
from ..cluster import ClusterError, ClusterInputError, EmbeddedCluster, remains
from ..core.errors import EXIT_INCONCLUSIVE, BadInput, combine_exit_codes
from ..lanes import REGISTRY
from ..record.ledger import FAIL, INCONCLUSIVE, PASS, new_run_id, read_rows
from .legs import Leg
from ..core.procs import die_with_parent, start_time
from .run_stop import DONE, INTERRUPTED, NOT_STARTED, Stopping, interrupted_by, killed, record_unfinished  # noqa: F401
from ..core.signals import Interrupted, SignalGuard
from ..reporting.report import write_matrix, write_run_report
from .run_folder import MISSING_SHOWN, link_latest, merge, verdict  # noqa: F401 (drills.run.runner's names)
from ..toolchain import BuildError, Toolchain, components_for

STATUS_EVERY_S = 30.0
MEM_PER_LEG_GIB = 1.5        # a cluster (~0.9 GiB) shared by its legs, each leg's pytest, mesh, Locust, Prometheus


def default_jobs(n_legs: int | None = None) -> int:
    """What the machine can hold: three legs per core (they mostly wait on the controller and on holds), and
    no more than the memory holds at MEM_PER_LEG_GIB each; at least 1, at most the number of legs."""
    cores = os.cpu_count() or 1
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / 2 ** 30
    except (ValueError, OSError):
        mem_gib = 4.0
    j = max(1, min(3 * cores, int(mem_gib // MEM_PER_LEG_GIB)))
    return min(j, n_legs) if n_legs else j


def cluster_name(version: str, versions: int = 2) -> str:
    """The embedded cluster of one controller version in a run: the default cluster's name when the run has one
    version (so `drills cluster status` finds a kept cluster), else that name plus the version."""
    base = config.cluster_name()
    if versions == 1 and "-to-" not in version:     # a swap's cluster is its own always: its controller is replaced
        return base
    return f"{base}-{re.sub(r'[^a-z0-9]+', '-', version.lower()).strip('-')}"


def say(message: str) -> None:
    """One progress line on stderr, written whole: legs' threads log at once."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


KEEP_LOG_BYTES = 2 << 20       # the last 2 MiB of each log


def keep_cluster_logs(cluster: EmbeddedCluster, dest: Path) -> Path:
    """Copy the tail of every log of an embedded cluster (the controller, the releaser, the control plane) into
    ``dest`` before the cluster is taken down."""
    dest.mkdir(parents=True, exist_ok=True)
    for folder in (cluster.folder / "logs", cluster.kwok_workdir / "clusters" / cluster.name / "logs"):
        for log in sorted(folder.glob("*.log")) if folder.is_dir() else []:
            if log.name == "audit.log":
                continue
            with open(log, "rb") as fh:
                fh.seek(max(0, log.stat().st_size - KEEP_LOG_BYTES))
                (dest / log.name).write_bytes(fh.read())
    return dest


def leg_rows(rows: list[dict], leg: Leg, binary: "Binary | None" = None) -> list[dict]:
    """The ledger rows one leg wrote: the rows naming it (``leg``); a row recorded without, by its lane and its
    controller (a user-built one by its sha256)."""
    def mine(r: dict) -> bool:
        if r.get("leg"):
            return r["leg"] == leg.id
        if r.get("lane") != leg.lane or (r.get("router") or "istio") != leg.router:
            return False
        if binary is not None and binary.sha256:
            return r.get("controller_sha256") == binary.sha256
        if leg.label:
            return str(r.get("controller_version", "")).startswith(leg.label)
        return r.get("controller_version") == leg.controller and not r.get("controller_sha256")
    return [r for r in rows if mine(r)]


@dataclass
class Binary:
    """A user-built controller: the release its cluster stands in for, and how to start it."""
    path: Path
    crds: Path
    reported: str
    label: str
    source: Path | None = None
    release: str = config.DEFAULT_CONTROLLER
    crd_warning: str | None = None
    sha256: str | None = None

    def env(self) -> dict:
        """What a leg's pytest needs to find this controller (the plugin's --controller-binary, --crds, --source)."""
        out = {"DRILLS_CONTROLLER_BINARY": str(self.path), "DRILLS_CRDS": str(self.crds)}
        if self.source:
            out["DRILLS_SOURCE"] = str(self.source)
        return out


class LegStopped(Exception):
    """A leg the run's stop reached before its pytest started."""


@dataclass
class LegResult:
    leg: Leg
    rc: int = -1
    started: float = 0.0
    ended: float = 0.0
    log: Path | None = None
    error: str | None = None
    state: str = DONE              # or INTERRUPTED: it ran when the run was stopped
    proc: subprocess.Popen | None = None
    proc_started: int | None = None      # the pytest's start time (the proof its group is still the leg's)

    @property
    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started


@dataclass
class Run(Stopping):
    legs: list[Leg]
    run_dir: Path
    jobs: int
    env: dict = field(default_factory=dict)
    binaries: dict[str, Binary] = field(default_factory=dict)    # leg label -> the user-built controller
    keep_cluster: bool = False
    log: Callable[[str], None] = lambda m: say(m)
    durations: dict[str, float] | None = None    # leg id -> seconds the plan used (None: the cache's)

    def __post_init__(self):
        self.run_id = self.run_dir.name
        self.results: dict[str, LegResult] = {}
        self.lock = threading.Lock()
        self.changed = threading.Event()
        self.built: set[str] = set()
        self.build_error: str | None = None
        self.clusters: dict[str, EmbeddedCluster] = {}
        self.cluster_locks = {self._key(x): threading.Lock() for x in self.legs}
        self.left = {k: sum(1 for x in self.legs if self._key(x) == k) for k in self.cluster_locks}
        self.failed_clusters: set[str] = set()
        self.stopping = threading.Event()          # a signal came: no leg starts, running ones are stopped
        self.interrupted: str | None = None         # the signal's name
        self.threads: list[threading.Thread] = []
        self.remains: list[str] = []                # what an interrupted run could not take away
        self.stopped_at = 0.0
        # legs start longest first (the plan's durations, else the lane's estimate; ties in plan order): a long leg
        # started last runs alone at the end while the other slots stand idle.  At most `jobs` clusters are up at
        # once (MEM_PER_LEG_GIB counts a cluster per leg): a leg whose cluster is not up waits while that many are
        durations = legsmod.read_durations() if self.durations is None else self.durations
        self.start_order = [x for _, _, x in sorted((-legsmod.estimate(x, durations), i, x)
                                                    for i, x in enumerate(self.legs))]
        self.opened: set[str] = set()               # clusters a leg has started on

    @staticmethod
    def _key(leg: Leg) -> str:
        """The cluster a leg runs on: one per release, one per user-built controller, one per swap (its controller is
        replaced under it)."""
        return f"{leg.controller}-to-{leg.to}" if leg.to else leg.label or leg.controller

    def _binary(self, leg: Leg) -> Binary | None:
        return self.binaries.get(leg.label) if leg.label else None

    # --- binaries, in the background -----------------------------------------------------------------------
    def _versions(self, leg: Leg) -> list[str]:
        return [] if self._binary(leg) else [leg.controller, *([leg.to] if leg.to else [])]

    def _needs(self, leg: Leg) -> set[str]:
        comps = components_for(self._versions(leg), list(REGISTRY[leg.lane].extras))
        return {c.key for c in comps if c.name != "helm"} | ({"helm@" + config.HELM_VERSION}
                                                            if REGISTRY[leg.lane].uses_helm else set())

    def _build_all(self) -> None:
        order = []
        for leg in self.start_order:            # the components of the legs that start first, first
            for c in components_for(self._versions(leg), list(REGISTRY[leg.lane].extras)):
                if c.key not in [o.key for o in order]:
                    order.append(c)
        def built(comp) -> None:
            with self.lock:
                self.built.add(comp.key)
            self.changed.set()
        try:
            # at DRILLS_BUILD_PRIORITY (normal unless said: a leg that waits for a component must not wait for a
            # build the other legs starve)
            tc = Toolchain(log=self.log)
            tc.ensure(order, on_built=built)
        except (BuildError, BadInput) as e:
            self.build_error = str(e)
            self.changed.set()

    def _ready(self, leg: Leg) -> bool:
        return self._needs(leg) <= self.built

    # --- clusters ------------------------------------------------------------------------------------------
    def _cluster(self, leg: Leg) -> EmbeddedCluster:
        key, binary = self._key(leg), self._binary(leg)
        with self.cluster_locks[key]:
            c = self.clusters.get(key)
            if c is None:
                if self.stopping.is_set():
                    raise LegStopped("the run was interrupted before its cluster started")
                c = EmbeddedCluster(cluster_name(key, len(self.cluster_locks)), log=self.log)
                kw = {}
                if binary:
                    kw = {"controller_binary": binary.path, "crds_dir": binary.crds,
                          "reported_version": binary.reported, "crd_warning": binary.crd_warning}
                self.log(f"run {self.run_id}: cluster {c.name} for "
                         + (f"user-built {binary.label} ({binary.path}, sha256 {binary.sha256}), CRDs from {binary.crds}"
                            if binary else key))
                c.hold(f"drills run {self.run_id}")     # until its last leg is done
                if not self.keep_cluster:                # marked as this run's before anything starts
                    remains.mark(c.name, self.run_id)
                try:
                    c.up(leg.controller, build=False, **kw)
                except BaseException:       # nothing of this run's is left up (another's cluster is not ours)
                    remains.unmark(c.name)
                    raise
                self.clusters[key] = c
            return c

    def _leg_done(self, leg: Leg, failed: bool = False) -> None:
        key = self._key(leg)
        with self.cluster_locks[key]:
            self.left[key] -= 1
            if failed:
                self.failed_clusters.add(key)
            if self.left[key] == 0 and not self.keep_cluster and key in self.clusters:
                c = self.clusters.pop(key)
                if key in self.failed_clusters:      # a failed leg's cluster: its logs outlive it
                    try:
                        kept = keep_cluster_logs(c, self.run_dir / "clusters" / c.name)
                        self.log(f"run {self.run_id}: a leg on {c.name} failed; its logs are kept in {kept}")
                    except OSError as e:
                        self.log(f"run {self.run_id}: the logs of {c.name} could not be kept: {e}")
                self._take_down(c)

    def _take_down(self, c: EmbeddedCluster) -> None:
        c.release()
        left_up = "left_up" in c.down(quiet=True, if_unused=True)
        if not left_up:
            remains.unmark(c.name)
        if self.stopping.is_set():
            self.log(f"run {self.run_id}: cluster {c.name} " + ("left up: somebody else holds it" if left_up
                                                                else "taken down"))

    # --- one leg ----------------------------------------------------------------------------------------------
    def _run_leg(self, leg: Leg, res: LegResult) -> None:
        try:
            cluster = self._cluster(leg)
            binary = self._binary(leg)
            res.log = self.run_dir / "legs" / f"{leg.slug}.log"
            res.log.parent.mkdir(parents=True, exist_ok=True)
            # the plugin asked for by name (it is opt-in); a built-in lane's tests run from the data root, so an
            # installed drills reads the lanes' conftest.py its package carries beside them
            tests, root = REGISTRY[leg.lane].tests_dir(), config.data_root()
            cmd = [sys.executable, "-m", "pytest", "-p", "no:locust", "-p", "no:cacheprovider", "-p",
                   "drills.pytest_plugin", "-q", "-rfE", "--no-header", "--drills-controller", leg.controller,
                   "--drills-lane-a-variant", leg.variant, "--drills-router", leg.router,
                   *(["--drills-swap-to", leg.to] if leg.to else []),
                   "--drills-run-dir", str(self.run_dir), "--drills-run-id", self.run_id, "--drills-leg", leg.id,
                   f"--junitxml={self.run_dir / f'junit-{leg.slug}.xml'}",
                   *([f"--rootdir={root}"] if tests.is_relative_to(root) else []), str(tests)]
            # the leg and run its rows and recordings name (drills.record.evidence: a row's evidence must be its own)
            env = dict(os.environ, **self.env, **(binary.env() if binary else {}), DRILLS_CLUSTER=cluster.name,
                       DRILLS_KEEP_CLUSTER="1", DRILLS_LEG=leg.id, DRILLS_RUN_ID=self.run_id)
            # a run started from inside a pytest-xdist worker: the leg's pytest is no worker (a worker's name
            # would rename the leg's cluster to one nobody started)
            for name in [k for k in env if k.startswith("PYTEST_XDIST_")]:
                env.pop(name)
            for name in ("DRILLS_CONTROLLER_BINARY", "DRILLS_CRDS", "DRILLS_SOURCE"):
                if binary is None:         # a release's leg never inherits a user-built controller's settings
                    env.pop(name, None)
            with open(res.log, "w") as out, self.lock:
                if self.stopping.is_set():
                    raise LegStopped("the run was interrupted before the leg's pytest started")
                # a group of its own: only the run signals it (SIGINT first, so its teardown runs)
                res.proc = subprocess.Popen(cmd, cwd=str(config.project_root()), env=env, stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, preexec_fn=die_with_parent)
                res.proc_started = start_time(res.proc.pid)
            res.rc = res.proc.wait()
        except LegStopped as e:
            res.error = str(e)
        except (ClusterError, ClusterInputError, BadInput) as e:
            res.error = f"cluster for {leg.label or leg.controller}: {e}"
            res.rc = 2 if isinstance(e, (ClusterInputError, BadInput)) else 1
        except Exception as e:   # a leg never takes the run down: it fails with its reason
            res.error = f"{type(e).__name__}: {e}"
            res.rc = 1
        finally:
            res.ended = time.monotonic()
            # a leg's time is kept only when its pytest ran to its end (exit 0: passed, 1: tests failed): a leg
            # killed, interrupted or refused ends early, and its short time would start it last in the next run
            if res.state == DONE and res.rc in (0, 1) and res.error is None and not self.stopping.is_set():
                legsmod.record_duration(leg, res.seconds)
            self._leg_done(leg, failed=res.rc != 0 and res.state == DONE)
            self._say_done(res)
            self.changed.set()

    def _say_done(self, res: LegResult) -> None:
        rows = leg_rows(read_rows(self.run_dir / "ledger.json"), res.leg, self._binary(res.leg))
        counts = {v: sum(1 for r in rows if r["verdict"] == v) for v in (PASS, FAIL, INCONCLUSIVE)}
        self.log(f"leg {res.leg.id}: done in {res.seconds:.0f}s (pytest exit {res.rc}; rows so far for its lane and "
                 f"version: {counts[PASS]} pass, {counts[FAIL]} fail, {counts[INCONCLUSIVE]} inconclusive)"
                 + (f" — {res.error}" if res.error else "") + (f"; log {res.log}" if res.rc else ""))

    def _status(self) -> None:
        now = time.monotonic()
        running = [r for r in self.results.values() if r.started and not r.ended]
        done = [r for r in self.results.values() if r.ended]
        waiting = len(self.legs) - len(running) - len(done)
        slowest = max(self.results.values(), key=lambda r: r.seconds if r.started else -1, default=None)
        self.log(f"run {self.run_id}: {len(running)} leg(s) running "
                 f"[{', '.join(f'{r.leg.id} {now - r.started:.0f}s' for r in running)}], {len(done)} done, "
                 f"{waiting} waiting" + (f"; slowest: {slowest.leg.id} ({slowest.seconds:.0f}s)" if slowest else ""))

    # --- the run --------------------------------------------------------------------------------------------
    def execute(self, guard: SignalGuard | None = None) -> dict[str, LegResult]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        builder = threading.Thread(target=self._build_all, name="toolchain", daemon=True)
        builder.start()
        try:
            remains.reap(self.log)    # the clusters of a run killed (SIGKILL) before it could take them down
            self._legs()
            builder.join(timeout=1)
            self._down_all()
        except Interrupted as e:
            self._stop(e, guard)
        return self.results

    def _legs(self) -> None:
        pending = list(self.start_order)
        threads = self.threads
        next_status = time.monotonic() + STATUS_EVERY_S
        while pending or any(t.is_alive() for t in threads):
            with self.lock:
                running = sum(1 for t in threads if t.is_alive())
            for leg in list(pending):
                if running >= self.jobs:
                    break
                if self.build_error:
                    res = self.results[leg.id] = LegResult(leg, rc=1, started=time.monotonic(),
                                                           error=f"binaries did not build: {self.build_error}")
                    res.ended = res.started
                    pending.remove(leg)
                    self._leg_done(leg)
                    continue
                if not self._ready(leg) or not self._may_open(leg):
                    continue
                pending.remove(leg)
                self.opened.add(self._key(leg))
                res = self.results[leg.id] = LegResult(leg, started=time.monotonic())
                self.log(f"leg {leg.id}: start")
                t = threading.Thread(target=self._run_leg, args=(leg, res), name=leg.id, daemon=True)
                t.start()
                threads.append(t)
                running += 1
            self.changed.wait(1.0)
            self.changed.clear()
            if time.monotonic() >= next_status:
                self._status()
                next_status = time.monotonic() + STATUS_EVERY_S

    def _may_open(self, leg: Leg) -> bool:
        """The leg's cluster is up (or coming up), or fewer than `jobs` clusters with legs left are."""
        key = self._key(leg)
        with self.lock:
            up = {k for k in self.opened if self.left[k] > 0}
        return key in up or len(up) < self.jobs

    def _down_all(self) -> None:
        for key in list(self.clusters):
            c = self.clusters.get(key)
            if c is not None and not self.keep_cluster:
                self._take_down(c)
                self.clusters.pop(key, None)

    def _is_leg_row(self, row: dict, results: list[LegResult]) -> bool:
        return any(leg_rows([row], res.leg, self._binary(res.leg)) for res in results)

    def _cluster_names(self) -> list[str]:
        return [cluster_name(key, len(self.cluster_locks)) for key in self.cluster_locks]


def run(plan: list[Leg], jobs: int | None = None, run_dir: Path | None = None, env: dict | None = None,
        binaries: list[Binary] = (), keep_cluster: bool = False, meta: dict | None = None,
        log: Callable[[str], None] | None = None, durations: dict[str, float] | None = None,
        ) -> tuple[int, Path, list[dict]]:
    log = log or say
    keys = {Run._key(x) for x in plan}
    for key in keys:          # every cluster the run will use has a plain name, before anything is made
        config.cluster_name(cluster_name(key, len(keys)))
    run_dir = Path(run_dir or config.reports_dir() / new_run_id())
    run_dir.mkdir(parents=True, exist_ok=True)
    link_latest(run_dir)
    jobs = jobs or default_jobs(len(plan))
    t0 = time.monotonic()
    log(f"run {run_dir.name}: {len(plan)} leg(s), {jobs} at a time")
    r = Run(plan, run_dir, jobs, env or {}, {b.label: b for b in binaries}, keep_cluster, log, durations)
    with SignalGuard() as guard:
        results = r.execute(guard)
        wall = time.monotonic() - t0
        record_unfinished(r)
        (run_dir / "run.json").write_text(json.dumps(dict(
            meta or {}, run_id=run_dir.name, jobs=jobs, wall_s=round(wall, 1), interrupted=bool(r.interrupted),
            signal=r.interrupted, left=r.remains,
            legs=[dict(x.to_dict(), state=results[x.id].state if x.id in results else NOT_STARTED,
                       rc=results[x.id].rc if x.id in results else None,
                       seconds=round(results[x.id].seconds, 1) if x.id in results else 0.0,
                       error=results[x.id].error if x.id in results else None) for x in plan]), indent=1))
    code, _, rows = verdict(run_dir)       # a stopped or never started leg is a gap: inconclusive
    if r.interrupted:
        code = combine_exit_codes(code, EXIT_INCONCLUSIVE)
    try:
        write_run_report(run_dir)
        write_matrix(None, run_dir.parent)
    except Exception as e:  # the ledger is the record; a report failure is said, not hidden
        log(f"report: {type(e).__name__}: {e}")
        code = combine_exit_codes(code, 1)
    legs_sum = sum(res.seconds for res in results.values())
    log(f"run {run_dir.name}: {len(plan)} leg(s) in {wall:.0f}s wall (the legs' own durations sum to "
        f"{legs_sum:.0f}s)")
    return code, run_dir, rows
