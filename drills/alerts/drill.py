"""The alert drill (lane ``alert``): the rules `drills alerts` writes for the drill's own Rollouts, evaluated by the
real Prometheus on the real controller's metrics, through four Rollouts of the drill's small sizes:

- ``healthy``: deployed once and left Healthy for the whole drill: neither alert may ever fire;
- ``normal``: a rollback whose revived pods turn Ready one per hold period: it completes within its expected ramp,
  the stuck alert may go pending but never fires;
- ``held``: a rollback held at the remaining rung (the first wave released, the rest never): the stuck alert fires
  within its ``for:`` plus one evaluation interval of the first scrape that showed the condition (and that scrape's
  own duration); ``promote --full`` is sent (the alert stays firing while the pods are held: the controller keeps
  the weight), then the hold is lifted and the alert resolves;
- ``aborted``: a deploy paused on an indefinite pause, aborted: RolloutAborted fires; ``promote --full`` clears the
  abort and resolves it.  (An abort sent while a revived ReplicaSet routed by subsets was partial was not acted on
  until it was available in a v1.8.2 run, lane A's exit posture: the stuck alert, not RolloutAborted, fired then.)

Prometheus scrapes the controller's /metrics and, for the weight, the step and the phase, the real kube-state-metrics
(built from its module, drills.alerts.ksm) with the custom-resource-state config `drills alerts --ksm-config`
writes.  Each alert's changes are
marked on its Rollout's timeline; the verdicts come from Prometheus' own ``ALERTS`` samples and the recorded
Rollout statuses.
"""
from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from ..kube.k8s import client

from ..cluster.availability import Availability
from ..cluster.namespaces import drop_namespace, make_namespace, namespace_name
from ..drill.kit import DrillRollout
from ..traffic.prometheus import Prometheus
from ..kube.rollout import HASH_LABEL, healthy, healthy_at, paused
from ..drill.shapes import RolloutSpec, manifests
from ..record.timeline import load as load_timeline
from ..toolchain import Toolchain
from ..core.wait import WaitTimeout, hold_for, until
from . import command
from . import promtool
from .evidence import (
    AlertWatch, aborted_now, alert_samples, first_scrape, intervals, mark_wall, scrape_seconds, stuck_now
)
from .ksm import KubeStateMetrics
from .metrics import CANARY_WEIGHT, PHASE, ROLLOUT_INFO, ROLLOUT_UNAVAILABLE, STEP_INDEX
from .ramp import expected_ramp, parse_seconds
from .rules import ABORTED, STUCK, expr_numbers
from ..core import fastyaml

SCENARIOS = ("healthy", "normal", "held", "aborted")
CONTROLLER_JOB, KSM_JOB = "argo-rollouts", "kube-state-metrics"
SETTLE_S = 3.0                  # after the last change: room for one more scrape and evaluation


class AlertDrill:
    def __init__(self, api: client.ApiClient, cluster, evidence_dir: Path, version: str, fx: dict, log=None):
        self.api, self.cluster, self.version, self.fx = api, cluster, version, fx
        self.ev = Path(evidence_dir) / "alert"
        self.ev.mkdir(parents=True, exist_ok=True)
        self.log = log or (lambda m: print(m, flush=True))
        a = fx["alerts"]
        self.interval_s = parse_seconds(a["interval"], "interval")
        self.args = argparse.Namespace(
            inputs=[str(self.ev / "rollouts.yaml")], fleet=None, env=None, app=[], stdin_name=None,
            out=str(self.ev / "rules.yaml"), format="rules", readiness=str(a["readiness"]), margin=float(a["margin"]),
            pods_at_once=a.get("pods_at_once"), abort_for=str(a["abort_for"]), interval=str(a["interval"]),
            ksm_config=str(self.ev / "kube-state-metrics-config.yaml"))
        self.drills: dict[str, DrillRollout] = {}
        self.namespaces: dict[str, str] = {}
        self.rules: dict = {}
        self.prom: Prometheus | None = None
        self.ksm: KubeStateMetrics | None = None
        self.watch: AlertWatch | None = None
        self.started_wall = time.time()
        self.checks: dict = {}

    # --- set-up ---------------------------------------------------------------------------------------------
    def _spec(self, key: str) -> RolloutSpec:
        r = self.fx["rollout"]
        steps = self.fx["aborted_steps"] if key == "aborted" else r["steps"]
        return RolloutSpec(steps=steps, replicas=r["replicas"], min_pods=r["minPodsPerReplicaSet"],
                           rollback_window=r["rollbackWindowRevisions"], scale_down_delay=r["scaleDownDelaySeconds"],
                           hold_seconds=float(self.fx["hold_seconds"]), name=key,
                           image_v1=f"registry.local/{key}:v1", image_v2=f"registry.local/{key}:v2")

    def start(self) -> None:
        audit = (self.cluster.status() or {}).get("audit_log")
        ctl_log = next((p.get("log") for p in (self.cluster.status() or {}).get("processes") or []
                        if p["name"] == "rollouts-controller"), None)
        for key in SCENARIOS:
            ns = make_namespace(self.api, namespace_name(f"alert-{key}"))
            self.namespaces[key] = ns
            self.drills[key] = DrillRollout(self.api, ns, self._spec(key), self.ev / key, log=self.log,
                                            controller_version=self.version, audit_log=audit, controller_log=ctl_log)
        self._write_rules()
        ksm_config = fastyaml.safe_load(Path(self.args.ksm_config).read_text())
        c = self.cluster
        self.ksm = KubeStateMetrics(c.kubeconfig, c.folder, ksm_config, register=c.register_process,
                                    unregister=c.unregister_process, log=self.log)
        metrics_port = next(p["ports"][0] for p in self.cluster.status()["processes"]
                            if p["name"] == "rollouts-controller")
        self.prom = Prometheus(c.folder, {CONTROLLER_JOB: f"127.0.0.1:{metrics_port}",
                                          KSM_JOB: self.ksm.hostport},
                               binary=Toolchain().component("prometheus") / "prometheus",
                               register=c.register_process, unregister=c.unregister_process,
                               interval_s=self.interval_s, rule_files=[Path(self.args.out)], honor_labels=True)
        self.prom.wait_scraped()
        self.watch = AlertWatch(self.prom, self._on_change, self.log).start()
        self.log(f"alert: Prometheus {self.prom.url} scrapes the controller (127.0.0.1:{metrics_port}) and the "
                 f"kube-state-metrics {self.ksm.version} ({self.ksm.hostport}); rules {self.args.out}")
        self._deploy()

    def _write_rules(self) -> None:
        """The drill's Rollouts as manifests, then `drills alerts` on them (the command's own code path)."""
        docs = [manifests(d.spec, self.namespaces[k])["rollout"] for k, d in self.drills.items()]
        Path(self.args.inputs[0]).write_text(yaml.safe_dump_all(docs, sort_keys=False))
        command.run(self.args, log=self.log)
        self.rules = fastyaml.safe_load(Path(self.args.out).read_text())
        rc, out = promtool.check_rules(Path(self.args.out))
        self.checks["check_rules"] = {"rc": rc, "output": out[-2000:]}
        rc, out = promtool.test_rules(self.ev / "promtool", self.rules,
                                      {"generated.test.yaml": promtool.unit_tests(self.rules, self.interval_s)})
        self.checks["test_rules"] = {"rc": rc, "output": out[-2000:]}

    def _deploy(self) -> None:
        def one(key: str) -> None:
            d = self.drills[key]
            d.deploy_v1()
            if key in ("normal", "held"):
                d.deploy_v2()
                d.wait_scaled_to_zero(d.hash_v1)
        with ThreadPoolExecutor(len(SCENARIOS)) as pool:
            for f in [pool.submit(one, k) for k in SCENARIOS]:
                f.result()

    def rule(self, key: str, alert: str) -> dict | None:
        ns = self.namespaces[key]
        g = next((g for g in self.rules["groups"] if g["name"] == f"drills.rollout.{ns}.{key}"), {})
        return next((r for r in g.get("rules", []) if r["alert"] == alert), None)

    def for_s(self, key: str, alert: str) -> float:
        return parse_seconds(self.rule(key, alert)["for"], "for")

    # --- alerts on the timeline -----------------------------------------------------------------------------
    def _on_change(self, key: tuple, state: str, wall: float, active_at) -> None:
        alertname, ns, name = key
        d = self.drills.get(name)
        if d is None or self.namespaces.get(name) != ns:
            return
        if d.recording is not None:
            d.recording.mark(f"alert {state}", alertname=alertname, active_at=active_at, seen_wall=round(wall, 3))
        self.log(f"alert: {alertname} {ns}/{name} {state}" + (f" (active since {active_at})" if active_at else ""))

    def _wait_state(self, key: str, alert: str, want: str | None, timeout: float) -> float | None:
        """Until Prometheus shows the alert in state ``want`` (None: not active); the wall time it was seen."""
        ns = self.namespaces[key]
        try:
            until(f"{alert} {'inactive' if want is None else want} for {ns}/{key}",
                  lambda: self.watch.state(alert, ns, key), lambda s: s == want, timeout, interval=0.1)
            return time.time()
        except WaitTimeout as e:
            self.log(f"alert: {e}")
            return None

    def _samples(self, key: str, alert: str, since: float | None = None) -> dict:
        """The alert's pending and firing evaluations for ``key`` (from ``since`` on, Unix seconds)."""
        got = alert_samples(self.prom, alert, self.namespaces[key], key, time.time() - self.started_wall + 60)
        return {state: [t for t in ts if since is None or t >= since] for state, ts in got.items()}

    def _quiet(self, key: str) -> None:
        """Until the stuck expression of ``key`` is false in Prometheus, then one more evaluation."""
        expr = self.rule(key, STUCK)["expr"]
        until(f"the stuck condition of {key} false in Prometheus", lambda: self.prom.query(expr), lambda r: not r,
              60, interval=0.2)
        hold_for(SETTLE_S, "one more scrape and evaluation after the condition ended")

    def _release_first_wave(self, d: DrillRollout, count: int) -> list[str]:
        core, av = client.CoreV1Api(self.api), Availability(self.api)

        def revived():
            return sorted((p for p in core.list_namespaced_pod(d.ns, label_selector=f"{HASH_LABEL}={d.hash_v1}").items
                           if p.metadata.deletion_timestamp is None), key=lambda p: p.metadata.creation_timestamp)
        pods = until(f"{count} revived pod(s) of {d.ns}/{d.name}", revived, lambda ps: len(ps) >= count, 60)
        names = [p.metadata.name for p in pods[:count]]
        for n in names:
            av.release_pod(d.ns, n)
        d.recording.mark("first wave released", pods=names)
        return names

    def _gauge_while_held(self, key: str, since: float | None) -> dict:
        """What the controller's rollout_info_replicas_unavailable read from the rollback until now, while revived pods
        are held un-Ready (its highest sample; None when it had none)."""
        window = max(2, int(time.time() - (since or self.started_wall)))
        sel = f'{ROLLOUT_UNAVAILABLE}{{namespace="{self.namespaces[key]}", name="{key}"}}[{window}s]'
        values = [float(v) for s in self.prom.query(sel) for _, v in s.get("values") or []]
        return {"max": max(values) if values else None, "samples": len(values), "window_s": window}

    def _shape(self, key: str) -> tuple[int, int]:
        """(step count, max weight) the stuck rule of ``key`` compares with."""
        return expr_numbers(self.rule(key, STUCK)["expr"])

    def _stuck_facts(self, key: str, records: list[dict]) -> dict:
        steps, max_w = self._shape(key)
        held = intervals(records, key, lambda st: stuck_now(st, steps, max_w), since_mark="rollback")
        return {"condition_intervals": held, "condition_from": held[0][0] if held else None,
                "condition_until": held[-1][1] if held else None}

    # --- the scenarios --------------------------------------------------------------------------------------
    def normal(self) -> dict:
        d = self.drills["normal"]
        rec = d.record("normal")
        d.hold({HASH_LABEL: d.hash_v1}, d.spec.hold_seconds)
        d.rollback()
        ro = d.ro.wait(d.name, healthy_at(d.hash_v1), d.settle_timeout(), progress=d.progress)
        self._quiet("normal")
        d.release_holds()
        obs = rec.finish()
        records = load_timeline(Path(obs.timeline))
        facts = self._stuck_facts("normal", records)
        t_rb, t_ok = mark_wall(records, "rollback"), (facts["condition_until"] or None)
        return {"scenario": "normal", "timeline": obs.timeline, "complete": obs.complete,
                "incomplete_reasons": obs.incomplete_reasons, "healthy": healthy_at(d.hash_v1)(ro),
                "samples": self._samples("normal", STUCK, t_rb), "for_s": self.for_s("normal", STUCK),
                "ramp": self._ramp("normal"), "rollback_wall": t_rb,
                "condition_s": None if not (facts["condition_from"] and t_ok) else round(t_ok - facts["condition_from"], 2),
                **facts}

    def held(self) -> dict:
        d = self.drills["held"]
        rec = d.record("held")
        d.hold({HASH_LABEL: d.hash_v1}, None)
        d.rollback()
        first = self._ramp("held")["first_wave"]
        self._release_first_wave(d, first)
        rung_ok = True
        try:
            rec.wait_weight(self._rung(), 60, "(the weight on the remaining rung)")
        except WaitTimeout as e:
            rung_ok = False
            self.log(f"alert: {e}")
        f = self.for_s("held", STUCK)
        fired = self._wait_state("held", STUCK, "firing", f + 4 * self.interval_s + 30) if rung_ok else None
        gauge = self._gauge_while_held("held", mark_wall(rec.records(), "rollback"))
        res = d.ro.promote(d.name, full=True)
        rec.mark("promote --full", res)
        hold_for(3 * self.interval_s + 1, "promote --full reaching the controller, then three evaluations")
        state_after_pf = self.watch.state(STUCK, self.namespaces["held"], "held")
        d.release_holds()
        rec.mark("hold lifted")
        resolved = self._wait_state("held", STUCK, None, d.settle_timeout())
        ro = d.ro.get(d.name)
        self._quiet("held")
        obs = rec.finish()
        records = load_timeline(Path(obs.timeline))
        t_rb = mark_wall(records, "rollback")
        return {"scenario": "held", "timeline": obs.timeline, "complete": obs.complete,
                "incomplete_reasons": obs.incomplete_reasons, "rung_reached": rung_ok,
                "fired_seen": fired, "resolved_seen": resolved, "state_after_promote_full": state_after_pf,
                "unavailable_gauge": gauge, "unheld_pods": d.spec.replicas - first,
                "promote_full_wall": mark_wall(records, "promote --full"), "hold_lifted_wall": mark_wall(records,
                                                                                                          "hold lifted"),
                "healthy": healthy_at(d.hash_v1)(ro), "samples": self._samples("held", STUCK, t_rb), "for_s": f,
                "first_scrape": first_scrape(self.prom, STUCK, self.namespaces["held"], "held", *self._shape("held"),
                                             t_rb or self.started_wall),
                "scrape_s": scrape_seconds(self.prom, KSM_JOB, t_rb or self.started_wall),
                "ramp": self._ramp("held"), "rollback_wall": t_rb, **self._stuck_facts("held", records)}

    def aborted(self) -> dict:
        """A deploy of v2 paused on its indefinite pause (its canary available), aborted, then promote --full."""
        d = self.drills["aborted"]
        rec = d.record("aborted")
        res = d.ro.set_image(d.name, d.spec.image_v2, container=d.spec.container)
        rec.mark("deploy v2", res)
        d.ro.wait(d.name, paused(), d.deploy_timeout(), progress=d.progress)
        res = d.ro.abort(d.name)
        rec.mark("abort", res)
        fa = self.for_s("aborted", ABORTED)
        fired = self._wait_state("aborted", ABORTED, "firing", fa + 4 * self.interval_s + 30)
        res = d.ro.promote(d.name, full=True)
        rec.mark("promote --full", res)
        resolved = self._wait_state("aborted", ABORTED, None, 30)
        ro = d.ro.wait(d.name, healthy(), d.settle_timeout(), progress=d.progress)
        hold_for(SETTLE_S, "one more scrape and evaluation after Healthy")
        obs = rec.finish()
        records = load_timeline(Path(obs.timeline))
        since = mark_wall(records, "deploy v2")
        st = ro.get("status") or {}
        return {"scenario": "aborted", "timeline": obs.timeline, "complete": obs.complete,
                "incomplete_reasons": obs.incomplete_reasons, "fired_seen": fired, "resolved_seen": resolved,
                "abort_intervals": intervals(records, "aborted", aborted_now, since_mark="deploy v2"),
                "first_scrape": first_scrape(self.prom, ABORTED, self.namespaces["aborted"], "aborted", 0, 0,
                                             since or self.started_wall),
                "scrape_s": scrape_seconds(self.prom, CONTROLLER_JOB, since or self.started_wall),
                "abort_wall": mark_wall(records, "abort"), "promote_full_wall": mark_wall(records, "promote --full"),
                "healthy": st.get("phase") == "Healthy" and st.get("stableRS") == st.get("currentPodHash"),
                "samples": self._samples("aborted", ABORTED, since), "for_s": fa,
                "stuck_samples": self._samples("aborted", STUCK, since)}

    def healthy(self) -> dict:
        d = self.drills["healthy"]
        ro = d.ro.get(d.name)
        return {"scenario": "healthy", "healthy": ro["status"].get("phase") == "Healthy",
                "watched_s": round(time.time() - self.started_wall, 1),
                "samples": {a: self._samples("healthy", a) for a in (STUCK, ABORTED)}}

    def inputs_present(self) -> dict:
        """Every metric the rules read has a series for the healthy Rollout (the real controller's names at this
        version; kube-state-metrics'), and every rule evaluates without error."""
        ns = self.namespaces["healthy"]
        found = {}
        for metric in (ROLLOUT_INFO, CANARY_WEIGHT, STEP_INDEX, PHASE):
            try:
                res = until(f"a {metric} series for {ns}/healthy",
                            lambda m=metric: self.prom.query(f'{m}{{namespace="{ns}", name="healthy"}}'), bool, 30,
                            interval=0.5)
            except WaitTimeout:
                res = []
            found[metric] = sorted({r["metric"].get("job", "") for r in res})
        health = self.prom.rule_health()
        return {"metrics": found, "rules": health, **self.checks}

    # --- numbers --------------------------------------------------------------------------------------------
    def _rung(self) -> int:
        return next(int(s["setWeight"]) for s in reversed(self.fx["rollout"]["steps"]) if "setWeight" in s)

    def _ramp(self, key: str) -> dict:
        r = self.fx["rollout"]
        ramp = expected_ramp(r["replicas"], r["minPodsPerReplicaSet"], self._rung(), 100, command.params_of(self.args))
        return {"first_wave": ramp.first_wave, "waves": ramp.waves, "ramp_s": ramp.ramp_s, "for_s": ramp.for_s,
                "formula": ramp.formula(), "bound_s": ramp.for_s + 2 * self.interval_s}

    # --- the end ---------------------------------------------------------------------------------------------
    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        for d in self.drills.values():
            d.cleanup()
        if self.prom is not None:
            self.prom.stop()
        if self.ksm is not None:
            self.ksm.stop()
        for ns in self.namespaces.values():
            try:
                drop_namespace(self.api, ns)
            except Exception as e:        # the namespace goes with the cluster; said
                self.log(f"alert: namespace {ns} not dropped: {e}")
