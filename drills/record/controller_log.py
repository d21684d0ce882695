"""What a controller's log (logrus text, one line per event) says about given Rollouts: which ones a sync
reconciled, the errors its syncs returned, and the lines that name a pod template hash change.

A Rollout is reconciled by a sync that completed without an error: the controller logs "Reconciliation
completed" after an error too, so an error between a sync's start and its completion makes that sync none.
The error a router's readiness guard returns while it holds a weight (the ReplicaSet not fully available; the
controller requeues) is the sync doing its work: counted apart (``guard_delays``), never an error.
"""
from __future__ import annotations

import re

from .. import routers

# the lines about one Rollout: a sync starts, completes, errs; the hash a new controller computes differs
_OF = r'.*\bnamespace=(?P<ns>[a-z0-9-]+)\b.*\brollout=(?P<name>[a-z0-9.-]+)(?:\s|$)'
SYNC = re.compile(r'msg="Started syncing rollout"' + _OF)
RECONCILED = re.compile(r'msg="Reconciliation completed"' + _OF)
ERROR = re.compile(r'level=error msg="(?P<msg>(?:[^"\\]|\\.)*)"' + _OF)
HASH_CHANGED = re.compile(r'msg="ComputePodTemplateHash hash changed[^"]*"' + _OF)
GUARD_DELAY = re.compile("|".join(f"(?:{g})" for g in routers.GUARD_DELAYS) or "(?!)")
MAX_ERRORS = 50          # the errors kept per Rollout (each cut to 300 characters)


class SyncLog:
    """Reads a controller's log text for the Rollouts of ``targets`` ((namespace, name) -> key); ``read`` again
    with the whole text since the same start as it grows (counts restart, a first reconcile is kept)."""

    def __init__(self, targets: dict[tuple[str, str], str]):
        self.targets = targets
        self.reconciled: dict[str, float] = {}     # key -> the elapsed seconds given to the read that saw it first
        self.errors: dict[str, list[str]] = {}     # the first MAX_ERRORS of each
        self.error_count: dict[str, int] = {}
        self.guard_delays: dict[str, int] = {}
        self.hash_changed: dict[str, int] = {}

    def read(self, text: str, elapsed: float) -> dict[str, float]:
        erred: dict[str, bool] = {}
        self.errors, self.error_count, self.guard_delays, self.hash_changed = {}, {}, {}, {}
        for line in text.splitlines():
            m = SYNC.search(line) or RECONCILED.search(line) or ERROR.search(line) or HASH_CHANGED.search(line)
            key = self.targets.get((m.group("ns"), m.group("name"))) if m else None
            if key is None:
                continue
            if m.re is SYNC:
                erred[key] = False
            elif m.re is ERROR and GUARD_DELAY.search(m.group("msg")):
                self.guard_delays[key] = self.guard_delays.get(key, 0) + 1
            elif m.re is ERROR:
                erred[key] = True
                self.error_count[key] = self.error_count.get(key, 0) + 1
                kept = self.errors.setdefault(key, [])
                if len(kept) < MAX_ERRORS:
                    kept.append(m.group("msg")[:300])
            elif m.re is HASH_CHANGED:
                self.hash_changed[key] = self.hash_changed.get(key, 0) + 1
            elif not erred.get(key):
                self.reconciled.setdefault(key, round(elapsed, 2))
        return self.reconciled
