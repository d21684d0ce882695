"""Mesh emulator for the embedded cluster — an EMULATION, not a service mesh or an ingress controller.

No Envoy, Istio or ingress-nginx data plane runs on the embedded cluster (there are no containers and no
sidecars).  This module stands in for the data path of one routed service so that drills can be run under load:

* it WATCHES (Kubernetes watch with relist on 410 Gone, never a poll) the objects the Rollout's router writes
  (drills.routers: the router names them and turns them into a route table of weighted destinations, each with
  the labels of its pods: a subset's labels, or a Service's selector that carries the ``rollouts-pod-template-hash``
  the Argo Rollouts controller writes), the Pods of the namespace, and optionally a ConfigMap holding injected
  faults;
* for every request on its HTTP front (127.0.0.1 only) it picks a destination by the weights in force, finds the
  Ready pods matching its labels and lets the least-loaded one serve if it has capacity (a token bucket of
  ``capacity_rps`` requests/second per Ready pod).  Over capacity it answers 503 (Envoy's ``UO`` overflow), with
  no Ready pod 503 ``no healthy upstream`` (Envoy's ``UH``).  A per-revision error rate (keyed by
  pod-template-hash or image tag) turns served requests into 500s: a broken release;
* it exposes ``/metrics`` in the Prometheus text format, shaped as the router's data plane exports them (the
  router's metrics, with a ``revision`` label: the pod-template-hash the seed's fleet lacked).

Admin endpoints (loopback only, same port): ``GET /-/ready`` (200 once every watch has listed),
``GET /-/state`` (routing table as JSON), ``GET|POST /-/faults`` (JSON ``{"error_rate": {rev: ratio},
"latency_ms": {rev: ms}}``; a POST replaces what the admin endpoint set).  Faults from the ConfigMap
(keys ``error-rate`` and ``latency-ms``, each a JSON or YAML mapping revision → value) are merged under the
admin ones.

Run: ``python -m drills.traffic.mesh_server --kubeconfig K --namespace NS --router istio --route NAME --port P
--capacity-rps N`` (drills.traffic.mesh_server; this module is the routing core, no I/O).
"""
from __future__ import annotations

import ipaddress
import json
import random
import threading
from dataclasses import dataclass

from ..core.config import HASH_LABEL
from ..routers import Route

NO_HEALTHY_UPSTREAM = "no healthy upstream"
OVERFLOW_BODY = "upstream connect error or disconnect/reset before headers. reset reason: overflow"
EMULATION_NOTE = ("EMULATION: requests are routed by an emulated mesh (drills.traffic.mesh), not by the router's data "
                  "plane; metrics are shaped as the router's")


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
        if route.labels is None:           # a subset or Service the route names is not there: no cluster
            return Decision(503, NO_HEALTHY_UPSTREAM, "NC", host=route.host, subset=subset)
        ready = matching_ready(self.pods, route.labels)
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
            "routes": [{"host": r.host, "subset": r.subset, "weight": r.weight, "labels": r.labels,
                        "ready": None if r.labels is None else len(matching_ready(self.pods, r.labels))}
                       for r in self.routes],
            "ready_per_subset": {r.subset or r.host: len(matching_ready(self.pods, r.labels)) for r in self.routes
                                 if r.labels is not None},
            "pods": {n: {"ready": p.ready, "revision": p.revision, "image": p.image, "workload": p.workload}
                     for n, p in sorted(self.pods.items())},
            "capacity_rps_per_pod": self.capacity_rps,
            "faults": {"error_rate": self.error_rate, "latency_ms": self.latency_ms},
        }


# ---------------------------------------------------------------------------------------------------------
# Watches (kubernetes client, list + watch from resourceVersion, relist on 410 Gone)
# ---------------------------------------------------------------------------------------------------------
def _parse_fault_map(text: str | None) -> dict:
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        from ..core import fastyaml            # YAML only when the map is not JSON
        data = fastyaml.safe_load(text)
    return {str(k): float(v) for k, v in (data or {}).items()}
