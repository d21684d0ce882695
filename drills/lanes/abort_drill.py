"""The drill "rollback aborts itself" (lane ``abort``; brief §5, §6, §13; DESIGN.md §6 Load).

A release (v2) is promoted, then breaks: the mesh emulator injects errors on its revision, which is now the
stable.  A GitOps rollback to v1 is a new revision for the controller: it restarts the canary steps and a
background AnalysisRun that reads the error rate through Argo's ``prometheus`` provider from a real
Prometheus scraping the emulator.  Measurements are read from the recorded AnalysisRun series (the flight
recorder's watch); for each one the drill evaluates, in the same Prometheus at the measurement's time, the error
rate of the stable (broken) revision, and counts Locust's 5xx responses in the seconds before.  Load figures
come from an emulated mesh (drills.traffic.mesh), not from Envoy/Istio.
"""
from __future__ import annotations

import calendar
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from ..kube.k8s import client

from ..core import config
from ..traffic import load, mesh_server, prometheus
from ..record import timeline
from ..routers import istio
from ..drill.analysis import (
    analysis_query, analysis_template, client_error_ratio, measurements, rollout_spec, run_names, service_fqdn
)
from ..drill.kit import DrillRollout
from ..kube.rollout import HASH_LABEL, Predicate, healthy_at
from ..drill.shapes import template_for
from ..core.steps import steps_text
from ..core.wait import WaitTimeout, hold_for, until

STEPS = ("whole-service-query", "per-revision-query", "rollback-window")
SCALE_DOWN_DEADLINE = "argo-rollouts.argoproj.io/scale-down-deadline"
CLIENT_WINDOW_S = 5.0          # Locust records counted before each measurement
AFTER_WINDOW_S = 3.0           # evidence window after the rollback settled


# --- the observation ------------------------------------------------------------------------------------------
@dataclass
class AbortObservation:
    step: str
    query: str
    rollback_window: int | None
    hash_v1: str
    hash_v2: str
    injected_error_rate: float
    threshold: float
    failure_limit: int
    runs: list                      # AnalysisRun names for the rollback revision
    run_phase: str | None           # final phase of the (first) run, from the recorded series
    run_phases: list
    measurements: list              # with stable/whole rates and client 5xx ratio at each
    measured_above: int             # measurements taken while the injected error rate was above threshold
    failed_above: int               # failed measurements among those
    final_rollout: dict
    aborted: bool
    healthy_at_v1: bool
    canary_weights: list            # [t since rollback, weight]
    final_canary_weight: int | None
    rates_during_rollback: list     # [t since rollback, whole-service, stable revision] sampled every second
    whole_rate_at_rollback: float | None
    window_evidence: list
    controller_skip_lines: list
    v1_scale_down_deadline: str | None
    load_phases: dict
    canary_requests: int | None     # requests the rolled-back revision served during the rollback (mesh)
    complete: bool
    incomplete_reasons: list
    timeline: str
    series: str
    evidence: str
    full_runs: list = field(default_factory=list)

    def summary(self) -> str:
        ms = ", ".join(f"#{m['n']} {'F' if m['failed'] else 'ok'} v={fmt(m['value'])} "
                       f"stable={fmt(m['stable_rate'])}" for m in self.measurements)
        return (f"runs {self.runs or 'none'} phase {self.run_phase}; {len(self.measurements)} measurements "
                f"({self.failed_above} failed while above threshold, {self.measured_above} taken while above): "
                f"[{ms}]; rollout phase={self.final_rollout.get('phase')} abort={self.aborted} "
                f"stableRS={self.final_rollout.get('stableRS')}; canary weights {self.canary_weights}")


def fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}"


# --- the drill ------------------------------------------------------------------------------------------------
class SelfAbortDrill:
    def __init__(self, api: client.ApiClient, cluster, namespace: str, step: str, evidence_dir: Path,
                 version: str, fx: dict, log=None):
        if step not in STEPS:
            raise ValueError(f"unknown self-abort step {step!r}: {', '.join(STEPS)}")
        self.api, self.cluster, self.ns, self.step_name = api, cluster, namespace, step
        self.fx = fx
        self.outcome = self.fx["outcomes"][step]
        self.per_revision = self.outcome["query"] == "per-revision"
        self.version = version
        self.ev = Path(evidence_dir) / "abort"
        self.ev.mkdir(parents=True, exist_ok=True)
        self.log = log or (lambda m: print(m, flush=True))
        self.spec = rollout_spec(self.fx, step)
        self.drill = DrillRollout(api, namespace, self.spec, self.ev / step, log=self.log, controller_version=version,
                                  audit_log=(cluster.status() or {}).get("audit_log"))
        self.co = client.CustomObjectsApi(api)
        self.fqdn = service_fqdn(self.spec.name, namespace)
        a = self.fx["analysis"]
        self.threshold, self.failure_limit = float(a["threshold"]), int(a["failureLimit"])
        self.whole_query = istio.error_rate_query(self.fqdn, reporter=a["reporter"], window=a["window"])
        self.mesh: mesh_server.MeshProcess | None = None
        self.prom: prometheus.Prometheus | None = None
        self.load: load.LoadRun | None = None
        self.marks: dict[str, float] = {}

    def _mark(self, name: str, res: dict | None = None):
        self.marks[name] = time.time()
        if self.drill.recording is not None:
            self.drill.recording.mark(name, res)

    # --- set-up: emulator, Prometheus, template, v1, load, v2 -------------------------------------------------
    def start(self) -> None:
        c = self.cluster
        ev = self.ev / self.step_name
        self.mesh = mesh_server.MeshProcess(c.kubeconfig, self.ns, self.spec.name,
                                     capacity_rps=self.fx["mesh"]["capacity_rps"], folder=ev,
                                     register=c.register_process, unregister=c.unregister_process, seed=7)
        self.prom = prometheus.Prometheus(c.folder, {"mesh": f"127.0.0.1:{self.mesh.port}"},
                                          binary=prometheus.ensure_binary(), register=c.register_process,
                                          unregister=c.unregister_process)
        self.prom.wait_scraped()
        self.query = analysis_query(self.fx, self.fqdn, self.per_revision)
        at = analysis_template(self.fx, self.ns, self.prom.url, self.query, self.per_revision)
        self.co.create_namespaced_custom_object(config.ARGO_GROUP, config.ARGO_VERSION, self.ns, "analysistemplates", at)
        (ev / "analysistemplate.yaml").write_text(yaml.safe_dump(at, sort_keys=False))
        self.log(f"abort/{self.step_name}: mesh emulator {self.mesh.url}, Prometheus {self.prom.url}; "
                 f"query: {self.query}")

    def deploy(self) -> None:
        d = self.drill
        self.log(f"abort/{self.step_name}: deploy v1 (steps [{steps_text(self.spec.steps)}], replicas "
                 f"{self.spec.replicas}, rollbackWindow {self.spec.rollback_window})")
        d.deploy_v1()
        lf = self.fx["load"]
        self.load = load.start_load(self.mesh.url, self.ev / self.step_name / "load", users=lf["users"],
                                    rate_per_user=lf["rate_per_user"], run_time_s=lf["run_time_s"],
                                    name=self.step_name)
        self.load.wait_first_responses()
        self._mark("load")
        d.record(self.step_name)
        self.log(f"abort/{self.step_name}: deploy v2 under load (background analysis runs, no errors yet)")
        d.deploy_v2()
        self.log(f"abort/{self.step_name}: wait until the v1 ReplicaSet {d.hash_v1} is scaled to 0")
        d.wait_scaled_to_zero(d.hash_v1)

    def break_stable(self, timeout: float = 45) -> float:
        """Inject errors on the stable (v2) revision; wait until the whole-service rate shows them."""
        rate = float(self.fx["broken"]["error_rate"])
        self.mesh.set_faults(error_rate={self.drill.hash_v2: rate})
        self._mark("inject")
        self.log(f"abort/{self.step_name}: v2 ({self.drill.hash_v2}) breaks: {rate:.0%} injected errors")
        try:
            return until(f"the whole-service error rate above {self.threshold} after the injection",
                         lambda: self.prom.value(self.whole_query), lambda v: v is not None and v >= self.threshold,
                         timeout, interval=0.5)
        except WaitTimeout as e:
            raise AssertionError(str(e)) from None

    # --- the rollback ---------------------------------------------------------------------------------------
    def rollback(self, timeout: float = 150) -> dict:
        d = self.drill
        rs = client.AppsV1Api(self.api).list_namespaced_replica_set(
            self.ns, label_selector=f"{HASH_LABEL}={d.hash_v1}").items
        self.v1_deadline = ((rs[0].metadata.annotations or {}).get(SCALE_DOWN_DEADLINE) if rs else None)
        self.whole_at_rollback = self.prom.value(self.whole_query)
        res = d.ro.gitops_rollback(d.name, template_for(self.spec, self.spec.image_v1))
        self._mark("rollback", res)
        self.log(f"abort/{self.step_name}: GitOps rollback to v1 ({d.hash_v1}); whole-service error rate "
                 f"{fmt(self.whole_at_rollback)}")
        settled = Predicate("Rollout aborted, or Healthy at the rolled-back revision",
                            lambda o: bool((o.get("status") or {}).get("abort")) or healthy_at(d.hash_v1)(o))
        ro = d.ro.wait(d.name, settled, timeout, progress=d.progress)
        self._mark("settled")
        if ro["status"].get("abort"):
            self.log(f"abort/{self.step_name}: the Rollout is aborted: {ro['status'].get('message')!r}")
            try:
                d.recording.wait_weight(0, 60, "after the abort")
            except WaitTimeout as e:
                self.log(f"  .. {e}")
        else:
            self.log(f"abort/{self.step_name}: Healthy at v1")
            d.wait_settled(timeout=60)
        hold_for(AFTER_WINDOW_S, "the last AnalysisRun updates and a few seconds of traffic after")
        self._mark("end")
        return d.ro.get(d.name)

    # --- observation ------------------------------------------------------------------------------------------
    def observe(self, ro: dict) -> AbortObservation:
        d = self.drill
        ev = self.ev / self.step_name
        runs_full = [o for o in self.co.list_namespaced_custom_object(
            config.ARGO_GROUP, config.ARGO_VERSION, self.ns, "analysisruns")["items"]
            if o["metadata"]["name"].startswith(f"{d.name}-{d.hash_v1}-")]
        self.load.stop()
        reqs = self.load.records()
        d.release_holds()
        obs = d.recording.finish()
        records = timeline.load(Path(obs.timeline))
        metric = self.fx["analysis"]["metric"]
        names = run_names(records, f"{d.name}-{d.hash_v1}-")
        ms, phases = measurements(records, names[0], metric) if names else ([], [])
        stable_q = istio.error_rate_query(self.fqdn, revision=d.hash_v2, reporter=self.fx["analysis"]["reporter"],
                                               window=self.fx["analysis"]["window"])
        for m in ms:
            m["stable_rate"] = _val(self.prom.query(stable_q, at=m["wall"]))
            m["whole_rate"] = _val(self.prom.query(self.whole_query, at=m["wall"]))
            m["client_5xx_ratio"], m["client_requests"] = client_error_ratio(reqs, m["wall"] - CLIENT_WINDOW_S,
                                                                             m["wall"])
            m["above_threshold"] = (m["stable_rate"] is not None and m["stable_rate"] >= self.threshold and
                                    (m["client_5xx_ratio"] or 0.0) >= self.threshold)
            m["t"] = round(m["wall"] - self.marks["rollback"], 3)
        rates = []
        t = self.marks["rollback"]
        while t <= self.marks["settled"] + 1e-6:
            rates.append([round(t - self.marks["rollback"], 1), _val(self.prom.query(self.whole_query, at=t)),
                          _val(self.prom.query(stable_q, at=t))])
            t += 1.0
        canary_q = istio.requests_increase_query(
            f'reporter="destination", destination_service=~"{self.fqdn}", revision="{d.hash_v1}"',
            f'{max(2, int(self.marks["end"] - self.marks["rollback"]) + 1)}s')
        canary_requests = _val(self.prom.query(canary_q, at=self.marks["end"]))
        st = ro["status"]
        derived = timeline.derive(records, d.hash_v1, since_mark="rollback")
        # the weight in force when the rollback was sent, then every change after it
        cw_all = [[round(a - derived.t0, 2), w] for a, w in derived.canary_weight]
        cw = ([[0.0, w] for t_, w in cw_all if t_ < 0][-1:]) + [x for x in cw_all if x[0] >= 0]
        phases_t = {"healthy": (self.marks["load"], self.marks["inject"]),
                    "broken": (self.marks["inject"], self.marks["rollback"]),
                    "rollback": (self.marks["rollback"], self.marks["settled"]),
                    "after": (self.marks["settled"], self.marks["end"])}
        lp = load.phase_stats(reqs, phases_t)
        skip = _controller_skip_lines(self.cluster, self.ns, d.name, self.marks["rollback"])
        out = AbortObservation(
            step=self.step_name, query=self.query, rollback_window=self.spec.rollback_window, hash_v1=d.hash_v1,
            hash_v2=d.hash_v2, injected_error_rate=float(self.fx["broken"]["error_rate"]), threshold=self.threshold,
            failure_limit=self.failure_limit, runs=names, run_phase=phases[-1][1] if phases else None,
            run_phases=[[round(w - self.marks["rollback"], 2), p, c, f] for w, p, c, f in phases],
            measurements=ms, measured_above=sum(1 for m in ms if m["above_threshold"]),
            failed_above=sum(1 for m in ms if m["above_threshold"] and m["failed"]),
            final_rollout={"phase": st.get("phase"), "abort": st.get("abort", False), "stableRS": st.get("stableRS"),
                           "currentPodHash": st.get("currentPodHash"), "message": st.get("message"),
                           "currentStepIndex": st.get("currentStepIndex")},
            aborted=bool(st.get("abort")), healthy_at_v1=healthy_at(d.hash_v1)(ro), canary_weights=cw,
            final_canary_weight=cw[-1][1] if cw else None, rates_during_rollback=rates,
            whole_rate_at_rollback=self.whole_at_rollback, window_evidence=derived.window_evidence,
            controller_skip_lines=skip, v1_scale_down_deadline=self.v1_deadline, load_phases=lp,
            canary_requests=None if canary_requests is None else int(round(canary_requests)),
            complete=obs.complete, incomplete_reasons=obs.incomplete_reasons, timeline=obs.timeline,
            series=obs.series, evidence=str(ev / f"{self.step_name}.analysis.json"),
            full_runs=[{"name": o["metadata"]["name"], "status": o.get("status")} for o in runs_full])
        Path(out.evidence).write_text(json.dumps(asdict(out), indent=1, default=str))
        return out

    def stop(self) -> None:
        if self.load is not None:
            self.load.stop()
        self.drill.cleanup()
        if self.prom is not None:
            self.prom.stop()
        if self.mesh is not None:
            self.mesh.stop()

    # --- the whole outcome ----------------------------------------------------------------------------------
    def run(self) -> AbortObservation:
        try:
            self.start()
            self.deploy()
            self.break_stable()
            ro = self.rollback()
            return self.observe(ro)
        finally:
            self.stop()


def _val(result: list[dict]) -> float | None:
    return float(result[0]["value"][1]) if result else None


def _controller_skip_lines(cluster, namespace: str, rollout: str, since_wall: float, limit: int = 3) -> list[str]:
    """The controller's own words on skipping analysis for this Rollout (its log, logfmt)."""
    try:
        st = cluster.status()
        logp = next(p["log"] for p in st.get("processes") or [] if p["name"] == "rollouts-controller")
        lines = Path(logp).read_text(errors="replace").splitlines()
    except (StopIteration, OSError, KeyError, TypeError):
        return []
    out = []
    for line in lines:
        if "Skipping analysis" in line and f"namespace={namespace}" in line and f"rollout={rollout}" in line:
            m = re.search(r'time="([^"]+)"', line)
            if m:
                try:
                    ts = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%SZ"))
                except ValueError:
                    ts = since_wall
                if ts < since_wall - 1:
                    continue
            out.append(line)
            if len(out) >= limit:
                break
    return out
