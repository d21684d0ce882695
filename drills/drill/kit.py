"""The drill kit: one routed Rollout that a drill deploys, rolls back and records.

``DrillRollout`` owns the Rollout and what routes its traffic (its router's objects: drills.routers, through
drills.drill.shapes).  It deploys v1, then v2, waits until the v1
ReplicaSet is scaled to 0, and rolls back inside rollbackWindow while availability control holds the revived
pods and releases them one at a time.  Lanes use it only through its public seams:

- ``record(label)``: a ``Recording`` (the flight recorder, its marks, derivations, named waits on the timeline,
  and the ``Observation`` it ends with);
- ``hold(selector, period)`` / ``release_holds()``: availability holds the drill owns (a context manager too);
- ``rollback()``: the rollback of the spec (GitOps-style revert by default, ``undo`` on request), marked.

The observation is derived from the timeline, never from one sample.
"""
from __future__ import annotations

import copy
import json
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

from ..kube import k8s
from ..kube.k8s import client

from ..record import recorder, timeline
from .. import routers
from ..cluster.availability import Availability
from ..record.ledger import FAIL, INCONCLUSIVE, PASS, UNVERIFIED
from ..core.podtemplate import container_images
from ..kube.rollout import HASH_LABEL, Predicate, Rollouts, healthy, healthy_at, paused
from .shapes import RolloutSpec, install, template_for
from ..core.steps import steps_text
from ..core.wait import WaitTimeout, hold_for, until

REASON_NO_PARTIAL = "no partial-availability window observed"
REASON_NOT_IN_WINDOW = "rollback not shown inside rollbackWindow (no SkipSteps event, no jump to the end of steps)"
REASON_INCOMPLETE = "timeline incomplete"
# the window check compares ReplicaSet creation timestamps, which have 1 s precision
RS_CREATION_SPACING_S = 1.0
# how long the route may take to return to all-stable after the Rollout is Healthy
ALL_STABLE_WITHIN_S = 30.0
# the controller reacts to an available pod within ~10 s (TOOLCHAIN.md): per held pod, hold + this
REACTION_S = 5.0
# what the controller says when a rollback is inside rollbackWindow (rollout/sync.go): the promotion reason of its
# RolloutCompleted event, and the line isRollbackWithinWindow logs.  The window's evidence when there is no step
# index to jump (steps: []); the log line stands in when the event broadcaster's per-object spam filter (25
# events, then one per 5 minutes) drops the event
IN_WINDOW_REASON = "Rollback within window"
IN_WINDOW_LOG = "Rollback within the window"
_DURATION_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)", re.ASCII)

NO_EXPECTATION = "no expectation for this controller version"


# --- observations --------------------------------------------------------------------------------------
@dataclass
class Observation:
    label: str
    peak_canary_weight_while_partial: int | None
    partial_window_observed: bool
    exposure_seconds: float
    rollback_in_window: bool
    window_evidence: list
    complete: bool
    incomplete_reasons: list
    timeline: str
    series: str
    weights_while_partial: list
    canary_weights: list
    revived_hash: str
    extra: dict = field(default_factory=dict)
    stopped_early: str | None = None       # a wait that ran out: the evidence is kept, the verdict inconclusive

    @classmethod
    def stopped_before_rollback(cls, label: str, reason: str, evidence: Path) -> "Observation":
        """A drill whose set-up wait ran out before the rollback: nothing to derive, the reason and what the
        wait last saw (``evidence``) kept."""
        return cls(label=label, peak_canary_weight_while_partial=None, partial_window_observed=False,
                   exposure_seconds=0.0, rollback_in_window=False, window_evidence=[], complete=False,
                   incomplete_reasons=[reason], timeline=str(evidence), series="", weights_while_partial=[],
                   canary_weights=[], revived_hash="", stopped_early=reason)

    def inconclusive_reason(self) -> str | None:
        if self.stopped_early:
            return self.stopped_early
        if not self.complete:
            return f"{REASON_INCOMPLETE}: {'; '.join(self.incomplete_reasons)}"
        if not self.partial_window_observed:
            return REASON_NO_PARTIAL
        if not self.rollback_in_window:
            return REASON_NOT_IN_WINDOW
        return None

    def verdict(self, expected: int | None, unexpected_reason: str = NO_EXPECTATION) -> tuple[str, str | None]:
        reason = self.inconclusive_reason()
        if reason:
            return INCONCLUSIVE, reason
        if expected is None:
            return UNVERIFIED, unexpected_reason
        return (PASS, None) if self.peak_canary_weight_while_partial == expected else (FAIL, None)

    def describe(self) -> str:
        return (f"peak canary weight while partial = {self.peak_canary_weight_while_partial} "
                f"(weights while partial [t, weight, available, target]: {self.weights_while_partial}); "
                f"canary weight series {self.canary_weights}; exposure {self.exposure_seconds:.1f}s; "
                f"in window: {self.rollback_in_window}")


def promoted_in_window(records: list[dict], since_mark: str = "rollback") -> str | None:
    """The controller's RolloutCompleted event giving "Rollback within window" as its reason, after the mark:
    the evidence of the window when no step index can jump (``steps: []``)."""
    seen = False
    for r in timeline.ordered(records):
        if r["kind"] == "Mark" and r["name"] == since_mark:
            seen = True
        elif seen and r["kind"] == "Event" and (r["obj"] or {}).get("reason") == "RolloutCompleted" and \
                IN_WINDOW_REASON in ((r["obj"] or {}).get("message") or ""):
            return f"RolloutCompleted event: {r['obj']['message']}"
    return None


def logged_in_window(log: Path | None, offset: int, namespace: str, name: str) -> str | None:
    """The controller's own log line saying the rollback of ``namespace/name`` is inside the window, written after
    ``offset`` (bytes) of its log file."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except (OSError, TypeError):
        return None
    for line in text.splitlines():
        if IN_WINDOW_LOG in line and f"namespace={namespace}" in line and f"rollout={name}" in line:
            return f"controller log: {line.strip()[:300]}"
    return None


def observation(label: str, d: timeline.Derived, result: dict, timeline_path: Path, series: Path,
                revived_hash: str | None, said: list[str] = ()) -> Observation:
    """``said``: what the controller said about the window besides the timeline's own evidence."""
    evidence = list(d.window_evidence) + [s for s in said if s not in d.window_evidence]
    return Observation(
        label=label, peak_canary_weight_while_partial=d.peak_canary_weight_while_partial,
        partial_window_observed=d.partial_window_observed, exposure_seconds=round(d.exposure_seconds, 3),
        rollback_in_window=d.rollback_in_window or bool(evidence), window_evidence=evidence,
        complete=result["complete"], incomplete_reasons=list(result["reasons"]), timeline=str(timeline_path),
        series=str(series), weights_while_partial=[[round(a - d.t0, 2), *b] for a, *b in d.weights_while_partial],
        canary_weights=[[round(a - d.t0, 2), w] for a, w in d.canary_weight], revived_hash=revived_hash or "")


# --- one recording -------------------------------------------------------------------------------------
class Recording:
    """The flight recorder of one run of a drill (``DrillRollout.record``): marks, derivations, named waits."""

    def __init__(self, drill: "DrillRollout", label: str):
        self.drill, self.label = drill, label
        self.path = drill.evidence_dir / f"{label}{timeline.TIMELINE_SUFFIX}"
        self.rec = recorder.Recorder(drill.api, drill.ns, drill.name, self.path, audit_log=drill.audit_log,
                                     router=drill.spec.router).start()
        self.route_kind = routers.get(drill.spec.router).route_kind
        self.result: dict | None = None
        try:
            self.log_offset = drill.controller_log.stat().st_size if drill.controller_log else 0
        except OSError:
            self.log_offset = 0

    @property
    def running(self) -> bool:
        return self.result is None

    def mark(self, name: str, response: dict | None = None, **extra) -> None:
        """An action of the drill, placed in resourceVersion order by the response's resourceVersion."""
        self.rec.mark(name, rv=(response or {}).get("metadata", {}).get("resourceVersion"), **extra)

    def records(self) -> list[dict]:
        return self.rec.snapshot()

    def controller_said_in_window(self, records: list[dict] | None = None) -> list[str]:
        """What the controller said about the rollback being inside rollbackWindow since the rollback mark: its
        RolloutCompleted event's reason, its log line (the embedded cluster's controller log)."""
        said = [promoted_in_window(self.records() if records is None else records),
                logged_in_window(self.drill.controller_log, self.log_offset, self.drill.ns, self.drill.name)]
        return [s for s in said if s]

    def derive(self, canary_hash: str | None = "revived", since_mark: str | None = "rollback", **kw
               ) -> timeline.Derived:
        h = self.drill.hash_v1 if canary_hash == "revived" else canary_hash
        return timeline.derive(self.records(), h, since_mark=since_mark, **kw)

    def wait(self, name: str, done: Callable[[timeline.Derived], bool], timeout: float,
             describe: Callable[[timeline.Derived], str] | None = None, interval: float = 0.05,
             **derive_kw) -> timeline.Derived:
        """A named wait on the timeline: until ``done(derived so far)`` holds."""
        return until(name, lambda: self.derive(**derive_kw), done, timeout, interval=interval,
                     describe=describe or (lambda d: f"canary weights {[w for _, w in d.canary_weight]}"))

    def wait_quiet(self, what: str, seconds: float, cap: float) -> bool:
        """Until no Rollout or route record came for ``seconds`` (the controller done answering ``what``), at most
        ``cap`` seconds; False when it did not go quiet by then (the caller goes on: what came is recorded)."""
        kinds = {"Rollout", *routers.ROUTE_KINDS}

        def quiet_for() -> float:
            return time.monotonic() - max((r["t"] for r in self.records() if r["kind"] in kinds), default=0.0)
        try:
            until(f"the controller's writes after {what} to pause for {seconds:g}s", quiet_for,
                  lambda q: q >= seconds, cap, interval=0.1, describe=lambda q: f"last write {q:.1f}s ago")
            return True
        except WaitTimeout:
            return False

    def wait_weight(self, weight: int, timeout: float, why: str = "") -> timeline.Derived:
        return self.wait(f"canary weight {weight} in the {self.route_kind}{' ' + why if why else ''}",
                         lambda d: bool(d.canary_weight) and d.canary_weight[-1][1] == weight, timeout)

    def series_path(self) -> Path:
        return timeline.series_path(self.path)

    def write_series(self, d: timeline.Derived, extra: dict | None = None) -> Path:
        title = (f"{self.label}: rollback to v1, steps [{steps_text(self.drill.spec.steps)}] "
                 f"({self.drill.version})")
        p = self.series_path()
        p.write_text(json.dumps(d.series(title, extra), indent=1))
        return p

    def observe(self, extra: dict | None = None) -> Observation:
        """An observation of the run so far (the recording goes on)."""
        d = self.derive()
        series = self.write_series(d, extra)
        return observation(self.label, d, {"complete": self.rec.complete, "reasons": self.rec.incomplete_reasons},
                           self.path, series, self.drill.hash_v1, self.controller_said_in_window())

    def stop(self) -> dict:
        if self.result is None:
            self.result = self.rec.stop()
        return self.result

    def finish(self, extra: dict | None = None, stopped_early: str | None = None) -> Observation:
        """Stop recording once the Rollout watch caught up with the Rollout as it is now; the observation of the
        whole run (series file written beside the timeline)."""
        if self.result is None:
            self.rec.catch_up()
        result = self.stop()
        d = timeline.derive(self.rec.records, self.drill.hash_v1, since_mark="rollback")
        obs = observation(self.label, d, result, self.path, self.write_series(d, extra), self.drill.hash_v1,
                          self.controller_said_in_window(self.rec.records))
        obs.stopped_early = stopped_early
        return obs


# --- the drill ---------------------------------------------------------------------------------------------
class DrillRollout:
    def __init__(self, api: client.ApiClient, namespace: str, spec: RolloutSpec, evidence_dir: Path,
                 journal=None, log=None, controller_version: str = "", audit_log: Path | None = None,
                 controller_log: Path | None = None):
        self.api = api
        self.audit_log = audit_log
        self.controller_log = Path(controller_log) if controller_log else None   # the embedded controller's log
        self.ns = namespace
        self.spec = spec
        self.evidence_dir = Path(evidence_dir)
        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        self.journal = journal
        self.log = log or (lambda m: print(m, flush=True))
        self.ro = Rollouts(api, namespace, journal=journal, log=self.log)
        self.version = controller_version
        self.hash_v1: str | None = None
        self.hash_v2: str | None = None
        self._availability = Availability(api)
        self._holds: list[str] = []
        self._saved_delay: float | None = None
        self._recording: Recording | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def recording(self) -> Recording | None:
        """The recording in progress, if any."""
        return self._recording if self._recording is not None and self._recording.running else None

    def progress(self, msg: str) -> None:
        self.log(f"  .. {msg}")

    def adopt(self, revived: str, stable: str) -> None:
        """A Rollout the drill did not deploy (live mode): the ReplicaSet a rollback revives, and the stable one."""
        self.hash_v1, self.hash_v2 = revived, stable

    # --- timeouts that scale with the shape ------------------------------------------------------------
    def settle_timeout(self) -> float:
        """Long enough for every held pod to be released one by one, with the controller's reaction time."""
        per_pod = self.spec.hold_seconds if self.spec.availability_control else 2.0
        return 120.0 + self.spec.replicas * (per_pod + REACTION_S)

    def deploy_timeout(self) -> float:
        """A deploy walks the steps: every timed pause in full, each step's pods, the controller's reactions."""
        steps = self.spec.steps or []
        return 60.0 + pause_seconds(steps) + (len(steps) + self.spec.replicas) * REACTION_S + 60.0

    def scale_down_timeout(self) -> float:
        """The old ReplicaSet is scaled down scaleDownDelaySeconds after the promotion, then its pods go."""
        return 120.0 + (self.spec.scale_down_delay or 0) + self.spec.replicas * 1.0

    # --- set-up ------------------------------------------------------------------------------------------
    def deploy_v1(self, timeout: float | None = None) -> str:
        install(self.api, self.ns, self.spec, journal=self.journal, log=self.log)
        ro = self.ro.wait(self.name, healthy(), timeout or self.deploy_timeout(), progress=self.progress)
        self.hash_v1 = ro["status"]["stableRS"]
        return self.hash_v1

    def space_replicasets(self) -> None:
        """Until the newest ReplicaSet of the Rollout is at least RS_CREATION_SPACING_S old (second precision)."""
        ro = self.ro.get(self.name)
        stamps = []
        for rs in self.ro.owned_replicasets(ro):
            ts = rs.metadata.creation_timestamp
            if isinstance(ts, datetime):
                stamps.append(ts.timestamp())
        newest = max(stamps, default=0.0)
        until(f"{RS_CREATION_SPACING_S:g}s since the newest ReplicaSet was created (creation times compare at "
              f"1 s precision)", time.time, lambda now: now >= newest + RS_CREATION_SPACING_S,
              timeout=RS_CREATION_SPACING_S + 5, describe=lambda now: f"{now - newest:.2f}s")

    def deploy(self, image: str, timeout: float | None = None) -> str:
        """Update the application container's image and let the rollout walk its steps (indefinite pauses
        promoted, said); returns the new stable ReplicaSet."""
        self.space_replicasets()
        self.ro.set_image(self.name, image, container=self.spec.container)
        deadline = time.monotonic() + (timeout or self.deploy_timeout())
        while True:
            ro = self.ro.wait(self.name, Predicate(
                "Healthy at the new image, or paused on an indefinite pause",
                lambda o: (healthy()(o) and _image(o, self.spec.container) == image and
                           o["status"].get("stableRS") == o["status"].get("currentPodHash"))
                or (paused()(o) and _indefinite_pause(o))), max(1.0, deadline - time.monotonic()),
                progress=self.progress)
            if ro["status"].get("phase") == "Healthy":
                return ro["status"]["stableRS"]
            self.log("  promote (indefinite pause)")
            self.ro.promote_and_wait(self.name)

    def deploy_v2(self, timeout: float | None = None) -> str:
        self.hash_v2 = self.deploy(self.spec.image_v2, timeout)
        return self.hash_v2

    def wait_scaled_to_zero(self, pod_hash: str, timeout: float | None = None):
        self.ro.wait_scaled_to_zero(self.name, pod_hash, timeout or self.scale_down_timeout())

    def cut_steps(self, steps: list[dict], timeout: float = 120):
        self.ro.set_steps(self.name, steps)
        self.spec.steps = copy.deepcopy(steps)
        self.ro.wait(self.name, healthy(), timeout, progress=self.progress)

    # --- seams: recording, holds, rollback --------------------------------------------------------------
    def record(self, label: str) -> Recording:
        if self.recording is not None:
            raise RuntimeError(f"a recording ({self._recording.label}) is already running")
        self._recording = Recording(self, label)
        return self._recording

    def hold(self, selector: dict, period: float | None, batch: bool = False) -> str:
        hid = self._availability.hold(self.ns, selector, period, batch=batch)
        self._holds.append(hid)
        if self.journal:
            self.journal.held(self.ns, hid)
        return hid

    def release(self, hold_id: str) -> None:
        if hold_id in self._holds:
            self._availability.unhold(hold_id)
            self._holds.remove(hold_id)

    def release_holds(self) -> None:
        for hid in list(self._holds):
            self.release(hid)
        if self._saved_delay is not None:
            self._availability.set_default_delay(self._saved_delay)
            self._saved_delay = None

    @contextmanager
    def holding(self, selector: dict, period: float | None, batch: bool = False):
        hid = self.hold(selector, period, batch)
        try:
            yield hid
        finally:
            self.release(hid)

    def hold_revived(self) -> None:
        """Availability control of a rollback: the revived pods one at a time (or every pod Ready at once)."""
        if self.spec.availability_control:
            self.hold({HASH_LABEL: self.hash_v1}, self.spec.hold_seconds, batch=self.spec.batch_release)
        else:
            self._saved_delay = float(self._availability.config().get("default_delay", 1.0))
            self._availability.set_default_delay(0.0)

    def freeze_revived(self) -> None:
        """The revived pods still held stay un-Ready until the drill releases them: a hold without a period, then
        the drill's periodic holds ended (in a probe, the revived pods' one; a pod whose period ends in the instant
        between the two writes may still be released)."""
        periodic = list(self._holds)
        self.hold({HASH_LABEL: self.hash_v1}, None)
        for hid in periodic:
            self.release(hid)

    def rollback(self, template: dict | None = None) -> dict | None:
        """Roll back to v1 (``template``: the pod template to revert to; default the spec's own at v1)."""
        if self.spec.rollback_via == "undo":
            res = self.ro.undo(self.name)
        else:
            res = self.ro.gitops_rollback(self.name, template or template_for(self.spec, self.spec.image_v1))
        if self.recording is not None:
            self.recording.mark("rollback", res, via=self.spec.rollback_via)
        self.log(f"  rolled back to v1 ({self.spec.rollback_via}); revived ReplicaSet {self.hash_v1}")
        return res

    def start_rollback(self, label: str, template: dict | None = None) -> Recording:
        """Record, hold the revived pods, roll back to v1."""
        rec = self.record(label)
        self.hold_revived()
        self.rollback(template)
        return rec

    # --- named waits ---------------------------------------------------------------------------------------
    def wait_partial_weight(self, timeout: float | None = None) -> int:
        """Until the controller wrote a non-zero canary weight while the revived ReplicaSet is partial."""
        d = self.recording.wait(
            "a non-zero canary weight while the revived ReplicaSet is partial", timeline.weight_on_partial,
            timeout or self.settle_timeout())
        return d.weights_while_partial[-1][1]

    def wait_settled(self, timeout: float | None = None):
        """Healthy at v1, then the route back to all-stable (when it does not, that is in the series)."""
        self.ro.wait(self.name, healthy_at(self.hash_v1), timeout or self.settle_timeout(), progress=self.progress)
        try:
            self.recording.wait_weight(0, ALL_STABLE_WITHIN_S, "(all traffic on the stable again)")
        except WaitTimeout as e:
            self.log(f"  .. {e}")

    def observe_for(self, seconds: float, why: str) -> None:
        """An evidence window: the recording goes on for ``seconds``."""
        hold_for(seconds, why)

    def cleanup(self) -> None:
        try:
            self.release_holds()
        except (k8s.ApiException, OSError):     # the journal's restore releases what is left (a full disk: OSError)
            pass
        if self._recording is not None and self._recording.running:
            try:
                self._recording.stop()
            except Exception:
                pass


def pause_seconds(steps: list[dict]) -> float:
    """Total of the timed pauses of a step list (Go durations: 10s, 1.5m, 1h30m, 500ms; a bare number is
    seconds); indefinite pauses count 0 (the drill promotes through them)."""
    total = 0.0
    for s in steps or []:
        d = (s.get("pause") or {}).get("duration") if isinstance(s, dict) and "pause" in s else None
        if isinstance(d, (int, float)):
            total += float(d)
        elif isinstance(d, str):
            total += sum(float(v) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[u] for v, u in _DURATION_RE.findall(d))
    return total


def _image(ro: dict, container: str = "app") -> str | None:
    return container_images(ro["spec"].get("template")).get(container)


def _indefinite_pause(ro: dict) -> bool:
    steps = ((ro["spec"].get("strategy") or {}).get("canary") or {}).get("steps") or []
    i = (ro.get("status") or {}).get("currentStepIndex")
    return i is not None and i < len(steps) and "pause" in steps[i] and not (steps[i]["pause"] or {}).get("duration")


__all__ = ["DrillRollout", "Recording", "Observation", "RolloutSpec", "FAIL", "PASS"]
