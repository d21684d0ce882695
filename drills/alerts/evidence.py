"""What the alert drill reads its verdicts from: Prometheus' own record of each alert (its ``ALERTS`` series, one
sample per evaluation while pending or firing), the alerts Prometheus has active now (polled, marked on the
timeline as they change), and the moment the stuck condition held in the cluster (from the recorded Rollout
statuses, which both the controller's metrics and kube-state-metrics' read)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ..record.timeline import ordered
from .metrics import ABORT_PHASE, CANARY_WEIGHT, IN_PROGRESS, PHASE, ROLLOUT_INFO, STEP_INDEX
from .rules import STUCK


POLL_S = 0.2


def alert_samples(prom, alertname: str, namespace: str, name: str, window_s: float) -> dict[str, list[float]]:
    """Evaluation times (Unix seconds) at which Prometheus recorded the alert pending and firing, over the last
    ``window_s`` (the raw samples of ``ALERTS``)."""
    sel = f'ALERTS{{alertname="{alertname}", namespace="{namespace}", name="{name}"}}[{max(1, int(window_s))}s]'
    out: dict[str, list[float]] = {"pending": [], "firing": []}
    for series in prom.query(sel):
        state = series["metric"].get("alertstate")
        out.setdefault(state, []).extend(float(ts) for ts, _ in series.get("values") or [])
    return {k: sorted(v) for k, v in out.items()}


def first_scrape(prom, alert: str, namespace: str, name: str, steps: int, max_weight: int,
                 since: float) -> float | None:
    """The timestamp of the first scrape (from ``since``) whose samples meet the alert's condition: for the stuck
    rule, one scrape of kube-state-metrics with the weight below ``max_weight``, the step at ``steps`` or past it and
    the phase Progressing or Degraded; for the abort rule, the controller's first rollout_info{phase="Abort"}."""
    window = f"[{max(2, int(time.time() - since) + 2)}s]"
    sel = f'namespace="{namespace}", name="{name}"'
    if alert != STUCK:
        ts = [float(t) for s in prom.query(f'{ROLLOUT_INFO}{{{sel}, phase="{ABORT_PHASE}"}}{window}')
              for t, _ in s.get("values") or []]
        return min((t for t in ts if t >= since), default=None)

    def by_time(q: str) -> dict[float, float]:
        return {float(t): float(v) for s in prom.query(q) for t, v in s.get("values") or []}
    weight, index = by_time(f"{CANARY_WEIGHT}{{{sel}}}{window}"), by_time(f"{STEP_INDEX}{{{sel}}}{window}")
    phase: dict[float, float] = {}
    for s in prom.query(f'{PHASE}{{{sel}, phase=~"{"|".join(IN_PROGRESS)}"}}{window}'):
        for t, v in s.get("values") or []:
            phase[float(t)] = max(phase.get(float(t), 0.0), float(v))
    hits = [t for t in sorted(weight) if t >= since and weight[t] < max_weight and index.get(t, -1) >= steps
            and phase.get(t) == 1.0]
    return hits[0] if hits else None


def scrape_seconds(prom, job: str, since: float) -> float:
    """The longest scrape of ``job`` since ``since`` (Prometheus' scrape_duration_seconds): an evaluation that starts
    while a scrape is still being appended sees its samples one evaluation later."""
    window = f"[{max(2, int(time.time() - since) + 2)}s]"
    res = prom.query(f'max_over_time(scrape_duration_seconds{{job="{job}"}}{window})')
    return max((float(r["value"][1]) for r in res), default=0.0)


@dataclass
class Seen:
    state: str | None = None
    since: float | None = None
    active_at: str | None = None
    changes: list = field(default_factory=list)     # [wall, state, activeAt]


class AlertWatch:
    """Polls Prometheus' active alerts; every change of (alertname, namespace, name) is kept and handed to
    ``on_change(key, state, wall, active_at)`` (the drill marks it on the Rollout's timeline)."""

    def __init__(self, prom, on_change=None, log=None):
        self.prom, self.on_change = prom, on_change
        self.log = log or (lambda m: None)
        self.seen: dict[tuple[str, str, str], Seen] = {}
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="alert-watch")

    def start(self) -> "AlertWatch":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)

    def state(self, alertname: str, namespace: str, name: str) -> str | None:
        with self.lock:
            return self.seen.get((alertname, namespace, name), Seen()).state

    def changes(self, alertname: str, namespace: str, name: str) -> list:
        with self.lock:
            return list(self.seen.get((alertname, namespace, name), Seen()).changes)

    def poll(self) -> None:
        now = time.time()
        alerts = self.prom.alerts()
        current = {}
        for a in alerts:
            lb = a.get("labels") or {}
            current[(lb.get("alertname"), lb.get("namespace"), lb.get("name"))] = (a.get("state"), a.get("activeAt"))
        with self.lock:
            keys = set(current) | {k for k, s in self.seen.items() if s.state is not None}
            changed = []
            for key in keys:
                state, active_at = current.get(key, (None, None))
                s = self.seen.setdefault(key, Seen())
                if state != s.state:
                    s.state, s.since, s.active_at = state, now, active_at
                    s.changes.append([now, state or "inactive", active_at])
                    changed.append((key, state or "inactive", now, active_at))
        for key, state, wall, active_at in changed:
            if self.on_change is not None:
                try:
                    self.on_change(key, state, wall, active_at)
                except Exception as e:            # a mark that cannot be written must not stop the watch
                    self.errors.append(f"mark: {e}")

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.poll()
            except Exception as e:                 # Prometheus busy or restarting: said, polled again
                self.errors.append(str(e)[:200])
            self.stopped.wait(POLL_S)


# --- the condition in the cluster's own record -----------------------------------------------------------
def stuck_now(status: dict, steps: int, max_weight: int) -> bool:
    """The stuck rule's condition on one recorded Rollout status (drills.record.recorder's condensed one), as its metrics
    show it: the canary weight below maxTrafficWeight, the step index at the end of the steps, status.phase
    Progressing or Degraded, not aborted (rollout_info's phase Abort) and not fully promoted (stableRS is not
    currentPodHash)."""
    weight, index = status.get("canaryWeight"), status.get("currentStepIndex")
    promoted = bool(status.get("stableRS")) and status.get("stableRS") == status.get("currentPodHash")
    return (isinstance(weight, (int, float)) and weight < max_weight and isinstance(index, int) and index >= steps
            and status.get("phase") in IN_PROGRESS and not aborted_now(status) and not promoted)


def aborted_now(status: dict) -> bool:
    """rollout_info's phase Abort: the Progressing condition's reason is RolloutAborted."""
    return status.get("progressingReason") == "RolloutAborted"


def intervals(records: list[dict], name: str, holds, since_mark: str | None = None) -> list[list[float]]:
    """[start, end] (Unix seconds; end None while it still holds) of every interval in which ``holds(status)``
    was true for Rollout ``name`` in the recorded timeline, from ``since_mark`` on."""
    out: list[list] = []
    started = since_mark is None
    for r in ordered(records):
        if r["kind"] == "Mark" and r["name"] == since_mark:
            started = True
            continue
        if not started or r["kind"] != "Rollout" or r.get("name") != name or r["type"] == "DELETED":
            continue
        on = holds((r.get("obj") or {}).get("status") or {})
        if on and (not out or out[-1][1] is not None):
            out.append([r["wall"], None])
        elif not on and out and out[-1][1] is None:
            out[-1][1] = r["wall"]
    return out


def mark_wall(records: list[dict], name: str) -> float | None:
    return next((r["wall"] for r in records if r["kind"] == "Mark" and r["name"] == name), None)
