"""The general rollback probe, and the drill it is made of.

A ``RollbackDrill`` owns one Rollout with Istio routing (one Service + DestinationRule subsets, as the
seed's chart, or canaryService/stableService routed by host).  It deploys v1, then v2, waits until the v1
ReplicaSet is scaled to 0, and rolls back inside rollbackWindow while availability control holds the
revived pods and releases them one at a time.  The flight recorder sees every weight the controller
writes; the observation is derived from the timeline, never from one sample.

Lane A is two probes and an exit on one drill; ``drills probe`` is one probe on a fresh namespace.
"""
from __future__ import annotations

import copy
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from . import recorder, timeline
from .cluster.availability import Availability
from .ledger import FAIL, INCONCLUSIVE, PASS, UNVERIFIED
from .rollout import HASH_LABEL, Predicate, Rollouts, container_images, healthy, healthy_at, paused, with_image

REASON_NO_PARTIAL = "no partial-availability window observed"
REASON_NOT_IN_WINDOW = "rollback not shown inside rollbackWindow (no SkipSteps event, no jump to the end of steps)"
REASON_INCOMPLETE = "timeline incomplete"


# --- steps -------------------------------------------------------------------------------------------
_PAUSE_RE = re.compile(r"^pause(?::([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)?)?$", re.ASCII)
_WEIGHT_RE = re.compile(r"^[0-9]{1,3}$", re.ASCII)
MAX_STEPS = 64
NO_STEPS = ("none", "[]")


def parse_steps(text: str) -> list[dict]:
    """'5,pause:10s,100' -> [{setWeight:5},{pause:{duration:10s}},{setWeight:100}]; 'pause' = indefinite;
    'none' (or an empty string) = no steps at all (``steps: []``)."""
    if text is None or text.strip().lower() in ("", *NO_STEPS):
        return []
    raw_steps = [s.strip() for s in text.split(",")]
    if any(not s for s in raw_steps):
        raise ValueError(f"empty step in {text!r}: steps are separated by single commas")
    if len(raw_steps) > MAX_STEPS:
        raise ValueError(f"{len(raw_steps)} steps: at most {MAX_STEPS}")
    steps = []
    for raw in raw_steps:
        if _WEIGHT_RE.match(raw):
            w = int(raw)
            if not 0 <= w <= 100:
                raise ValueError(f"setWeight {w} is outside 0..100")
            steps.append({"setWeight": w})
            continue
        m = _PAUSE_RE.match(raw)
        if not m:
            raise ValueError(f"unknown step {raw!r}: use a weight (0-100), 'pause' or 'pause:10s'")
        if m.group(1) is None:
            steps.append({"pause": {}})
        else:
            steps.append({"pause": {"duration": f"{m.group(1)}{m.group(2) or 's'}"}})
    return steps


def last_set_weight(steps: list[dict]) -> int:
    for s in reversed(steps):
        if "setWeight" in s:
            return int(s["setWeight"])
    return 0


def steps_text(steps: list[dict]) -> str:
    out = []
    for s in steps:
        if "setWeight" in s:
            out.append(str(s["setWeight"]))
        elif "pause" in s:
            d = (s["pause"] or {}).get("duration")
            out.append(f"pause:{d}" if d else "pause")
        else:
            out.append(next(iter(s)))
    return ",".join(out)


@dataclass
class ProbeSpec:
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
    def from_fixture(cls, path: Path, **over) -> tuple["ProbeSpec", dict]:
        fx = yaml.safe_load(Path(path).read_text())
        spec = cls(steps=fx["steps_before"], replicas=fx["replicas"], min_pods=fx["minPodsPerReplicaSet"],
                   rollback_window=fx["rollbackWindowRevisions"], scale_down_delay=fx["scaleDownDelaySeconds"],
                   hold_seconds=fx["hold_seconds"], batch_release=fx.get("batch_release", False),
                   name=fx["name"], image_v1=fx["images"]["v1"], image_v2=fx["images"]["v2"])
        for k, v in over.items():
            setattr(spec, k, v)
        return spec, fx


# --- manifests ---------------------------------------------------------------------------------------
def manifests(spec: ProbeSpec, namespace: str) -> dict:
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
    ro = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": n, "namespace": namespace},
          "spec": {"replicas": spec.replicas, "revisionHistoryLimit": 10,
                   "selector": {"matchLabels": dict(labels)}, "template": template,
                   "strategy": {"canary": canary}}}
    if spec.rollback_window is not None:
        ro["spec"]["rollbackWindow"] = {"revisions": spec.rollback_window}
    return {"services": services, "destinationrule": dr, "virtualservice": vs, "rollout": ro}


def install(api: client.ApiClient, namespace: str, spec: ProbeSpec, journal=None, log=None) -> Rollouts:
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


def template_for(spec: ProbeSpec, image: str) -> dict:
    """The probe's pod template with the application container at ``image`` (sidecars as they are)."""
    return with_image(manifests(spec, "x")["rollout"]["spec"]["template"], spec.container, image)


# --- observations --------------------------------------------------------------------------------------
@dataclass
class Observation:
    label: str
    peak_canary_weight_while_partial: int | None
    partial_window_observed: bool
    exposure_seconds: float
    rollback_in_window: bool
    window_evidence: list
    complete: bool
    incomplete_reasons: list
    timeline: str
    series: str
    weights_while_partial: list
    canary_weights: list
    revived_hash: str
    extra: dict = field(default_factory=dict)

    def inconclusive_reason(self) -> str | None:
        if not self.complete:
            return f"{REASON_INCOMPLETE}: {'; '.join(self.incomplete_reasons)}"
        if not self.partial_window_observed:
            return REASON_NO_PARTIAL
        if not self.rollback_in_window:
            return REASON_NOT_IN_WINDOW
        return None

    def verdict(self, expected: int | None) -> tuple[str, str | None]:
        reason = self.inconclusive_reason()
        if reason:
            return INCONCLUSIVE, reason
        if expected is None:
            return UNVERIFIED, "no expectation for this controller version"
        return (PASS, None) if self.peak_canary_weight_while_partial == expected else (FAIL, None)

    def describe(self) -> str:
        return (f"peak canary weight while partial = {self.peak_canary_weight_while_partial} "
                f"(weights while partial [t, weight, available, target]: {self.weights_while_partial}); "
                f"canary weight series {self.canary_weights}; exposure {self.exposure_seconds:.1f}s; "
                f"in window: {self.rollback_in_window}")


# --- the drill -----------------------------------------------------------------------------------------
class RollbackDrill:
    def __init__(self, api: client.ApiClient, namespace: str, spec: ProbeSpec, evidence_dir: Path,
                 journal=None, log=None, controller_version: str = "", audit_log: Path | None = None):
        self.api = api
        self.audit_log = audit_log
        self.ns = namespace
        self.spec = spec
        self.evidence_dir = Path(evidence_dir)
        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        self.journal = journal
        self.log = log or (lambda m: print(m, flush=True))
        self.ro = Rollouts(api, namespace, journal=journal, log=self.log)
        self.co = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.availability = Availability(api)
        self.version = controller_version
        self.hash_v1 = self.hash_v2 = None
        self.holds: list[str] = []
        self.recorder: recorder.Recorder | None = None
        self.run_label = None

    @property
    def name(self):
        return self.spec.name

    def _progress(self, msg):
        self.log(f"  .. {msg}")

    # --- set-up ------------------------------------------------------------------------------------
    def deploy_v1(self, timeout: float = 120) -> str:
        install(self.api, self.ns, self.spec, journal=self.journal, log=self.log)
        ro = self.ro.wait(self.name, healthy(), timeout, progress=self._progress)
        self.hash_v1 = ro["status"]["stableRS"]
        return self.hash_v1

    def deploy(self, image: str, timeout: float = 300) -> str:
        """Update the image and let the rollout walk its steps (indefinite pauses promoted, recorded)."""
        time.sleep(1.0)   # the window check compares ReplicaSet creation times at 1 s precision
        self.ro.set_image(self.name, image, container=self.spec.container)
        deadline = time.monotonic() + timeout
        while True:
            ro = self.ro.wait(self.name, Predicate("Healthy at the new image, or paused on an indefinite pause",
                                                   lambda o: (healthy()(o) and _image(o, self.spec.container) == image and
                                                              o["status"].get("stableRS") ==
                                                              o["status"].get("currentPodHash")) or
                                                   (paused()(o) and _indefinite_pause(o))),
                              max(1.0, deadline - time.monotonic()), progress=self._progress)
            if ro["status"].get("phase") == "Healthy":
                return ro["status"]["stableRS"]
            self.log("  promote (indefinite pause)")
            self.ro.promote_and_wait(self.name)

    def deploy_v2(self, timeout: float = 300) -> str:
        self.hash_v2 = self.deploy(self.spec.image_v2, timeout)
        return self.hash_v2

    def wait_scaled_to_zero(self, pod_hash: str, timeout: float = 180):
        self.ro.wait_scaled_to_zero(self.name, pod_hash, timeout)

    def cut_steps(self, steps: list[dict], timeout: float = 120):
        self.ro.set_steps(self.name, steps)
        self.spec.steps = copy.deepcopy(steps)
        self.ro.wait(self.name, healthy(), timeout, progress=self._progress)

    # --- the rollback ----------------------------------------------------------------------------------
    def start_rollback(self, label: str) -> None:
        """Hold the revived pods, start the recorder, roll back to v1."""
        self.run_label = label
        path = self.evidence_dir / f"{label}.timeline.jsonl"
        self.recorder = recorder.Recorder(self.api, self.ns, self.name, path, audit_log=self.audit_log).start()
        if self.spec.availability_control:
            hid = self.availability.hold(self.ns, {HASH_LABEL: self.hash_v1}, self.spec.hold_seconds,
                                         batch=self.spec.batch_release)
            self.holds.append(hid)
            if self.journal:
                self.journal.held(self.ns, hid)
        else:
            self._saved_delay = float(self.availability.config().get("default_delay", 1.0))
            self.availability.set_default_delay(0.0)
        if self.spec.rollback_via == "undo":
            res = self.ro.undo(self.name)
        else:
            res = self.ro.gitops_rollback(self.name, template_for(self.spec, self.spec.image_v1))
        self.recorder.mark("rollback", rv=(res or {}).get("metadata", {}).get("resourceVersion"),
                           via=self.spec.rollback_via)
        self.log(f"  rolled back to v1 ({self.spec.rollback_via}); revived ReplicaSet {self.hash_v1}")

    def mark(self, label: str, res: dict | None = None):
        self.recorder.mark(label, rv=(res or {}).get("metadata", {}).get("resourceVersion"))

    def current(self) -> timeline.Derived:
        return timeline.derive(list(self.recorder.records), self.hash_v1, since_mark="rollback")

    def wait_partial_weight(self, timeout: float = 120) -> int:
        """Wait until the controller wrote a non-zero canary weight while the revived RS is partial."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            d = self.current()
            if d.weights_while_partial and d.weights_while_partial[-1][1] > 0 and d.partial and \
                    d.partial[-1][1] is None:
                return d.weights_while_partial[-1][1]
            time.sleep(0.05)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for a canary weight while the revived "
                           f"ReplicaSet is partial; seen: {self.current().canary_weight}")

    def wait_canary_weight(self, weight: int, timeout: float = 60, what: str = "") -> float:
        """Wait until the VirtualService carries this canary weight (as recorded); returns the wait."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            d = self.current()
            if d.canary_weight and d.canary_weight[-1][1] == weight:
                return time.monotonic() - t0
            time.sleep(0.05)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for canary weight {weight} {what}; "
                           f"canary weights seen: {[w for _, w in self.current().canary_weight]}")

    def wait_settled(self, timeout: float = 240):
        """Healthy at v1 and the VirtualService back to all-stable."""
        self.ro.wait(self.name, healthy_at(self.hash_v1), timeout, progress=self._progress)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            d = self.current()
            if d.canary_weight and d.canary_weight[-1][1] == 0:
                break
            time.sleep(0.1)

    def finish(self, extra_series: dict | None = None) -> Observation:
        for hid in self.holds:
            self.availability.unhold(hid)
        self.holds = []
        self._restore_delay()
        rec = self.recorder
        result = rec.stop()
        d = timeline.derive(rec.records, self.hash_v1, since_mark="rollback")
        title = f"{self.run_label}: rollback to v1, steps [{steps_text(self.spec.steps)}] ({self.version})"
        series_path = timeline.series_path(rec.out)
        series_path.write_text(json.dumps(d.series(title, extra_series), indent=1))
        obs = Observation(
            label=self.run_label, peak_canary_weight_while_partial=d.peak_canary_weight_while_partial,
            partial_window_observed=d.partial_window_observed, exposure_seconds=round(d.exposure_seconds, 3),
            rollback_in_window=d.rollback_in_window or bool(d.window_evidence), window_evidence=d.window_evidence,
            complete=result["complete"], incomplete_reasons=result["reasons"], timeline=str(rec.out),
            series=str(series_path), weights_while_partial=[[round(a - d.t0, 2), *b] for a, *b in
                                                             d.weights_while_partial],
            canary_weights=[[round(a - d.t0, 2), w] for a, w in d.canary_weight], revived_hash=self.hash_v1)
        self.recorder = None
        return obs

    def _restore_delay(self):
        if getattr(self, "_saved_delay", None) is not None:
            self.availability.set_default_delay(self._saved_delay)
            self._saved_delay = None

    def cleanup(self):
        try:
            self._restore_delay()
        except ApiException:
            pass
        for hid in self.holds:
            try:
                self.availability.unhold(hid)
            except ApiException:
                pass
        self.holds = []
        if self.recorder:
            try:
                self.recorder.stop()
            except Exception:
                pass


def _image(ro: dict, container: str = "app") -> str | None:
    return container_images(ro["spec"].get("template")).get(container)


def _indefinite_pause(ro: dict) -> bool:
    steps = ((ro["spec"].get("strategy") or {}).get("canary") or {}).get("steps") or []
    i = (ro.get("status") or {}).get("currentStepIndex")
    return i is not None and i < len(steps) and "pause" in steps[i] and not (steps[i]["pause"] or {}).get("duration")


# --- the probe ------------------------------------------------------------------------------------------
def run_probe(api, namespace: str, spec: ProbeSpec, evidence_dir: Path, controller_version: str, journal=None,
              log=None, audit_log: Path | None = None) -> tuple[Observation, RollbackDrill]:
    drill = RollbackDrill(api, namespace, spec, evidence_dir, journal=journal, log=log,
                          controller_version=controller_version, audit_log=audit_log)
    try:
        drill.log(f"probe: deploy v1 (steps [{steps_text(spec.steps)}], replicas {spec.replicas}, "
                  f"minPodsPerReplicaSet {spec.min_pods}, routing {spec.routing})")
        drill.deploy_v1()
        drill.log("probe: deploy v2 and let it promote")
        drill.deploy_v2()
        drill.log(f"probe: wait until the v1 ReplicaSet {drill.hash_v1} is scaled to 0")
        drill.wait_scaled_to_zero(drill.hash_v1)
        drill.log("probe: roll back to v1 inside rollbackWindow")
        drill.start_rollback("probe")
        drill.wait_settled()
        obs = drill.finish()
        return obs, drill
    finally:
        drill.cleanup()


def observation_dict(obs: Observation, controller_version: str, routing: str) -> dict:
    d = asdict(obs)
    d.update({"controller_version": controller_version, "routing": routing})
    return d
