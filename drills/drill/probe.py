"""The general rollback probe: any step list (``steps: []`` too), one rollback inside rollbackWindow, on a fresh
namespace.

Deploy v1, deploy v2 and let it promote, wait until the v1 ReplicaSet is scaled to 0, roll back while
availability control holds the revived pods, and observe the peak canary weight while the revived
ReplicaSet is partial.  Waits scale with the shape (replicas x hold, the timed pauses, scaleDownDelaySeconds).
The revived pods are released one at a time until the rollback's weight decision is on record
(``window_decided``); the rest may then be released together (``release="after-window"``, the default), which
keeps a probe of the fleet's real sizes (20 replicas and more) short.  A wait that still runs out ends the probe
``inconclusive`` with the evidence kept and said (the timeline so far, or what a set-up wait last saw), never
with a traceback.  Lane A is two probes and an exit on one DrillRollout.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path

from ..core import config
from ..record import timeline
from .autoscale import HPAScaleOut
from .kit import DrillRollout, Observation
from ..kube.rollout import summarize_rollout
from .shapes import RolloutSpec
from ..core.steps import steps_text
from ..core.wait import WaitTimeout, until

AFTER_WINDOW, ONE_BY_ONE = config.PROBE_AFTER_WINDOW, config.PROBE_ONE_BY_ONE
RELEASES = (AFTER_WINDOW, ONE_BY_ONE)
# after the weight decision is on record, this many more revived pods turn available one at a time with no
# weight change before the rest may be released together
AFTER_WINDOW_PODS = 2
# how long the controller's event broadcaster may take to deliver the promotion event after Healthy
EVENT_WITHIN_S = 30.0


def run_probe(api, namespace: str, spec: RolloutSpec, evidence_dir: Path, controller_version: str, journal=None,
              log=None, audit_log: Path | None = None, release: str = AFTER_WINDOW,
              rollback_timeout: float | None = None, controller_log: Path | None = None,
              scale_out_to: int | None = None, hpa_metrics=None) -> tuple[Observation, DrillRollout]:
    """One probe; the observation is inconclusive (``stopped_early``) when a wait ran out.  ``rollback_timeout``:
    seconds the rollback may take to settle (default: scaled with the shape, DrillRollout.settle_timeout);
    ``controller_log``: the embedded controller's log (``controller_log_of``), read for its word on the window;
    ``scale_out_to``: once the weight decision is on record, the Rollout is scaled to that many replicas through
    its scale subresource (as an autoscaler does) while the revived pods are still held, and what the controller
    did is in the observation's ``extra["scale_out"]``; with ``hpa_metrics`` (drills.cluster.external_metrics,
    started) the write is the real HPA controller's: an HPA on the Rollout (drills.drill.autoscale), created before the
    rollback, scales it when the drill raises its external metric."""
    drill = DrillRollout(api, namespace, spec, evidence_dir, journal=journal, log=log,
                         controller_version=controller_version, audit_log=audit_log, controller_log=controller_log)
    autoscaler = None
    try:
        stage = "deploy v1"
        try:
            shown = steps_text(spec.steps) if spec.steps else ""
            drill.log(f"probe: deploy v1 (steps [{shown}], replicas {spec.replicas}, minPodsPerReplicaSet "
                      f"{spec.min_pods}, routing {spec.routing})")
            drill.deploy_v1()
            stage = "deploy v2"
            drill.log("probe: deploy v2 and let it promote")
            drill.deploy_v2()
            stage = "scale-down of v1"
            drill.log(f"probe: wait until the v1 ReplicaSet {drill.hash_v1} is scaled to 0")
            drill.wait_scaled_to_zero(drill.hash_v1)
            if scale_out_to is not None and hpa_metrics is not None:
                stage = "the HPA's first read of its metric"
                autoscaler = HPAScaleOut(api, hpa_metrics, namespace, drill.name, spec.replicas, scale_out_to,
                                         log=drill.log)
                autoscaler.start()
        except WaitTimeout as e:
            reason = f"the probe's set-up ({stage}) did not finish: {e}"
            drill.log(f"probe: {reason}")
            return Observation.stopped_before_rollback("probe", reason, _setup_evidence(drill, stage, e)), drill
        drill.log("probe: roll back to v1 inside rollbackWindow")
        rec = drill.start_rollback("probe")
        budget = rollback_timeout or drill.settle_timeout()
        deadline = time.monotonic() + budget
        stopped = None
        extra: dict = {}
        try:
            if scale_out_to is not None:
                wait_window_decided(drill, budget)
                extra["scale_out"] = scale_out(drill, scale_out_to, autoscaler)
                if not extra["scale_out"]["revived_resized"]:
                    stopped = (f"the scale-out was not observed ({extra['scale_out']['written_by']}): the controller "
                               f"never resized the revived ReplicaSet")
                budget += drill.settle_timeout()
                deadline = time.monotonic() + drill.settle_timeout()
            if release == AFTER_WINDOW and spec.availability_control:
                if scale_out_to is None:
                    wait_window_decided(drill, budget)
                release_rest(drill)
            drill.wait_settled(max(1.0, deadline - time.monotonic()))
            wait_window_evidence(drill)
        except WaitTimeout as e:
            stopped = stopped or f"the rollback did not settle within {budget:g}s: {e}"
            drill.log(f"probe: {stopped}; the evidence so far is kept")
        drill.release_holds()
        obs = rec.finish(extra=extra or None, stopped_early=stopped)
        obs.extra.update(extra)
        return obs, drill
    finally:
        if autoscaler is not None:
            autoscaler.stop()
        drill.cleanup()


def _setup_evidence(drill: DrillRollout, stage: str, e: WaitTimeout) -> Path:
    """What a set-up wait last saw, kept beside the probe's timeline (there is no timeline before the rollback)."""
    path = drill.evidence_dir / "probe.setup.json"
    last = e.last if isinstance(e.last, dict) else None
    path.write_text(json.dumps({"stage": stage, "wait": str(e), "rollout": summarize_rollout(last) if last else None,
                                "last_seen": e.last}, indent=1, default=str))
    return path


# --- the discriminating window, then the rest together ---------------------------------------------------------
def threshold_pods(spec: RolloutSpec) -> int | None:
    """Revived pods at which the spec's replicaProgressThreshold is met (None without one)."""
    t = (spec.extra_canary or {}).get("replicaProgressThreshold") or {}
    if isinstance(t.get("value"), bool) or not isinstance(t.get("value"), int):
        return None
    return t["value"] if t.get("type") == "Pods" else math.ceil(t["value"] * spec.replicas / 100)


def window_decided(d: timeline.Derived, revived: str | None, threshold: int | None = None) -> bool:
    """Whether the rollback's weight decision is on record: the revived ReplicaSet was scaled to its target, any
    replicaProgressThreshold count was reached, and since the later of that scale-up and the last weight change
    AFTER_WINDOW_PODS more pods turned available with no weight change (or the ReplicaSet is fully available)."""
    avail = [(t, a, tgt) for t, a, tgt in d.canary_available if t >= d.t0]
    if not avail or revived is None:
        return False
    _, a_now, target = avail[-1]
    if target and a_now >= target:
        return True
    t_full = next((t for t, spec, _r, _a in d.replicasets.get(revived, []) if t >= d.t0 and spec >= target), None)
    if t_full is None or (threshold is not None and a_now < threshold):
        return False
    t_ref = max([t_full, *(t for t, _ in d.canary_weight if t >= d.t0)])
    a_ref = next((a for t, a, _ in reversed(avail) if t <= t_ref), 0)
    return a_now - a_ref >= AFTER_WINDOW_PODS


def wait_window_decided(drill: DrillRollout, timeout: float) -> timeline.Derived:
    """Until the weight decision of the rollback is on record: after it, holding the remaining revived pods one
    at a time only makes the probe longer."""
    revived, threshold = drill.hash_v1, threshold_pods(drill.spec)
    return drill.recording.wait(
        f"the rollback's weight decision on record (the revived ReplicaSet at its target size, then "
        f"{AFTER_WINDOW_PODS} more pods available with no weight change)",
        lambda d: window_decided(d, revived, threshold), timeout, describe=lambda d: _so_far(d, revived))


def _so_far(d: timeline.Derived, revived: str | None) -> str:
    last = [[round(t - d.t0, 2), *x] for t, *x in d.replicasets.get(revived, [])[-1:]]
    return f"canary weights {[w for _, w in d.canary_weight]}, revived ReplicaSet [t, spec, ready, available] {last}"


# --- a scale-out while the revived ReplicaSet is partial ------------------------------------------------------
SCALE_OUT_OBSERVE_S = 30.0      # after the controller resized the revived ReplicaSet: the weights it writes then
WRITTEN_BY = {"subresource": "the drill wrote the Rollout's scale subresource (as an autoscaler does; no autoscaler "
                             "ran)",
              "hpa": "the HPA controller of the cluster's kube-controller-manager wrote it, on the drill's external "
                     "metric (drills.drill.autoscale)"}


def scale_out(drill: DrillRollout, to: int, autoscaler: HPAScaleOut | None = None) -> dict:
    """Scale the Rollout to ``to`` replicas through its scale subresource while the revived pods are held (the
    drill's own write, or, with ``autoscaler``, the real HPA controller's when the drill raises its metric; the held
    pods then stay held until release_rest), wait until the controller resizes the revived ReplicaSet (named wait,
    bounded), watch the weights it writes for SCALE_OUT_OBSERVE_S more, and say what it did: the revived
    ReplicaSet's size before and after, the weights written after the scale-out, and whether a weight rose above the
    share of the traffic the available revived pods can carry (100 x available / replicas)."""
    revived = drill.hash_v1
    before = drill.recording.derive()
    rs_before = before.replicasets.get(revived, [])
    spec_before = rs_before[-1][1] if rs_before else None
    frm = drill.spec.replicas
    by = {}
    if autoscaler is None:
        drill.log(f"probe: scale the Rollout {frm} -> {to} through its scale subresource while the revived pods are "
                  f"held")
        drill.recording.mark("scale-out", response=drill.ro.scale(drill.name, to), replicas=to)
        by = {"by": "subresource", "written_by": WRITTEN_BY["subresource"]}
    else:
        drill.log(f"probe: raise the HPA's external metric to {to} while the revived pods are held: the HPA "
                  f"controller scales the Rollout {frm} -> {to}")
        drill.freeze_revived()          # the HPA acts within its sync period: no revived pod released meanwhile
        drill.recording.mark("scale-out", replicas=to, metric=autoscaler.metric, by="hpa")
        t0 = time.time()
        autoscaler.raise_load()
        try:
            hpa = autoscaler.wait_scaled(drill.ro)
            by = {"hpa_wrote_within_s": round(time.time() - t0, 2),
                  "hpa_last_scale_time": (hpa.get("status") or {}).get("lastScaleTime")}
            by.update(by="hpa", written_by=WRITTEN_BY["hpa"])
        except WaitTimeout as e:
            by = {"by": "hpa", "hpa_wrote_within_s": None, "hpa_error": str(e)[:300],
                  "written_by": f"the HPA controller did not write the Rollout's replicas: {str(e)[:200]}"}

    def after(d: timeline.Derived) -> tuple[float, list, list]:
        t_mark = next((t for t, name in d.markers if name == "scale-out"), math.inf)
        return (t_mark, [x for x in d.replicasets.get(revived, []) if x[0] >= t_mark],
                [x for x in d.canary_weight if x[0] >= t_mark])
    resized = True
    try:
        drill.recording.wait(f"the controller to resize the revived ReplicaSet {revived} after the scale-out",
                             lambda d: any(spec != spec_before for _, spec, _r, _a in after(d)[1]),
                             drill.deploy_timeout(), describe=lambda d: _so_far(d, revived))
    except WaitTimeout:
        resized = False
    drill.observe_for(SCALE_OUT_OBSERVE_S, "the weights the controller writes after the scale-out")
    d = drill.recording.derive()
    t_mark, rs_after, weights = after(d)
    last = rs_after[-1] if rs_after else (rs_before[-1] if rs_before else None)
    available = last[3] if last else 0
    share = round(100.0 * available / to, 2)
    above = [[round(t - t_mark, 2), w] for t, w in weights if w > share]
    return {**by, "from": frm, "to": to, "at": round(t_mark - d.t0, 2) if math.isfinite(t_mark) else None,
            "revived_spec_before": spec_before, "revived_spec_after": last[1] if last else None,
            "revived_resized": resized, "revived_available": available,
            "weights_after": [[round(t - t_mark, 2), w] for t, w in weights],
            "share_of_available_pods": share, "weights_above_share": above,
            "said": (f"the controller {'resized' if resized else 'did not resize'} the revived "
                     f"ReplicaSet ({spec_before} -> {last[1] if last else None}) and wrote "
                     f"{'weights ' + str([w for _, w in weights]) if weights else 'no weight'} after the scale-out "
                     f"{frm} -> {to}; {available} revived pods available carry {share}% of the traffic at most"
                     + (f"; weights above that: {[w for _, w in above]}" if above else "")
                     + f" (the scale-out: {by['written_by']})")}


def release_rest(drill: DrillRollout) -> None:
    """Release every revived pod still held, together (marked on the recording)."""
    drill.recording.mark("release the rest")
    drill.release_holds()
    drill.log("  released the remaining revived pods together (the weight decision is on record)")


def wait_window_evidence(drill: DrillRollout, timeout: float = EVENT_WITHIN_S) -> bool:
    """Until the recording shows the rollback was inside rollbackWindow (the step index jumped, a SkipSteps event,
    the promotion's RolloutCompleted event, which may arrive after Healthy, or the controller's log line); False
    when it does not."""
    def found(recs: list[dict]) -> bool:
        return bool(timeline.derive(recs, drill.hash_v1, since_mark="rollback").window_evidence) or \
            bool(drill.recording.controller_said_in_window(recs))
    try:
        until("evidence that the rollback was inside rollbackWindow", drill.recording.records, found, timeout,
              interval=0.5, describe=lambda recs: "none yet")
    except WaitTimeout:
        return False
    return True


def controller_log_of(cluster_status: dict) -> Path | None:
    """The rollouts-controller's log file of an embedded cluster (from its status), if it has one."""
    proc = next((p for p in cluster_status.get("processes") or [] if p.get("name") == "rollouts-controller"), None)
    return Path(proc["log"]) if proc and proc.get("log") else None


def observation_dict(obs: Observation, controller_version: str, routing: str, router: str = "istio") -> dict:
    d = asdict(obs)
    d.update({"controller_version": controller_version, "routing": routing, "router": router})
    return d
