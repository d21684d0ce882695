"""Lane ``scan`` — the scan's predictions (drills.scan) judged by the real controller, per controller version.

Two runbook steps:

- ``summary``: the scanned set as the rules predict it on this version: one row per fix wave (brief §9.5; ``-`` =
  not exposed) with the number of Rollouts in it, against the expectations of fixtures/lanes/scan/ for the fixture
  fleet (a set the lane did not scan itself, e.g. ``drills scan --verify``'s, has none: its rows are unverified).
- ``verify``: up to K distinct shapes, covering every predicted rule the probe can run (drills.scan.verify.pick),
  each probed once on the real controller in a namespace of its own: one row per shape, predicted vs observed
  peak canary weight while the revived ReplicaSet is partial (and the pods that carried it).  A disagreement is a
  ``fail`` that names the shape; a probe without evidence of its window is ``inconclusive``.

By default the lane scans the fixture fleet (fixtures/lanes/scan/lane.yaml: the fleet, its environments, K) with
the real helm; ``use()`` hands it a set scanned elsewhere (``drills scan --verify``).  The matrix shows the
components per fix wave and version, and the verification rows.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path

from ..core import config
from ..charts.helm import Helm
from ..record.ledger import FAIL, PASS, UNVERIFIED, key_of
from ..drill.probe import controller_log_of
from ..scan.advice import WAVES
from ..scan.fleet import FleetScan
from ..scan.records import Record, evaluate, summary, version_order
from ..scan.sources import facts_for
from ..scan.autoscalers import join
from ..scan.verify import Shape, pick, run_shapes
from .base import Runbook, step

STEP_SUMMARY, STEP_VERIFY = "summary", "verify"
PLAN = "lane.yaml"
EXAMPLES = 20                    # Rollouts named per wave row (a fleet has thousands)


class LaneScan(Runbook):
    key = "scan"
    estimate_s = 200.0
    title = "the scan's predicted rollback exposure (drills scan) judged by the real controller"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.given: tuple[list[Record], str, list[Shape] | None] | None = None
        self.comparisons: list[dict] = []        # run_shapes' dicts of the verify step
        self.uncovered: list[str] = []

    # --- what is scanned -------------------------------------------------------------------------------------
    @cached_property
    def plan(self) -> dict:
        return self.data(PLAN)

    def use(self, records: list[Record], scope: str, shapes: list[Shape] | None = None) -> "LaneScan":
        """Judge a set scanned elsewhere (its records on this lane's version) instead of the fixture fleet;
        ``shapes``: the ones to probe (default: picked from the records with the plan's K)."""
        self.given = (records, scope, shapes)
        return self

    @property
    def scope(self) -> str:
        if self.given:
            return self.given[1]
        return f"fixture fleet ({', '.join(self.plan['envs'])})"

    @cached_property
    def records(self) -> list[Record]:
        if self.given:
            return self.given[0]
        facts = facts_for(self.ctx.version, self.ctx.options.get("source"))
        with Helm() as helm:
            scan = FleetScan(config.fixtures_dir() / self.plan["fleet"], list(self.plan["envs"]), None,
                             self.ctx.version, helm, workers=2)
            res = scan.run()
            specs = res.rollouts
            join(specs, res.autoscalers)
        self.ctx.log(f"scan: {len(specs)} Rollouts in the {self.scope} at {self.ctx.name}")
        cache: dict = {}
        return [evaluate(ro, facts, cache) for ro in specs]

    # --- the runbook -----------------------------------------------------------------------------------------
    @step()
    def summary(self) -> list[dict]:
        """One row per fix wave: the Rollouts the rules put in it on this version."""
        whole = summary(self.records)
        counts = whole["by_wave"]
        expected = (self.expected("waves") or {}) if not self.given else {}
        seen = self.observation(f"{self.scope}-summary", {"summary": whole, "rollouts": [
            {"source": r.ro.source, "rollout": r.ro.key, "wave": r.wave} for r in self.records]})
        rows = []
        for wave in WAVES:
            observed = sum(counts.get(wave, {}).values())
            exp = expected.get(wave, 0 if expected else None)
            verdict = UNVERIFIED if exp is None else (PASS if observed == exp else FAIL)
            reason = None
            if verdict == UNVERIFIED:
                reason = "no expectation: the scanned set is not the fixture fleet" if self.given else self.no_expectation
            rows.append(self.row(STEP_SUMMARY, f"{self.scope}: Rollouts in fix wave {wave}", exp, observed,
                                 verdict, evidence=seen, reason=reason, key=f"wave-{wave}" if wave != "-" else "wave-none",
                                 scope=self.scope, wave=wave,
                                 examples=[f"{r.ro.source} {r.ro.key}" for r in self.records
                                           if r.wave == wave][:EXAMPLES]))
        return rows

    @step(STEP_SUMMARY)
    def verify(self) -> list[dict]:
        """Each picked shape probed on the real controller: predicted vs observed peak while partial."""
        shapes = self.given[2] if self.given and self.given[2] is not None else None
        if shapes is None:
            shapes, self.uncovered, _ = pick(self.records, int(self.plan["verify"]))
        rows = []
        for s in shapes:
            self.ctx.log(f"scan verify: {self.ctx.name} {s.label} (rule {s.pred.rule}, {s.count} "
                         f"Rollout(s)), probed at replicas {s.probe_replicas}")
        results = run_shapes(self.ctx.api, shapes, self.ctx.name, Path(self.ctx.evidence_dir) / "scan",
                             self.ctx.audit_log, self.ctx.log, controller_log_of(self.ctx.cluster.status())
                             if self.ctx.cluster is not None else None)
        error = next((c for c in results if isinstance(c, BaseException)), None)
        for s, c in zip(shapes, results):
            if isinstance(c, BaseException):      # its row is missing; the others are recorded, then the first raised
                self.ctx.log(f"scan verify: {self.ctx.name} {s.label}: the probe failed: {type(c).__name__}: {c}")
                continue
            self.comparisons.append(c)
            if c["verdict"] in (PASS, FAIL) and self.ctx.options.get("user_built") \
                    and not self.ctx.options.get("source"):
                # the prediction came from the nearest release's rules: no release is held against this controller
                c = dict(c, verdict=UNVERIFIED, reason=f"{self.no_expectation}; predicted from the nearest "
                                                        f"release's rules (give --source for its own)")
            rows.append(self.row(
                STEP_VERIFY, f"peak canary weight while partial: {s.label} (probed at replicas {s.probe_replicas})",
                c["predicted"], c["observed"],
                c["verdict"], evidence=c["evidence"], reason=c["reason"], key=key_of(s.label), router=c["router"],
                rule=c["rule"],
                predicted_pods=c["predicted_pods"], observed_pods=c["observed_pods"],
                probe_replicas=c["probe_replicas"], replicas=c["replicas"], at_max=c["at_max"], rollouts=c["rollouts"],
                example=c["example"], window_evidence=c["window_evidence"],
                weights_while_partial=c["weights_while_partial"],
                series_text=f"weights while partial [t, weight, available, target]: {c['weights_while_partial']}"))
        if error is not None:
            raise error
        return rows

    # --- the report ------------------------------------------------------------------------------------------
    @classmethod
    def report_sections(cls, cells: dict, out_dir: Path | None = None) -> list[dict]:
        """Per scanned set: Rollouts per fix wave (a column per wave, a row per version); then the verification
        rows (a row per version, every shape it probed)."""
        versions = version_order({v for v, _, _ in cells})
        scopes = sorted({(r.get("details") or {}).get("scope") for (_, s, _), r in cells.items()
                         if s == STEP_SUMMARY} - {None})
        sections = []
        for scope in scopes:
            rows = []
            for v in versions:
                mine = [r for (cv, s, _), r in cells.items() if cv == v and s == STEP_SUMMARY and
                        (r.get("details") or {}).get("scope") == scope]
                if mine:
                    rows.append([v, *[[r for r in mine if r["details"].get("wave") == w] for w in WAVES]])
            sections.append({"title": f"Scan — {scope}: Rollouts per fix wave", "rows": rows, "callouts": [],
                             "columns": ["controller version", *[f"wave {w}" for w in WAVES]],
                             "note": "Predicted from each version's own source (drills scan); wave - = not exposed. "
                                     "Waves: " + "; ".join(f"{w}: {t}" for w, t in WAVES.items()) + "."})
        rows, callouts = [], []
        for v in versions:
            mine = [r for (cv, s, _), r in sorted(cells.items()) if cv == v and s == STEP_VERIFY]
            if mine:
                rows.append([v, mine])
            callouts += [f"{v}: {r['reason']}" for r in mine if r.get("verdict") == FAIL]
        if rows:
            sections.append({"title": "Scan — prediction vs the real controller", "columns": ["controller version",
                                                                                               "shapes probed"],
                             "rows": rows, "callouts": callouts,
                             "note": "Each cell: a shape probed on the embedded cluster, the peak canary weight while "
                                     "the revived ReplicaSet was partial (expected = predicted)."})
        return sections
