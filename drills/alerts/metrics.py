"""The metrics the rules read, and where a cluster gets them.

From the Argo Rollouts controller's own ``/metrics`` (``controller/metrics/prommetrics.go`` and ``rollouts.go``,
the same at v1.8.2 and v1.10.2): ``rollout_info{namespace, name, strategy, traffic_router, phase}`` (1; phase
``Abort`` when the Progressing condition's reason is ``RolloutAborted``).  Its replica gauges
(``rollout_info_replicas_unavailable`` = ``status.replicas - status.availableReplicas``) come from the Rollout's
status, which the controller does not write while a revived ReplicaSet routed by Istio subsets is
partly available (the Istio UpdateHash guard returns before the status is persisted): they read 0 unavailable
through the whole held rollback (lane alert shows it), so no rule reads them.  The controller exports no weight:
the canary weight, the step index and the Rollout's phase come from kube-state-metrics' custom-resource-state
metrics on the Rollout's status, with the config ``KSM_CONFIG`` below (``drills alerts --ksm-config FILE``
writes it; the alert drill runs kube-state-metrics ``config.KUBE_STATE_METRICS_VERSION``, built from its module,
with it: drills.alerts.ksm):

    kube_customresource_rollout_canary_weight{customresource_group="argoproj.io", customresource_kind="Rollout",
        customresource_version="v1alpha1", namespace, name}        status.canary.weights.canary.weight
    kube_customresource_rollout_current_step_index{...}             status.currentStepIndex
    kube_customresource_rollout_phase{..., phase}                   status.phase (a StateSet: 1 for the current one)
    kube_customresource_rollout_pod_hashes{..., stable_rs,          status.stableRS, status.currentPodHash (an Info:
        current_pod_hash}                                           1; equal once the Rollout is fully promoted)

A fully promoted Rollout (stableRS = currentPodHash) sits at the end of its steps with weight 0, and its phase is
Progressing whenever its pods are short (its first deploy, a scale-up, pods lost): the stuck rule leaves it out by
the two hashes, as a rollback's revived ReplicaSet is never the stable one until the rollback is promoted.

Both sources put the Rollout's ``namespace`` and ``name`` on each sample: scrape them with ``honor_labels: true``
(else Prometheus renames them ``exported_namespace``, ``exported_name``).
"""
from __future__ import annotations

from ..core import config

GROUP, KIND, VERSION = config.ARGO_GROUP, "Rollout", config.ARGO_VERSION
KSM_PREFIX = "kube_customresource"          # kube-state-metrics' default metricNamePrefix

ROLLOUT_INFO = "rollout_info"
ROLLOUT_UNAVAILABLE = "rollout_info_replicas_unavailable"
CANARY_WEIGHT = f"{KSM_PREFIX}_rollout_canary_weight"
STEP_INDEX = f"{KSM_PREFIX}_rollout_current_step_index"
PHASE = f"{KSM_PREFIX}_rollout_phase"
POD_HASHES = f"{KSM_PREFIX}_rollout_pod_hashes"
STABLE_LABEL, CURRENT_LABEL = "stable_rs", "current_pod_hash"
ABORT_PHASE = "Abort"
PHASES = ("Healthy", "Progressing", "Paused", "Degraded")     # status.phase of a Rollout
IN_PROGRESS = ("Progressing", "Degraded")                      # not promoted, not paused (Degraded: timed out too)

KSM_CONFIG = {
    "kind": "CustomResourceStateMetrics",
    "spec": {"resources": [{
        "groupVersionKind": {"group": GROUP, "kind": KIND, "version": VERSION},
        "labelsFromPath": {"namespace": ["metadata", "namespace"], "name": ["metadata", "name"]},
        "metrics": [
            {"name": "rollout_canary_weight",
             "help": "The canary weight the controller last wrote (status.canary.weights.canary.weight).",
             "each": {"type": "Gauge", "gauge": {"path": ["status", "canary", "weights", "canary", "weight"]}}},
            {"name": "rollout_current_step_index",
             "help": "The canary step the Rollout is at (status.currentStepIndex; the step count at the end).",
             "each": {"type": "Gauge", "gauge": {"path": ["status", "currentStepIndex"]}}},
            {"name": "rollout_phase",
             "help": "The Rollout's status.phase (1 for the current one).",
             "each": {"type": "StateSet", "stateSet": {"labelName": "phase", "path": ["status", "phase"],
                                                         "list": list(PHASES)}}},
            {"name": "rollout_pod_hashes",
             "help": "The stable ReplicaSet's and the current pod template's hashes (status.stableRS, "
                     "status.currentPodHash): the same once the Rollout is fully promoted.",
             "each": {"type": "Info", "info": {"labelsFromPath": {STABLE_LABEL: ["status", "stableRS"],
                                                                  CURRENT_LABEL: ["status", "currentPodHash"]}}}},
        ],
    }]},
}

CONTROLLER_SOURCE = "the Argo Rollouts controller's /metrics"
KSM_SOURCE = "kube-state-metrics custom-resource-state metrics (drills alerts --ksm-config)"
NEEDS = {
    "stuck": [f"{CANARY_WEIGHT} ({KSM_SOURCE}: status.canary.weights.canary.weight)",
              f"{STEP_INDEX} ({KSM_SOURCE}: status.currentStepIndex)",
              f"{PHASE} ({KSM_SOURCE}: status.phase)",
              f"{POD_HASHES} ({KSM_SOURCE}: status.stableRS, status.currentPodHash)",
              f"{ROLLOUT_INFO}{{phase=\"{ABORT_PHASE}\"}} ({CONTROLLER_SOURCE})"],
    "aborted": [f"{ROLLOUT_INFO}{{phase=\"{ABORT_PHASE}\"}} ({CONTROLLER_SOURCE})"],
}


def ksm_labels(namespace: str, name: str) -> dict:
    """The labels kube-state-metrics puts on a custom-resource-state sample of this config."""
    return {"customresource_group": GROUP, "customresource_kind": KIND, "customresource_version": VERSION,
            "namespace": namespace, "name": name}
