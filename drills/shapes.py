"""The Rollouts drills deploy: their spec (steps, size, routing, images) and their manifests.

One Service + DestinationRule subsets (``routing: subset``, as the seed's chart: the controller writes the
pod-template-hash into the subsets) or canaryService/stableService (``routing: host``), a VirtualService with
one http route, and a Rollout whose application container is ``container`` (sidecars beside it unchanged).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kubernetes import client

from . import config
from .podtemplate import with_image
from .rollout import Rollouts


@dataclass
class RolloutSpec:
    steps: list
    replicas: int = 2
    min_pods: int = 1
    routing: str = "subset"              # subset | host
    rollback_window: int | None = 3      # None: no rollbackWindow at all
    scale_down_delay: int = 5
    hold_seconds: float = 15.0
    batch_release: bool = False
    availability_control: bool = True
    rollback_via: str = "gitops"         # gitops | undo
    name: str = "probe"
    container: str = "app"               # the application container: the only one the drill changes
    image_v1: str = "registry.local/probe:v1"
    image_v2: str = "registry.local/probe:v2"
    extra_canary: dict = field(default_factory=dict)   # e.g. replicaProgressThreshold
    sidecars: list = field(default_factory=list)        # containers beside the app (never changed by the drill)

    @classmethod
    def from_fixture(cls, path: Path, **over) -> tuple["RolloutSpec", dict]:
        fx = yaml.safe_load(Path(path).read_text())
        spec = cls(steps=fx["steps_before"], replicas=fx["replicas"], min_pods=fx["minPodsPerReplicaSet"],
                   rollback_window=fx["rollbackWindowRevisions"], scale_down_delay=fx["scaleDownDelaySeconds"],
                   hold_seconds=fx["hold_seconds"], batch_release=fx.get("batch_release", False),
                   name=fx["name"], image_v1=fx["images"]["v1"], image_v2=fx["images"]["v2"])
        for k, v in over.items():
            setattr(spec, k, v)
        return spec, fx


def manifests(spec: RolloutSpec, namespace: str) -> dict:
    n = spec.name
    labels = {"app.kubernetes.io/name": n, "app.kubernetes.io/instance": n}
    istio: dict = {"virtualService": {"name": n, "routes": ["primary"]}}
    canary: dict = {"steps": copy.deepcopy(spec.steps), "minPodsPerReplicaSet": spec.min_pods,
                    "scaleDownDelaySeconds": spec.scale_down_delay, "trafficRouting": {"istio": istio}}
    canary.update(copy.deepcopy(spec.extra_canary))
    services = []
    if spec.routing == "subset":
        istio["destinationRule"] = {"name": n, "canarySubsetName": "canary", "stableSubsetName": "stable"}
        services.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": n, "namespace": namespace},
                         "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080, "name": "http"}]}})
        route = [{"destination": {"host": n, "subset": "stable"}, "weight": 100},
                 {"destination": {"host": n, "subset": "canary"}, "weight": 0}]
        dr = {"apiVersion": "networking.istio.io/v1alpha3", "kind": "DestinationRule",
              "metadata": {"name": n, "namespace": namespace},
              "spec": {"host": n, "subsets": [{"name": "canary", "labels": {"app.kubernetes.io/name": n}},
                                              {"name": "stable", "labels": {"app.kubernetes.io/name": n}}]}}
    elif spec.routing == "host":
        canary["canaryService"], canary["stableService"] = f"{n}-canary", f"{n}-stable"
        for s in (f"{n}-canary", f"{n}-stable"):
            services.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": s, "namespace": namespace},
                             "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080, "name": "http"}]}})
        route = [{"destination": {"host": f"{n}-stable"}, "weight": 100},
                 {"destination": {"host": f"{n}-canary"}, "weight": 0}]
        dr = None
    else:
        raise ValueError(f"unknown routing {spec.routing!r}: subset or host")
    vs = {"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService",
          "metadata": {"name": n, "namespace": namespace},
          "spec": {"hosts": [n], "http": [{"name": "primary", "route": route}]}}
    template = {"metadata": {"labels": dict(labels)},
                "spec": {"containers": [{"name": spec.container, "image": spec.image_v1,
                                         "ports": [{"containerPort": 8080}]}, *copy.deepcopy(spec.sidecars)]}}
    ro = {"apiVersion": config.ARGO_API_VERSION, "kind": "Rollout", "metadata": {"name": n, "namespace": namespace},
          "spec": {"replicas": spec.replicas, "revisionHistoryLimit": 10,
                   "selector": {"matchLabels": dict(labels)}, "template": template,
                   "strategy": {"canary": canary}}}
    if spec.rollback_window is not None:
        ro["spec"]["rollbackWindow"] = {"revisions": spec.rollback_window}
    return {"services": services, "destinationrule": dr, "virtualservice": vs, "rollout": ro}


def install(api: client.ApiClient, namespace: str, spec: RolloutSpec, journal=None, log=None) -> Rollouts:
    """Create the probe's Service(s), DestinationRule, VirtualService and Rollout (v1)."""
    m = manifests(spec, namespace)
    core, co = client.CoreV1Api(api), client.CustomObjectsApi(api)
    for svc in m["services"]:
        core.create_namespaced_service(namespace, svc)
    if m["destinationrule"]:
        co.create_namespaced_custom_object("networking.istio.io", "v1alpha3", namespace, "destinationrules",
                                           m["destinationrule"])
    co.create_namespaced_custom_object("networking.istio.io", "v1alpha3", namespace, "virtualservices",
                                       m["virtualservice"])
    ro = Rollouts(api, namespace, journal=journal, log=log)
    ro.create(m["rollout"])
    return ro


def template_for(spec: RolloutSpec, image: str) -> dict:
    """The probe's pod template with the application container at ``image`` (sidecars as they are)."""
    return with_image(manifests(spec, "x")["rollout"]["spec"]["template"], spec.container, image)
