"""The flight recorder: watches one Rollout and everything around it and writes every change to a JSONL
timeline (derivations are drills.record.timeline's).

Every record carries the monotonic and wall time of its arrival and the object's resourceVersion.
All objects live in one etcd, so resourceVersions order changes across resources.

Completeness: each watch (drills.kube.watching) resumes from the last resourceVersion it delivered after a dropped
connection, so no change is skipped.  If the apiserver answers 410 (history compacted), the recorder
re-lists; for the route objects that carry the weights (drills.routers: the router's route kind) the timeline
then stays complete only if the re-listed object is the one already recorded (same resourceVersion); otherwise it
is marked incomplete.  On the embedded cluster the apiserver's audit log is the independent proof: every
resourceVersion of a route object it handed out must be in the timeline.  A watch that fails for good marks the
recording incomplete.  The closing END record names the leg and run that recorded it (under `drills run`), so a
row can prove the timeline it names is its own (drills.record.evidence).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

from ..kube import k8s
from ..kube.k8s import client

from ..core import config
from ..kube import api as kube
from .. import routers
from ..core.errors import BadInput
from ..routers import Source
from .evidence import leg_stamp
from ..core.podtemplate import app_container_name, container_images, selector_string
from ..kube.rollout import HASH_LABEL, Rollouts, healthy
from ..core.signals import Interrupted, SignalGuard
from .timeline import derive, series_path
from ..core.wait import WaitTimeout, until
from ..kube.watching import ListWatch

CATCH_UP_S = 10.0       # how long a finished recording waits for its Rollout watch to deliver the latest state


class RecorderError(RuntimeError):
    """The recording could not start (a watch did not list in time, or failed)."""


# --- condensing objects into records ----------------------------------------------------------------
def _rollout(o: dict) -> dict:
    spec, st = o.get("spec") or {}, o.get("status") or {}
    canary = (spec.get("strategy") or {}).get("canary") or {}
    weights = (st.get("canary") or {}).get("weights") or {}
    template = spec.get("template") or {}
    ping_pong = canary.get("pingPong") or {}
    try:
        app = app_container_name(template, rollout_name=(o.get("metadata") or {}).get("name"))
    except BadInput:
        app = None
    images = container_images(template)
    router = routers.of_canary(canary)
    return {
        **(router.rollout_fields((o.get("metadata") or {}).get("name") or "", canary) if router else {}),
        "generation": o["metadata"].get("generation"), "replicas": spec.get("replicas", 1),
        "steps": canary.get("steps"), "image": images.get(app) if app else None, "images": images,
        "canaryService": canary.get("canaryService"), "stableService": canary.get("stableService"),
        "pingService": ping_pong.get("pingService"), "pongService": ping_pong.get("pongService"),
        "status": {
            "currentStepIndex": st.get("currentStepIndex"), "phase": st.get("phase"), "abort": st.get("abort", False),
            "promoteFull": st.get("promoteFull", False), "stableRS": st.get("stableRS"),
            "currentPodHash": st.get("currentPodHash"), "observedGeneration": st.get("observedGeneration"),
            "canaryWeight": (weights.get("canary") or {}).get("weight"),
            "stableWeight": (weights.get("stable") or {}).get("weight"),
            "stablePingPong": (st.get("canary") or {}).get("stablePingPong"),
            "pauseConditions": [p.get("reason") for p in st.get("pauseConditions") or []],
            "message": st.get("message"), "availableReplicas": st.get("availableReplicas"),
            # what the controller's rollout_info{phase} is computed from (RolloutAborted: phase Abort)
            "progressingReason": next((c.get("reason") for c in st.get("conditions") or []
                                       if c.get("type") == "Progressing"), None),
        },
    }


def _replicaset(o: dict) -> dict:
    md, spec, st = o["metadata"], o.get("spec") or {}, o.get("status") or {}
    return {"hash": (md.get("labels") or {}).get(HASH_LABEL),
            "revision": (md.get("annotations") or {}).get(config.REVISION_ANNOTATION),
            "created": md.get("creationTimestamp"), "spec_replicas": spec.get("replicas", 0),
            "replicas": st.get("replicas", 0), "ready": st.get("readyReplicas", 0),
            "available": st.get("availableReplicas", 0),
            "image": ((((spec.get("template") or {}).get("spec") or {}).get("containers") or [{}])[0]).get("image")}


def _pod(o: dict) -> dict:
    md, st = o["metadata"], o.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
    return {"hash": (md.get("labels") or {}).get(HASH_LABEL), "phase": st.get("phase"), "ready": ready,
            "deleting": md.get("deletionTimestamp") is not None}


def _analysisrun(o: dict) -> dict:
    st = o.get("status") or {}
    return {"phase": st.get("phase"), "message": st.get("message"),
            "metrics": {m.get("name"): {"phase": m.get("phase"), "count": m.get("count"), "failed": m.get("failed"),
                                         "last": ((m.get("measurements") or [{}])[-1]).get("value")}
                        for m in st.get("metricResults") or []}}


def _event(o: dict) -> dict:
    inv = o.get("involvedObject") or {}
    return {"reason": o.get("reason"), "message": o.get("message"), "type": o.get("type"),
            "involved": f"{inv.get('kind')}/{inv.get('name')}", "count": o.get("count")}


# --- the recorder ------------------------------------------------------------------------------------
class Recorder:
    def __init__(self, api: client.ApiClient, namespace: str, rollout: str, out: Path, log=None,
                 audit_log: Path | None = None, router: str | None = None):
        self.api = api
        # the router whose objects are recorded: the Rollout's own once it is read, else the one named
        self.router = routers.get(router)
        self.audit_log = Path(audit_log) if audit_log else None
        self.started_wall = time.time()
        self.ns = namespace
        self.rollout = rollout
        self.out = Path(out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.log = log or (lambda m: None)
        self.records: list[dict] = []
        self.lock = threading.Lock()
        self.seq = 0
        self.stop_flag = threading.Event()
        self.threads: list[threading.Thread] = []
        self.loops: dict[str, ListWatch] = {}
        self.failures: dict[str, str] = {}
        self.incomplete_reasons: list[str] = []
        self.ready: dict[str, threading.Event] = {}
        self._fh = open(self.out, "w")
        self.listeners: list[Callable[[dict], None]] = []
        self.audit_checked: int | None = None
        self.notes: list[str] = []
        self.route_listed_rv: int | None = None    # the route objects' first list: writes up to it are not owed

    def _sources(self) -> list[Source]:
        co = client.CustomObjectsApi(self.api)
        apps = client.AppsV1Api(self.api)
        core = client.CoreV1Api(self.api)
        sel = None
        try:
            ro = co.get_namespaced_custom_object(config.ARGO_GROUP, config.ARGO_VERSION, self.ns, "rollouts", self.rollout)
            self.router = routers.of_canary(((ro.get("spec") or {}).get("strategy") or {}).get("canary") or {}) \
                or self.router
            sel = selector_string(ro["spec"].get("selector"))
        except k8s.ApiException as e:
            if e.status != 404:
                raise
            # recorded from its creation: ReplicaSets and Pods of the whole namespace until it exists
            self.notes.append(f"rollout {self.ns}/{self.rollout} did not exist when the recording started: "
                              "ReplicaSets and Pods of the whole namespace are recorded")
        except BadInput as e:
            self.notes.append(f"no label selector ({e}): ReplicaSets and Pods of the whole namespace are recorded")
        lab = {"label_selector": sel} if sel else {}
        return [
            Source("Rollout", co.list_namespaced_custom_object, (config.ARGO_GROUP, config.ARGO_VERSION, self.ns, "rollouts"),
                   _rollout, {"field_selector": f"metadata.name={self.rollout}"}),
            Source("ReplicaSet", apps.list_namespaced_replica_set, (self.ns,), _replicaset, dict(lab)),
            Source("Pod", core.list_namespaced_pod, (self.ns,), _pod, dict(lab)),
            *self.router.sources(self.api, self.ns),
            Source("AnalysisRun", co.list_namespaced_custom_object, (config.ARGO_GROUP, config.ARGO_VERSION, self.ns, "analysisruns"),
                   _analysisrun),
            Source("Event", core.list_namespaced_event, (self.ns,), _event),
        ]

    # --- writing ------------------------------------------------------------------------------------
    def _emit(self, rec: dict) -> dict:
        with self.lock:
            self.seq += 1
            rec = {"seq": self.seq, "t": time.monotonic(), "wall": time.time(), **rec}
            self.records.append(rec)
            self._fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
            self._fh.flush()
        for fn in self.listeners:
            try:
                fn(rec)
            except Exception:
                pass
        return rec

    def mark(self, label: str, rv: str | None = None, **extra) -> dict:
        """An action of the drill, placed in resourceVersion order by ``rv`` (the response's RV)."""
        return self._emit({"kind": "Mark", "type": "MARK", "name": label, "rv": rv, "obj": extra})

    # --- watching ------------------------------------------------------------------------------------
    def start(self, timeout: float = 15) -> "Recorder":
        for src in self._sources():
            self.ready[src.kind] = threading.Event()
            self.loops[src.kind] = ListWatch(src.list_fn, *src.args, **src.kwargs)
            t = threading.Thread(target=self._loop, args=(src,), daemon=True, name=f"rec-{src.kind}")
            t.start()
            self.threads.append(t)
        try:
            until("every watch of the recorder to list", lambda: [k for k, e in self.ready.items() if not e.is_set()],
                  lambda pending: not pending, timeout, describe=lambda pending: f"not yet listed: {pending}")
        except WaitTimeout as e:
            self.stop()
            raise RecorderError(f"recorder: {e}") from None
        except BaseException:        # interrupted while its watches list: none is left running
            self.stop()
            raise
        if self.failures:
            self.stop()
            raise RecorderError(f"recorder: {'; '.join(self.failures.values())}")
        return self

    def _loop(self, src: Source):
        kind = src.kind
        known: dict[str, str] = {}
        lw = self.loops[kind]

        def on_list(items, rv, relisted):
            if kind == self.router.route_kind and not relisted and str(rv).isdigit():
                self.route_listed_rv = int(rv)
            seen = set()
            for item in items:
                name = item["metadata"]["name"]
                seen.add(name)
                irv = item["metadata"]["resourceVersion"]
                if known.get(name) != irv:
                    if relisted and kind == self.router.route_kind:
                        self.incomplete_reasons.append(
                            f"{kind} {name} changed during a watch gap (rv {known.get(name)} -> {irv})")
                    self._emit({"kind": kind, "type": "RELIST" if relisted else "INITIAL", "name": name,
                                "rv": irv, "obj": src.condense(item)})
                    known[name] = irv
            for name in list(known):
                if name not in seen:
                    if kind == self.router.route_kind:
                        self.incomplete_reasons.append(f"{kind} {name} deleted during a watch gap")
                    self._emit({"kind": kind, "type": "DELETED", "name": name, "rv": rv, "obj": {}})
                    del known[name]
            self.ready[kind].set()

        def on_event(etype, obj):
            name, orv = obj["metadata"]["name"], obj["metadata"]["resourceVersion"]
            if etype == "DELETED":
                known.pop(name, None)
            else:
                known[name] = orv
            self._emit({"kind": kind, "type": etype, "name": name, "rv": orv, "obj": src.condense(obj)})

        def on_gap(reason):
            self._emit({"kind": kind, "type": "GAP", "name": "", "rv": None, "obj": {"reason": reason}})

        try:
            lw.run(on_list, on_event, on_gap)
        except Exception as e:       # a watch that cannot go on: the recording is not complete
            self.failures[kind] = kube.describe(e, kube.server_of(self.api), f"the {kind} watch")
            self.incomplete_reasons.append(self.failures[kind])
            self.ready[kind].set()

    @property
    def reconnects(self) -> dict:
        return {k: lw.reconnects for k, lw in self.loops.items() if lw.reconnects}

    def cut_connections(self) -> int:
        """Drop every watch connection (as a network fault would); the recorder must resume."""
        return sum(1 for lw in list(self.loops.values()) if lw.cut())

    def catch_up(self, timeout: float = CATCH_UP_S) -> None:
        """Until the Rollout watch delivered the Rollout as a read finds it now: a drill's own waits read the
        API, its watch may lag behind them (a busy apiserver, a restarted controller's burst of writes), and a
        recording stopped then would lack the end of the step.  Not delivered in time: the recording is
        incomplete, never silently short."""
        if self.stop_flag.is_set() or "Rollout" not in self.loops or self.failures:
            return
        try:
            ro = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                config.ARGO_GROUP, config.ARGO_VERSION, self.ns, "rollouts", self.rollout)
        except Exception:       # gone or unreachable: the watches' own failures say what is missing
            return
        rv = ro["metadata"]["resourceVersion"]

        def delivered() -> bool:
            with self.lock:
                return any(r["kind"] == "Rollout" and r["rv"] == rv for r in reversed(self.records))
        try:
            until(f"the Rollout watch to deliver resourceVersion {rv}", delivered, timeout=timeout, interval=0.05)
        except WaitTimeout:
            self.incomplete_reasons.append(f"the Rollout watch had not delivered the Rollout as read at the end "
                                           f"(resourceVersion {rv}) within {timeout:.0f}s")

    def stop(self) -> dict:
        stopped_wall = time.time()      # the end of the recording: a route write after it is no gap in it
        self.stop_flag.set()
        for lw in list(self.loops.values()):
            lw.stop()
        for t in self.threads:
            t.join(timeout=5)
        if self.audit_log:
            writes = audit_route_writes(self.audit_log, self.ns, since_wall=self.started_wall, router=self.router)
            # a write the apiserver completed after the recording ended (the controller carries on while the watches
            # stop and their threads are joined, seconds on a loaded machine) is outside it, not missed by it
            within = [w for w in writes if not (w["time"] and w["time"] > stopped_wall)]
            if len(within) < len(writes):
                self.notes.append(f"{len(writes) - len(within)} {self.router.route_kind} write(s) after the recording "
                                  f"ended are outside it")
            writes = within
            # a write after the recorder started but at or below its first list's resourceVersion was superseded
            # before any watch could see it (the list holds what came after): not a gap (a loaded machine lists late)
            floor, before = self.route_listed_rv, len(writes)
            writes = [w for w in writes if floor is None or not str(w["rv"]).isdigit() or int(w["rv"]) > floor]
            if len(writes) < before:
                self.notes.append(f"{before - len(writes)} {self.router.route_kind} write(s) after the recorder began "
                                  f"and before its first list (resourceVersion {floor}) are in that list's state")
            missing = missing_route_versions(self.records, writes, self.router)
            self.audit_checked = len(writes)
            blind = sum(1 for w in writes if not w["rv"])
            if blind:              # a policy without the response body: those writes prove nothing either way
                self.incomplete_reasons.append(f"the apiserver's audit log has {blind} {self.router.route_kind} "
                                               f"write(s) without the object written: the timeline cannot be proved "
                                               f"complete against them")
            if missing:
                self.incomplete_reasons.append(f"the apiserver's audit log has {self.router.route_kind} "
                                               f"resourceVersions the timeline lacks: {missing}")
        with self.lock:
            complete = not self.incomplete_reasons
            self._emit_footer(complete)
            self._fh.close()
        return {"complete": complete, "reasons": list(self.incomplete_reasons), "reconnects": dict(self.reconnects),
                "audit_writes_checked": self.audit_checked, "audit_log_checked": self.audit_log is not None,
                "notes": list(self.notes)}

    def _emit_footer(self, complete: bool):
        self.seq += 1
        rec = {"seq": self.seq, "t": time.monotonic(), "wall": time.time(), "kind": "Recorder", "type": "END",
               "name": "", "rv": None, "obj": {"complete": complete, "reasons": self.incomplete_reasons,
                                               "reconnects": self.reconnects,
                                               "audit_writes_checked": self.audit_checked,
                                               "audit_log_checked": self.audit_log is not None,
                                               "notes": self.notes, **leg_stamp()}}
        self.records.append(rec)
        self._fh.write(json.dumps(rec) + "\n")

    @property
    def complete(self) -> bool:
        return not self.incomplete_reasons

    def snapshot(self) -> list[dict]:
        """The records so far (a copy; the recording goes on)."""
        with self.lock:
            return list(self.records)

    def wait_for(self, name: str, pred: Callable[[list[dict]], bool], timeout: float) -> list[dict]:
        """A named wait on the recording: until ``pred(records so far)`` holds."""
        return until(name, self.snapshot, pred, timeout, describe=lambda recs: f"{len(recs)} records")


# --- proof from the apiserver's audit log (embedded cluster) -----------------------------------------------
def audit_route_writes(audit_log: Path, namespace: str, name: str | None = None, since_wall: float | None = None,
                       router: routers.TrafficRouter | None = None) -> list[dict]:
    """Successful writes of the router's route objects in ``namespace`` as the apiserver
    recorded them: [{"rv", "verb", "user", "time" (wall, ResponseComplete), "weights"}]."""
    router = router or routers.get(None)
    group, plural = router.audit_resource
    out = []
    try:
        fh = open(audit_log)
    except FileNotFoundError:
        return out
    with fh:
        for line in fh:
            if f'"{plural}"' not in line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ref = ev.get("objectRef") or {}
            if ref.get("resource") != plural or (ref.get("apiGroup") or "") != group or ref.get("namespace") != namespace:
                continue
            if name and ref.get("name") != name:
                continue
            if ev.get("verb") not in ("create", "update", "patch") or ev.get("stage") != "ResponseComplete":
                continue
            if (ev.get("responseStatus") or {}).get("code", 200) >= 300:
                continue
            resp = ev.get("responseObject") or {}
            rv = (resp.get("metadata") or {}).get("resourceVersion")
            ts = ev.get("stageTimestamp")
            wall = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() if ts else None
            if since_wall and wall and wall < since_wall:
                continue
            out.append({"rv": rv, "verb": ev.get("verb"), "user": (ev.get("user") or {}).get("username"),
                        "time": wall, "name": ref.get("name"), "weights": router.condense_route(resp) if resp else None})
    return out


def missing_route_versions(records: list[dict], audit_writes: list[dict],
                           router: routers.TrafficRouter | None = None) -> list[str]:
    """resourceVersions the apiserver handed out for the route objects that the timeline lacks."""
    kind = (router or routers.get(None)).route_kind
    have = {r["rv"] for r in records if r["kind"] == kind}
    return [w["rv"] for w in audit_writes if w["rv"] and w["rv"] not in have]


# --- `drills watch`: a read-only recording of one Rollout ----------------------------------------------------
def watch_rollout(api, namespace: str, rollout: str, out: Path, duration: float | None, until_healthy: bool,
                  audit_log: Path | None = None, progress=print) -> dict:
    """Record until the duration ends, the Rollout is Healthy at its new revision, or a signal; returns the
    summary `drills watch` prints (timeline, series, completeness, the derived windows and weights)."""
    rl = Rollouts(api, namespace)
    try:
        rl.get(rollout)
        exists = True
    except k8s.ApiException as e:
        if e.status != 404:
            raise kube.unreachable(e, api, f"reading rollout {namespace}/{rollout}") from None
        exists = False
    except Exception as e:
        raise kube.unreachable(e, api, f"reading rollout {namespace}/{rollout}") from None
    rec = Recorder(api, namespace, rollout, out, audit_log=audit_log).start()
    progress(f"recording {namespace}/{rollout} to {out} (read-only)"
             + ("" if exists else "; it does not exist yet: recording from its creation") + "; Ctrl-C ends it")
    t0 = time.monotonic()

    def done() -> bool:
        if duration and time.monotonic() - t0 >= duration:
            return True
        if until_healthy and time.monotonic() - t0 > 2:
            try:
                ro = rl.get(rollout)
            except k8s.ApiException as e:
                if e.status == 404:
                    return False
                raise
            return healthy()(ro) and ro["status"].get("stableRS") == ro["status"].get("currentPodHash")
        return False
    with SignalGuard() as guard:
        try:
            until("the end of the recording", done, lambda v: v, timeout=duration + 60 if duration else 10 ** 7,
                  interval=0.5)
        except Interrupted:
            progress("recording ended by a signal")
        finally:
            guard.quiet()
    result = rec.stop()
    d = derive(rec.records, None)
    sp = series_path(out)
    series = d.series(f"{namespace}/{rollout}")
    sp.write_text(json.dumps(series, indent=1))
    return {"timeline": str(out), "series": str(sp), "complete": result["complete"],
            "incomplete_reasons": result["reasons"], "notes": result["notes"],
            "audit_log_checked": result["audit_log_checked"], "audit_writes_checked": result["audit_writes_checked"],
            "peak_canary_weight_while_partial": d.peak_canary_weight_while_partial,
            "partial_window_observed": d.partial_window_observed, "exposure_seconds": round(d.exposure_seconds, 3),
            "exposure_windows": series["exposure"], "partial_windows": series["partial"],
            "canary_weights": series["canary_weight"]}
