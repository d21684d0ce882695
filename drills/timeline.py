"""The flight recorder: watches one Rollout and everything around it, writes every change to a JSONL
timeline, and derives the series and windows the drills assert on.

Every record carries the monotonic and wall time of its arrival and the object's resourceVersion.
All objects live in one etcd, so resourceVersions order changes across resources; derivations
replay the records in resourceVersion order, never in arrival order.

Completeness: each watch resumes from the last resourceVersion it delivered after a dropped
connection, so no change is skipped.  If the apiserver answers 410 (history compacted), the recorder
re-lists; for the VirtualService the timeline then stays complete only if the re-listed object is the
one already recorded (same resourceVersion); otherwise it is marked incomplete.
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from .errors import BadInput
from .rollout import app_container_name, container_images, selector_string

HASH_LABEL = "rollouts-pod-template-hash"


# --- condensing objects into records ----------------------------------------------------------------
def _rollout(o: dict) -> dict:
    spec, st = o.get("spec") or {}, o.get("status") or {}
    canary = (spec.get("strategy") or {}).get("canary") or {}
    weights = (st.get("canary") or {}).get("weights") or {}
    template = spec.get("template") or {}
    istio = ((canary.get("trafficRouting") or {}).get("istio") or {})
    vs = istio.get("virtualService") or {}
    ping_pong = canary.get("pingPong") or {}
    try:
        app = app_container_name(template, rollout_name=(o.get("metadata") or {}).get("name"))
    except BadInput:
        app = None
    images = container_images(template)
    return {
        "generation": o["metadata"].get("generation"), "replicas": spec.get("replicas", 1),
        "steps": canary.get("steps"), "image": images.get(app) if app else None, "images": images,
        "canaryService": canary.get("canaryService"), "stableService": canary.get("stableService"),
        "pingService": ping_pong.get("pingService"), "pongService": ping_pong.get("pongService"),
        "virtualService": vs.get("name"),
        "vsRoutes": {"http": vs.get("routes"), "tls": vs.get("tlsRoutes"), "tcp": vs.get("tcpRoutes")},
        "destinationRule": istio.get("destinationRule"),
        "status": {
            "currentStepIndex": st.get("currentStepIndex"), "phase": st.get("phase"), "abort": st.get("abort", False),
            "promoteFull": st.get("promoteFull", False), "stableRS": st.get("stableRS"),
            "currentPodHash": st.get("currentPodHash"), "observedGeneration": st.get("observedGeneration"),
            "canaryWeight": (weights.get("canary") or {}).get("weight"),
            "stableWeight": (weights.get("stable") or {}).get("weight"),
            "stablePingPong": (st.get("canary") or {}).get("stablePingPong"),
            "pauseConditions": [p.get("reason") for p in st.get("pauseConditions") or []],
            "message": st.get("message"), "availableReplicas": st.get("availableReplicas"),
        },
    }


def _replicaset(o: dict) -> dict:
    md, spec, st = o["metadata"], o.get("spec") or {}, o.get("status") or {}
    return {"hash": (md.get("labels") or {}).get(HASH_LABEL),
            "revision": (md.get("annotations") or {}).get("rollout.argoproj.io/revision"),
            "created": md.get("creationTimestamp"), "spec_replicas": spec.get("replicas", 0),
            "replicas": st.get("replicas", 0), "ready": st.get("readyReplicas", 0),
            "available": st.get("availableReplicas", 0),
            "image": ((((spec.get("template") or {}).get("spec") or {}).get("containers") or [{}])[0]).get("image")}


def _pod(o: dict) -> dict:
    md, st = o["metadata"], o.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
    return {"hash": (md.get("labels") or {}).get(HASH_LABEL), "phase": st.get("phase"), "ready": ready,
            "deleting": md.get("deletionTimestamp") is not None}


ROUTE_KINDS = ("http", "tls", "tcp")


def _virtualservice(o: dict) -> dict:
    """Every route of every kind (http, tls, tcp) with its destinations and weights."""
    spec = o.get("spec") or {}
    out: dict = {}
    for kind in ROUTE_KINDS:
        routes = []
        for i, r in enumerate(spec.get(kind) or []):
            routes.append({"name": r.get("name") or f"{kind}[{i}]",
                           "route": [{"host": (d.get("destination") or {}).get("host"),
                                      "subset": (d.get("destination") or {}).get("subset"),
                                      "weight": d.get("weight", 0)} for d in r.get("route") or []]})
        out[kind] = routes
    return out


def _destinationrule(o: dict) -> dict:
    return {"subsets": {s.get("name"): s.get("labels") or {} for s in (o.get("spec") or {}).get("subsets") or []}}


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


@dataclass
class Source:
    kind: str
    list_fn: Callable
    args: tuple
    condense: Callable[[dict], dict]
    kwargs: dict = field(default_factory=dict)


# --- the recorder ------------------------------------------------------------------------------------
class Recorder:
    def __init__(self, api: client.ApiClient, namespace: str, rollout: str, out: Path, log=None,
                 audit_log: Path | None = None):
        self.api = api
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
        self.watches: dict[str, watch.Watch] = {}
        self.last_rv: dict[str, str] = {}
        self.incomplete_reasons: list[str] = []
        self.reconnects: dict[str, int] = {}
        self.ready: dict[str, threading.Event] = {}
        self._fh = open(self.out, "w")
        self.listeners: list[Callable[[dict], None]] = []
        self.audit_checked: int | None = None
        self.notes: list[str] = []

    def _sources(self) -> list[Source]:
        co = client.CustomObjectsApi(self.api)
        apps = client.AppsV1Api(self.api)
        core = client.CoreV1Api(self.api)
        sel = None
        try:
            ro = co.get_namespaced_custom_object("argoproj.io", "v1alpha1", self.ns, "rollouts", self.rollout)
            sel = selector_string(ro["spec"].get("selector"))
        except ApiException as e:
            if e.status != 404:
                raise
            # recorded from its creation: ReplicaSets and Pods of the whole namespace until it exists
            self.notes.append(f"rollout {self.ns}/{self.rollout} did not exist when the recording started: "
                              "ReplicaSets and Pods of the whole namespace are recorded")
        except BadInput as e:
            self.notes.append(f"no label selector ({e}): ReplicaSets and Pods of the whole namespace are recorded")
        lab = {"label_selector": sel} if sel else {}
        return [
            Source("Rollout", co.list_namespaced_custom_object, ("argoproj.io", "v1alpha1", self.ns, "rollouts"),
                   _rollout, {"field_selector": f"metadata.name={self.rollout}"}),
            Source("ReplicaSet", apps.list_namespaced_replica_set, (self.ns,), _replicaset, dict(lab)),
            Source("Pod", core.list_namespaced_pod, (self.ns,), _pod, dict(lab)),
            Source("VirtualService", co.list_namespaced_custom_object,
                   ("networking.istio.io", "v1alpha3", self.ns, "virtualservices"), _virtualservice),
            Source("DestinationRule", co.list_namespaced_custom_object,
                   ("networking.istio.io", "v1alpha3", self.ns, "destinationrules"), _destinationrule),
            Source("AnalysisRun", co.list_namespaced_custom_object, ("argoproj.io", "v1alpha1", self.ns, "analysisruns"),
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
            t = threading.Thread(target=self._loop, args=(src,), daemon=True, name=f"rec-{src.kind}")
            t.start()
            self.threads.append(t)
        deadline = time.monotonic() + timeout
        for kind, ev in self.ready.items():
            if not ev.wait(max(0.0, deadline - time.monotonic())):
                self.stop()
                raise RuntimeError(f"recorder: the {kind} watch did not start within {timeout:.0f}s")
        return self

    def _list(self, src: Source) -> dict:
        resp = src.list_fn(*src.args, _preload_content=False, **src.kwargs)
        return json.loads(resp.data)

    def _loop(self, src: Source):
        kind = src.kind
        first = True
        rv = None
        known: dict[str, str] = {}
        while not self.stop_flag.is_set():
            try:
                if rv is None:
                    lst = self._list(src)
                    rv = lst["metadata"]["resourceVersion"]
                    seen = set()
                    for item in lst.get("items") or []:
                        name = item["metadata"]["name"]
                        seen.add(name)
                        irv = item["metadata"]["resourceVersion"]
                        if known.get(name) != irv:
                            if not first and kind == "VirtualService":
                                self.incomplete_reasons.append(
                                    f"VirtualService {name} changed during a watch gap (rv {known.get(name)} -> {irv})")
                            self._emit({"kind": kind, "type": "INITIAL" if first else "RELIST", "name": name,
                                        "rv": irv, "obj": src.condense(item)})
                            known[name] = irv
                    for name in list(known):
                        if name not in seen:
                            if kind == "VirtualService":
                                self.incomplete_reasons.append(f"VirtualService {name} deleted during a watch gap")
                            self._emit({"kind": kind, "type": "DELETED", "name": name, "rv": rv, "obj": {}})
                            del known[name]
                    first = False
                    self.ready[kind].set()
                w = watch.Watch()
                self.watches[kind] = w
                for ev in w.stream(src.list_fn, *src.args, resource_version=rv, allow_watch_bookmarks=True,
                                   timeout_seconds=240, deserialize=False, **src.kwargs):
                    if self.stop_flag.is_set():
                        w.stop()
                        break
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    orv = obj["metadata"]["resourceVersion"]
                    rv = orv
                    if ev["type"] == "BOOKMARK":
                        continue
                    name = obj["metadata"]["name"]
                    if ev["type"] == "DELETED":
                        known.pop(name, None)
                    else:
                        known[name] = orv
                    self.last_rv[kind] = orv
                    self._emit({"kind": kind, "type": ev["type"], "name": name, "rv": orv,
                                "obj": src.condense(obj)})
                # a watch that ends by its timeout resumes from rv
            except ApiException as e:
                if self.stop_flag.is_set():
                    break
                if e.status == 410:
                    self._emit({"kind": kind, "type": "GAP", "name": "", "rv": None, "obj": {"reason": "410 Gone"}})
                    rv = None      # relist; the VirtualService check above decides completeness
                else:
                    self.reconnects[kind] = self.reconnects.get(kind, 0) + 1
                    time.sleep(0.1)
            except Exception:
                if self.stop_flag.is_set():
                    break
                # dropped connection: resume from the last resourceVersion delivered
                self.reconnects[kind] = self.reconnects.get(kind, 0) + 1
                time.sleep(0.05)

    def cut_connections(self) -> int:
        """Drop every watch connection (as a network fault would); the recorder must resume."""
        n = 0
        for w in list(self.watches.values()):
            resp = getattr(w, "_resp", None)
            if resp is not None:
                try:
                    resp.shutdown()
                except Exception:
                    resp.close()
                n += 1
        return n

    def stop(self) -> dict:
        self.stop_flag.set()
        for w in list(self.watches.values()):
            w.stop()
            resp = getattr(w, "_resp", None)
            if resp is not None:
                try:
                    resp.shutdown()
                except Exception:
                    pass
        for t in self.threads:
            t.join(timeout=5)
        if self.audit_log:
            writes = audit_virtualservice_writes(self.audit_log, self.ns, since_wall=self.started_wall)
            missing = missing_virtualservice_versions(self.records, writes)
            self.audit_checked = len(writes)
            if missing:
                self.incomplete_reasons.append(
                    f"the apiserver's audit log has VirtualService resourceVersions the timeline lacks: {missing}")
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
                                               "notes": self.notes}}
        self.records.append(rec)
        self._fh.write(json.dumps(rec) + "\n")

    @property
    def complete(self) -> bool:
        return not self.incomplete_reasons

    def wait_for(self, pred: Callable[[list[dict]], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                recs = list(self.records)
            if pred(recs):
                return
            time.sleep(0.05)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


TIMELINE_SUFFIX = ".timeline.jsonl"
SERIES_SUFFIX = ".series.json"


def series_path(timeline: Path | str) -> Path:
    """The one name of a timeline's derived series: x.timeline.jsonl (or x.jsonl) -> x.series.json."""
    p = Path(timeline)
    for suffix in (TIMELINE_SUFFIX, ".jsonl"):
        if p.name.endswith(suffix):
            return p.with_name(p.name[: -len(suffix)] + SERIES_SUFFIX)
    return p.with_name(p.name + SERIES_SUFFIX)


def load(path: Path) -> list[dict]:
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


# --- derivations --------------------------------------------------------------------------------------
def _rvkey(rec: dict, prev: int) -> int:
    try:
        return int(rec["rv"])
    except (TypeError, ValueError):
        return prev


def ordered(records: list[dict]) -> list[dict]:
    """Records in resourceVersion order; records without one (marks without rv) keep arrival order."""
    keyed = []
    prev = 0
    for r in sorted(records, key=lambda r: r["seq"]):
        if r["type"] in ("END", "GAP"):
            continue
        k = _rvkey(r, prev)
        prev = k
        keyed.append((k, r["seq"], r))
    keyed.sort(key=lambda x: (x[0], x[1]))
    return [r for _, _, r in keyed]


def canary_stable_hosts(rollout: dict) -> tuple[str | None, str | None]:
    """(canary host, stable host) when routed by host: canaryService/stableService, or ping-pong services
    (the stable one named by status.canary.stablePingPong, ping when unset)."""
    if rollout.get("pingService") and rollout.get("pongService"):
        if (rollout.get("status") or {}).get("stablePingPong") == "pong":
            return rollout["pingService"], rollout["pongService"]
        return rollout["pongService"], rollout["pingService"]
    return rollout.get("canaryService"), rollout.get("stableService")


def canary_weight_of(vs: dict, rollout: dict) -> tuple[int | None, int | None]:
    """(canary, stable) weights from a condensed VirtualService, routed by subset, by host or ping-pong, over
    the route kinds the Rollout manages (http, tls, tcp; the first managed route that names either)."""
    canary_host, stable_host = canary_stable_hosts(rollout)
    dr = rollout.get("destinationRule") or {}
    csub, ssub = dr.get("canarySubsetName", "canary"), dr.get("stableSubsetName", "stable")
    managed = rollout.get("vsRoutes") or {}
    for kind in ROUTE_KINDS:
        wanted = managed.get(kind)
        for http in vs.get(kind) or []:
            if kind == "http" and wanted and http.get("name") not in wanted:
                continue
            c = s = None
            for r in http["route"]:
                if canary_host and r["host"] == canary_host or (not canary_host and r["subset"] == csub):
                    c = r["weight"]
                elif stable_host and r["host"] == stable_host or (not stable_host and r["subset"] == ssub):
                    s = r["weight"]
            if c is not None or s is not None:
                return c or 0, s or 0
    return None, None


@dataclass
class Derived:
    canary_weight: list = field(default_factory=list)       # [t, weight]
    stable_weight: list = field(default_factory=list)
    canary_available: list = field(default_factory=list)    # [t, available, target]
    replicasets: dict = field(default_factory=dict)         # hash -> [[t, spec, ready, available]]
    rollout: list = field(default_factory=list)             # [t, step, phase, abort, promoteFull, stableRS]
    analysisruns: dict = field(default_factory=dict)         # name -> [[t, phase]]
    partial: list = field(default_factory=list)              # [t0, t1]
    exposure: list = field(default_factory=list)
    markers: list = field(default_factory=list)              # [t, label]
    peak_canary_weight_while_partial: int | None = None
    weights_while_partial: list = field(default_factory=list)
    # a partial-availability window: some but not all of the canary's target pods available.  Windows
    # (``partial``) and the peak also cover moments with none available (the controller then holds 0).
    partial_window_observed: bool = False
    exposure_seconds: float = 0.0
    rollback_in_window: bool = False
    window_evidence: list = field(default_factory=list)
    t0: float = 0.0
    t0_wall: float = 0.0
    end: float = 0.0

    def series(self, title: str, extra: dict | None = None) -> dict:
        rel = lambda rows: [[round(r[0] - self.t0, 3), *r[1:]] for r in rows]  # noqa: E731
        win = lambda ws: [[round(a - self.t0, 3), None if b is None else round(b - self.t0, 3)] for a, b in ws]  # noqa
        out = {"title": title, "t0_wall": self.t0_wall,
               "canary_weight": rel(self.canary_weight), "stable_weight": rel(self.stable_weight),
               "canary_available": rel(self.canary_available), "partial": win(self.partial),
               "exposure": win(self.exposure), "markers": rel(self.markers),
               "summary": {"peak_canary_weight_while_partial": self.peak_canary_weight_while_partial,
                           "partial_window_observed": self.partial_window_observed,
                           "exposure_seconds": round(self.exposure_seconds, 3),
                           "rollback_in_window": self.rollback_in_window}}
        if extra:
            out.update(extra)
        return out


def derive(records: list[dict], canary_hash: str | None, since_mark: str | None = None,
           target: str = "rollout_replicas", until_mark: str | None = None) -> Derived:
    """Replay records in resourceVersion order.

    canary_hash: the ReplicaSet whose availability defines the windows (the revived one in a rollback);
      None = whatever the Rollout reports as currentPodHash.
    since_mark: windows only count after this mark (e.g. "rollback").
    target: "rollout_replicas" (at the end of steps: spec.replicas) or "rs_spec" (the canary ReplicaSet's
      own desired count, for mid-steps probes).
    """
    recs = ordered(records)
    d = Derived()
    if not recs:
        return d
    t_prev = -math.inf
    ro: dict = {}
    vs_by_name: dict[str, dict] = {}
    rs: dict[str, dict] = {}
    active = since_mark is None
    stopped = False
    cur_weight = cur_stable = None
    partial_since = exposure_since = None
    peak = None
    base = min(r["t"] for r in recs)
    d.t0, d.t0_wall = base, min(r["wall"] for r in recs)
    for r in recs:
        t = max(t_prev, r["t"])
        t_prev = t
        kind, obj = r["kind"], r["obj"]
        if kind == "Mark":
            d.markers.append([t, r["name"]])
            if since_mark and r["name"] == since_mark and not active:
                active = True
                d.t0, d.t0_wall = t, r["wall"]
            if until_mark and r["name"] == until_mark and active and not stopped:
                stopped = True
                if partial_since is not None:
                    d.partial[-1][1] = t
                    partial_since = None
                if exposure_since is not None:
                    d.exposure[-1][1] = t
                    d.exposure_seconds += t - exposure_since
                    exposure_since = None
            continue
        if kind == "Rollout" and r["type"] != "DELETED":
            ro = obj
            st = obj["status"]
            d.rollout.append([t, st["currentStepIndex"], st["phase"], st["abort"], st["promoteFull"], st["stableRS"]])
        elif kind == "ReplicaSet" and obj.get("hash"):
            if r["type"] == "DELETED":
                rs.pop(obj["hash"], None)
            else:
                rs[obj["hash"]] = obj
                d.replicasets.setdefault(obj["hash"], []).append(
                    [t, obj["spec_replicas"], obj["ready"], obj["available"]])
        elif kind == "VirtualService":
            vs_by_name[r["name"]] = obj if r["type"] != "DELETED" else {}
        elif kind == "AnalysisRun" and r["type"] != "DELETED":
            d.analysisruns.setdefault(r["name"], []).append([t, obj.get("phase")])
        elif kind == "Event" and active and obj.get("reason") == "SkipSteps":
            d.window_evidence.append(f"SkipSteps event: {obj.get('message')}")
        # current weights
        vs = vs_by_name.get(ro.get("virtualService")) if ro.get("virtualService") else \
            (next(iter(vs_by_name.values())) if vs_by_name else None)
        if vs and ro:
            c, s = canary_weight_of(vs, ro)
            if c is not None and c != cur_weight:
                cur_weight = c
                d.canary_weight.append([t, c])
            if s is not None and s != cur_stable:
                cur_stable = s
                d.stable_weight.append([t, s])
        chash = canary_hash or (ro.get("status") or {}).get("currentPodHash")
        crs = rs.get(chash) if chash else None
        if not ro:
            continue
        avail = crs["available"] if crs else 0
        tgt = ro.get("replicas", 1) if target == "rollout_replicas" else (crs["spec_replicas"] if crs else 0)
        if not d.canary_available or d.canary_available[-1][1:] != [avail, tgt]:
            d.canary_available.append([t, avail, tgt])
        if not active or stopped:
            continue
        steps = ro.get("steps") or []
        if (kind == "Rollout" and ro["status"]["currentStepIndex"] == len(steps) and steps
                and crs is not None and avail < tgt and ro["status"].get("currentPodHash") == chash):
            if not d.rollback_in_window:
                d.window_evidence.append(f"currentStepIndex jumped to {len(steps)} (end of steps) "
                                         f"while the revived ReplicaSet had {avail}/{tgt} available")
            d.rollback_in_window = True
        is_partial = crs is not None and tgt > 0 and avail < tgt
        if is_partial and avail > 0:
            d.partial_window_observed = True      # some, not all, of the canary's pods available
        if is_partial:
            if partial_since is None:
                partial_since = t
                d.partial.append([t, None])
            w = cur_weight or 0
            peak = w if peak is None else max(peak, w)
            if not d.weights_while_partial or d.weights_while_partial[-1][1] != w:
                d.weights_while_partial.append([t, w, avail, tgt])
        elif partial_since is not None:
            d.partial[-1][1] = t
            partial_since = None
        replicas = ro.get("replicas") or 1
        exposed = (cur_weight or 0) > 100.0 * avail / replicas + 1e-9 and chash is not None
        if exposed and exposure_since is None:
            exposure_since = t
            d.exposure.append([t, None])
        elif not exposed and exposure_since is not None:
            d.exposure[-1][1] = t
            d.exposure_seconds += t - exposure_since
            exposure_since = None
    d.end = t_prev
    if exposure_since is not None:
        d.exposure_seconds += t_prev - exposure_since
    d.peak_canary_weight_while_partial = peak if d.partial_window_observed else None
    return d


# --- proof from the apiserver's audit log (embedded cluster) -----------------------------------------------
def audit_virtualservice_writes(audit_log: Path, namespace: str, name: str | None = None,
                                since_wall: float | None = None) -> list[dict]:
    """Successful writes of VirtualServices in ``namespace`` as the apiserver recorded them:
    [{"rv", "verb", "user", "time" (wall, ResponseComplete), "weights"}]."""
    from datetime import datetime
    out = []
    try:
        fh = open(audit_log)
    except FileNotFoundError:
        return out
    with fh:
        for line in fh:
            if '"virtualservices"' not in line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ref = ev.get("objectRef") or {}
            if ref.get("resource") != "virtualservices" or ref.get("namespace") != namespace:
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
                        "time": wall, "name": ref.get("name"), "weights": _virtualservice(resp) if resp else None})
    return out


def missing_virtualservice_versions(records: list[dict], audit_writes: list[dict]) -> list[str]:
    """resourceVersions the apiserver handed out for the VirtualService that the timeline lacks."""
    have = {r["rv"] for r in records if r["kind"] == "VirtualService"}
    return [w["rv"] for w in audit_writes if w["rv"] and w["rv"] not in have]
