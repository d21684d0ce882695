"""What a drill needs from the thing that routes a Rollout's traffic, and the route table the mesh emulator
serves by.

A router module (``istio``, ``nginx``) gives one ``TrafficRouter``:

* the manifests of a drill's Rollout routed by it (Services and the router's own objects) and how to create them;
* the objects the flight recorder records (its sources) and how each is condensed, which record kind carries the
  weights, and the canary/stable weights read from those records and the condensed Rollout;
* the resources the embedded cluster's audit policy logs with their response (the proof the timeline is
  complete) and the CRDs the embedded cluster installs;
* for the mesh emulator: the objects it watches and the route table they give (each route names the labels of
  the pods behind it).

The controller picks a router by the key under ``spec.strategy.canary.trafficRouting``; so does ``of_canary``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..core.errors import BadInput


@dataclass(frozen=True)
class Route:
    """One weighted destination of the route table: ``labels`` selects the Ready pods behind it; None when the
    destination does not resolve (a subset or Service not found: the data path answers 503)."""
    host: str
    subset: str | None
    weight: int
    labels: dict | None = None


@dataclass
class Source:
    """One watched kind of the flight recorder: its list call and how its objects are condensed."""
    kind: str
    list_fn: Callable
    args: tuple
    condense: Callable[[dict], dict]
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Watch:
    """One watched kind of the mesh emulator: the list call (built on the emulator's own client)."""
    key: str
    list_call: Callable     # (api_client) -> (list_fn, args, kwargs)


class TrafficRouter:
    """The interface; each router module subclasses it once."""
    name = ""                # as on the run dimension and in rows: istio, nginx
    key = ""                 # the key under trafficRouting
    routings: tuple = ()     # the RolloutSpec.routing forms it supports (subset: Istio's DestinationRule subsets)
    route_kind = ""          # the record kind whose objects carry the weights
    object_kinds: tuple = ()  # the kinds of the router's own objects a drill's (or a chart's) manifests bring
    # the error a sync returns by design while the router's readiness guard holds a weight (the controller requeues
    # and tries again): a regex over the logged message, None for a router without such a guard
    guard_delay: str | None = None
    audit_resource = ("", "")  # (group, plural) of the route objects whose writes the audit log keeps
    crds: frozenset = frozenset()
    metrics_note = ""        # what the emulated data path's metrics are shaped like

    # --- a drill's Rollout -------------------------------------------------------------------------------
    def check_routing(self, routing: str) -> None:
        if routing not in self.routings:
            raise BadInput(f"routing {routing!r} is not one {self.name} has: {', '.join(self.routings)}")

    def routing_manifests(self, spec, namespace: str, labels: dict, canary: dict) -> tuple[list, list]:
        """Services and the router's objects for ``spec``; sets the canary strategy's routing fields."""
        raise NotImplementedError

    def create(self, api, namespace: str, obj: dict) -> None:
        raise NotImplementedError

    # --- the recorder and the timeline --------------------------------------------------------------------
    def rollout_fields(self, name: str, canary: dict) -> dict:
        """The routing fields of a condensed Rollout record (``router`` among them)."""
        raise NotImplementedError

    def sources(self, api, namespace: str) -> list[Source]:
        raise NotImplementedError

    def condense_route(self, obj: dict) -> dict:
        raise NotImplementedError

    def weights(self, routes: dict[str, dict], rollout: dict) -> tuple[int | None, int | None]:
        """(canary, stable) weights in force from the condensed route objects by name and the condensed Rollout;
        (None, None) when they do not say."""
        raise NotImplementedError

    # --- the mesh emulator --------------------------------------------------------------------------------
    def watches(self, namespace: str, name: str) -> list[Watch]:
        raise NotImplementedError

    def route_table(self, objects: dict[str, dict[str, dict]], name: str) -> list[Route]:
        """The weighted destinations from the watched objects (key -> name -> object)."""
        raise NotImplementedError

    def metrics(self, namespace: str, name: str):
        """The emulated data path's metrics: ``observe(decision, ms)`` and ``render()``."""
        raise NotImplementedError


def service_manifest(name: str, namespace: str, labels: dict) -> dict:
    """A drill's Service: port 80 to the pods' 8080, selecting ``labels`` (the controller adds the hash to a
    canaryService's and a stableService's selector)."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": dict(labels), "ports": [{"port": 80, "targetPort": 8080, "name": "http"}]}}


def services_watch(namespace: str) -> Watch:
    """The mesh emulator's watch of the namespace's Services (a host route's pods are its Service's)."""
    def call(api):
        from ..kube.k8s import client        # imported when used: the command line needs none
        return client.CoreV1Api(api).list_namespaced_service, (namespace,), {}
    return Watch("services", call)


def service_labels(services: dict[str, dict], name: str) -> dict | None:
    """The selector of the Service ``name`` among the watched ones (None: not found, or it selects nothing)."""
    svc = services.get(name)
    if not svc:
        return None
    sel = (svc.get("spec") or {}).get("selector")
    return dict(sel) if sel else None


def fqdn(host: str, namespace: str) -> str:
    if not host:
        return "unknown"
    if "." not in host:
        return f"{host}.{namespace}.svc.cluster.local"
    parts = host.split(".")
    return f"{parts[0]}.{parts[1]}.svc.cluster.local" if len(parts) == 2 else host


def esc(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
