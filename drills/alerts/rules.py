"""Prometheus alerting rules for Rollouts read as ``drills scan`` reads them (drills.scan.model.ScannedRollout).

Per Rollout, one group ``drills.rollout.<namespace>.<name>`` with:

- ``RolloutStuckAtRemainingRung``: the canary weight below maxTrafficWeight at the end of the steps (a rollback
  inside rollbackWindow jumps there) while some of the Rollout's pods are unavailable and it is not aborted, for
  longer than the Rollout's expected ramp with its margin (drills.alerts.ramp).  Not written for a Rollout without
  trafficRouting (no weight) or a blue-green one.
- ``RolloutAborted``: the controller reports the Rollout aborted (``rollout_info{phase="Abort"}``, the Progressing
  condition's reason ``RolloutAborted``); nothing recovers from it by itself.

Annotations are plain text (no templates): the summary, the description with the formula and its numbers, the
metrics each rule needs, and the runbook, whose escape is ``promote --full`` (lane escape's evidence).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml

from ..scan.model import ScannedRollout, last_set_weight_step, prescribed, steps_text
from .metrics import (
    ABORT_PHASE, CANARY_WEIGHT, NEEDS, ROLLOUT_INFO, IN_PROGRESS, CURRENT_LABEL, PHASE, POD_HASHES, STABLE_LABEL,
    STEP_INDEX, ksm_labels
)
from .ramp import Ramp, RampParams, duration, expected_ramp

STUCK = "RolloutStuckAtRemainingRung"
ABORTED = "RolloutAborted"
BLIND = "RolloutAlertMetricsMissing"
SEVERITY = "critical"
BLIND_FOR_S = 600.0            # a source of the stuck rule missing this long for a Rollout the controller reports
GROUP_PREFIX = "drills.rollout."
PROMETHEUS_RULE_NAME = "drills-rollout-alerts"


@dataclass
class AlertTarget:
    """One Rollout the rules are written for (several reads of one namespace/name: the longest ramp wins)."""
    ro: ScannedRollout
    ramp: Ramp | None
    steps: list = field(default_factory=list)      # the steps the rule is for: the prescribed ones
    sources: list = field(default_factory=list)
    notes: list = field(default_factory=list)      # the alert delay (for:) of each read, to tell them apart


def _sel(labels: dict) -> str:
    return "{" + ", ".join(f'{k}="{_q(v)}"' for k, v in labels.items()) + "}"


def _q(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"')


def stuck_expr(namespace: str, name: str, steps: int, max_weight: int) -> str:
    ksm = ksm_labels(namespace, name)
    in_progress = _sel({**ksm, "phase": "|".join(IN_PROGRESS)}).replace('phase="', 'phase=~"')
    abort = _sel({"namespace": namespace, "name": name, "phase": ABORT_PHASE})
    return (f"(max by (namespace, name) ({CANARY_WEIGHT}{_sel(ksm)}) < {max_weight})\n"
            f"and on (namespace, name) (max by (namespace, name) ({STEP_INDEX}{_sel(ksm)}) >= {steps})\n"
            f"and on (namespace, name) (max by (namespace, name) ({PHASE}{in_progress}) == 1)\n"
            f"unless on (namespace, name) (max by (namespace, name) ({ROLLOUT_INFO}{abort}))\n"
            f"unless on (namespace, name) {promoted_expr(namespace, name)}")


def promoted_expr(namespace: str, name: str) -> str:
    """A series while the Rollout is fully promoted: its stable ReplicaSet is its current pod template's
    (kube-state-metrics' pod-hashes Info, its two labels compared by a join on a copy of each)."""
    hashes = f"{POD_HASHES}{_sel(ksm_labels(namespace, name))}"

    def copy(label: str) -> str:
        return (f'label_replace(max by (namespace, name, {label}) ({hashes}), "pod_hash", "$1", "{label}", '
                f'"(.+)")')
    return f"({copy(STABLE_LABEL)} and on (namespace, name, pod_hash) {copy(CURRENT_LABEL)})"


def expr_numbers(stuck: str) -> tuple[int, int]:
    """(step count, max weight) a stuck expression compares with."""
    steps = re.search(r"\) >= ([0-9]+)\)", stuck)
    weight = re.search(r"\) < ([0-9]+)\)", stuck)
    if not (steps and weight):
        raise ValueError(f"not a stuck expression of drills alerts: {stuck[:200]}")
    return int(steps.group(1)), int(weight.group(1))


def blind_expr(namespace: str, name: str) -> str:
    ksm = _sel(ksm_labels(namespace, name))
    ctl = _sel({"namespace": namespace, "name": name})
    each = " and on (namespace, name) ".join(f"max by (namespace, name) ({m}{ksm})"
                                             for m in (CANARY_WEIGHT, STEP_INDEX, PHASE))
    return (f"(max by (namespace, name) ({ROLLOUT_INFO}{ctl}) unless on (namespace, name) ({each}))\n"
            f"or (max by (namespace, name) ({CANARY_WEIGHT}{ksm}) unless on (namespace, name) "
            f"max by (namespace, name) ({ROLLOUT_INFO}{ctl}))")


def aborted_expr(namespace: str, name: str) -> str:
    abort = _sel({"namespace": namespace, "name": name, "phase": ABORT_PHASE})
    return f"max by (namespace, name) ({ROLLOUT_INFO}{abort}) == 1"


def runbook_stuck(ns: str, name: str, rung) -> str:
    share = f"{100 - rung} %" if rung else "all"
    return (f"While the revived ReplicaSet of {ns}/{name} is not available, {share} of the traffic stays on the "
            f"version being rolled back from. 1. Find why its pods are not Ready (kubectl -n {ns} get pods; "
            f"kubectl -n {ns} describe pod: capacity, an image pull, a failing readiness probe) and fix that: the "
            f"rollback completes by itself once they are available, and the alert resolves. 2. `kubectl argo "
            f"rollouts promote --full {name} -n {ns}` keeps the weight where it is until the revived ReplicaSet is "
            f"fully available and then completes the rollout; it does not make the pods available (drills lane "
            f"alert: the alert stays firing after promote --full while the pods are held). 3. If the Rollout gets "
            f"aborted, RolloutAborted fires: its escape is promote --full.")


def runbook_aborted(ns: str, name: str) -> str:
    return (f"{ns}/{name} is aborted: traffic is back on its stable ReplicaSet and nothing recovers from an abort "
            f"by itself. The escape is `kubectl argo rollouts promote --full {name} -n {ns}`: it clears the abort, "
            f"keeps the weight where it is until the revived ReplicaSet is fully available, then the Rollout is "
            f"Healthy at the revision it rolled back to (drills lane escape, promote-full). Not `retry` (the steps "
            f"and the analysis run again and abort again), not a plain `promote` (the abort stays), not `undo` (the "
            f"previous revision, the broken release, serves again).")


def _cut(read: list, steps: list) -> str:
    return "" if read == steps else f" (as prescribed: read as {steps_text(read)}, the final setWeight 100 deleted)"


def rollout_rules(t: AlertTarget, params: RampParams) -> list[dict]:
    ro = t.ro
    ns, name = ro.namespace, ro.name
    where = "; ".join(t.sources) or ro.source
    # the Rollout in each rule's labels: rules of one name differ by their labels (promtool's duplicate-rules lint)
    labels = {"severity": SEVERITY, "rollout": f"{ns}/{name}"}
    rules = []
    if t.ramp is not None:
        r = t.ramp
        rung = f"the remaining rung {r.rung} %" if r.rung else "weight 0 (no setWeight)"
        rules.append({
            "alert": STUCK,
            "expr": stuck_expr(ns, name, len(t.steps), ro.max_weight),
            "for": duration(r.for_s),
            "labels": dict(labels),
            "annotations": {
                "summary": f"{ns}/{name}: the rollback sits below weight {ro.max_weight} at {rung} longer than its "
                           f"expected ramp ({duration(r.ramp_s)}, alert after {duration(r.for_s)})",
                "description": (f"The canary weight of {ns}/{name} is below {ro.max_weight} at the end of its steps "
                                f"{steps_text(t.steps)}{_cut(ro.steps, t.steps)} (a rollback inside rollbackWindow "
                                f"jumps there) while it is not promoted (status.phase Progressing, or Degraded once its "
                                f"progress deadline passed; a fully promoted Rollout, whose stable ReplicaSet is its "
                                f"current pod template's, is left out: its first deploy, a scale-up) nor aborted, for "
                                f"longer than its expected ramp. Expected "
                                f"ramp from "
                                f"its sizes (replicas {r.replicas}, minPodsPerReplicaSet {r.min_pods}, rung "
                                f"{r.rung or 0}) and a stated readiness time of {duration(r.readiness_s)} per pod, "
                                f"margin {r.margin * 100:g} %: {r.formula()}. Read from {where}."),
                "ramp_formula": r.formula(),
                "metrics": "; ".join(NEEDS["stuck"]),
                "runbook": runbook_stuck(ns, name, r.rung),
            }})
        rules.append({
            "alert": BLIND,
            "expr": blind_expr(ns, name),
            "for": duration(BLIND_FOR_S),
            "labels": {"severity": "warning", "rollout": f"{ns}/{name}"},
            "annotations": {
                "summary": f"{ns}/{name}: {STUCK} cannot see this Rollout (a metric it needs is missing)",
                "description": (f"The controller reports {ns}/{name} but the kube-state-metrics custom-resource "
                                f"metrics of its weight, step or phase are missing, or the other way round, for "
                                f"{duration(BLIND_FOR_S)}: {STUCK} would never fire for it. Read from {where}."),
                "metrics": "; ".join(NEEDS["stuck"]),
                "runbook": ("Deploy kube-state-metrics with the custom-resource-state config of `drills alerts "
                            "--ksm-config` (RBAC: list/watch rollouts.argoproj.io), and scrape it and the Argo "
                            "Rollouts controller's /metrics with honor_labels: true."),
            }})
    rules.append({
        "alert": ABORTED,
        "expr": aborted_expr(ns, name),
        "for": duration(params.abort_for_s),
        "labels": dict(labels),
        "annotations": {
            "summary": f"{ns}/{name} is aborted (RolloutAborted): no automatic recovery",
            "description": (f"The Argo Rollouts controller reports {ns}/{name} aborted (rollout_info phase "
                            f"{ABORT_PHASE}: its Progressing condition's reason is RolloutAborted) for "
                            f"{duration(params.abort_for_s)}. Read from {where}."),
            "metrics": "; ".join(NEEDS["aborted"]),
            "runbook": runbook_aborted(ns, name),
        }})
    return rules


def targets(rollouts: list[ScannedRollout], params: RampParams) -> tuple[list[AlertTarget], list[str]]:
    """One target per namespace/name, in input order; notes for what gets no stuck rule and for merged reads."""
    out: dict[tuple[str, str], AlertTarget] = {}
    notes: list[str] = []
    for ro in rollouts:
        ramp, steps = None, prescribed(ro.steps)
        if ro.strategy == "canary" and ro.routing != "none":
            _, rung = last_set_weight_step(steps)
            ramp = expected_ramp(ro.replicas, ro.min_pods, rung, ro.max_weight, params)
            if steps != ro.steps:
                notes.append(f"{ro.key} ({ro.source}): the last setWeight is 100 (drills scan's lint error): the rule "
                             f"is written for the prescribed steps {steps_text(steps)}, which ship with it; until "
                             f"they are deployed a rollback puts weight 100 on the partial ReplicaSet, which a rule "
                             f"on a weight below {ro.max_weight} does not see")
        elif ro.strategy == "canary":
            notes.append(f"{ro.key} ({ro.source}): no trafficRouting, no weight to watch: only {ABORTED}")
        else:
            notes.append(f"{ro.key} ({ro.source}): {ro.strategy} strategy: only {ABORTED}")
        key = (ro.namespace, ro.name)
        if key not in out:
            out[key] = AlertTarget(ro, ramp, steps, [ro.source])
        else:
            t = out[key]
            t.sources.append(ro.source)
            if ramp is not None and (t.ramp is None or ramp.for_s > t.ramp.for_s):
                t.ro, t.ramp, t.steps = ro, ramp, steps
        out[key].notes.append(ramp.for_s if ramp else None)
    for t in out.values():
        if len(set(t.notes)) > 1:
            notes.append(f"{t.ro.key} is read {len(t.sources)} times with different sizes ({', '.join(t.sources)}): "
                         f"one rule, with the longest expected ramp ({duration(t.ramp.for_s)}, from {t.ro.source}); "
                         f"a rules file per cluster (--env) gives each its own")
    return list(out.values()), notes


def rules_document(rollouts: list[ScannedRollout], params: RampParams = RampParams(),
                   interval_s: float | None = None) -> tuple[dict, list[str]]:
    """{"groups": [...]} (what promtool and Prometheus read) and the notes for standard error."""
    params.check()
    ts, notes = targets(rollouts, params)
    groups = []
    for t in ts:
        g = {"name": f"{GROUP_PREFIX}{t.ro.namespace}.{t.ro.name}"}
        if interval_s:
            g["interval"] = duration(interval_s)
        g["rules"] = rollout_rules(t, params)
        groups.append(g)
    return {"groups": groups}, list(dict.fromkeys(notes))


def prometheus_rule(doc: dict, name: str = PROMETHEUS_RULE_NAME) -> dict:
    """The same groups as a prometheus-operator PrometheusRule manifest."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "drills"}},
            "spec": {"groups": doc["groups"]}}


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, value: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def render(doc: dict, fmt: str = "rules", header: str = "") -> str:
    body = prometheus_rule(doc) if fmt == "prometheusrule" else doc
    text = yaml.dump(body, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)
    lines = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return lines + text
