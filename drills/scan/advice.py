"""What to do about a Rollout: the last-rung lint, the safe pod count and the fix wave.

Lint (brief §9.5 "guard against regressions"; errors fail ``--fail-on lint``):
- ``final-setweight-100`` (error): the last setWeight value is 100 (the backward search picks it on a
  rollback inside rollbackWindow), also when a pause follows it.  Pointed at that step.
- ``last-rung-ratio`` (warning): once the final 100 is gone, the remaining rung is more than 3 x the first
  rung (brief: w_last <= 3 x w_first).  A heuristic: the incident's own fix [1, pause, 5, pause] breaks it
  while its first pods carry 5 % of 20 replicas easily, so the exposure prediction, not this ratio, is the
  gate (``--fail-on exposed``).  Pointed at that step.
- ``above-safe-pod-count`` (warning): spec.replicas above the safe pod count (an autoscaled Rollout: its
  autoscaler's maxReplicas).
- ``invalid-spec`` (error): a step the controller's validation refuses (two of setWeight, pause, experiment and
  analysis in one step, or a step that sets nothing): InvalidSpec, nothing is reconciled.  Pointed at that step.
- ``crd-pruned-field`` (error): a field the version's CRD does not know where it was put (drills.scan.schema): the
  apiserver drops it, so the controller never sees it (``rollbackWindow`` under ``strategy.canary``: no window
  at all).  The message names where it belongs.  Pointed at the field.
- ``crd-rejected-field`` (error): a value the CRD schema refuses (type, enum, a required field missing): the
  apiserver rejects the Rollout.  Pointed at the field.

Safe pod count (brief §9.3: minPodsPerReplicaSet / remaining rung x 100): computed exactly from the rules
(the largest replica count whose rollback puts no more than its share on the pods that first carry the
remaining rung), next to the brief's formula.  They agree for the incident's shape; they differ where the
first rung already sizes the revived ReplicaSet to carry the remaining rung (the base [5, pause 10m]: any
count is safe, the brief says 40) and without the guard (host routing, v1.7.x: 1 pod carries it).

Fix wave (brief §9.5 order, corrected by what the rules and the probe show):
- ``-``: not exposed on this routing and version: nothing to do for this hazard.  Under the seed's chart
  (subset routing) on v1.8+ this includes the ``[100]``-alone blocks and ``100 -> pause`` forms: their
  revived ReplicaSet is first sized to the whole Rollout, and the guard holds the weight until it is full.
- ``1``: exposed; deleting the final setWeight 100 leaves no setWeight at all (``[100]``, ``[100, pause]``).
- ``2``: exposed; deleting it leaves a low rung that the first pods carry (predicted not exposed after).
- ``3``: exposed even without the final 100 (a high remaining rung, or replicas above the safe pod count):
  lower the earlier rungs or raise minPodsPerReplicaSet too.
- ``4``: exposed by replicaProgressThreshold (v1.9+): the end-of-steps branch writes 100 whatever the steps,
  so the cut does not help; drop the threshold.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .model import ScannedRollout, last_set_weight_step, prescribed, set_weights
from .predict import RPT, Prediction, predict
from .sources import VersionFacts

ERROR, WARNING = "error", "warning"
FINAL_100, RATIO, ABOVE_SAFE = "final-setweight-100", "last-rung-ratio", "above-safe-pod-count"
INVALID_SPEC, CRD_PRUNED, CRD_REJECTED = "invalid-spec", "crd-pruned-field", "crd-rejected-field"
LINT_RULES = {
    FINAL_100: "the last setWeight is 100: a rollback inside rollbackWindow puts it on the first revived pods",
    RATIO: "the remaining rung is more than 3 x the first rung (w_last <= 3 x w_first)",
    ABOVE_SAFE: "spec.replicas above the safe pod count for the remaining rung",
    INVALID_SPEC: "the controller's validation refuses the spec (InvalidSpec): it reconciles nothing",
    CRD_PRUNED: "a field the controller version's CRD does not know there: the apiserver drops it",
    CRD_REJECTED: "a value the CRD schema refuses: the apiserver rejects the Rollout",
}
WAVES = {"-": "not exposed", "1": "[100]-alone family: delete the final setWeight 100 (nothing remains)",
         "2": "low remaining rung: delete the final setWeight 100",
         "3": "high remaining rung: delete the final 100 and lower earlier rungs or raise minPodsPerReplicaSet",
         "4": "replicaProgressThreshold (v1.9+): drop the threshold; the cut does not help"}


@dataclass
class Finding:
    rule: str
    level: str
    message: str
    step: int | None          # index of the offending step
    line: int | None          # its line in steps_file
    file: str | None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _at(ro: ScannedRollout, step: int | None) -> tuple[int | None, str | None]:
    if step is not None and step < len(ro.step_lines) and ro.step_lines[step]:
        return ro.step_lines[step], ro.steps_file
    return ro.steps_line or ro.line, ro.steps_file or ro.file


def _exposed_at(ro: ScannedRollout, facts: VersionFacts, steps: list, replicas: int) -> bool:
    r = dataclasses.replace(ro, steps=steps, replicas=replicas, step_lines=[])
    return predict(r, facts).exposed


def safe_pod_count(ro: ScannedRollout, facts: VersionFacts) -> dict:
    """The safe pod count for the remaining rung (the steps after the prescription): the largest replica count
    up to which a rollback inside rollbackWindow puts no more than their share on the pods that first carry
    it.  ``brief_safe_pod_count`` is the brief's formula (minPodsPerReplicaSet / rung x 100, §9.3); the exact
    count differs where the first rung sizes the revived ReplicaSet above the floor (then the floor is not
    what carries it: with a first rung >= the remaining rung, any count is safe) and where there is no guard
    (the first available pod carries it: 100 / rung)."""
    cut = prescribed(ro.steps)
    _, rung = last_set_weight_step(cut)
    sw = set_weights(ro.steps)
    w0 = sw[0][1] if sw and sw[0][0] == 0 else 0
    m = ro.min_pods
    count = max(-(-w0 * ro.replicas // ro.max_weight), m or 0) if w0 else 0
    out = {"remaining_rung": rung, "safe_pod_count": None, "brief_safe_pod_count": None,
           "canary_count": (f"canary pods = max(ceil(V x R / maxW), M) = max(ceil({w0} x {ro.replicas} / "
                            f"{ro.max_weight}), {m if m is not None else '-'}) = {count}")}
    if not rung or ro.routing == "none":
        out["basis"] = "no remaining rung" if not rung else "no traffic routing"
        return out
    out["brief_safe_pod_count"] = ((m or 1) * ro.max_weight) // rung
    guard = facts.guard and ro.routing == "subset"
    if guard:
        w0_cut = cut[0].get("setWeight") if cut and isinstance(cut[0], dict) else None
        if w0_cut is None or w0_cut >= rung:
            out["basis"] = "the first rung sizes the revived ReplicaSet to carry the remaining rung: any count"
            return out
        bound = (max((m or 1) * ro.max_weight // rung, ro.max_weight // (rung - w0_cut)) + 2)
        out["basis"] = "the first size max(ceil(w0 x R / maxW), M) carries it (subset routing, UpdateHash guard)"
    else:
        bound = ro.max_weight // rung + 2
        out["basis"] = "1 pod carries it (no UpdateHash guard on this routing/version): 100 / rung"
    first_exposed = next((n for n in range(2, bound + 1) if _exposed_at(ro, facts, cut, n)), None)
    out["safe_pod_count"] = (first_exposed - 1) if first_exposed else None
    return out


def lint(ro: ScannedRollout, facts: VersionFacts | None, safe: dict | None = None) -> list[Finding]:
    """The findings; with ``facts`` None (the controller version unknown) those that do not depend on the version
    (the final setWeight 100, the last-rung ratio, the steps the validation refuses), never none."""
    out: list[Finding] = [Finding(CRD_PRUNED if f.kind == "pruned" else CRD_REJECTED, ERROR, f.message, None,
                                  f.line or ro.line, ro.file) for f in ro.schema_findings]
    for problem in ro.invalid:
        i = int(re.match(r"step (\d+)", problem).group(1))
        line, file = _at(ro, i)
        where = f", {facts.line('step-one-of').ref()}" if facts is not None else ""
        out.append(Finding(INVALID_SPEC, ERROR, f"{problem}: the controller's validation refuses the spec "
                           f"(InvalidSpec{where}) and reconciles nothing", i, line, file))
    out += [Finding(INVALID_SPEC, ERROR, f"{problem}: the controller's validation refuses the spec (InvalidSpec) "
                                         f"and reconciles nothing", None, ro.line, ro.file) for problem in ro.spec_invalid]
    if ro.strategy != "canary" or ro.rejected:
        return out
    i, w = last_set_weight_step(ro.steps)
    if w is not None and w >= ro.max_weight:
        line, file = _at(ro, i)
        tail = "" if i == len(ro.steps) - 1 else f" (followed by {len(ro.steps) - 1 - i} more step(s))"
        out.append(Finding(FINAL_100, ERROR, f"step {i}: setWeight {w} is the last setWeight{tail}; a rollback "
                           f"inside rollbackWindow jumps past it and the backward search picks it while the "
                           f"revived ReplicaSet is partial. Delete it: after the last step the controller "
                           f"moves to {ro.max_weight} on its own.", i, line, file))
    cut = prescribed(ro.steps)
    sw = set_weights(cut)
    if len(sw) >= 2 and sw[-1][1] > 3 * sw[0][1]:
        idx = sw[-1][0]           # setWeights before the removed final one keep their index
        line, file = _at(ro, idx)
        out.append(Finding(RATIO, WARNING, f"step {idx}: the remaining rung setWeight {sw[-1][1]} is more than 3 x "
                           f"the first rung {sw[0][1]}: a rollback puts {sw[-1][1]} on the first revived pods "
                           f"even without a final 100; lower it.", idx, line, file))
    if facts is None:             # the safe pod count depends on the version's rules
        return out
    safe = safe if safe is not None else safe_pod_count(ro, facts)
    sizes = ro.size_range           # autoscaled: the check runs at the maximum the autoscalers allow
    top = sizes[1] if sizes else ro.replicas
    if safe["safe_pod_count"] is not None and top > safe["safe_pod_count"]:
        line, file = _at(ro, None)
        what = f"maxReplicas {top} (its autoscaler's)" if sizes else f"replicas {ro.replicas}"
        out.append(Finding(ABOVE_SAFE, WARNING, f"{what} above the safe pod count "
                           f"{safe['safe_pod_count']} for the remaining rung {safe['remaining_rung']} "
                           f"({safe['basis']})", None, line, file))
    return out


def wave(ro: ScannedRollout, pred: Prediction, facts: VersionFacts) -> str:
    if not pred.exposed and not pred.promotes_while_partial:
        return "-"
    if pred.rule == RPT or pred.promotes_while_partial:
        return "4"
    cut = prescribed(ro.steps)
    if cut == list(ro.steps):
        return "3"
    after = predict(dataclasses.replace(ro, steps=cut, step_lines=[]), facts)
    if after.exposed or after.promotes_while_partial:
        return "3"
    return "1" if not set_weights(cut) else "2"
