"""Lane ``escape`` — the four ways out of an aborted Rollout (brief §13), observed per controller version.

Each escape runs in a namespace of its own: the incident's aborted state is made as lane ``abort`` makes it (a
GitOps rollback to v1 aborted by its own analysis, the broken v2 still the stable), then one escape is applied
with kubectl-argo-rollouts parity (drills.kube.rollout) and the controller is watched:

- ``retry``: status.abort false -> the steps are walked again from 0 and the analysis aborts the rollback again;
- ``promote``: a plain promote -> the abort stays (nothing useful happens);
- ``promote-full``: status.promoteFull -> the abort is cleared, the weight frozen until the revived ReplicaSet is
  fully available, Healthy at v1 (the runbook's escape);
- ``undo``: the previous revision's pod template written into the spec (declarable in Git) -> the abort is
  cleared by the template change; the broken revision serves again.

Rows per escape: the abort state after it, what the steps and the analysis did, the weight path, Degraded and its
reason, and the revision serving at the end.  The matrix draws the four weight paths of a version side by side.
The four escapes need nothing from each other: they start together at the first step and run side by side
(drills.drill.together), each with its own namespace, mesh emulator, Prometheus and load.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path

from ..record import timeline
from ..core.config import version_order
from ..cluster.namespaces import drop_namespace
from ..record.ledger import FAIL, INCONCLUSIVE, PASS, UNVERIFIED
from ..record.plots import plot_paths
from ..kube.rollout import Predicate, healthy
from ..core.wait import WaitTimeout, hold_for
from .abort import LaneAbort
from .abort_drill import SelfAbortDrill
from .base import Runbook, step
from ..core import fastyaml

ESCAPES = ("retry", "promote", "promote-full", "undo")
PROMOTE_WINDOW_S = 20.0      # evidence window after a plain promote: long enough for the controller to act on it
SETTLE_S = 240.0             # an escape that moves the Rollout settles (Healthy, or aborted again) within this


class EscapeDrill(SelfAbortDrill):
    """The self-abort set-up (whole-service query, no rollbackWindow), then one escape."""

    def __init__(self, api, cluster, namespace, escape: str, evidence_dir: Path, version: str, fx: dict, log=None):
        super().__init__(api, cluster, namespace, "whole-service-query", Path(evidence_dir) / "escape" / escape,
                         version, fx, log)
        self.escape_name = escape

    def apply(self) -> tuple[dict, dict | None]:
        """The aborted state first (the rollout as the abort left it), then the escape; returns (before, response)."""
        d = self.drill
        before = d.ro.get(d.name)
        self._mark("escape")
        if self.escape_name == "retry":
            res = d.ro.retry(d.name)
        elif self.escape_name == "promote":
            res = d.ro.promote(d.name)
        elif self.escape_name == "promote-full":
            res = d.ro.promote(d.name, full=True)
        else:
            res = d.ro.undo(d.name)
        if d.recording is not None:
            d.recording.mark({"promote-full": "promote --full"}.get(self.escape_name, self.escape_name), res)
        self.log(f"escape/{self.escape_name}: applied to the aborted Rollout")
        return before, res

    def settle(self) -> dict:
        d = self.drill
        if self.escape_name == "promote":
            hold_for(PROMOTE_WINDOW_S, "the controller's answer to a plain promote of an aborted Rollout")
            return d.ro.get(d.name)
        seen_clear = {"v": False}

        def done(o) -> bool:
            st = (o or {}).get("status") or {}
            if not st.get("abort"):
                seen_clear["v"] = True
            again = seen_clear["v"] and bool(st.get("abort"))         # retry: aborted once more
            return again or (healthy()(o) and st.get("stableRS") == st.get("currentPodHash"))
        try:
            return d.ro.wait(d.name, Predicate("Healthy after the escape, or aborted again", done), SETTLE_S,
                             progress=d.progress)
        except WaitTimeout as e:
            self.log(f"escape/{self.escape_name}: {e}")
            return d.ro.get(d.name)

    def run_escape(self) -> dict:
        """Everything of one escape; the observation (a dict for the rows) with the timeline kept."""
        try:
            self.start()
            self.deploy()
            self.break_stable()
            aborted = self.rollback()
            if not (aborted.get("status") or {}).get("abort"):
                return {"precondition": "the rollback was not aborted by its own analysis: no abort to escape from",
                        "final": aborted.get("status") or {}}
            before, res = self.apply()
            final = self.settle()
            hold_for(3.0, "the last writes after the escape")
            self.load.stop()
            self.drill.release_holds()
            obs = self.drill.recording.finish()
            return self._observe(before, final, res, obs)
        finally:
            self.stop()

    def _observe(self, before: dict, final: dict, res, obs) -> dict:
        d = self.drill
        recs = timeline.ordered(timeline.load(Path(obs.timeline)))
        t_escape = next((r["t"] for r in recs if r["kind"] == "Mark" and r["name"] == "escape"), None)
        der = timeline.derive(recs, d.hash_v1, since_mark="escape")
        path = [[round(t - der.t0, 2), w] for t, w in der.canary_weight]
        weight_then = ([w for t, w in path if t <= 0][-1:] or [None])[0]
        after = [r["obj"]["status"] for r in recs if r["kind"] == "Rollout" and t_escape is not None
                 and r["t"] >= t_escape]
        runs_after = sorted({r["name"] for r in recs if r["kind"] == "AnalysisRun" and t_escape is not None and
                             r["t"] >= t_escape and r["type"] == "ADDED"})
        st = final.get("status") or {}
        serving = {d.hash_v1: "v1 (the rollback's target)", d.hash_v2: "v2 (the broken release)"}.get(
            st.get("stableRS"), st.get("stableRS"))
        ex = timeline.exit_analysis(recs, d.hash_v1, replicas=d.spec.replicas) if self.escape_name == "promote-full" \
            else None
        return {"escape": self.escape_name, "timeline": obs.timeline, "complete": obs.complete,
                "incomplete_reasons": obs.incomplete_reasons, "response": res is not None,
                "abort_before": bool((before.get("status") or {}).get("abort")),
                "abort_cleared": any(not s.get("abort") for s in after), "abort_after": bool(st.get("abort")),
                "step_indexes": _changes([s.get("currentStepIndex") for s in after]),
                "phases": _changes([s.get("phase") for s in after]), "message": st.get("message"),
                "new_analysis_runs": runs_after, "aborted_again": any(not s.get("abort") for s in after) and
                bool(st.get("abort")), "serving": serving, "weight_path": path, "weight_at_escape": weight_then,
                "max_weight_until_available": (ex or {}).get("max_weight_until_available"),
                "weight_at_promote_full": (ex or {}).get("weight_at_promote_full"),
                "healthy": healthy()(final) and st.get("stableRS") == st.get("currentPodHash")}


def _changes(values: list) -> list:
    out: list = []
    for v in values:
        if not out or out[-1] != v:
            out.append(v)
    return out


class LaneEscape(Runbook):
    key = "escape"
    estimate_s = 120.0
    title = "the four escapes from an aborted Rollout: retry, promote, promote --full, undo"
    extras = ("prometheus",)
    probes_leave = ", their mesh emulators, Prometheus and load (these end with the leg)"
    probes_stop_s = 40.0      # a probe's unwinding stops its load (Locust writes its stats: up to 35 s), Prometheus, mesh

    @cached_property
    def fx(self) -> dict:
        """The self-abort drill's data (fixtures/lanes/abort/drill.yaml): the same Rollout, analysis and load."""
        return fastyaml.safe_load((LaneAbort.data_dir() / "drill.yaml").read_text())

    @cached_property
    def observations(self) -> dict[str, dict]:
        return {}

    def _run_escape(self, name: str, ns: str, reached) -> dict:
        try:
            return EscapeDrill(self.ctx.api, self.ctx.cluster, ns, name, Path(self.ctx.evidence_dir), self.ctx.name,
                               self.fx, log=self.together().lines_of(name, f"[{name}] ")).run_escape()
        finally:
            drop_namespace(self.ctx.api, ns)

    def _escape(self, name: str) -> list[dict]:
        """One escape on a fresh aborted Rollout in a namespace of its own; the four run side by side (each with its
        own mesh emulator, Prometheus and load), started together at the first step."""
        self.start_in_namespaces("escape", ESCAPES, self._run_escape)
        obs = self.probes.wait(name)
        self.observations[name] = obs
        return escape_rows(self, name, obs, self.expected(name) or {})


    @step()
    def retry(self) -> list[dict]:
        return self._escape("retry")

    @step()
    def promote(self) -> list[dict]:
        return self._escape("promote")

    @step()
    def promote_full(self) -> list[dict]:
        return self._escape("promote-full")

    @step()
    def undo(self) -> list[dict]:
        return self._escape("undo")

    @classmethod
    def report_sections(cls, cells: dict, out_dir: Path | None = None) -> list[dict]:
        """One picture per version: the four weight paths side by side (from the rows' recorded paths)."""
        by_version: dict[str, dict[str, list]] = {}
        for (version, step_name, assertion), row in cells.items():
            path = (row.get("details") or {}).get("weight_path")
            if path is not None and assertion.startswith("the revision serving at the end"):
                by_version.setdefault(version, {})[step_name] = path
        if not by_version or out_dir is None:
            return []
        figures = []
        for version in version_order(by_version):
            paths = by_version[version]
            png = Path(out_dir) / "escape" / f"escape-{version.replace('+', '_')}.png"
            plot_paths({e: paths.get(e) for e in ESCAPES}, f"escapes from an abort — {version}", png)
            figures.append({"png": png, "caption": f"{version}: canary weight after each escape (t = 0: the "
                                                   f"escape is applied)"})
        return [{"title": "Escapes from an abort", "columns": [], "rows": [], "callouts": [], "figures": figures,
                 "note": "Each escape starts from the same aborted state: a rollback aborted by its own analysis."}]


def escape_rows(lane: Runbook, name: str, obs: dict, exp: dict) -> list[dict]:
    """Rows of one escape; verdicts from the observation against the version's expectations."""
    if obs.get("precondition"):
        return [lane.row(name, "the Rollout was aborted by its own analysis before the escape", True, False,
                         INCONCLUSIVE, reason=obs["precondition"], key="precondition")]
    reason = None if obs["complete"] else f"timeline incomplete: {'; '.join(obs['incomplete_reasons'])}"

    def verdict(key: str, observed) -> str:
        if reason:
            return INCONCLUSIVE
        if key not in exp:
            return UNVERIFIED
        return PASS if observed == exp[key] else FAIL

    def row(assertion, key, observed, **extra):
        v = verdict(key, observed)
        r = reason or (lane.no_expectation if v == UNVERIFIED else None)
        return lane.row(name, assertion, exp.get(key), observed, v, evidence=obs["timeline"], reason=r,
                        key=key.replace("_", "-"), escape=name, **extra)

    common = {"step_indexes": obs["step_indexes"], "phases": obs["phases"], "message": obs["message"],
              "weight_path": obs["weight_path"]}
    rows = [row(f"status.abort cleared by {name}", "abort_cleared", obs["abort_cleared"], **common),
            row(f"a new AnalysisRun starts after {name} and aborts the rollback again", "aborted_again",
                obs["aborted_again"], new_analysis_runs=obs["new_analysis_runs"], **common),
            row(f"the revision serving at the end after {name}", "serving", obs["serving"],
                healthy=obs["healthy"], **common)]
    if name == "promote-full":
        cap = obs["max_weight_until_available"]
        rows.append(row("the weight never rises above its value at promote --full until the revived ReplicaSet is "
                        "fully available", "weight_frozen_until_available",
                        cap is not None and obs["weight_at_promote_full"] is not None and
                        cap <= obs["weight_at_promote_full"], **common))
    return rows
