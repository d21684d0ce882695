"""What every fault case asserts at its end: the target as it was (spec, status, routing, lease gone), nothing of
the run left (processes, listeners, registered cluster processes, namespaces, holds), the cluster whole again, no
`pass` row where the fault took the evidence away, and pass rows only with a complete record."""
from __future__ import annotations

import json
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from drills.drill import safety
from drills.record import timeline
from drills.cluster.availability import Availability
from drills.record.recorder import audit_route_writes
from drills.kube.rollout import GROUP, PLURAL, VERSION
from drills.core.wait import WaitTimeout, until

# status fields a restore gives back (counts, revision hashes, step, abort, weights); observedGeneration moves
# with every spec write and is checked as "observed the latest spec" instead
STATUS_KEYS = ("phase", "stableRS", "currentPodHash", "currentStepIndex", "abort", "promoteFull", "pauseConditions",
               "replicas", "updatedReplicas", "readyReplicas", "availableReplicas")
FLAGS = ("abort", "promoteFull")
CONTROLLER_ANNOTATIONS = ("rollout.argoproj.io/revision",)


def target_state(api, namespace: str, name: str) -> dict:
    """The Rollout (spec, labels, annotations but the controller's revision counter, status) and its routing."""
    co = client.CustomObjectsApi(api)
    ro = co.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    md, st = ro["metadata"], ro.get("status") or {}
    weights = (st.get("canary") or {}).get("weights") or {}
    vs = co.get_namespaced_custom_object("networking.istio.io", "v1alpha3", namespace, "virtualservices", name)
    try:
        dr = co.get_namespaced_custom_object("networking.istio.io", "v1alpha3", namespace, "destinationrules", name)
        subsets = (dr.get("spec") or {}).get("subsets")
    except ApiException:
        subsets = None
    return {
        "spec": ro["spec"], "labels": md.get("labels") or {},
        "annotations": {k: v for k, v in (md.get("annotations") or {}).items() if k not in CONTROLLER_ANNOTATIONS},
        # an absent abort/promoteFull and a false one are the same state (the plugin's retry writes false)
        "status": {k: bool(st.get(k)) if k in FLAGS else st.get(k) for k in STATUS_KEYS},
        "observed": str(st.get("observedGeneration")) == str(md.get("generation")),
        "weights": {k: (v or {}).get("weight") for k, v in weights.items() if k in ("canary", "stable")},
        "virtualservice": (vs.get("spec") or {}).get("http"), "subsets": subsets,
    }


def _diff(a: dict, b: dict, path: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _diff(x, y, f"{path}{k}.")
        elif json.dumps(x, sort_keys=True) != json.dumps(y, sort_keys=True):
            out.append(f"{path}{k}: before {json.dumps(x)[:160]}, now {json.dumps(y)[:160]}")
    return out


def assert_restored(api, namespace: str, name: str, before: dict, timeout: float = 180) -> dict:
    """Until the target is exactly as it was (the controller settles the counts after a restore)."""
    try:
        return until(f"rollout {namespace}/{name} exactly as before the drill", lambda: target_state(
            api, namespace, name), lambda now: not _diff(before, now), timeout=timeout, interval=0.2,
            describe=lambda now: "; ".join(_diff(before, now)))
    except WaitTimeout as e:
        raise AssertionError(str(e)) from None


def lease_of(api, namespace: str, name: str) -> dict:
    ro = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return safety.parse_lease((ro["metadata"].get("annotations") or {}).get(safety.LEASE_ANNOTATION))


# --- leftovers ----------------------------------------------------------------------------------------------
def active_namespaces(api) -> set[str]:
    return {n.metadata.name for n in client.CoreV1Api(api).list_namespace().items if n.status.phase == "Active"}


class World:
    """What exists around a case before it runs: namespaces, the cluster's registered processes, the
    availability settings; ``leftovers()`` lists what the run added and did not take away."""

    def __init__(self, api, cluster):
        self.api, self.cluster = api, cluster
        self.namespaces = active_namespaces(api)
        self.processes = {p["name"] for p in cluster.state().get("processes", [])}
        self.availability = Availability(api).config()

    def leftovers(self, drill=None, own_namespace: str | None = None) -> list[str]:
        out = list(drill.left_behind()) if drill is not None else []
        now = {p["name"] for p in self.cluster.state().get("processes", [])}
        out += [f"cluster process {n} still registered" for n in sorted(now - self.processes)]
        try:
            until("the run's namespaces to be deleted", lambda: active_namespaces(self.api) - self.namespaces,
                  lambda extra: not extra, timeout=60, interval=0.2)
        except WaitTimeout as e:
            out.append(str(e))
        conf = Availability(self.api).config()
        mine = {own_namespace} if own_namespace else set()
        out += [f"availability hold {h}" for h in conf.get("holds", []) if h.get("namespace") in mine
                or h.get("namespace") not in active_namespaces(self.api)]
        if conf.get("default_delay") != self.availability.get("default_delay"):
            out.append(f"availability default delay {self.availability.get('default_delay')} -> "
                       f"{conf.get('default_delay')}")
        return out


def cluster_whole(cluster) -> list[str]:
    """Every process of the embedded cluster alive and the cluster ready (a fault must not leave it broken)."""
    st = cluster.status()
    dead = [f"{p['name']} (pid {p['pid']}) dead" for p in st.get("processes", []) if not p["alive"]]
    return dead + ([] if st.get("ready") else ["the cluster does not report ready"])


# --- the ledger -----------------------------------------------------------------------------------------
def ledger_rows(reports: Path) -> list[dict]:
    rows = []
    for f in sorted(Path(reports).rglob("ledger.json")):
        rows += json.loads(f.read_text())
    return rows


def passes(rows: list[dict], steps) -> list[dict]:
    return [r for r in rows if r["step"] in steps and r["verdict"] == "pass"]


def unrecorded_writes(timeline_file: Path, audit_log: Path, namespace: str) -> list[str]:
    """VirtualService resourceVersions the apiserver handed out while the timeline recorded that it lacks: a pass
    row on such a timeline would rest on incomplete evidence."""
    recs = timeline.load(Path(timeline_file))
    walls = [r["wall"] for r in recs if r.get("wall")]
    have = {r["rv"] for r in recs if r["kind"] == "VirtualService"}
    writes = audit_route_writes(Path(audit_log), namespace, since_wall=min(walls))
    return [w["rv"] for w in writes if w["time"] and w["time"] <= max(walls) and w["rv"] not in have]


def unsupported_passes(rows: list[dict], run_dir: Path, audit_log: Path, namespace: str) -> list[str]:
    """Pass rows whose timeline lacks a VirtualService write the apiserver's audit log has (false passes)."""
    out = []
    for r in rows:
        if r["verdict"] != "pass" or not r.get("evidence") or not str(r["evidence"]).endswith(".jsonl"):
            continue
        path = Path(r["evidence"]) if Path(r["evidence"]).is_absolute() else Path(run_dir) / r["evidence"]
        missing = unrecorded_writes(path, audit_log, namespace)
        if missing:
            out.append(f"{r['step']}: {r['assertion']} passed on {path.name}, which lacks VirtualService "
                       f"resourceVersions {missing}")
    return out


def rollout_writes(audit_log, namespace: str, name: str, agent_prefix: str, since: float = 0.0) -> list[dict]:
    """Writes to one Rollout (spec, status or scale) the apiserver's audit log has from one user agent:
    [{"verb", "subresource", "time" (wall), "agent"}] in order."""
    from datetime import datetime
    out = []
    with open(audit_log) as f:
        for line in f:
            if '"rollouts"' not in line:
                continue
            ev = json.loads(line)
            ref = ev.get("objectRef") or {}
            if ref.get("resource") != "rollouts" or ref.get("namespace") != namespace or ref.get("name") != name:
                continue
            if ev.get("verb") not in ("create", "update", "patch", "delete") or ev.get("stage") != "ResponseComplete":
                continue
            if not (ev.get("userAgent") or "").startswith(agent_prefix):
                continue
            t = datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if t >= since:
                out.append({"verb": ev["verb"], "subresource": ref.get("subresource"), "time": t,
                            "agent": ev.get("userAgent")})
    return out
