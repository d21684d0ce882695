"""The Rollouts drills deploy: their spec (steps, size, router and routing, images) and their manifests.

The router (drills.routers) writes the Services and its own objects (``routing: subset``: one Service whose
pods the router's subsets pick, as the seed's chart; ``routing: host``: canaryService/stableService), and a
Rollout whose application container is ``container`` (sidecars beside it unchanged).
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ..kube.k8s import client

from ..core import config
from .. import routers
from ..core.podtemplate import with_image
from ..kube.rollout import Rollouts
from ..core import fastyaml


@dataclass
class RolloutSpec:
    steps: list
    replicas: int = 2
    min_pods: int = 1
    routing: str | None = None           # subset | host (the forms the router has; None: its first)
    router: str = "istio"                # istio | nginx (nginx routes by host only)
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

    def __post_init__(self):
        router = routers.get(self.router)           # an unknown router or a routing it lacks: BadInput
        if self.routing is None:
            self.routing = router.routings[0]
        router.check_routing(self.routing)

    def on_router(self, router: str) -> "RolloutSpec":
        """The same Rollout routed by ``router`` (its first routing form unless it has this one)."""
        keep = self.routing if self.routing in routers.get(router).routings else None
        return dataclasses.replace(self, router=router, routing=keep)

    @classmethod
    def from_fixture(cls, path: Path, **over) -> tuple["RolloutSpec", dict]:
        fx = fastyaml.safe_load(Path(path).read_text())
        kw = dict(steps=fx["steps_before"], replicas=fx["replicas"], min_pods=fx["minPodsPerReplicaSet"],
                  rollback_window=fx["rollbackWindowRevisions"], scale_down_delay=fx["scaleDownDelaySeconds"],
                  hold_seconds=fx["hold_seconds"], batch_release=fx.get("batch_release", False),
                  name=fx["name"], image_v1=fx["images"]["v1"], image_v2=fx["images"]["v2"])
        kw.update(over)
        return cls(**kw), fx


def manifests(spec: RolloutSpec, namespace: str) -> dict:
    """{"services": [...], "routes": [the router's objects], "rollout": {...}} for ``spec`` on its router."""
    router = routers.get(spec.router)
    router.check_routing(spec.routing)
    n = spec.name
    labels = {"app.kubernetes.io/name": n, "app.kubernetes.io/instance": n}
    canary: dict = {"steps": copy.deepcopy(spec.steps), "minPodsPerReplicaSet": spec.min_pods,
                    "scaleDownDelaySeconds": spec.scale_down_delay}
    canary.update(copy.deepcopy(spec.extra_canary))       # the router's fields are its own: they come last
    services, objects = router.routing_manifests(spec, namespace, labels, canary)
    template = {"metadata": {"labels": dict(labels)},
                "spec": {"containers": [{"name": spec.container, "image": spec.image_v1,
                                         "ports": [{"containerPort": 8080}]}, *copy.deepcopy(spec.sidecars)]}}
    ro = {"apiVersion": config.ARGO_API_VERSION, "kind": "Rollout", "metadata": {"name": n, "namespace": namespace},
          "spec": {"replicas": spec.replicas, "revisionHistoryLimit": 10,
                   "selector": {"matchLabels": dict(labels)}, "template": template,
                   "strategy": {"canary": canary}}}
    if spec.rollback_window is not None:
        ro["spec"]["rollbackWindow"] = {"revisions": spec.rollback_window}
    return {"services": services, "routes": objects, "rollout": ro}


def install(api: client.ApiClient, namespace: str, spec: RolloutSpec, journal=None, log=None) -> Rollouts:
    """Create the probe's Service(s), its router's objects and the Rollout (v1)."""
    m = manifests(spec, namespace)
    core = client.CoreV1Api(api)
    for svc in m["services"]:
        core.create_namespaced_service(namespace, svc)
    router = routers.get(spec.router)
    for obj in m["routes"]:
        router.create(api, namespace, obj)
    ro = Rollouts(api, namespace, journal=journal, log=log)
    ro.create(m["rollout"])
    return ro


def template_for(spec: RolloutSpec, image: str) -> dict:
    """The probe's pod template with the application container at ``image`` (sidecars as they are)."""
    return with_image(manifests(spec, "x")["rollout"]["spec"]["template"], spec.container, image)
