"""Watchdogs: what stops a drill that no signal would, checked from a thread beside it.

A drill's waits trust their target to answer and to be theirs alone; a watchdog checks what they cannot see and
stops the drill through its SignalGuard (the main thread gets ``Interrupted`` with the reason, as on SIGTERM, even
inside a blocking read), so the drill restores what it changed and says why instead of waiting out its timeouts.

- ``api_answers``: the API server answers a cheap read; no answer for ``OUTAGE_TIMEOUTS`` request timeouts in a
  row stops a live drill (it can neither see nor steer its Rollout);
- ``no_other_writer``: nobody but the drill changed the Rollout's spec: a pod template or steps the journal does not
  know (``Journal.moved_on``), or any other field of the spec changed since before the drill (replicas included:
  the evidence assumes the size the drill started from);
- ``processes_alive``: the embedded cluster's processes a probe depends on (the controller, the pod releaser, the
  control plane) are still running.
"""
from __future__ import annotations

import copy
import json
import threading
import time
from typing import Callable

from ..kube.k8s import client

from ..core import config
from ..kube import api as kube
from ..core.procs import pid_alive
from ..core.signals import SignalGuard

Check = Callable[[], "str | None"]
OUTAGE_TIMEOUTS = 3          # request timeouts without an answer before a live drill stops
INTERVAL_S = 1.0


class Watchdog:
    """Runs ``checks`` every ``interval`` seconds while the ``with`` block runs; the first reason one returns stops
    the drill (``guard.stop``).  Leaving the block stops the checks; a stop already sent is taken there."""

    def __init__(self, guard: SignalGuard, checks: list[Check], interval: float = INTERVAL_S):
        self.guard, self.checks, self.interval = guard, checks, interval
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.tripped: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="drills-watchdog")

    def _run(self) -> None:
        while not self.closed.wait(self.interval):
            for check in self.checks:
                try:
                    reason = check()
                except Exception:         # a check that cannot look says nothing; the drill's own requests will
                    reason = None
                if reason:
                    with self.lock:
                        if not self.closed.is_set() and self.guard.stop(reason):
                            self.tripped = reason
                    return

    def __enter__(self) -> "Watchdog":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        with self.lock:
            self.closed.set()
        self.thread.join(timeout=30)
        if self.tripped:
            self.guard.await_stop()       # raises Interrupted here when the main thread has not taken it yet
        return False


# --- checks ---------------------------------------------------------------------------------------------------
def api_answers(api: client.ApiClient, limit: float | None = None) -> Check:
    """No answer from the API server for ``limit`` seconds (default OUTAGE_TIMEOUTS request timeouts)."""
    limit = limit if limit is not None else OUTAGE_TIMEOUTS * kube.read_timeout()
    since: list[float | None] = [None]

    def check() -> str | None:
        sent = time.monotonic()
        try:
            client.VersionApi(api).get_code()
        except Exception as e:
            since[0] = since[0] or sent
            if time.monotonic() - since[0] >= limit:
                return (f"stopped: {kube.describe(e, kube.server_of(api), 'the API server')}; it has not answered "
                        f"for {time.monotonic() - since[0]:.0f}s")
            return None
        since[0] = None
        return None
    return check


def _other_fields(spec: dict) -> dict:
    """The spec without what the drill itself writes: the pod template, the canary steps, spec.paused."""
    out = copy.deepcopy(spec or {})
    for key in ("template", "paused"):
        out.pop(key, None)
    ((out.get("strategy") or {}).get("canary") or {}).pop("steps", None)
    return out


def spec_changes(before: dict, now: dict) -> list[str]:
    """Fields of the spec, other than the ones the drill writes, that differ between ``before`` and ``now``."""
    a, b = _other_fields(before), _other_fields(now)
    out = []
    for key in sorted(set(a) | set(b)):
        if json.dumps(a.get(key), sort_keys=True) != json.dumps(b.get(key), sort_keys=True):
            out.append(f"spec.{key} ({json.dumps(a.get(key))[:80]} -> {json.dumps(b.get(key))[:80]})")
    return out


def no_other_writer(api: client.ApiClient, namespace: str, name: str, journal, before_spec: dict) -> Check:
    """Someone else changed the Rollout's spec during the drill."""
    co = client.CustomObjectsApi(api)
    key = f"{namespace}/{name}"

    def check() -> str | None:
        ro = co.get_namespaced_custom_object(config.ARGO_GROUP, config.ARGO_VERSION, namespace, "rollouts", name)
        changed = journal.moved_on(key, ro) + spec_changes(before_spec, ro.get("spec") or {})
        if changed:
            return f"stopped: another writer changed rollout {key} during the drill: {'; '.join(changed)}"
        return None
    return check


def cluster_processes(status: dict) -> dict[str, int]:
    """name -> pid of what a drill on an embedded cluster (its ``status()``) cannot go on without: the control
    plane kwokctl runs, the pod releaser and the rollouts controller (not the mesh emulators or Prometheus of
    other legs on the same cluster, which come and go)."""
    return {p["name"]: p["pid"] for p in status.get("processes", [])
            if p.get("managed_by") == "kwokctl" or p["name"] in ("releaser", "rollouts-controller")}


def processes_alive(processes: dict[str, int]) -> Check:
    """One of the named processes (name -> pid) exited."""
    def check() -> str | None:
        dead = [f"{n} (pid {pid})" for n, pid in processes.items() if not pid_alive(pid)]
        if dead:
            return f"stopped: the embedded cluster's {', '.join(dead)} exited; the drill cannot go on without it"
        return None
    return check


__all__ = ["Watchdog", "api_answers", "cluster_processes", "no_other_writer", "processes_alive", "spec_changes"]
