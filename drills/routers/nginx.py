"""nginx (ingress-nginx): native in the controller, no CRD.  The Rollout names a stable Ingress whose backend is
its stableService; the controller creates a canary Ingress (``<rollout>-<stableIngress>-canary``: the stable one's
rules with the backend switched to the canaryService) and writes the weight into its ``canary-weight`` annotation
(rollout/trafficrouting/nginx/nginx.go, the same at v1.8.2 and v1.10.2).  The Services' selectors carry the
pod-template-hash the controller writes (rollout/service.go): the canaryService follows the newest ReplicaSet from
its first available pod, so there is no readiness guard on the weight.

The canary/stable weights are read from the canary Ingress's annotations as written (``canary-weight``, and the
rest of ``canary-weight-total``, 100 by default); the emulated data path sends that share to the canary Ingress's
backend and the rest to the stable one's, as ingress-nginx does for a canary Ingress on the same host and path.
"""
from __future__ import annotations

import threading


from .base import Route, Source, TrafficRouter, Watch, esc, service_labels, service_manifest, services_watch

GROUP = "networking.k8s.io"
VERSION = "v1"
DEFAULT_PREFIX = "nginx.ingress.kubernetes.io"       # utils/defaults: the default annotationPrefix
INGRESS_CLASS = "nginx"
CANARY_SUFFIX = "-canary"
NAME_MAX = 253
REQUESTS = "nginx_ingress_controller_requests"


def canary_ingress_name(rollout: str, stable_ingress: str) -> str:
    """The controller's name for the canary Ingress (utils/ingress GetCanaryIngressName)."""
    prefix = f"{rollout}-{stable_ingress}"
    return prefix[: NAME_MAX - len(CANARY_SUFFIX)] + CANARY_SUFFIX


# --- manifests ---------------------------------------------------------------------------------------------
def _manifests(spec, namespace: str, labels: dict, canary: dict) -> tuple[list, list]:
    n = spec.name
    canary["canaryService"], canary["stableService"] = f"{n}-canary", f"{n}-stable"
    canary["trafficRouting"] = {"nginx": {"stableIngress": n}}
    services = [service_manifest(s, namespace, labels) for s in (f"{n}-canary", f"{n}-stable")]
    ingress = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Ingress", "metadata": {"name": n, "namespace": namespace},
               "spec": {"ingressClassName": INGRESS_CLASS,
                        "rules": [{"host": f"{n}.drills.local", "http": {"paths": [
                            {"path": "/", "pathType": "Prefix",
                             "backend": {"service": {"name": f"{n}-stable", "port": {"number": 80}}}}]}}]}}
    return services, [ingress]


# --- records -----------------------------------------------------------------------------------------------
def _backends(spec: dict) -> list[str]:
    out = []
    for rule in spec.get("rules") or []:
        for path in ((rule or {}).get("http") or {}).get("paths") or []:
            name = (((path or {}).get("backend") or {}).get("service") or {}).get("name")
            if name and name not in out:
                out.append(name)
    default = ((spec.get("defaultBackend") or {}).get("service") or {}).get("name")
    if default and default not in out:
        out.append(default)
    return out


def condense_ingress(o: dict) -> dict:
    """The canary annotations (any prefix) and the backend Services."""
    md, spec = o.get("metadata") or {}, o.get("spec") or {}
    ann = {k: v for k, v in (md.get("annotations") or {}).items()
           if k.endswith(("/canary", "/canary-weight", "/canary-weight-total"))}
    hosts = [r.get("host") or "" for r in spec.get("rules") or [] if isinstance(r, dict)]
    return {"annotations": ann, "services": _backends(spec), "hosts": hosts}


def _int(v, default: int) -> int:
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        return default


def canary_share(annotations: dict, prefix: str = DEFAULT_PREFIX) -> tuple[int, int] | None:
    """(weight, total) of a canary Ingress's annotations; None when it is not a canary."""
    if str(annotations.get(f"{prefix}/canary", "")).lower() != "true":
        return None
    total = max(1, _int(annotations.get(f"{prefix}/canary-weight-total"), 100))
    return min(max(0, _int(annotations.get(f"{prefix}/canary-weight"), 0)), total), total


# --- the mesh emulator's route table --------------------------------------------------------------------------
def route_table(ingresses: dict[str, dict], services: dict[str, dict], stable_ingress: str,
                prefix: str = DEFAULT_PREFIX, rollout: str | None = None) -> list[Route]:
    """The stable Ingress's backend with the rest of the traffic and the canary Ingress on one of its hosts with its
    share: the one the controller names for ``rollout`` (default: a Rollout named as the stable Ingress), else the
    first by name (ingress-nginx serves one canary per host and path).  Weights as written, over the total."""
    stable = ingresses.get(stable_ingress)
    if not stable:
        return []
    st_spec = stable.get("spec") or {}
    st_hosts = {r.get("host") or "" for r in st_spec.get("rules") or [] if isinstance(r, dict)}
    backends = _backends(st_spec)
    if not backends:
        return []
    routes, canary_weight, total = [], 0, 100
    mine = canary_ingress_name(rollout or stable_ingress, stable_ingress)
    for name in sorted(ingresses, key=lambda n: (n != mine, n)):
        if name == stable_ingress:
            continue
        o = ingresses[name]
        share = canary_share((o.get("metadata") or {}).get("annotations") or {}, prefix)
        spec = o.get("spec") or {}
        hosts = {r.get("host") or "" for r in spec.get("rules") or [] if isinstance(r, dict)}
        if share is None or not hosts & st_hosts or not _backends(spec):
            continue
        canary_weight, total = share
        svc = _backends(spec)[0]
        routes.append(Route(svc, None, canary_weight, service_labels(services, svc)))
        break
    routes.insert(0, Route(backends[0], None, total - canary_weight, service_labels(services, backends[0])))
    return routes


class NginxMetrics:
    """``nginx_ingress_controller_requests`` as ingress-nginx exports it (the labels the drills read: namespace,
    ingress, service, status, canary), plus a ``revision`` label (the pod-template-hash).  Requests refused before a
    pod was reached carry the service the route named."""
    LABELS = ("namespace", "ingress", "service", "canary", "status", "revision")

    def __init__(self, namespace: str, ingress: str):
        self.namespace, self.ingress = namespace, ingress
        self.lock = threading.Lock()
        self.requests: dict[tuple, int] = {}

    def observe(self, d, duration_ms: float) -> None:
        canary = d.host if d.host.endswith("-canary") else ""
        key = (self.namespace, self.ingress, d.host or "", canary, str(d.code), d.revision)
        with self.lock:
            self.requests[key] = self.requests.get(key, 0) + 1

    def render(self) -> str:
        out = [f"# HELP {REQUESTS} Requests seen by the EMULATED ingress (drills.traffic.mesh), ingress-nginx-shaped.",
               f"# TYPE {REQUESTS} counter"]
        with self.lock:
            reqs = sorted(self.requests.items())
        for key, n in reqs:
            labels = ",".join(f'{k}="{esc(v)}"' for k, v in zip(self.LABELS, key))
            out.append(f"{REQUESTS}{{{labels}}} {n}")
        return "\n".join(out) + "\n"


# --- the router -------------------------------------------------------------------------------------------
class Nginx(TrafficRouter):
    name = key = "nginx"
    routings = ("host",)          # nginx always routes by canaryService/stableService
    route_kind = "Ingress"
    object_kinds = ("Ingress",)
    audit_resource = (GROUP, "ingresses")
    crds = frozenset()
    metrics_note = "ingress-nginx-shaped (nginx_ingress_controller_requests)"

    def routing_manifests(self, spec, namespace, labels, canary):
        return _manifests(spec, namespace, labels, canary)

    def create(self, api, namespace, obj):
        from ..kube.k8s import client        # imported when used: the command line needs none
        client.NetworkingV1Api(api).create_namespaced_ingress(namespace, obj)

    def rollout_fields(self, name, canary):
        nginx = (canary.get("trafficRouting") or {}).get("nginx") or {}
        stable = list(nginx.get("stableIngresses") or []) or ([nginx["stableIngress"]] if nginx.get("stableIngress")
                                                               else [])
        return {"router": self.name, "stableIngresses": stable,
                "canaryIngresses": [canary_ingress_name(name, s) for s in stable],
                "annotationPrefix": nginx.get("annotationPrefix") or DEFAULT_PREFIX}

    def sources(self, api, namespace):
        from ..kube.k8s import client        # imported when used: the command line needs none
        return [Source(self.route_kind, client.NetworkingV1Api(api).list_namespaced_ingress, (namespace,),
                       condense_ingress)]

    def condense_route(self, obj):
        return condense_ingress(obj)

    def weights(self, routes, rollout):
        prefix = rollout.get("annotationPrefix") or DEFAULT_PREFIX
        for name in rollout.get("canaryIngresses") or []:
            ing = routes.get(name)
            share = canary_share(ing.get("annotations") or {}, prefix) if ing else None
            if share is not None:       # as written, as Istio's are (a total other than 100: maxTrafficWeight)
                w, total = share
                return w, total - w
        if any(routes.get(s) for s in rollout.get("stableIngresses") or []):
            return 0, 100        # no canary Ingress (yet, or any more): the stable one has it all
        return None, None

    def watches(self, namespace, name):
        from ..kube.k8s import client        # imported when used: the command line needs none
        return [Watch("ingresses", lambda api: (client.NetworkingV1Api(api).list_namespaced_ingress, (namespace,), {})),
                services_watch(namespace)]

    def route_table(self, objects, name):
        return route_table(objects.get("ingresses", {}), objects.get("services", {}), name)

    def metrics(self, namespace, name):
        return NginxMetrics(namespace, name)


ROUTER = Nginx()
