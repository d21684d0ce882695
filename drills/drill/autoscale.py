"""A scale-out by the real autoscaler: an ``autoscaling/v2`` HorizontalPodAutoscaler on the drill's Rollout, acted on
by the embedded cluster's kube-controller-manager (its HPA controller, the one that scales every HPA- and
KEDA-autoscaled Rollout of a fleet: KEDA writes such an HPA for a ScaledObject), on an external metric the drill
serves (drills.cluster.external_metrics): the load an incident brings.

The HPA holds the Rollout at its size (minimum = its replicas, the metric = its replicas, target ``AverageValue``
1: the HPA wants as many replicas as the metric says), scales up in one write when the drill raises the metric
(scale-up policy: all the pods at once, no stabilization window) and never down (scale-down disabled), so that
the only write it makes during the drill is the scale-out.  The write goes through the Rollout's scale
subresource, as for any HPA target."""
from __future__ import annotations

from ..kube import k8s
from ..kube.k8s import client

from contextlib import nullcontext

from ..core import config
from ..cluster.external_metrics import ExternalMetrics, cluster_cert
from ..core.wait import WaitTimeout, until

STATUS_WAIT_S = 30.0           # after the scale: the HPA controller's status write that records it
SYNC_WAIT_S = 90.0             # the HPA controller syncs every 15 s (kube-controller-manager's default): six rounds


def metric_name(rollout: str) -> str:
    return f"drills-load-{rollout}"


def hpa_manifest(namespace: str, rollout: str, replicas: int, maximum: int) -> dict:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": rollout, "namespace": namespace, "labels": {"drills/role": "scale-out"}},
            "spec": {"scaleTargetRef": {"apiVersion": config.ARGO_API_VERSION, "kind": "Rollout", "name": rollout},
                     "minReplicas": replicas, "maxReplicas": maximum,
                     "metrics": [{"type": "External", "external": {
                         "metric": {"name": metric_name(rollout)},
                         "target": {"type": "AverageValue", "averageValue": "1"}}}],
                     "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                                              "policies": [{"type": "Pods", "value": maximum, "periodSeconds": 1}]},
                                  "scaleDown": {"selectPolicy": "Disabled"}}}}


def _conditions(h: dict) -> dict:
    return {c.get("type"): c for c in ((h or {}).get("status") or {}).get("conditions") or []}


class HPAScaleOut:
    """The HPA of one drill Rollout, and the metric it reads."""

    def __init__(self, api: client.ApiClient, metrics, namespace: str, rollout: str, replicas: int, maximum: int,
                 log=None):
        self.api, self.metrics, self.ns, self.name = api, metrics, namespace, rollout
        self.replicas, self.maximum = replicas, maximum
        self.metric = metric_name(rollout)
        self.log = log or (lambda m: None)
        self.hpa = client.AutoscalingV2Api(api)
        self.created = False

    def get(self) -> dict:
        return self.api.sanitize_for_serialization(self.hpa.read_namespaced_horizontal_pod_autoscaler(self.name,
                                                                                                        self.ns))

    def start(self) -> "HPAScaleOut":
        """Create the HPA at the Rollout's size and wait until the HPA controller has read the metric."""
        self.metrics.set(self.ns, self.metric, self.replicas)
        self.hpa.create_namespaced_horizontal_pod_autoscaler(self.ns, hpa_manifest(self.ns, self.name, self.replicas,
                                                                                   self.maximum))
        self.created = True
        self.log(f"autoscale: HPA {self.ns}/{self.name} ({self.replicas}..{self.maximum} on external metric "
                 f"{self.metric}); waiting for the HPA controller to read it")
        until(f"the HPA controller to read {self.metric} for {self.ns}/{self.name} (ScalingActive)", self.get,
              lambda h: (_conditions(h).get("ScalingActive") or {}).get("status") == "True", SYNC_WAIT_S,
              interval=0.5, describe=lambda h: str([(c.get("type"), c.get("status"), c.get("reason"))
                                                    for c in _conditions(h).values()]))
        return self

    def raise_load(self) -> None:
        """The incident's load: the metric at the maximum, so the HPA wants every replica it may have."""
        self.metrics.set(self.ns, self.metric, self.maximum)

    def wait_scaled(self, rollouts) -> dict:
        """Until the HPA controller has written the Rollout's replicas (the maximum), then its own status saying so
        (it writes the scale first, its status after: ``lastScaleTime``); the HPA as it then was (without that
        status when it did not come within STATUS_WAIT_S: the caller shows what is missing)."""
        until(f"the HPA controller to scale {self.ns}/{self.name} to {self.maximum}", lambda: rollouts.get(self.name),
              lambda ro: (ro.get("spec") or {}).get("replicas") == self.maximum, SYNC_WAIT_S, interval=0.2,
              describe=lambda ro: f"spec.replicas {(ro.get('spec') or {}).get('replicas')}")
        try:
            return until(f"the HPA {self.ns}/{self.name} to record its scale to {self.maximum} (lastScaleTime)",
                         self.get, lambda h: bool((h.get("status") or {}).get("lastScaleTime")) and
                         (h.get("status") or {}).get("desiredReplicas") == self.maximum, STATUS_WAIT_S, interval=0.2)
        except WaitTimeout:
            return self.get()

    def stop(self) -> None:
        if self.created:
            self.created = False
            try:
                self.hpa.delete_namespaced_horizontal_pod_autoscaler(self.name, self.ns)
            except k8s.ApiException as e:
                if e.status != 404:
                    self.log(f"autoscale: HPA {self.ns}/{self.name} not deleted: {e.reason}")


def external_metrics_for(cluster, api: client.ApiClient, wanted: bool, log=None):
    """The cluster's external metrics API served by this process while the ``with`` lasts (``wanted``), else
    nothing (a context manager giving None)."""
    if not wanted:
        return nullcontext(None)
    return ExternalMetrics(api, *cluster_cert(cluster), log=log)
