"""Istio: a VirtualService whose route weights the controller writes, and either DestinationRule subsets
(``routing: subset``, the seed's chart: the controller writes the pod-template-hash into the subsets and, from
v1.8, holds the weight until the ReplicaSet is ready) or canaryService/stableService hosts (``routing: host``).

Everything the product knows of Istio lives here: the manifests, the recorded objects and the weights read from
them, the audited resource, the CRDs, the route table the mesh emulator serves by, its Istio-shaped metrics and
the seed's error-rate query over them.
"""
from __future__ import annotations

import bisect
import threading


from .base import Route, Source, TrafficRouter, Watch, esc, fqdn, service_labels, service_manifest, services_watch

GROUP = "networking.istio.io"
VERSION = "v1alpha3"
ROUTE_KINDS = ("http", "tls", "tcp")
CRDS = frozenset({"virtualservices.networking.istio.io", "destinationrules.networking.istio.io"})
# Istio's default buckets for istio_request_duration_milliseconds.
DURATION_BUCKETS_MS = (0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
                       300000, 600000, 1800000, 3600000)
REQUESTS = "istio_requests_total"
DURATION = "istio_request_duration_milliseconds"


# --- manifests ---------------------------------------------------------------------------------------------
def _manifests(spec, namespace: str, labels: dict, canary: dict) -> tuple[list, list]:
    n = spec.name
    istio: dict = {"virtualService": {"name": n, "routes": ["primary"]}}
    canary["trafficRouting"] = {"istio": istio}
    objects = []
    if spec.routing == "subset":
        istio["destinationRule"] = {"name": n, "canarySubsetName": "canary", "stableSubsetName": "stable"}
        services = [service_manifest(n, namespace, labels)]
        route = [{"destination": {"host": n, "subset": "stable"}, "weight": 100},
                 {"destination": {"host": n, "subset": "canary"}, "weight": 0}]
        objects.append({"apiVersion": f"{GROUP}/{VERSION}", "kind": "DestinationRule",
                        "metadata": {"name": n, "namespace": namespace},
                        "spec": {"host": n, "subsets": [{"name": "canary", "labels": {"app.kubernetes.io/name": n}},
                                                        {"name": "stable", "labels": {"app.kubernetes.io/name": n}}]}})
    else:
        canary["canaryService"], canary["stableService"] = f"{n}-canary", f"{n}-stable"
        services = [service_manifest(s, namespace, labels) for s in (f"{n}-canary", f"{n}-stable")]
        route = [{"destination": {"host": f"{n}-stable"}, "weight": 100},
                 {"destination": {"host": f"{n}-canary"}, "weight": 0}]
    objects.append({"apiVersion": f"{GROUP}/{VERSION}", "kind": "VirtualService",
                    "metadata": {"name": n, "namespace": namespace},
                    "spec": {"hosts": [n], "http": [{"name": "primary", "route": route}]}})
    return services, objects


# --- records -----------------------------------------------------------------------------------------------
def condense_virtualservice(o: dict) -> dict:
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


def condense_destinationrule(o: dict) -> dict:
    return {"subsets": {s.get("name"): s.get("labels") or {} for s in (o.get("spec") or {}).get("subsets") or []}}


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


# --- the mesh emulator's route table --------------------------------------------------------------------------
def parse_routes(vs: dict | None) -> list[tuple[str, str | None, int]]:
    """spec.http[0].route[] of a VirtualService as (host, subset, weight); a single route without weight carries
    100."""
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
        out.append((d.get("host", ""), d.get("subset"), int(w)))
    return out


def parse_subsets(dr: dict | None) -> dict[str, dict]:
    if not dr:
        return {}
    return {s.get("name"): dict(s.get("labels") or {}) for s in (dr.get("spec") or {}).get("subsets") or []}


def route_table(vs: dict | None, dr: dict | None, services: dict[str, dict]) -> list[Route]:
    """A subset's pods are the DestinationRule subset's labels; a host's are its Service's selector (a host
    given as ``name.namespace...`` is looked up by its first label)."""
    subsets = parse_subsets(dr)
    out = []
    for host, subset, weight in parse_routes(vs):
        if subset is not None:
            labels = subsets.get(subset)
        else:
            labels = service_labels(services, host.split(".")[0])
        out.append(Route(host, subset, weight, labels))
    return out


class IstioMetrics:
    """``istio_requests_total`` and ``istio_request_duration_milliseconds``, plus a ``revision`` label (the
    pod-template-hash).  Every request is counted once with ``reporter="source"`` (the caller's proxy: all requests,
    including the 503s produced before any pod is reached) and, when a pod was reached, once more with
    ``reporter="destination"`` (the server-side sidecar: served requests and the application's injected errors)."""
    LABELS = ("reporter", "destination_service", "destination_service_name", "destination_service_namespace",
              "destination_workload", "destination_workload_namespace", "destination_canonical_revision",
              "revision", "response_code", "response_flags")

    def __init__(self, namespace: str):
        self.namespace = namespace
        self.lock = threading.Lock()
        self.requests: dict[tuple, int] = {}
        self.hist: dict[tuple, list] = {}   # key -> [bucket counts..., sum, count]

    def observe(self, d, duration_ms: float) -> None:
        name = fqdn(d.host, self.namespace)
        base = (name, name.split(".")[0] if name != "unknown" else "unknown", self.namespace,
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
        out = [f"# HELP {REQUESTS} Requests seen by the EMULATED mesh (drills.traffic.mesh), Istio-shaped.",
               f"# TYPE {REQUESTS} counter"]
        with self.lock:
            reqs = sorted(self.requests.items())
            hist = sorted((k, list(v)) for k, v in self.hist.items())
        for key, n in reqs:
            out.append(f"{REQUESTS}{{{self._labels(key)}}} {n}")
        out += [f"# HELP {DURATION} Request duration in the EMULATED mesh (drills.traffic.mesh).",
                f"# TYPE {DURATION} histogram"]
        for key, h in hist:
            lab, cum = self._labels(key), 0
            for le, c in zip(DURATION_BUCKETS_MS, h):
                cum += c
                out.append(f'{DURATION}_bucket{{{lab},le="{le}"}} {cum}')
            out.append(f'{DURATION}_bucket{{{lab},le="+Inf"}} {h[-1]}')
            out.append(f"{DURATION}_sum{{{lab}}} {h[-2]:.3f}")
            out.append(f"{DURATION}_count{{{lab}}} {h[-1]}")
        return "\n".join(out) + "\n"

    def _labels(self, key: tuple) -> str:
        return ",".join(f'{k}="{esc(v)}"' for k, v in zip(self.LABELS, key))


def error_rate_query(service_fqdn: str, revision: str | None = None, reporter: str = "destination",
                     window: str = "1m") -> str:
    """The seed's error-rate query (brief §5): 5xx over all requests of the whole service, ``> 0``, then
    ``OR on() vector(0)`` so that no traffic reads as 0.  ``revision`` adds the per-revision filter the
    seed's fleet lacked (a pod-template-hash, e.g. from ``podTemplateHashValue: Latest``)."""
    sel = f'reporter="{reporter}", destination_service=~"{service_fqdn}"'
    if revision:
        sel += f', revision="{revision}"'
    num = f'sum(irate({REQUESTS}{{{sel}, response_code=~"5.*"}}[{window}]))'
    den = f"sum(irate({REQUESTS}{{{sel}}}[{window}]))"
    return f"{num} / {den} > 0 OR on() vector(0)"


def requests_increase_query(selector: str, window: str) -> str:
    return f"sum(increase({REQUESTS}{{{selector}}}[{window}]))"


# --- the router -------------------------------------------------------------------------------------------
class Istio(TrafficRouter):
    name = key = "istio"
    routings = ("subset", "host")
    route_kind = "VirtualService"
    object_kinds = ("VirtualService", "DestinationRule")
    # rollout/trafficrouting/istio/istio.go (v1.8.2 :330, v1.10.2 :382): the subset switch waits for a full ReplicaSet
    guard_delay = r"delaying destination rule switch: ReplicaSet \S+ not fully available"
    audit_resource = (GROUP, "virtualservices")
    crds = CRDS
    metrics_note = "Istio-shaped (istio_requests_total, reporter=source for all requests, reporter=destination " \
                   "for requests that reached a pod)"

    def routing_manifests(self, spec, namespace, labels, canary):
        return _manifests(spec, namespace, labels, canary)

    def create(self, api, namespace, obj):
        from ..kube.k8s import client        # imported when used: the command line needs none
        plural = {"VirtualService": "virtualservices", "DestinationRule": "destinationrules"}[obj["kind"]]
        client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, plural, obj)

    def rollout_fields(self, name, canary):
        istio = (canary.get("trafficRouting") or {}).get("istio") or {}
        vs = istio.get("virtualService") or {}
        return {"router": self.name, "virtualService": vs.get("name"),
                "vsRoutes": {"http": vs.get("routes"), "tls": vs.get("tlsRoutes"), "tcp": vs.get("tcpRoutes")},
                "destinationRule": istio.get("destinationRule")}

    def sources(self, api, namespace):
        from ..kube.k8s import client        # imported when used: the command line needs none
        co = client.CustomObjectsApi(api)
        return [Source(self.route_kind, co.list_namespaced_custom_object,
                       (GROUP, VERSION, namespace, "virtualservices"), condense_virtualservice),
                Source("DestinationRule", co.list_namespaced_custom_object,
                       (GROUP, VERSION, namespace, "destinationrules"), condense_destinationrule)]

    def condense_route(self, obj):
        return condense_virtualservice(obj)

    def weights(self, routes, rollout):
        name = rollout.get("virtualService")
        vs = routes.get(name) if name else next(iter(routes.values()), None)
        return canary_weight_of(vs, rollout) if vs else (None, None)

    def watches(self, namespace, name):
        from ..kube.k8s import client        # imported when used: the command line needs none
        def custom(plural):
            return lambda api: (client.CustomObjectsApi(api).list_namespaced_custom_object,
                                (GROUP, VERSION, namespace, plural), {"field_selector": f"metadata.name={name}"})
        return [Watch("virtualservice", custom("virtualservices")),
                Watch("destinationrule", custom("destinationrules")), services_watch(namespace)]

    def route_table(self, objects, name):
        return route_table(objects.get("virtualservice", {}).get(name), objects.get("destinationrule", {}).get(name),
                           objects.get("services", {}))

    def metrics(self, namespace, name):
        return IstioMetrics(namespace)


ROUTER = Istio()
