"""The drill "rollback aborts itself" (lane ``abort``; brief §5, §6, §13; DESIGN.md §6 Load).

A release (v2) is promoted, then breaks: the mesh emulator injects errors on its revision, which is now the
stable.  A GitOps rollback to v1 is a new revision for the controller: it restarts the canary steps and a
background AnalysisRun that reads the error rate through Argo's ``prometheus`` provider from a real
Prometheus scraping the emulator.  Three outcomes, each on a fresh Rollout:

- ``whole-service-query``: the seed's query (no revision filter), no rollbackWindow.  The run reads the broken
  stable's errors, fails after failureLimit + 1 failed measurements, the Rollout is aborted and the canary
  weight goes back to 0: traffic returns to the broken release.
- ``per-revision-query``: the same with ``revision="{{args.canary-hash}}"`` (``podTemplateHashValue: Latest``):
  the run measures the rolled-back revision only, passes, and the rollback completes.
- ``rollback-window``: the whole-service query with ``rollbackWindow: {revisions: 3}``: the controller creates
  no AnalysisRun for the rollback and it completes.

A self-abort outcome counts only if the analysis took at least failureLimit + 1 measurements while the injected
error rate was above its threshold (DESIGN.md §6).  Measurements are read from the recorded AnalysisRun series
(the flight recorder's watch); for each one the drill evaluates, in the same Prometheus at the measurement's
time, the error rate of the stable (broken) revision, and counts Locust's 5xx responses in the seconds before.
Under a rollbackWindow there are no measurements; the rule then requires the whole-service error rate to be
above the threshold when the rollback was sent and while it ran.

Load figures come from an emulated mesh (drills.mesh), not from Envoy/Istio.
"""
from __future__ import annotations

import calendar
import copy
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from kubernetes import client

from . import config, load, mesh_server, prometheus, recorder, timeline
from .ledger import FAIL, INCONCLUSIVE, PASS, UNVERIFIED, Ledger, describe_row
from .probe import ProbeSpec, RollbackDrill, manifests, steps_text
from .rollout import HASH_LABEL, Predicate, healthy_at

LANE = "abort"
STEPS = ("whole-service-query", "per-revision-query", "rollback-window")
SCALE_DOWN_DEADLINE = "argo-rollouts.argoproj.io/scale-down-deadline"
CLIENT_WINDOW_S = 5.0          # Locust records counted before each measurement


def fixture(path: Path | None = None) -> dict:
    return yaml.safe_load(Path(path or config.fixtures_dir() / "abort" / "drill.yaml").read_text())


def expectations(version: str) -> dict | None:
    data = yaml.safe_load((config.fixtures_dir() / "abort" / "expectations.yaml").read_text())
    return (data.get("versions") or {}).get(version)


# --- manifests ----------------------------------------------------------------------------------------------
def service_fqdn(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.svc.cluster.local"


def analysis_query(fx: dict, fqdn: str, per_revision: bool) -> str:
    a = fx["analysis"]
    return prometheus.error_rate_query(fqdn, revision="{{args.canary-hash}}" if per_revision else None,
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
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate",
            "metadata": {"name": a["template"], "namespace": namespace}, "spec": spec}


def canary_analysis(fx: dict, per_revision: bool) -> dict:
    """Background analysis as the seed's chart renders it: ``canary.analysis.templates``, no startingStep."""
    out: dict = {"templates": [{"templateName": fx["analysis"]["template"]}]}
    if per_revision:
        out["args"] = [{"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}}]
    return out


def probe_spec(fx: dict, step: str) -> ProbeSpec:
    oc = fx["outcomes"][step]
    return ProbeSpec(steps=copy.deepcopy(fx["steps"]), replicas=fx["replicas"], min_pods=fx["minPodsPerReplicaSet"],
                     rollback_window=oc["rollback_window"], scale_down_delay=fx["scaleDownDelaySeconds"],
                     availability_control=True, rollback_via="gitops", name=fx["name"],
                     image_v1=fx["images"]["v1"], image_v2=fx["images"]["v2"],
                     extra_canary={"analysis": canary_analysis(fx, oc["query"] == "per-revision")})


def rollout_manifests(spec: ProbeSpec, namespace: str) -> dict:
    """The drill's manifests (no ``rollbackWindow`` at all when the outcome runs without one)."""
    return manifests(spec, namespace)


class AbortRollbackDrill(RollbackDrill):
    """A RollbackDrill whose Rollout carries background analysis, and no rollbackWindow unless asked
    (``ProbeSpec.rollback_window = None`` leaves the field out)."""


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
        ms = ", ".join(f"#{m['n']} {'F' if m['failed'] else 'ok'} v={_fmt(m['value'])} "
                       f"stable={_fmt(m['stable_rate'])}" for m in self.measurements)
        return (f"runs {self.runs or 'none'} phase {self.run_phase}; {len(self.measurements)} measurements "
                f"({self.failed_above} failed while above threshold, {self.measured_above} taken while above): "
                f"[{ms}]; rollout phase={self.final_rollout.get('phase')} abort={self.aborted} "
                f"stableRS={self.final_rollout.get('stableRS')}; canary weights {self.canary_weights}")


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}"


# --- the drill ------------------------------------------------------------------------------------------------
class SelfAbortDrill:
    def __init__(self, api: client.ApiClient, cluster, namespace: str, step: str, evidence_dir: Path,
                 ledger: Ledger, version: str, fx: dict | None = None, log=None):
        if step not in STEPS:
            raise ValueError(f"unknown self-abort step {step!r}: {', '.join(STEPS)}")
        self.api, self.cluster, self.ns, self.step_name = api, cluster, namespace, step
        self.fx = fx or fixture()
        self.outcome = self.fx["outcomes"][step]
        self.per_revision = self.outcome["query"] == "per-revision"
        self.ledger, self.version = ledger, version
        self.expect = (expectations(version) or {}).get(step)
        self.ev = Path(evidence_dir) / "abort"
        self.ev.mkdir(parents=True, exist_ok=True)
        self.log = log or (lambda m: print(m, flush=True))
        self.spec = probe_spec(self.fx, step)
        self.drill = AbortRollbackDrill(api, namespace, self.spec, self.ev / step, log=self.log,
                                        controller_version=version,
                                        audit_log=(cluster.status() or {}).get("audit_log"))
        self.co = client.CustomObjectsApi(api)
        self.fqdn = service_fqdn(self.spec.name, namespace)
        a = self.fx["analysis"]
        self.threshold, self.failure_limit = float(a["threshold"]), int(a["failureLimit"])
        self.whole_query = prometheus.error_rate_query(self.fqdn, reporter=a["reporter"], window=a["window"])
        self.mesh: mesh_server.MeshProcess | None = None
        self.prom: prometheus.Prometheus | None = None
        self.load: load.LoadRun | None = None
        self.marks: dict[str, float] = {}

    def _mark(self, name: str, res: dict | None = None):
        self.marks[name] = time.time()
        if self.drill.recorder:
            self.drill.mark(name, res)

    # --- set-up: emulator, Prometheus, template, v1, load, v2 -------------------------------------------------
    def start(self) -> None:
        c = self.cluster
        ev = self.ev / self.step_name
        self.mesh = mesh_server.MeshProcess(c.kubeconfig, self.ns, self.spec.name, self.spec.name,
                                     capacity_rps=self.fx["mesh"]["capacity_rps"], folder=ev,
                                     register=c.register_process, unregister=c.unregister_process, seed=7)
        self.prom = prometheus.Prometheus(c.folder, {"mesh": f"127.0.0.1:{self.mesh.port}"},
                                          binary=prometheus.ensure_binary(), register=c.register_process,
                                          unregister=c.unregister_process)
        self.prom.wait_scraped()
        self.query = analysis_query(self.fx, self.fqdn, self.per_revision)
        at = analysis_template(self.fx, self.ns, self.prom.url, self.query, self.per_revision)
        self.co.create_namespaced_custom_object("argoproj.io", "v1alpha1", self.ns, "analysistemplates", at)
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
        self._mark("load")
        d.recorder = recorder.Recorder(self.api, self.ns, self.spec.name,
                                       self.ev / self.step_name / f"{self.step_name}.timeline.jsonl",
                                       audit_log=d.audit_log).start()
        d.run_label = self.step_name
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
        deadline = time.monotonic() + timeout
        v = None
        while time.monotonic() < deadline:
            v = self.prom.value(self.whole_query)
            if v is not None and v >= self.threshold:
                return v
            time.sleep(0.5)
        raise AssertionError(f"the whole-service error rate did not rise above {self.threshold} within "
                             f"{timeout}s of the injection (last {v})")

    # --- the rollback ---------------------------------------------------------------------------------------
    def rollback(self, timeout: float = 150) -> dict:
        d = self.drill
        rs = client.AppsV1Api(self.api).list_namespaced_replica_set(
            self.ns, label_selector=f"{HASH_LABEL}={d.hash_v1}").items
        self.v1_deadline = ((rs[0].metadata.annotations or {}).get(SCALE_DOWN_DEADLINE) if rs else None)
        self.whole_at_rollback = self.prom.value(self.whole_query)
        from .probe import template_for
        res = d.ro.gitops_rollback(d.name, template_for(self.spec, self.spec.image_v1))
        self._mark("rollback", res)
        self.log(f"abort/{self.step_name}: GitOps rollback to v1 ({d.hash_v1}); whole-service error rate "
                 f"{_fmt(self.whole_at_rollback)}")
        settled = Predicate("Rollout aborted, or Healthy at the rolled-back revision",
                            lambda o: bool((o.get("status") or {}).get("abort")) or healthy_at(d.hash_v1)(o))
        ro = d.ro.wait(d.name, settled, timeout, progress=d._progress)
        self._mark("settled")
        if ro["status"].get("abort"):
            self.log(f"abort/{self.step_name}: the Rollout is aborted: {ro['status'].get('message')!r}")
            try:
                d.wait_canary_weight(0, 60, "after the abort")
            except TimeoutError as e:
                self.log(f"  .. {e}")
        else:
            self.log(f"abort/{self.step_name}: Healthy at v1")
            d.wait_settled(timeout=60)
        time.sleep(3.0)            # the last AnalysisRun updates and a few seconds of traffic after
        self._mark("end")
        return d.ro.get(d.name)

    # --- observation ------------------------------------------------------------------------------------------
    def observe(self, ro: dict) -> AbortObservation:
        d = self.drill
        ev = self.ev / self.step_name
        runs_full = [o for o in self.co.list_namespaced_custom_object(
            "argoproj.io", "v1alpha1", self.ns, "analysisruns")["items"]
            if o["metadata"]["name"].startswith(f"{d.name}-{d.hash_v1}-")]
        self.load.stop()
        reqs = self.load.records()
        obs = d.finish()
        records = timeline.load(Path(obs.timeline))
        metric = self.fx["analysis"]["metric"]
        names = run_names(records, f"{d.name}-{d.hash_v1}-")
        ms, phases = measurements(records, names[0], metric) if names else ([], [])
        stable_q = prometheus.error_rate_query(self.fqdn, revision=d.hash_v2, reporter=self.fx["analysis"]["reporter"],
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
        canary_q = (f'sum(increase(istio_requests_total{{reporter="destination", destination_service=~"{self.fqdn}", '
                    f'revision="{d.hash_v1}"}}[{max(2, int(self.marks["end"] - self.marks["rollback"]) + 1)}s]))')
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
    def run(self) -> tuple[list[dict], AbortObservation]:
        try:
            self.start()
            self.deploy()
            self.break_stable()
            ro = self.rollback()
            obs = self.observe(ro)
        finally:
            self.stop()
        return record(self.ledger, obs, self.expect, self.version), obs


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


# --- ledger rows ----------------------------------------------------------------------------------------------
def _precondition_reason(obs: AbortObservation) -> str | None:
    if not obs.complete:
        return f"timeline incomplete: {'; '.join(obs.incomplete_reasons)}"
    if obs.v1_scale_down_deadline:
        return (f"the revived ReplicaSet still carried a scale-down deadline ({obs.v1_scale_down_deadline}) at the "
                f"rollback: the controller skips analysis for that reason, not for the one under test")
    return None


def _counts_reason(obs: AbortObservation) -> str | None:
    need = obs.failure_limit + 1
    pre = _precondition_reason(obs)
    if pre:
        return pre
    if obs.measured_above < need:
        return (f"only {obs.measured_above} measurement(s) were taken while the injected error rate was above "
                f"{obs.threshold} (< failureLimit + 1 = {need}): the outcome does not count")
    return None


def record(ledger: Ledger, obs: AbortObservation, expect: str | None, version: str) -> list[dict]:
    """Ledger rows of one outcome; verdicts derive from the observation, never from the expectation alone."""
    rows = []
    ev = obs.evidence
    need = obs.failure_limit + 1
    common = {"query": obs.query, "rollback_window": obs.rollback_window, "revived_replicaset": obs.hash_v1,
              "broken_replicaset": obs.hash_v2, "injected_error_rate": obs.injected_error_rate,
              "analysis_runs": obs.runs, "run_phases": obs.run_phases, "measurements": obs.measurements,
              "series_text": obs.summary(), "timeline": Path(obs.timeline).name, "load_phases": obs.load_phases,
              "load_note": load.EMULATED_NOTE}

    def verdict(ok: bool, reason: str | None) -> tuple[str, str | None]:
        if reason:
            return INCONCLUSIVE, reason
        if expect is None:
            return UNVERIFIED, "no expectation for this controller version"
        return (PASS if ok else FAIL), None

    if obs.step == "whole-service-query":
        reason = _counts_reason(obs)
        ok = obs.run_phase == "Failed" and obs.failed_above >= need
        v, r = verdict(ok, reason)
        rows.append(ledger.record(
            LANE, obs.step, "the rollback's AnalysisRun (whole-service error rate, no revision filter) fails: "
                            f">= failureLimit + 1 = {need} failed measurements while the broken stable's error "
                            "rate is above the threshold",
            f"Failed, >= {need} failed measurements above threshold",
            f"{obs.run_phase}, {len(obs.measurements)} measurements, {obs.failed_above} failed above threshold",
            v, evidence=ev, reason=r, **common))
        ok = obs.aborted and obs.final_rollout.get("stableRS") == obs.hash_v2 and not obs.healthy_at_v1
        v, r = verdict(ok, reason)
        rows.append(ledger.record(
            LANE, obs.step, "the Rollout is aborted by its own AnalysisRun; the broken release stays stable",
            f"abort=true, stableRS={obs.hash_v2} (broken)",
            f"abort={str(obs.aborted).lower()}, phase={obs.final_rollout.get('phase')}, "
            f"stableRS={obs.final_rollout.get('stableRS')}", v, evidence=ev, reason=r,
            message=obs.final_rollout.get("message"), **common))
        ok = obs.final_canary_weight == 0 and obs.aborted
        after = obs.load_phases.get("after") or {}
        v, r = verdict(ok, reason)
        rows.append(ledger.record(
            LANE, obs.step, "traffic returns to the broken release: VirtualService canary weight back to 0",
            "canary weight 0 after the abort", f"canary weight {obs.final_canary_weight}; weights {obs.canary_weights}; "
            f"5xx ratio after: {_fmt(after.get('failure_ratio'))}", v, evidence=ev, reason=r, **common))
    elif obs.step == "per-revision-query":
        reason = _counts_reason(obs)
        failed = sum(1 for m in obs.measurements if m["failed"])
        ok = obs.run_phase in ("Successful", "Running") and failed < need and not obs.aborted
        v, r = verdict(ok, reason)
        rows.append(ledger.record(
            LANE, obs.step, "the rollback's AnalysisRun (per-revision error rate, revision = "
                            "podTemplateHashValue Latest) does not fail although it measured >= failureLimit + 1 "
                            "times while the broken stable's error rate was above the threshold",
            f"not Failed, < {need} failed measurements, >= {need} measurements above threshold",
            f"{obs.run_phase}, {len(obs.measurements)} measurements ({obs.measured_above} above threshold), "
            f"{failed} failed; the rolled-back revision served {obs.canary_requests} requests",
            v, evidence=ev, reason=r, canary_requests=obs.canary_requests, **common))
    else:   # rollback-window
        reason = _precondition_reason(obs)
        if reason:
            pass
        elif obs.whole_rate_at_rollback is None or obs.whole_rate_at_rollback < obs.threshold:
            reason = (f"the whole-service error rate at the rollback was {obs.whole_rate_at_rollback} (< "
                      f"{obs.threshold}): an analysis would not have failed, the outcome does not count")
        ok = not obs.runs
        v, r = verdict(ok, reason)
        rows.append(ledger.record(
            LANE, obs.step, "a rollback inside rollbackWindow creates no AnalysisRun (analysis skipped) while "
                            "the whole-service error rate is above the threshold",
            "no AnalysisRun for the rolled-back revision",
            f"{len(obs.runs)} AnalysisRun(s) {obs.runs}; whole-service error rate at the rollback "
            f"{_fmt(obs.whole_rate_at_rollback)}", v, evidence=ev, reason=r,
            window_evidence=obs.window_evidence, controller_log=obs.controller_skip_lines,
            rates_during_rollback=obs.rates_during_rollback, **common))
    if obs.step != "whole-service-query":     # the two outcomes in which the rollback must complete
        v, r = verdict(obs.healthy_at_v1 and not obs.aborted, reason)
        rows.append(ledger.record(
            LANE, obs.step, "the rollback completes: Healthy at the rolled-back revision",
            f"Healthy, stableRS={obs.hash_v1}, abort=false",
            f"{obs.final_rollout.get('phase')}, stableRS={obs.final_rollout.get('stableRS')}, "
            f"abort={str(obs.aborted).lower()}", v, evidence=ev, reason=r, **common))
    return rows


def assert_row(row: dict) -> None:
    assert row["verdict"] in (PASS, UNVERIFIED), describe_row(row)
