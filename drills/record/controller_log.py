"""What a controller's log (logrus text, one line per event) says about given Rollouts: which ones a sync
reconciled, the errors its syncs returned, and the lines that name a pod template hash change.

A Rollout is reconciled by a sync that completed without an error.  The controller logs "Reconciliation
completed" in a deferred call, after an error and after a panic too, and the work queue logs a failed sync's
"rollout syncHandler error" (and "Recovered from panic") after it (rollout/controller.go, utils/controller/
controller.go): so a completion counts once no error of that Rollout followed it, up to its next sync's start, or
for ``SETTLE_S`` seconds of the log's clock.  A line not yet ended (the log being written) is left for the next
read.  The error the leg's router's readiness guard returns while it holds a weight (the ReplicaSet not fully
available; the controller requeues) is the sync doing its work: counted apart (``guard_delays``), never an error.
"""
from __future__ import annotations

import calendar
import re
import time

from .. import routers

# the lines about one Rollout: a sync starts, completes, errs; the hash a new controller computes differs
_OF = r'.*\bnamespace=(?P<ns>[a-z0-9-]+)\b.*\brollout=(?P<name>[a-z0-9.-]+)(?:\s|$)'
SYNC = re.compile(r'msg="Started syncing rollout"' + _OF)
RECONCILED = re.compile(r'msg="Reconciliation completed"' + _OF)
HASH_CHANGED = re.compile(r'msg="ComputePodTemplateHash hash changed[^"]*"' + _OF)
ERROR = re.compile(r'level=error msg=(?:"(?P<msg>(?:[^"\\]|\\.)*)"|(?P<word>\S+))' + _OF)
TIME = re.compile(r'^time="(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)')
MAX_ERRORS = 50          # the errors kept per Rollout (each cut to 300 characters)
SETTLE_S = 2.0           # a completion no error followed for this long (the log's clock, whole seconds) counts


class SyncLog:
    """Reads a controller's log text for the Rollouts of ``targets`` ((namespace, name) -> key); ``read`` again
    with the whole text since the same start as it grows (counts restart, a first reconcile is kept).
    ``router``: the leg's (its readiness guard's hold is no error); None: any router's."""

    def __init__(self, targets: dict[tuple[str, str], str], router: routers.TrafficRouter | None = None):
        self.targets = targets
        guards = (router.guard_delay,) if router is not None and router.guard_delay else \
            () if router is not None else routers.GUARD_DELAYS
        self.guard = re.compile("|".join(f"(?:{g})" for g in guards) or "(?!)")
        self.reconciled: dict[str, float] = {}     # key -> the elapsed seconds given to the read that saw it first
        self.errors: dict[str, list[str]] = {}     # the first MAX_ERRORS of each
        self.error_count: dict[str, int] = {}
        self.guard_delays: dict[str, int] = {}
        self.hash_changed: dict[str, int] = {}

    def read(self, text: str, elapsed: float, now: float | None = None) -> dict[str, float]:
        """``elapsed``: what a reconcile first seen in this read is credited with; ``now``: the wall clock the
        log's times are compared with (a completion older than SETTLE_S with no error after it counts)."""
        now = time.time() if now is None else now
        erred: dict[str, bool] = {}
        pending: dict[str, float | None] = {}     # key -> the log time of a completion no error followed yet
        self.errors, self.error_count, self.guard_delays, self.hash_changed = {}, {}, {}, {}
        for line in text[:text.rfind("\n") + 1].splitlines():
            m = SYNC.search(line) or RECONCILED.search(line) or ERROR.search(line) or HASH_CHANGED.search(line)
            key = self.targets.get((m.group("ns"), m.group("name"))) if m else None
            if key is None:
                continue
            if m.re is SYNC:
                if key in pending:                    # the sync before completed, and no error followed it
                    self.reconciled.setdefault(key, round(elapsed, 2))
                pending.pop(key, None)
                erred[key] = False
            elif m.re is ERROR:
                msg = m.group("msg") if m.group("msg") is not None else m.group("word")
                if self.guard.search(msg):
                    self.guard_delays[key] = self.guard_delays.get(key, 0) + 1
                    continue
                erred[key] = True
                pending.pop(key, None)                # an error after the completion: that sync failed
                self.error_count[key] = self.error_count.get(key, 0) + 1
                kept = self.errors.setdefault(key, [])
                if len(kept) < MAX_ERRORS:
                    kept.append(msg[:300])
            elif m.re is HASH_CHANGED:
                self.hash_changed[key] = self.hash_changed.get(key, 0) + 1
            elif not erred.get(key):
                pending[key] = _log_time(line)
        for key, at in pending.items():
            if at is not None and now - at >= SETTLE_S:
                self.reconciled.setdefault(key, round(elapsed, 2))
        return self.reconciled


def _log_time(line: str) -> float | None:
    m = TIME.search(line)
    return calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) if m else None
