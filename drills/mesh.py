"""Mesh emulator for the embedded cluster — an EMULATION, not a service mesh.

No Envoy or Istio data plane runs on the embedded cluster (there are no containers and no sidecars).  This
module stands in for the data path of one Istio-routed service so that drills can be run under load:

* it WATCHES (Kubernetes watch with relist on 410 Gone, never a poll) one VirtualService
  (``networking.istio.io/v1alpha3``; ``spec.http[0].route[]`` with ``destination.host``/``subset`` and
  ``weight``), the DestinationRule whose subsets (``canary``/``stable``) carry the
  ``rollouts-pod-template-hash`` label the Argo Rollouts controller writes, the Pods of the namespace, and
  optionally a ConfigMap holding injected faults;
* for every request on its HTTP front (127.0.0.1 only) it picks a subset by the weights in force, finds the
  Ready pods matching the subset's labels and lets the least-loaded one serve if it has capacity (a token
  bucket of ``capacity_rps`` requests/second per Ready pod).  Over capacity it answers 503 (Envoy's
  ``UO`` overflow), with no Ready pod 503 ``no healthy upstream`` (Envoy's ``UH``).  A per-revision error
  rate (keyed by pod-template-hash or image tag) turns served requests into 500s: a broken release;
* it exposes ``/metrics`` in the Prometheus text format, shaped like Istio's standard metrics
  ``istio_requests_total`` and ``istio_request_duration_milliseconds``, plus a ``revision`` label (the
  pod-template-hash) that the seed's fleet lacked.

Which Istio reporter the metrics stand for: every request is counted once with ``reporter="source"`` (what
the caller's proxy / the ingress gateway sees: all requests, including the 503s produced before any pod is
reached) and, when a pod was reached, once more with ``reporter="destination"`` (what the server-side
sidecar sees: served requests and the application's injected errors).  So, as in a real mesh, a query on
``reporter="destination"`` (the seed's error-rate query) does not see ``no healthy upstream`` or overflow
503s; a query on ``reporter="source"`` does.

Admin endpoints (loopback only, same port): ``GET /-/ready`` (200 once every watch has listed),
``GET /-/state`` (routing table as JSON), ``GET|POST /-/faults`` (JSON ``{"error_rate": {rev: ratio},
"latency_ms": {rev: ms}}``; a POST replaces what the admin endpoint set).  Faults from the ConfigMap
(keys ``error-rate`` and ``latency-ms``, each a JSON or YAML mapping revision → value) are merged under the
admin ones.

Run: ``python -m drills.mesh --kubeconfig K --namespace NS --virtualservice VS --destinationrule DR
--port P --capacity-rps N``.
"""
from __future__ import annotations

import argparse
import bisect
import ipaddress
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HASH_LABEL = "rollouts-pod-template-hash"
ISTIO_GROUP = "networking.istio.io"
DEFAULT_ISTIO_VERSION = "v1alpha3"
NO_HEALTHY_UPSTREAM = "no healthy upstream"
OVERFLOW_BODY = "upstream connect error or disconnect/reset before headers. reset reason: overflow"
# Istio's default buckets for istio_request_duration_milliseconds.
DURATION_BUCKETS_MS = (0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
                       300000, 600000, 1800000, 3600000)
EMULATION_NOTE = ("EMULATION: requests are routed by an emulated mesh (drills.mesh), not by Envoy/Istio; "
                  "metrics are Istio-shaped, reporter=source for all requests, reporter=destination for "
                  "requests that reached a pod")


class NotLoopback(ValueError):
    """A bind or target address outside 127.0.0.0/8 (or ::1) on the embedded cluster."""


def require_loopback(host: str) -> str:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise NotLoopback(f"refusing to bind the mesh emulator to {host!r}: give a loopback IP address "
                          f"(127.0.0.0/8), not a name") from None
    if not ip.is_loopback:
        raise NotLoopback(f"refusing to bind the mesh emulator to {host}: not a loopback address")
    return host


# ---------------------------------------------------------------------------------------------------------
# Pure routing core: plain data in, a decision out.  No I/O, the clock and the random source are arguments.
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    host: str
    subset: str | None
    weight: int


@dataclass
class PodInfo:
    name: str
    labels: dict
    ready: bool
    image: str = ""
    workload: str = "unknown"

    @property
    def revision(self) -> str:
        return self.labels.get(HASH_LABEL, "unknown")

    @property
    def image_tag(self) -> str:
        ref = self.image.rsplit("@", 1)[0]
        last = ref.rsplit("/", 1)[-1]
        return last.split(":", 1)[1] if ":" in last else ""


@dataclass
class Decision:
    code: int
    body: str
    flags: str                 # Envoy response flags: "-" none, "UH" no healthy upstream, "UO" overflow, "NR"
    host: str = ""
    subset: str = ""
    pod: str = ""
    revision: str = "unknown"
    workload: str = "unknown"
    latency_ms: float = 0.0    # injected service time
    reached_pod: bool = False


class TokenBucket:
    __slots__ = ("rate", "burst", "tokens", "last")

    def __init__(self, rate: float, burst: float, now: float):
        self.rate, self.burst, self.tokens, self.last = rate, burst, burst, now

    def refill(self, now: float) -> float:
        if now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
        return self.tokens


def parse_routes(vs: dict | None) -> list[Route]:
    """spec.http[0].route[] of a VirtualService; a single route without weight carries 100."""
    if not vs:
        return []
    http = (vs.get("spec") or {}).get("http") or []
    if not http:
        return []
    routes = http[0].get("route") or []
    out = []
    for r in routes:
        d = r.get("destination") or {}
        w = r.get("weight")
        if w is None:
            w = 100 if len(routes) == 1 else 0
        out.append(Route(d.get("host", ""), d.get("subset"), int(w)))
    return out


def parse_subsets(dr: dict | None) -> dict[str, dict]:
    if not dr:
        return {}
    return {s.get("name"): dict(s.get("labels") or {}) for s in (dr.get("spec") or {}).get("subsets") or []}


def pod_info(pod: dict) -> PodInfo:
    md = pod.get("metadata") or {}
    st = pod.get("status") or {}
    ready = (st.get("phase") == "Running" and not md.get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []))
    labels = dict(md.get("labels") or {})
    containers = (pod.get("spec") or {}).get("containers") or []
    workload = "unknown"
    for o in md.get("ownerReferences") or []:
        if o.get("kind") == "ReplicaSet":
            name, h = o.get("name", ""), labels.get(HASH_LABEL)
            workload = name[: -len(h) - 1] if h and name.endswith("-" + h) else name
    return PodInfo(md.get("name", ""), labels, bool(ready), containers[0].get("image", "") if containers else "",
                   workload)


def pick_route(routes: list[Route], r: float) -> Route | None:
    """Weighted choice with r uniform in [0, 1)."""
    total = sum(max(0, x.weight) for x in routes)
    if total <= 0:
        return None
    point, acc = r * total, 0.0
    for x in routes:
        acc += max(0, x.weight)
        if point < acc:
            return x
    return routes[-1]


def matching_ready(pods: dict[str, PodInfo], labels: dict) -> list[PodInfo]:
    return [p for p in pods.values() if p.ready and all(p.labels.get(k) == v for k, v in labels.items())]


def fault_for(pod: PodInfo, table: dict) -> float:
    """A fault value keyed by pod-template-hash, image tag or full image."""
    for key in (pod.revision, pod.image_tag, pod.image):
        if key and key in table:
            return float(table[key])
    return 0.0


class Router:
    """Routing state and per-pod token buckets; ``decide`` is the whole data-path logic."""

    def __init__(self, capacity_rps: float, burst_seconds: float = 1.0, rng: random.Random | None = None):
        if capacity_rps <= 0:
            raise ValueError("capacity_rps must be > 0")
        self.capacity_rps = float(capacity_rps)
        self.burst = max(1.0, self.capacity_rps * burst_seconds)
        self.rng = rng or random.Random()
        self.routes: list[Route] = []
        self.subsets: dict[str, dict] = {}
        self.pods: dict[str, PodInfo] = {}
        self.error_rate: dict[str, float] = {}
        self.latency_ms: dict[str, float] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._rr = 0

    def set_pods(self, pods: dict[str, PodInfo]) -> None:
        self.pods = dict(pods)
        for gone in set(self._buckets) - set(self.pods):
            del self._buckets[gone]

    def decide(self, now: float) -> Decision:
        route = pick_route(self.routes, self.rng.random())
        if route is None:
            return Decision(503, NO_HEALTHY_UPSTREAM, "NR")
        subset = route.subset or ""
        if route.subset is not None and route.subset not in self.subsets:
            return Decision(503, NO_HEALTHY_UPSTREAM, "NC", host=route.host, subset=subset)
        ready = matching_ready(self.pods, self.subsets.get(route.subset, {}) if route.subset else {})
        if not ready:
            return Decision(503, NO_HEALTHY_UPSTREAM, "UH", host=route.host, subset=subset)
        # least loaded pod (most tokens); ties go round-robin, as Envoy spreads over equal endpoints
        order = sorted(ready, key=lambda p: p.name)
        self._rr = (self._rr + 1) % len(order)
        best, best_tokens = None, -1.0
        for p in order[self._rr:] + order[:self._rr]:
            b = self._buckets.get(p.name)
            if b is None:
                b = self._buckets[p.name] = TokenBucket(self.capacity_rps, self.burst, now)
            t = b.refill(now)
            if t > best_tokens:
                best, best_tokens = p, t
        if best_tokens < 1.0:
            return Decision(503, OVERFLOW_BODY, "UO", host=route.host, subset=subset,
                            revision=best.revision, workload=best.workload)
        self._buckets[best.name].tokens -= 1.0
        err = fault_for(best, self.error_rate)
        code, body = (500, "injected error\n") if err > 0 and self.rng.random() < err else (200, "ok\n")
        return Decision(code, body, "-", host=route.host, subset=subset, pod=best.name, revision=best.revision,
                        workload=best.workload, latency_ms=fault_for(best, self.latency_ms), reached_pod=True)

    def snapshot(self) -> dict:
        return {
            "routes": [{"host": r.host, "subset": r.subset, "weight": r.weight} for r in self.routes],
            "subsets": self.subsets,
            "pods": {n: {"ready": p.ready, "revision": p.revision, "image": p.image, "workload": p.workload}
                     for n, p in sorted(self.pods.items())},
            "ready_per_subset": {s: len(matching_ready(self.pods, lab)) for s, lab in self.subsets.items()},
            "capacity_rps_per_pod": self.capacity_rps,
            "faults": {"error_rate": self.error_rate, "latency_ms": self.latency_ms},
        }


# ---------------------------------------------------------------------------------------------------------
# Istio-shaped metrics
# ---------------------------------------------------------------------------------------------------------
def service_fqdn(host: str, namespace: str) -> str:
    if not host:
        return "unknown"
    if "." not in host:
        return f"{host}.{namespace}.svc.cluster.local"
    parts = host.split(".")
    return f"{parts[0]}.{parts[1]}.svc.cluster.local" if len(parts) == 2 else host


def _esc(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    LABELS = ("reporter", "destination_service", "destination_service_name", "destination_service_namespace",
              "destination_workload", "destination_workload_namespace", "destination_canonical_revision",
              "revision", "response_code", "response_flags")

    def __init__(self, namespace: str):
        self.namespace = namespace
        self.lock = threading.Lock()
        self.requests: dict[tuple, int] = {}
        self.hist: dict[tuple, list] = {}   # key -> [bucket counts..., sum, count]

    def observe(self, d: Decision, duration_ms: float) -> None:
        fqdn = service_fqdn(d.host, self.namespace)
        base = (fqdn, fqdn.split(".")[0] if fqdn != "unknown" else "unknown", self.namespace,
                d.workload, self.namespace, d.revision, d.revision, str(d.code), d.flags)
        reporters = ("source", "destination") if d.reached_pod else ("source",)
        idx = bisect.bisect_left(DURATION_BUCKETS_MS, duration_ms)
        with self.lock:
            for rep in reporters:
                key = (rep,) + base
                self.requests[key] = self.requests.get(key, 0) + 1
                h = self.hist.get(key)
                if h is None:
                    h = self.hist[key] = [0] * (len(DURATION_BUCKETS_MS) + 2)
                if idx < len(DURATION_BUCKETS_MS):
                    h[idx] += 1
                h[-2] += duration_ms
                h[-1] += 1

    def render(self) -> str:
        out = ["# HELP istio_requests_total Requests seen by the EMULATED mesh (drills.mesh), Istio-shaped.",
               "# TYPE istio_requests_total counter"]
        with self.lock:
            reqs = sorted(self.requests.items())
            hist = sorted((k, list(v)) for k, v in self.hist.items())
        for key, n in reqs:
            out.append(f"istio_requests_total{{{self._labels(key)}}} {n}")
        out += ["# HELP istio_request_duration_milliseconds Request duration in the EMULATED mesh (drills.mesh).",
                "# TYPE istio_request_duration_milliseconds histogram"]
        for key, h in hist:
            lab, cum = self._labels(key), 0
            for le, c in zip(DURATION_BUCKETS_MS, h):
                cum += c
                out.append(f'istio_request_duration_milliseconds_bucket{{{lab},le="{le}"}} {cum}')
            out.append(f'istio_request_duration_milliseconds_bucket{{{lab},le="+Inf"}} {h[-1]}')
            out.append(f"istio_request_duration_milliseconds_sum{{{lab}}} {h[-2]:.3f}")
            out.append(f"istio_request_duration_milliseconds_count{{{lab}}} {h[-1]}")
        return "\n".join(out) + "\n"

    def _labels(self, key: tuple) -> str:
        return ",".join(f'{k}="{_esc(v)}"' for k, v in zip(self.LABELS, key))


# ---------------------------------------------------------------------------------------------------------
# Watches (kubernetes client, list + watch from resourceVersion, relist on 410 Gone)
# ---------------------------------------------------------------------------------------------------------
def _parse_fault_map(text: str | None) -> dict:
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        import yaml
        data = yaml.safe_load(text)
    return {str(k): float(v) for k, v in (data or {}).items()}


class Mesh:
    def __init__(self, kubeconfig: str, namespace: str, virtualservice: str, destinationrule: str,
                 capacity_rps: float, istio_version: str = DEFAULT_ISTIO_VERSION, pod_selector: str | None = None,
                 faults_configmap: str | None = None, seed: int | None = None):
        self.kubeconfig, self.namespace = kubeconfig, namespace
        self.vs_name, self.dr_name = virtualservice, destinationrule
        self.istio_version, self.pod_selector, self.cm_name = istio_version, pod_selector, faults_configmap
        self.router = Router(capacity_rps, rng=random.Random(seed))
        self.metrics = Metrics(namespace)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self._pods: dict[str, PodInfo] = {}
        self._admin_faults: dict = {"error_rate": {}, "latency_ms": {}}
        self._cm_faults: dict = {"error_rate": {}, "latency_ms": {}}
        self.synced = {"virtualservice": threading.Event(), "destinationrule": threading.Event(),
                       "pods": threading.Event()}
        if faults_configmap:
            self.synced["configmap"] = threading.Event()
        self.relists = {k: 0 for k in self.synced}

    # -- state updates
    def _apply(self, kind: str, etype: str, obj: dict | None, items: list[dict] | None = None) -> None:
        with self.lock:
            if kind == "virtualservice":
                self.router.routes = parse_routes(None if etype == "DELETED" else obj)
            elif kind == "destinationrule":
                self.router.subsets = parse_subsets(None if etype == "DELETED" else obj)
            elif kind == "pods":
                if items is not None:
                    self._pods = {p.name: p for p in map(pod_info, items)}
                elif etype == "DELETED":
                    self._pods.pop(obj["metadata"]["name"], None)
                else:
                    p = pod_info(obj)
                    self._pods[p.name] = p
                self.router.set_pods(self._pods)
            elif kind == "configmap":
                data = {} if etype == "DELETED" or obj is None else (obj.get("data") or {})
                try:
                    self._cm_faults = {"error_rate": _parse_fault_map(data.get("error-rate")),
                                       "latency_ms": _parse_fault_map(data.get("latency-ms"))}
                except (ValueError, TypeError, AttributeError) as e:
                    print(f"mesh: ignoring malformed faults ConfigMap: {e}", file=sys.stderr, flush=True)
                self._merge_faults()

    def _merge_faults(self) -> None:
        self.router.error_rate = {**self._cm_faults["error_rate"], **self._admin_faults["error_rate"]}
        self.router.latency_ms = {**self._cm_faults["latency_ms"], **self._admin_faults["latency_ms"]}

    def set_admin_faults(self, faults: dict) -> None:
        with self.lock:
            self._admin_faults = {"error_rate": {str(k): float(v) for k, v in (faults.get("error_rate") or {}).items()},
                                  "latency_ms": {str(k): float(v) for k, v in (faults.get("latency_ms") or {}).items()}}
            self._merge_faults()

    # -- watch loops
    def _list_fn(self, kind: str, api_client):
        from kubernetes import client
        ns = self.namespace
        if kind in ("virtualservice", "destinationrule"):
            api = client.CustomObjectsApi(api_client)
            plural = "virtualservices" if kind == "virtualservice" else "destinationrules"
            name = self.vs_name if kind == "virtualservice" else self.dr_name

            def fn(**kw):
                return api.list_namespaced_custom_object(ISTIO_GROUP, self.istio_version, ns, plural,
                                                         field_selector=f"metadata.name={name}", **kw)
            return fn
        core = client.CoreV1Api(api_client)
        if kind == "pods":
            sel = {"label_selector": self.pod_selector} if self.pod_selector else {}
            return lambda **kw: core.list_namespaced_pod(ns, **sel, **kw)
        return lambda **kw: core.list_namespaced_config_map(ns, field_selector=f"metadata.name={self.cm_name}", **kw)

    def _watch_loop(self, kind: str) -> None:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        from .kube import new_client
        api_client = new_client(self.kubeconfig)
        fn = self._list_fn(kind, api_client)
        while not self.stop.is_set():
            try:
                resp = fn(_preload_content=False)
                listing = json.loads(resp.data)
                items = listing.get("items") or []
                rv = listing["metadata"]["resourceVersion"]
                if kind == "pods":
                    self._apply(kind, "LIST", None, items=items)
                else:
                    self._apply(kind, "ADDED" if items else "DELETED", items[0] if items else None)
                self.synced[kind].set()
                while not self.stop.is_set():
                    w = watch.Watch()
                    for ev in w.stream(fn, resource_version=rv, timeout_seconds=30, allow_watch_bookmarks=True,
                                       deserialize=False):
                        obj = ev.get("object") or {}
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            self._apply(kind, ev["type"], obj)
                        if self.stop.is_set():
                            w.stop()
                            break
            except ApiException as e:
                if e.status == 410:
                    self.relists[kind] += 1
                    continue
                print(f"mesh: watch {kind}: {e.status} {e.reason}; relisting in 1s", file=sys.stderr, flush=True)
                self.relists[kind] += 1
                self.stop.wait(1.0)
            except Exception as e:  # connection refused while the apiserver restarts, etc.
                print(f"mesh: watch {kind}: {type(e).__name__}: {e}; relisting in 1s", file=sys.stderr, flush=True)
                self.relists[kind] += 1
                self.stop.wait(1.0)

    def start_watches(self) -> None:
        for kind in self.synced:
            threading.Thread(target=self._watch_loop, args=(kind,), name=f"watch-{kind}", daemon=True).start()

    def ready(self) -> bool:
        return all(e.is_set() for e in self.synced.values())

    def handle(self) -> Decision:
        with self.lock:
            return self.router.decide(time.monotonic())

    def state(self) -> dict:
        with self.lock:
            snap = self.router.snapshot()
        snap.update({"emulation": EMULATION_NOTE, "namespace": self.namespace, "virtualservice": self.vs_name,
                     "destinationrule": self.dr_name, "synced": {k: e.is_set() for k, e in self.synced.items()},
                     "relists": dict(self.relists),
                     "admin_faults": self._admin_faults, "configmap_faults": self._cm_faults})
        return snap


# ---------------------------------------------------------------------------------------------------------
# HTTP front
# ---------------------------------------------------------------------------------------------------------
def make_handler(mesh: Mesh):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "drills-mesh-emulator"
        disable_nagle_algorithm = True      # headers and body are two writes: no 40 ms delayed-ACK stall

        def log_message(self, fmt, *args):  # request logs would cost more than the routing itself
            pass

        def _send(self, code: int, body: str, ctype: str = "text/plain; charset=utf-8", headers: dict | None = None):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _route(self):
            t0 = time.perf_counter()
            d = mesh.handle()
            if d.latency_ms > 0:
                time.sleep(d.latency_ms / 1000.0)
            headers = {"x-mesh-emulated": "true", "x-mesh-subset": d.subset or "-", "x-mesh-pod": d.pod or "-",
                       "x-mesh-revision": d.revision, "x-envoy-response-flags": d.flags}
            self._send(d.code, d.body if d.body.endswith("\n") else d.body + "\n", headers=headers)
            mesh.metrics.observe(d, (time.perf_counter() - t0) * 1000.0)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                return self._send(200, mesh.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
            if path == "/-/ready":
                return self._send(200 if mesh.ready() else 503, "ready\n" if mesh.ready() else "syncing\n")
            if path == "/-/state":
                return self._send(200, json.dumps(mesh.state(), indent=1), "application/json")
            if path == "/-/faults":
                return self._send(200, json.dumps(mesh._admin_faults), "application/json")
            return self._route()

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            if path == "/-/faults":
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    mesh.set_admin_faults(json.loads(self.rfile.read(n) or b"{}"))
                except (ValueError, TypeError, AttributeError) as e:
                    return self._send(400, f"bad faults: {e}\n")
                return self._send(200, json.dumps(mesh._admin_faults), "application/json")
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            return self._route()

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def serve(mesh: Mesh, bind: str, port: int) -> _Server:
    require_loopback(bind)
    srv = _Server((bind, port), make_handler(mesh))
    return srv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m drills.mesh", description=EMULATION_NOTE)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--virtualservice", required=True)
    p.add_argument("--destinationrule", required=True)
    p.add_argument("--port", type=int, required=True, help="0 picks a free port (see --port-file)")
    p.add_argument("--bind", default="127.0.0.1", help="loopback address only")
    p.add_argument("--capacity-rps", type=float, required=True, help="requests/second each Ready pod serves")
    p.add_argument("--istio-api-version", default=DEFAULT_ISTIO_VERSION)
    p.add_argument("--pod-selector", default=None, help="label selector of the Service's pods")
    p.add_argument("--faults-configmap", default=None, help="ConfigMap with keys error-rate / latency-ms")
    p.add_argument("--error-rate", action="append", default=[], metavar="REV=RATIO",
                   help="initial injected error ratio per revision (pod-template-hash or image tag)")
    p.add_argument("--port-file", default=None, help="write the bound port here once listening")
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args(argv)
    try:
        require_loopback(a.bind)
    except NotLoopback as e:
        print(f"mesh: {e}", file=sys.stderr)
        return 2
    mesh = Mesh(a.kubeconfig, a.namespace, a.virtualservice, a.destinationrule, a.capacity_rps,
                a.istio_api_version, a.pod_selector, a.faults_configmap, a.seed)
    if a.error_rate:
        mesh.set_admin_faults({"error_rate": dict(x.split("=", 1) for x in a.error_rate)})
    srv = serve(mesh, a.bind, a.port)
    port = srv.server_address[1]
    if a.port_file:
        tmp = Path(a.port_file + ".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, a.port_file)
    mesh.start_watches()

    def _term(*_):
        mesh.stop.set()
        threading.Thread(target=srv.shutdown, daemon=True).start()
    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    print(f"mesh: {EMULATION_NOTE}", file=sys.stderr, flush=True)
    print(f"mesh: listening on http://{a.bind}:{port} for {a.namespace}/{a.virtualservice}", file=sys.stderr,
          flush=True)
    srv.serve_forever(poll_interval=0.2)
    srv.server_close()
    return 0


# ---------------------------------------------------------------------------------------------------------
# Starting the emulator as a subprocess
# ---------------------------------------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"{url}: process exited with {proc.returncode} before ready\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError as e:
            last = e
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s ({last})")


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class MeshProcess:
    """``python -m drills.mesh`` as a child process; a context manager that always stops it."""

    def __init__(self, kubeconfig, namespace: str, virtualservice: str, destinationrule: str, capacity_rps: float,
                 folder: Path, register=None, unregister=None, pod_selector: str | None = None, faults_configmap: str | None = None,
                 istio_api_version: str = DEFAULT_ISTIO_VERSION, seed: int | None = None, ready_timeout: float = 30):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = str(kubeconfig)
        self.name = f"mesh-{namespace}-{virtualservice}"
        self._unregister = unregister
        self.log = self.folder / f"mesh-{namespace}-{virtualservice}.log"
        port_file = self.folder / f"mesh-{namespace}-{virtualservice}.port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "drills.mesh", "--kubeconfig", str(kubeconfig), "--namespace", namespace,
               "--virtualservice", virtualservice, "--destinationrule", destinationrule, "--port", "0",
               "--port-file", str(port_file), "--capacity-rps", str(capacity_rps),
               "--istio-api-version", istio_api_version]
        if pod_selector:
            cmd += ["--pod-selector", pod_selector]
        if faults_configmap:
            cmd += ["--faults-configmap", faults_configmap]
        if seed is not None:
            cmd += ["--seed", str(seed)]
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        try:
            deadline = time.monotonic() + ready_timeout
            while not port_file.exists():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mesh emulator did not start (rc={self.proc.poll()}):\n"
                                       + self.log.read_text()[-2000:])
                time.sleep(0.05)
            self.port = int(port_file.read_text())
            self.url = f"http://127.0.0.1:{self.port}"
            if register is not None:
                register(self.name, self.proc.pid, [self.port], self.log)
            wait_http(self.url + "/-/ready", max(1.0, deadline - time.monotonic()), self.proc, self.log)
        except BaseException:
            self.stop()
            raise

    def state(self) -> dict:
        with urllib.request.urlopen(self.url + "/-/state", timeout=5) as r:
            return json.loads(r.read())

    def set_faults(self, error_rate: dict | None = None, latency_ms: dict | None = None) -> dict:
        body = json.dumps({"error_rate": error_rate or {}, "latency_ms": latency_ms or {}}).encode()
        req = urllib.request.Request(self.url + "/-/faults", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            return r.read().decode()

    def stop(self) -> None:
        stop_process(self.proc)
        if not self._logf.closed:
            self._logf.close()
        if self._unregister is not None:
            try:
                self._unregister(self.name)
            except Exception:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
