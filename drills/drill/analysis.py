"""Background analysis the seed's way (brief §5): an error-rate AnalysisTemplate read through Argo's prometheus
provider from a real Prometheus, and the recorded AnalysisRun series read back measurement by measurement."""
from __future__ import annotations

import copy
import re

from ..core import config
from ..routers import istio
from .shapes import RolloutSpec


# --- manifests ----------------------------------------------------------------------------------------------
def service_fqdn(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.svc.cluster.local"


def analysis_query(fx: dict, fqdn: str, per_revision: bool) -> str:
    a = fx["analysis"]
    return istio.error_rate_query(fqdn, revision="{{args.canary-hash}}" if per_revision else None,
                                       reporter=a["reporter"], window=a["window"])


def analysis_template(fx: dict, namespace: str, prometheus_url: str, query: str, per_revision: bool) -> dict:
    """The seed's error-rate template (brief §5) with the interval shortened; failureLimit and condition kept."""
    a = fx["analysis"]
    spec: dict = {"metrics": [{
        "name": a["metric"], "interval": a["interval"], "failureLimit": a["failureLimit"],
        "failureCondition": a["failureCondition"],
        "provider": {"prometheus": {"address": prometheus_url, "query": query}}}]}
    if per_revision:
        spec["args"] = [{"name": "canary-hash"}]
    return {"apiVersion": config.ARGO_API_VERSION, "kind": "AnalysisTemplate",
            "metadata": {"name": a["template"], "namespace": namespace}, "spec": spec}


def canary_analysis(fx: dict, per_revision: bool) -> dict:
    """Background analysis as the seed's chart renders it: ``canary.analysis.templates``, no startingStep."""
    out: dict = {"templates": [{"templateName": fx["analysis"]["template"]}]}
    if per_revision:
        out["args"] = [{"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}}]
    return out


def rollout_spec(fx: dict, step: str) -> RolloutSpec:
    oc = fx["outcomes"][step]
    return RolloutSpec(steps=copy.deepcopy(fx["steps"]), replicas=fx["replicas"], min_pods=fx["minPodsPerReplicaSet"],
                     rollback_window=oc["rollback_window"], scale_down_delay=fx["scaleDownDelaySeconds"],
                     availability_control=True, rollback_via="gitops", name=fx["name"],
                     image_v1=fx["images"]["v1"], image_v2=fx["images"]["v2"],
                     extra_canary={"analysis": canary_analysis(fx, oc["query"] == "per-revision")})


# --- reading the recorded AnalysisRun series -----------------------------------------------------------------
_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|NaN|[-+]?Inf", re.IGNORECASE)


def measurement_value(text) -> float | None:
    """The prometheus provider stores a vector result as e.g. ``[0.4839]``; the first number of it."""
    if text is None:
        return None
    m = _NUM.search(str(text))
    return float(m.group(0)) if m else None


def run_names(records: list[dict], prefix: str) -> list[str]:
    names = []
    for r in sorted(records, key=lambda r: r["seq"]):
        if r["kind"] == "AnalysisRun" and r["name"].startswith(prefix) and r["name"] not in names:
            names.append(r["name"])
    return names


def measurements(records: list[dict], run_name: str, metric: str) -> tuple[list[dict], list[list]]:
    """One entry per measurement of ``metric`` in the recorded updates of one AnalysisRun (arrival order).

    Each entry: n (1-based), wall (arrival of the update that first carried it), value (the measurement's
    value when that update carried it as the last one), failed (True/False), coalesced (the update carried
    more than one new measurement: their order of failures is not known, the last value is).
    Also returns the run's phase series [[wall, phase, count, failed]].
    """
    out: list[dict] = []
    phases: list[list] = []
    last_count = last_failed = 0
    for r in sorted(records, key=lambda r: r["seq"]):
        if r["kind"] != "AnalysisRun" or r["name"] != run_name or r["type"] == "DELETED":
            continue
        obj = r["obj"] or {}
        m = (obj.get("metrics") or {}).get(metric) or {}
        count, failed = int(m.get("count") or 0), int(m.get("failed") or 0)
        if not phases or phases[-1][1:] != [obj.get("phase"), count, failed]:
            phases.append([r["wall"], obj.get("phase"), count, failed])
        if count > last_count:
            new = count - last_count
            new_failed = max(0, failed - last_failed)
            for i in range(new):
                n = last_count + i + 1
                out.append({"n": n, "wall": r["wall"], "rv": r.get("rv"),
                            "value": measurement_value(m.get("last")) if n == count else None,
                            "raw": m.get("last") if n == count else None,
                            "failed": (i >= new - new_failed) if new > 1 else new_failed == 1,
                            "coalesced": new > 1})
            last_count, last_failed = count, failed
    return out, phases


def client_error_ratio(reqs: list[dict], t0: float, t1: float) -> tuple[float | None, int]:
    sel = [r for r in reqs if t0 <= r["t"] < t1]
    if not sel:
        return None, 0
    return sum(1 for r in sel if int(r.get("code") or 0) >= 500) / len(sel), len(sel)
