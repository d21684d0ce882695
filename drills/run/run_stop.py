"""How a run stops when a signal comes (drills.run.runner's Run takes these methods): the legs that run are asked to stop
(SIGINT to each leg's pytest group, so its teardown removes its namespaces, load and mesh), killed (SIGKILL to the
group) after LEG_STOP_GRACE_S, the legs' threads awaited (a cluster that is coming up is taken down once it is up),
then every cluster the run started is taken down.  A second signal during that kills the legs and stops at once,
saying what is left (the next run takes those clusters down: drills.cluster.remains).  A leg that did not run to
its end gets an inconclusive row: whatever rows it wrote before, it is no complete pass.
"""
from __future__ import annotations

import calendar
import json
import os
import signal
import time
from pathlib import Path

from ..cluster import EmbeddedCluster
from ..record.ledger import FAIL, INCONCLUSIVE, PASS, Ledger, rewrite_rows
from ..core.procs import start_time
from ..core.signals import Interrupted, SignalGuard
from ..core.wait import WaitTimeout, until

LEG_STOP_GRACE_S = 60.0      # a leg's pytest after SIGINT: its teardown (namespaces, load, mesh) before SIGKILL
STOP_WAIT_S = 240.0          # after the legs: a cluster still coming up (or going down) in a leg's thread
DONE, INTERRUPTED, NOT_STARTED = "done", "interrupted", "not started"


def killed(res) -> bool:
    """The leg's pytest ended by a signal (not the run's stop)."""
    return res.proc is not None and (res.proc.returncode or 0) < 0


class Stopping:
    """The stop of a run (a mixin of drills.run.runner.Run: its results, threads, clusters and log)."""

    def _stop(self, e: Interrupted, guard: SignalGuard | None) -> None:
        self.interrupted = signal.Signals(e.signum).name
        self.stopped_at = time.time()
        with self.lock:
            self.stopping.set()
            running = [r for r in self.results.values() if not r.ended]
            for r in running:
                r.state = INTERRUPTED
        ids = ", ".join(r.leg.id for r in running) or "none"
        self.log(f"run {self.run_id}: {e}: stopping the leg(s) that run ({ids}; SIGINT, SIGKILL after "
                 f"{LEG_STOP_GRACE_S:.0f}s), then taking down the cluster(s) the run started; a second signal stops "
                 f"at once")
        try:
            self._signal_legs(running, signal.SIGINT)
            try:
                until("the legs' pytest to end after SIGINT", lambda: not any(self._pytest_runs(r) for r in running),
                      timeout=LEG_STOP_GRACE_S, interval=0.1)
            except WaitTimeout:
                self.log(f"run {self.run_id}: leg(s) still running after {LEG_STOP_GRACE_S:.0f}s: SIGKILL "
                         f"{', '.join(r.leg.id for r in running if self._pytest_runs(r))}")
                self._signal_legs(running, signal.SIGKILL)
            try:
                until("the legs' threads to end (a cluster coming up or going down)",
                      lambda: not any(t.is_alive() for t in self.threads), timeout=STOP_WAIT_S, interval=0.1)
            except WaitTimeout as w:
                self.log(f"run {self.run_id}: {w}")
            self._down_all()
        except Interrupted as again:
            if guard is not None:
                guard.quiet()
            self._signal_legs(running, signal.SIGKILL)
            self.log(f"run {self.run_id}: {again} during the stop: stopping at once (legs killed, clusters left)")
        if guard is not None:
            guard.quiet()           # the run is stopped: further signals are only noted
        self.remains = self._left()
        self.log(f"run {self.run_id}: interrupted by {self.interrupted}; "
                 + (f"left: {'; '.join(self.remains)}" if self.remains else "nothing of it is left running"))

    def _pytest_runs(self, r) -> bool:
        return r.proc is not None and r.proc.returncode is None and start_time(r.proc.pid) == r.proc_started

    def _signal_legs(self, results: list, sig: int) -> None:
        """Signal the process group of each leg's pytest still running (the run made that group; a pytest that
        has exited and been reaped is never signalled)."""
        for r in results:
            if self._pytest_runs(r):
                try:
                    os.killpg(r.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def _left(self) -> list[str]:
        out = [f"leg {r.leg.id}'s pytest (pid {r.proc.pid})" for r in self.results.values() if self._pytest_runs(r)]
        for name in self._cluster_names():
            c = EmbeddedCluster(name)
            if c.folder.exists() or c.kwok_dir.exists():
                how = "kept (--keep-cluster)" if self.keep_cluster else \
                    f"take it down with: DRILLS_CLUSTER={name} drills cluster down (the next run does)"
                out.append(f"cluster {name}: {how}")
        return out


def _recorded_at(row: dict) -> float:
    try:
        return float(calendar.timegm(time.strptime(str(row.get("recorded_at")), "%Y-%m-%dT%H:%M:%SZ")))
    except (ValueError, OverflowError):
        return float("inf")         # a row that does not say when: taken as recorded during the stop


def judge_stopped_rows(r) -> None:
    """A row a stopped leg recorded once the stop began (its step cut short: load and holds torn down under it) is
    no evidence either way: its pass or fail becomes inconclusive, the verdict it had kept in its details."""
    stopped = [res for res in r.results.values() if res.state == INTERRUPTED]
    path = r.run_dir / "ledger.json"
    if not stopped or not path.exists():
        return
    since = int(r.stopped_at)          # rows say the second they were recorded

    def change(row: dict) -> dict:
        if row.get("verdict") not in (PASS, FAIL) or _recorded_at(row) < since or not r._is_leg_row(row, stopped):
            return row
        return dict(row, verdict=INCONCLUSIVE, shows=None, reason=f"recorded while the leg was being stopped "
                    f"(the run was interrupted by {r.interrupted}): its step was cut short",
                    details=dict(row.get("details") or {}, verdict_before_stop=row.get("verdict")))
    rewrite_rows(path, change)


def record_unfinished(r) -> None:
    """An inconclusive row for each leg that did not run to its end (stopped by the run's signal, or its pytest
    killed by one): whatever rows it wrote before, the leg is no complete pass."""
    judge_stopped_rows(r)
    for res in r.results.values():
        if res.state == INTERRUPTED:
            why = f"the run was interrupted by {r.interrupted} while this leg ran"
        elif killed(res):
            why = f"the leg's pytest was killed by {signal.Signals(-res.proc.returncode).name} before its end"
        else:
            continue
        b = r._binary(res.leg)
        Ledger(r.run_dir, r.run_id, "embedded", b.reported if b else res.leg.controller, b.sha256 if b else None,
               b.label if b else None, leg=res.leg.id, router=res.leg.router).record(
            res.leg.lane, "run", "the leg ran to its end", "its pytest ends by itself", res.state if res.state ==
            INTERRUPTED else f"pytest exit {res.rc}", INCONCLUSIVE, reason=f"leg {res.leg.id}: {why}; its rows are "
            f"what it recorded before", key="leg-ran-to-its-end")


def interrupted_by(run_dir: Path) -> str | None:
    """The signal that interrupted the run of this folder (its run.json), None when it ran to its end."""
    try:
        meta = json.loads((Path(run_dir) / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return (meta.get("signal") or "a signal") if isinstance(meta, dict) and meta.get("interrupted") else None
