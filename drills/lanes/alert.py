"""Lane ``alert`` — the "stuck at the remaining rung" alert that ships with the prescription (brief §9.2, §10), proven
on the real controller's metrics: `drills alerts` writes the rules for the drill's own Rollouts, promtool checks and
unit-tests them, the real Prometheus evaluates them on the real controller's /metrics and the real
kube-state-metrics' custom-resource-state metrics (drills.alerts.ksm), and four Rollouts show when they fire and
when they stay quiet (drills.alerts.drill).  Fire and resolve times are marked on each Rollout's timeline and
written in the rows (and the lane's report section)."""
from __future__ import annotations

import time
from functools import cached_property
from pathlib import Path

from ..alerts.drill import AlertDrill
from ..alerts.rules import ABORTED, STUCK
from ..core import config
from ..core.config import version_order
from ..record.ledger import FAIL, INCONCLUSIVE, PASS, UNVERIFIED
from .base import Runbook, StepFailed, step

WEIGHT_SOURCE = (f"weight, step and phase from kube-state-metrics {config.KUBE_STATE_METRICS_VERSION} "
                 "custom-resource-state metrics (built from its module)")


def _utc(wall: float | None) -> str:
    if wall is None:
        return "—"
    return time.strftime("%H:%M:%S", time.gmtime(wall)) + f".{int((wall % 1) * 10)}Z"


class LaneAlert(Runbook):
    key = "alert"
    estimate_s = 95.0
    title = "the stuck-at-the-remaining-rung alert: fires when a rollback is held, quiet otherwise, on real metrics"
    extras = ("prometheus", "kube-state-metrics")

    @cached_property
    def fx(self) -> dict:
        return self.data("drill.yaml")

    @cached_property
    def drill(self) -> AlertDrill:
        if self.ctx.cluster is None:
            raise StepFailed("lane alert runs on the embedded cluster (its controller's metrics port, its Prometheus)")
        return AlertDrill(self.ctx.api, self.ctx.cluster, Path(self.ctx.evidence_dir), self.ctx.name, self.fx,
                          log=self.ctx.log)

    def close(self) -> None:
        if "drill" in self.__dict__:
            self.drill.stop()

    # --- rows ---------------------------------------------------------------------------------------------------
    def _row(self, step_name: str, assertion: str, key: str, ok, expected_text: str, observed_text: str,
             evidence=None, reason: str | None = None, **details) -> dict:
        exp = self.expected(step_name) or {}
        field = key.replace("-", "_")
        if reason is None and ok is None:
            reason = "no observation"
        if reason:
            verdict = INCONCLUSIVE
        elif field not in exp:
            verdict, reason = UNVERIFIED, self.no_expectation
        else:
            verdict = PASS if ok == exp[field] else FAIL
        return self.row(step_name, assertion, expected_text, observed_text, verdict, evidence=evidence,
                        reason=reason, key=key, weight_source=WEIGHT_SOURCE, **details)

    @staticmethod
    def _timeline_reason(obs: dict) -> str | None:
        return None if obs["complete"] else f"timeline incomplete: {'; '.join(obs['incomplete_reasons'])}"

    # --- the runbook -------------------------------------------------------------------------------------------
    @step()
    def rules(self) -> list[dict]:
        """The rules written, checked, unit-tested and loaded; every metric they read present; four Rollouts up."""
        d = self.drill
        d.start()
        got = d.inputs_present()
        ev = str(d.ev / "rules.yaml")
        bad = [r for r in got["rules"] if r["health"] != "ok"]
        missing = [m for m, jobs in got["metrics"].items() if not jobs]
        return [
            self._row("rules", "promtool check rules passes on the rules drills alerts wrote", "check-rules",
                      got["check_rules"]["rc"] == 0, "exit 0", f"exit {got['check_rules']['rc']}", evidence=ev,
                      output=got["check_rules"]["output"]),
            self._row("rules", "promtool test rules passes on their generated unit tests", "test-rules",
                      got["test_rules"]["rc"] == 0, "exit 0", f"exit {got['test_rules']['rc']}", evidence=ev,
                      output=got["test_rules"]["output"]),
            self._row("rules", "every metric the rules read has a series for a drill Rollout: the controller's "
                               "rollout_info, the weight, the step and the phase",
                      "metrics-present", not missing, "a series of each",
                      "; ".join(f"{m}: {', '.join(j) or 'none'}" for m, j in got["metrics"].items()), evidence=ev,
                      metrics=got["metrics"]),
            self._row("rules", "every rule evaluates without error in Prometheus", "rules-healthy",
                      bool(got["rules"]) and not bad, "health ok", f"{len(got['rules']) - len(bad)} of "
                      f"{len(got['rules'])} ok" + (f"; {bad[0]}" if bad else ""), evidence=ev)]

    @step("rules")
    def normal(self) -> list[dict]:
        obs = self.drill.normal()
        reason = self._timeline_reason(obs) or (None if obs["healthy"] else "the rollback did not end Healthy")
        firing, pending = obs["samples"].get("firing") or [], obs["samples"].get("pending") or []
        ramp, f = obs["ramp"], obs["for_s"]
        cond = obs["condition_s"]
        if cond is None and not reason:
            reason = "the stuck condition never held during the rollback in the recording"
        # a rollback slower than the rule's for: is no normal rollback: the alert firing then says nothing
        slow = None if cond is None or cond < f else (f"the rollback took {cond}s, not less than for: {f:g}s: not a "
                                                      f"rollback within its ramp and margin")
        return [
            self._row("normal", f"a rollback that completes within its expected ramp never fires {STUCK}",
                      "never-fires", not firing, "never firing",
                      f"firing at {len(firing)} evaluation(s); pending at {len(pending)}" +
                      (f" (first {_utc(pending[0])})" if pending else ""), evidence=obs["timeline"],
                      reason=reason or slow, pending=pending, firing=firing, **_times(obs)),
            self._row("normal", "the rollback completes within its expected ramp and margin (the condition ends before "
                                "the rule's for:)", "within-ramp", None if cond is None else cond < f,
                      f"< {f:g}s (for:; the ramp {ramp['ramp_s']:g}s)", f"{cond}s", evidence=obs["timeline"],
                      reason=reason, formula=ramp["formula"], **_times(obs))]

    @step("rules")
    def held(self) -> list[dict]:
        obs = self.drill.held()
        reason = self._timeline_reason(obs) or (None if obs["rung_reached"] else
                                                "the weight never reached the remaining rung: nothing held there")
        e = self.drill.interval_s
        firing = obs["samples"].get("firing") or []
        scraped, start = obs["first_scrape"], obs["condition_from"]
        fired_at = firing[0] if firing else None
        delay = _delta_s(fired_at, scraped)
        pf, lifted = obs["promote_full_wall"], obs["hold_lifted_wall"]
        last = firing[-1] if firing else None
        resolved_at = None if last is None else last + e
        bound = round(obs["for_s"] + e + obs["scrape_s"], 3)
        times = {**_times(obs), "first_scrape_at": scraped, "fired_at": fired_at, "resolved_at": resolved_at,
                 "promote_full_at": pf, "hold_lifted_at": lifted, "fire_delay_s": delay, "bound_s": bound,
                 "fire_delay_from_cluster_s": _delta_s(fired_at, start), "firing": firing,
                 "formula": obs["ramp"]["formula"]}
        if scraped is None and not reason:
            reason = "no scrape showed the stuck condition"
        firing_after_pf = [t for t in firing if pf is not None and lifted is not None and pf + 2 < t < lifted]
        blind = (self.expected("held") or {}).get("replica_gauge_blind", True)
        return [
            self._row("held", f"a rollback held at the remaining rung fires {STUCK} within its for: plus one "
                              f"evaluation interval of the first scrape that showed the condition, not before its "
                              f"for:", "fires-in-time", None if delay is None else obs["for_s"] <= delay + 1e-3 <= bound + 2e-3,
                      f"firing <= {bound:g}s after that scrape (for {obs['for_s']:g}s + {e:g}s + the scrape's "
                      f"{obs['scrape_s'] * 1000:.0f}ms)",
                      "never fired" if fired_at is None else
                      f"fired at {_utc(fired_at)}, {delay}s after the first scrape showing it ({_utc(scraped)}; "
                      f"the cluster showed the condition at {_utc(start)}, {_delta_s(fired_at, start)}s before)",
                      evidence=obs["timeline"], reason=reason, **times),
            self._row("held", "the controller's rollout_info_replicas_unavailable does not show the held revived pods "
                              "(its status is not written while the revived ReplicaSet is partial): no rule reads it"
                      if blind else "the controller's rollout_info_replicas_unavailable shows the held revived pods "
                                    "(this version writes the status while the revived ReplicaSet is partial); no rule "
                                    "reads it, as on the versions where it does not",
                      "replica-gauge-blind", None if obs["unavailable_gauge"]["max"] is None else
                      obs["unavailable_gauge"]["max"] < obs["unheld_pods"], f"below {obs['unheld_pods']} (pods held)"
                      if blind else f"{obs['unheld_pods']} or more",
                      f"at most {obs['unavailable_gauge']['max']:g} over {obs['unavailable_gauge']['samples']} "
                      f"sample(s) while {obs['unheld_pods']} revived pod(s) were held un-Ready"
                      if obs["unavailable_gauge"]["max"] is not None else "no sample",
                      evidence=obs["timeline"], reason=reason, gauge=obs["unavailable_gauge"], **times),
            self._row("held", "promote --full alone, while the revived pods stay unavailable, leaves it firing (the "
                              "controller keeps the weight at the rung until they are available)",
                      "firing-after-promote-full", obs["state_after_promote_full"] == "firing" and
                      bool(firing_after_pf), "still firing", f"{obs['state_after_promote_full'] or 'inactive'}; "
                      f"{len(firing_after_pf)} firing evaluation(s) between promote --full and the hold lifted",
                      evidence=obs["timeline"], reason=reason, **times),
            self._row("held", f"after promote --full, {STUCK} resolves once the revived pods are available (the hold "
                              f"lifted), Healthy at the rolled-back revision", "resolves",
                      obs["resolved_seen"] is not None and obs["healthy"] and bool(firing),
                      "resolved, Healthy", ("resolved" if obs["resolved_seen"] else "still firing") +
                      f" at {_utc(resolved_at)} ({_delta(resolved_at, lifted)} after the hold lifted, "
                      f"{_delta(resolved_at, pf)} after promote --full); "
                      f"{'Healthy' if obs['healthy'] else 'not Healthy'}",
                      evidence=obs["timeline"], reason=reason, **times)]

    @step("rules")
    def aborted(self) -> list[dict]:
        obs = self.drill.aborted()
        reason = self._timeline_reason(obs)
        e = self.drill.interval_s
        firing = obs["samples"].get("firing") or []
        iv, scraped = obs["abort_intervals"], obs["first_scrape"]
        if not iv and not reason:
            reason = "the controller never reported the Rollout aborted in the recording"
        elif scraped is None and not reason:
            reason = "no scrape showed rollout_info phase Abort"
        bound = round(obs["for_s"] + e + obs["scrape_s"], 3)
        fired_at = firing[0] if firing else None
        delay = _delta_s(fired_at, scraped)
        pf = obs["promote_full_wall"]
        resolved_at = firing[-1] + e if firing else None
        stuck_firing = obs["stuck_samples"].get("firing") or []
        times = {"first_scrape_at": scraped, "fired_at": fired_at, "resolved_at": resolved_at, "promote_full_at": pf,
                 "abort_at": obs["abort_wall"], "abort_intervals": iv, "fire_delay_s": delay, "bound_s": bound,
                 "fire_delay_from_abort_s": _delta_s(fired_at, obs["abort_wall"]), "firing": firing}
        return [
            self._row("aborted", f"an aborted Rollout fires {ABORTED} within its for: plus one evaluation interval of "
                                 f"the first scrape that showed it aborted, not before its for:", "fires-in-time",
                      None if delay is None else obs["for_s"] <= delay + 1e-3 <= bound + 2e-3,
                      f"firing <= {bound:g}s after that scrape (for {obs['for_s']:g}s + {e:g}s + the scrape's "
                      f"{obs['scrape_s'] * 1000:.0f}ms)",
                      "never fired" if fired_at is None else
                      f"fired at {_utc(fired_at)}, {delay}s after the first scrape showing it "
                      f"({_delta_s(fired_at, obs['abort_wall'])}s after the abort was sent)", evidence=obs["timeline"],
                      reason=reason, **times),
            self._row("aborted", f"promote --full clears the abort and resolves {ABORTED}, then the Rollout is Healthy",
                      "resolves-after-promote-full",
                      obs["resolved_seen"] is not None and bool(firing) and pf is not None and firing[-1] <= pf + e + 1
                      and obs["healthy"], "resolved, then Healthy",
                      f"{'resolved' if obs['resolved_seen'] else 'still firing'} at {_utc(resolved_at)} "
                      f"({_delta(resolved_at, pf)} after promote --full); {'Healthy' if obs['healthy'] else 'not Healthy'}",
                      evidence=obs["timeline"], reason=reason, **times),
            self._row("aborted", f"{STUCK} never fires for the aborted Rollout", "stuck-quiet", not stuck_firing,
                      "never firing", f"firing at {len(stuck_firing)} evaluation(s)", evidence=obs["timeline"],
                      reason=reason, **times)]

    @step("rules")
    def healthy(self) -> list[dict]:
        obs = self.drill.healthy()
        s = obs["samples"]
        seen = {a: len(s[a].get("firing") or []) + len(s[a].get("pending") or []) for a in s}
        return [self._row("healthy", f"a Healthy Rollout never fires {STUCK} or {ABORTED} (nor goes pending), over "
                                     f"the whole drill", "never-fires", obs["healthy"] and not any(seen.values()),
                          "never active", f"{'Healthy' if obs['healthy'] else 'not Healthy'} for {obs['watched_s']}s; "
                          + "; ".join(f"{a} active at {n} evaluation(s)" for a, n in seen.items()),
                          evidence=self.observation("healthy-samples", obs), reason=None, samples=s)]

    @classmethod
    def report_sections(cls, cells: dict, out_dir: Path | None = None) -> list[dict]:
        """One row per version: when the held rollback fired and resolved, the abort, the quiet ones."""
        cols = [("held: fires", "held", "fires-in-time"), ("held: after promote --full", "held",
                                                          "firing-after-promote-full"),
                ("held: resolves", "held", "resolves"), ("aborted: fires", "aborted", "fires-in-time"),
                ("aborted: resolves", "aborted", "resolves-after-promote-full"),
                ("normal rollback", "normal", "never-fires"), ("Healthy", "healthy", "never-fires")]
        versions = version_order({v for v, _, _ in cells})
        if not versions:
            return []
        rows = []
        for v in versions:
            rows.append([v, *[[r for (cv, s, _), r in sorted(cells.items()) if cv == v and s == st and
                               str(r.get("id", "")).endswith(f"/{st}/{k}")] for _, st, k in cols]])
        return [{"title": "Alerts: the stuck rollback fires, the others stay quiet", "columns":
                 ["controller version", *[c for c, _, _ in cols]], "rows": rows, "callouts": [],
                 "note": "Prometheus evaluates the rules drills alerts writes on the controller's own /metrics and "
                         f"on kube-state-metrics {config.KUBE_STATE_METRICS_VERSION}' custom-resource-state metrics "
                         "(the weight, the step and the phase); times are "
                         "Prometheus' evaluation times (UTC)."}]


def _times(obs: dict) -> dict:
    return {"condition_from": obs.get("condition_from"), "condition_until": obs.get("condition_until"),
            "condition_intervals": obs.get("condition_intervals"), "rollback_at": obs.get("rollback_wall")}


def _delta(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None else f"{a - b:.1f}s"


def _delta_s(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 2)
