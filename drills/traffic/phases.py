"""Load during a drill's rollbacks, cut into phases by the timeline (Locust as a subprocess, drills.traffic.load).

Embedded cluster: a mesh emulator in front of the drill's Rollout (an emulation, drills.traffic.mesh) takes the load;
per-pod capacity is set so the stable ReplicaSet carries it comfortably while half the pods cannot: a BEFORE
exposure (100 % on 1 of 2 pods) shows failures, AFTER (5 %) nearly none.  Live: the stage service's URL the user
names, with the live target rules of drills.traffic.load; its figures are observations (``unverified``).

Phases (DESIGN.md §6 Load): steady (before the rollback), exposure (a non-zero weight on the partial ReplicaSet),
exit (from the exit's mark to full availability), settled (afterwards).
"""
from __future__ import annotations

import time
from pathlib import Path

from ..record import timeline
from ..record.ledger import Ledger
from .load import load_thresholds, mark_cut_short, phase_stats, record_phase_rows, start_load
from .mesh_server import MeshProcess
from ..core.wait import hold_for

STEADY_PHASE_S = 5.0        # evidence window: the steady phase before each rollback
SETTLED_PHASE_S = 3.0       # evidence window: a little of the settled phase after it


class PhasedLoad:
    USERS, RATE_PER_USER, CAPACITY_RPS = 10, 4.0, 30.0     # 40 req/s offered; 30 req/s per Ready pod
    RUN_TIME_S = 240

    def __init__(self, cluster, namespace: str, name: str, folder: Path, lane: str, log=None,
                 url: str | None = None, judged: str | None = None, router: str | None = None):
        self.folder = Path(folder)
        self.lane = lane
        self.judged = judged        # a reason the figures are observations only (a user-built controller's)
        self.log = log or (lambda m: None)
        self.mesh = None
        self.target = "embedded"
        if url:
            self.url, self.target = url, "live"
        else:
            self.mesh = MeshProcess(cluster.kubeconfig, namespace, name, capacity_rps=self.CAPACITY_RPS, router=router,
                                    folder=self.folder, register=cluster.register_process,
                                    unregister=cluster.unregister_process, seed=7)
            self.url = self.mesh.url
        self.run = None

    def start(self, label: str):
        self.run = start_load(self.url, self.folder / label, users=self.USERS, rate_per_user=self.RATE_PER_USER,
                              spawn_rate=float(self.USERS), run_time_s=self.RUN_TIME_S, name=label, target=self.target)
        # the steady window starts once load flows, not while Locust starts (slow on a busy machine)
        self.run.wait_first_responses()
        hold_for(STEADY_PHASE_S, "the steady phase before the rollback")

    def phases(self, ledger: Ledger, step: str, records: list[dict], revived_hash: str, settled: bool = True,
               exit_mark: str | None = None) -> tuple[list[dict], dict]:
        """Cut the load into phases from the timeline; ledger rows per phase; the phases for the series."""
        d = timeline.derive(records, revived_hash, since_mark="rollback")
        rel = lambda t: None if t is None else t - d.t0  # noqa: E731
        first_weight = next((t for t, w, *_ in d.weights_while_partial if w > 0), None)
        partial_end = d.partial[-1][1] if d.partial else None
        mark = next((t for t, label in d.markers if label == exit_mark), None) if exit_mark else None
        now = rel(time.monotonic())
        phases = {"steady": (-STEADY_PHASE_S, 0.0)}
        if first_weight is not None:
            end = mark if mark is not None else (partial_end if partial_end else None)
            phases["exposure"] = (rel(first_weight), rel(end) if end is not None else now)
        if mark is not None:
            phases["exit"] = (rel(mark), rel(partial_end) if partial_end else now)
        if settled:
            phases["settled"] = (rel(partial_end) if partial_end else now, None)
        return self.finish(ledger, step, d, phases)

    def finish(self, ledger: Ledger, step: str, derived, phases_rel: dict) -> tuple[list[dict], dict]:
        hold_for(SETTLED_PHASE_S, "a little of the settled phase")
        exited = self.run.proc.poll()     # Locust gone before the drill ended it: its records stop early
        mesh_exited = self.mesh.proc.poll() if self.mesh is not None else None
        self.run.stop()
        to_wall = lambda t: derived.t0_wall + t  # noqa: E731
        phases = {k: (to_wall(a), to_wall(b)) for k, (a, b) in phases_rel.items() if a is not None and b is not None
                  and b > a}
        if "settled" in phases_rel and phases_rel["settled"][0] is not None:
            phases["settled"] = (to_wall(phases_rel["settled"][0]), self.run.ended_at)
        records = self.run.records()
        stats = phase_stats(records, phases)
        mark_cut_short(stats, phases, self.run)
        if exited is not None:
            last = max((r["t"] for r in records), default=self.run.started_at)
            for name, (_, end) in phases.items():
                if end > last + 1.0:
                    stats[name]["cut_short"] = (f"Locust exited ({exited}) {max(0.0, end - last):.1f}s before phase "
                                                f"{name} ended: the phase's load is not all recorded; log "
                                                f"{self.run.log}")
        if mesh_exited is not None:       # the emulated service died: from its first refused request on, the
            refused = min((r["t"] for r in records if not r.get("code")), default=None)    # failures are ours
            since = refused if refused is not None else max((r["t"] for r in records), default=self.run.started_at)
            for name, (_, end) in phases.items():
                if end > since:
                    stats[name]["cut_short"] = (f"the mesh emulator exited ({mesh_exited}) during phase {name}: its "
                                                f"failures are the harness's, not the Rollout's; log {self.mesh.log}")
        # thresholds are calibrated for the emulated mesh; against a live service the figures are recorded
        # as observations (`unverified`): what users saw, not a pass or fail of the drill
        thresholds = load_thresholds() if self.target == "embedded" else {}
        rows = record_phase_rows(ledger, self.lane, step, stats, thresholds, self.run.records_path,
                                 emulated=self.target == "embedded", judged=self.judged, url=self.url)
        extra = {"phases": {k: [round(a - derived.t0_wall, 3), round(b - derived.t0_wall, 3)]
                            for k, (a, b) in phases.items()},
                 "load": {k: {"failure_ratio": v.get("failure_ratio"), "p95_ms": v.get("p95_ms"),
                              "requests": v.get("requests")} for k, v in stats.items()}}
        return rows, extra

    def close(self):
        if self.run:
            self.run.stop()
        if self.mesh:
            self.mesh.stop()
