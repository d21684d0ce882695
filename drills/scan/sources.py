"""What a controller version does on the rollback path, read from that version's own source.

Every line a prediction names is found here by its code in the version's module source (the Go module cache,
``go mod download``) or a tree given with ``--source``; the weight-chain lines come from drills.drill.branches.
Nothing is typed in by hand.  Four facts decide the rules (predict.py):

- ``guard``: Istio's UpdateHash refuses (returns an error, so SetWeight is not reached) while a ReplicaSet with
  replicas > 0 is not fully available, when the Rollout names neither canaryService nor stableService
  (issue #2507): v1.8.0-v1.8.2 and v1.9.0 on.  Absent in v1.7.x; in v1.8.3-v1.8.5 UpdateHash only delays the
  DestinationRule switch and returns nil, so SetWeight runs (``guard_kind`` "dr-only").
- ``rpt``: CanaryStrategy has replicaProgressThreshold (v1.9.0 on): AtDesiredReplicaCountsForCanary and the
  promotion gate accept a partly available canary.
- ``cap``: reconcileTrafficRouting caps the weight with weightFromAvailableReplicas (upstream PR #4852, not in a
  release): the weight follows the available share.
- ``stable_check``: checkReplicasAvailable(stableRS, ...) guards the weight (v1.8.1 on).
- ``min_pods_capped``: the minPodsPerReplicaSet floor is capped at spec.replicas (v1.10.0 on).
- ``skips_analysis_in_window``: reconcileAnalysisRuns skips analysis for a rollback inside rollbackWindow (v1.7.2
  on: isRollbackWithinWindow, v1.10 isFastRollback); v1.7.1 runs it, so a failing AnalysisRun aborts the rollback.

Without any source (no Go toolchain, no module cache) the facts come from the release ranges above and the
lines are unknown; ``derived_from`` says which.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..core import config
from ..core import inputs as budget
from ..drill.branches import BACKWARD, END, MID, SourceMapError, find_branches
from ..core.errors import BadInput
from ..core.procs import run_bounded
from ..toolchain.modsource import ModuleUnavailable, rollouts_source

TR, CANARY, SYNC, RSC, ISTIO, TYPES, VALIDATION, ANALYSIS = (
    "rollout/trafficrouting.go", "rollout/canary.go", "rollout/sync.go", "utils/replicaset/canary.go",
    "rollout/trafficrouting/istio/istio.go", "pkg/apis/rollouts/v1alpha1/types.go",
    "pkg/apis/rollouts/validation/validation.go", "rollout/analysis.go")

# key: (file, function whose body holds the line (None: anywhere), pattern, what the line is)
FINDERS = {
    "zero-available": (TR, "reconcileTrafficRouting",
                       r"\}\s*else if c\.newRS == nil \|\| c\.newRS\.Status\.AvailableReplicas == 0",
                       "newRS nil or 0 available: weight stays 0"),
    "stable-check": (TR, "reconcileTrafficRouting", r"if !c\.checkReplicasAvailable\(c\.stableRS",
                     "checkReplicasAvailable(stableRS, max - weight): looks at the stable only"),
    "cap": (TR, "reconcileTrafficRouting", r"weightFromAvailableReplicas\(",
            "weight capped to the canary's available share"),
    "jump": (CANARY, "syncRolloutStatusCanary",
             r"if c\.rollout\.Status\.PromoteFull \|\| c\.isRollbackWithinWindow\(\)",
             "inside rollbackWindow: index jumps to len(steps) at the end of the pass"),
    "skip-steps": (CANARY, "syncRolloutStatusCanary", r"c\.isRollbackWithinWindow\(\) && replicasetutil\.IsActive",
                   "template-change pass: jump only if the revived ReplicaSet still has replicas"),
    "first-size": (RSC, "GetCurrentSetWeight", r"for i := \*currentStepIndex; i >= 0; i--",
                   "RS sized from the setWeight at the current index (steps[0] on the pass before the jump)"),
    "min-pods": (RSC, "CheckMinPodsPerReplicaSet",
                 r"return max\(count, (\*rollout\.Spec\.Strategy\.Canary\.MinPodsPerReplicaSet|minPodsPerReplicaSet)\)",
                 "floor minPodsPerReplicaSet (0 stays 0)"),
    "min-pods-cap": (RSC, "CheckMinPodsPerReplicaSet", r"if minPodsPerReplicaSet > rolloutSpecReplicaSet",
                     "the floor is capped at spec.replicas"),
    "ceil": (RSC, "trafficWeightToReplicas", r"math\.Ceil\(", "pods = ceil(weight x replicas / max weight)"),
    "guard": (ISTIO, "UpdateHash", r'return fmt\.Errorf\("delaying destination rule switch',
              "UpdateHash refuses while a ReplicaSet with replicas > 0 is not fully available"),
    "guard-log": (ISTIO, "UpdateHash", r"delaying destination rule switch",
                  "UpdateHash delays the DestinationRule switch while a ReplicaSet is not fully available"),
    "guard-services": (ISTIO, None, r'Canary\.CanaryService (==|!=) ""',
                       "the guard only without canaryService/stableService"),
    "rpt-field": (TYPES, None, r"ReplicaProgressThreshold \*ReplicaProgressThreshold",
                  "replicaProgressThreshold in the canary strategy"),
    "rpt-at-desired": (RSC, "AtDesiredReplicaCountsForCanary", r"if !ReplicaProgressThresholdMet\(",
                       "at desired counts once the threshold is met"),
    "rpt-pods": (RSC, "ReplicaProgressThresholdMet", r"return rs\.Status\.AvailableReplicas >= threshold\.Value",
                 "type Pods: met at available >= value"),
    "rpt-promote": (SYNC, "shouldFullPromote", r"ReplicaProgressThresholdMet\(",
                    "promotion gate accepts the threshold"),
    "promote-gate": (SYNC, "shouldFullPromote", r"c\.newRS\.Status\.AvailableReplicas (!=|<) ",
                     "promotion waits for the revived ReplicaSet's availability"),
    "dss-scaledown": (VALIDATION, "ValidateRolloutStrategyCanary",
                      r"canary\.ScaleDownDelaySeconds != nil && canary\.DynamicStableScale",
                      "InvalidSpec: dynamicStableScale with scaleDownDelaySeconds"),
    "step-one-of": (VALIDATION, "hasMultipleStepsType", r"oneOf = append\(oneOf, s\.SetWeight != nil\)",
                    "InvalidSpec: one of setWeight, pause, experiment, analysis per step"),
    "analysis-reconcile": (ANALYSIS, None, r"^func \(c \*rolloutContext\) reconcileAnalysisRuns\(\)",
                           "reconcileAnalysisRuns: which analysis runs, cancelled or skipped"),
    "analysis-skip": (ANALYSIS, "reconcileAnalysisRuns", r":= c\.(isRollbackWithinWindow|isFastRollback)\(\)",
                      "analysis skipped for a rollback inside rollbackWindow"),
    "in-window": (SYNC, None, r"^func \(c \*rolloutContext\) isRollbackWithinWindow\(\)",
                  "rollback inside rollbackWindow"),
}
CHAIN = {BACKWARD: "backward search: last setWeight before the index",
         MID: "mid-steps: GetCurrentSetWeight", END: "end of steps: MaxTrafficWeight"}
NO_SOURCE = "release ranges (no source)"
RELEASES_WITH = {"guard": (1, 8, 0), "rpt": (1, 9, 0), "stable_check": (1, 8, 1), "min_pods_capped": (1, 10, 0),
                 "skips_analysis_in_window": (1, 7, 2)}
GUARD_DR_ONLY = ((1, 8, 3), (1, 8, 5))       # UpdateHash returns nil while delaying the DestinationRule switch


@dataclass(frozen=True)
class Line:
    key: str
    file: str
    line: int | None
    what: str

    def ref(self) -> str:
        return f"{self.file}:{self.line}" if self.line else f"{self.file} (line unknown)"


@dataclass
class VersionFacts:
    version: str
    guard: bool
    rpt: bool
    cap: bool
    stable_check: bool
    derived_from: str                        # "source <dir>" | "release ranges (no source)"
    lines: dict = field(default_factory=dict)
    min_pods_capped: bool = False            # the minPodsPerReplicaSet floor is capped at spec.replicas
    guard_kind: str = "none"                 # blocking | dr-only | none
    skips_analysis_in_window: bool = True    # reconcileAnalysisRuns skips analysis for a rollback in the window
    root: str = ""                           # a --source tree (its manifests/crds hold its CRDs)

    @property
    def from_source(self) -> bool:
        return self.derived_from.startswith("source ")

    def line(self, key: str) -> Line:
        if key in self.lines:
            return self.lines[key]
        f = FINDERS.get(key)
        return Line(key, f[0] if f else TR, None, (f[3] if f else CHAIN.get(key, key)))

    def refs(self, *keys: str) -> list[Line]:
        return [self.line(k) for k in keys]

    def as_dict(self) -> dict:
        return {"version": self.version, "guard": self.guard, "guard_kind": self.guard_kind, "rpt": self.rpt,
                "cap": self.cap,
                "stable_check": self.stable_check, "min_pods_capped": self.min_pods_capped,
                "skips_analysis_in_window": self.skips_analysis_in_window, "derived_from": self.derived_from,
                "lines": {k: v.ref() for k, v in sorted(self.lines.items())}}


# --- finding lines --------------------------------------------------------------------------------------
def _body(lines: list[str], func: str | None) -> range:
    if func is None:
        return range(len(lines))
    start_re = re.compile(r"^func\s+(\([^)]*\)\s+)?" + re.escape(func) + r"\s*\(")
    start = next((i for i, text in enumerate(lines) if start_re.match(text)), None)
    if start is None:
        return range(0)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("}")), len(lines))
    return range(start, end + 1)


def find_lines(root: Path) -> dict[str, Line]:
    """Every FINDERS line and the three chain lines found in a source tree (missing ones are absent)."""
    root = Path(root)
    out: dict[str, Line] = {}
    cache: dict[str, list[str]] = {}
    for key, (rel, func, pattern, what) in FINDERS.items():
        if rel not in cache:
            p = root / rel
            cache[rel] = budget.read_text(p, what="Go source").splitlines() if p.is_file() else []
        lines = cache[rel]
        rx = re.compile(pattern)
        hit = next((i for i in _body(lines, func) if rx.search(lines[i])), None)
        if hit is not None:
            out[key] = Line(key, rel, hit + 1, what)
    try:
        bm = find_branches(root / TR)
        for b in (BACKWARD, MID, END):
            out[b] = Line(b, TR, bm.line(b), CHAIN[b])
    except (SourceMapError, OSError):
        pass
    return out


def facts_from_source(version: str, root: Path) -> VersionFacts:
    lines = find_lines(root)
    if BACKWARD not in lines:
        raise SourceMapError(f"{root}: no Argo Rollouts source (rollout/trafficrouting.go with the weight chain)")
    return VersionFacts(version=version, guard="guard" in lines, rpt="rpt-field" in lines, cap="cap" in lines,
                        stable_check="stable-check" in lines, derived_from=f"source {root}", lines=lines,
                        min_pods_capped="min-pods-cap" in lines,
                        skips_analysis_in_window="analysis-skip" in lines,
                        guard_kind="blocking" if "guard" in lines else ("dr-only" if "guard-log" in lines else "none"))


def facts_from_releases(version: str) -> VersionFacts:
    v = config.version_tuple(version)
    dr_only = GUARD_DR_ONLY[0] <= v <= GUARD_DR_ONLY[1]
    guard = v >= RELEASES_WITH["guard"] and not dr_only
    return VersionFacts(version=version, guard=guard, rpt=v >= RELEASES_WITH["rpt"],
                        cap=False, stable_check=v >= RELEASES_WITH["stable_check"],
                        derived_from=NO_SOURCE,
                        min_pods_capped=v >= RELEASES_WITH["min_pods_capped"],
                        skips_analysis_in_window=v >= RELEASES_WITH["skips_analysis_in_window"],
                        guard_kind="blocking" if guard else ("dr-only" if dr_only else "none"))


# --- locating a release's source ----------------------------------------------------------------------
def module_dir(version: str, download: bool = True) -> Path | None:
    """The module source of argo-rollouts@version (downloaded from the module proxy under the toolchain's Go rule
    when the module cache lacks it and ``download``), or None."""
    return source_status(version, download)[0]


def source_status(version: str, download: bool = True) -> tuple[Path | None, str | None]:
    """(the module source, None) or (None, why it cannot be read)."""
    if not download:
        cached = _cached_module_dir(version)
        return (cached, None) if cached else (None, "not in the Go module cache (no download asked for)")
    try:
        root = rollouts_source(version).dir
    except (ModuleUnavailable, OSError, BadInput) as e:
        return None, " ".join(str(e).split())[:300]
    return (root, None) if (root / CANARY).is_file() else (None, f"{root}: no {CANARY}")


def _cached_module_dir(version: str) -> Path | None:
    try:
        gomodcache = run_bounded(["go", "env", "GOMODCACHE"], timeout=60,
                                 env=dict(os.environ, GOTOOLCHAIN="local")).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    cached = Path(gomodcache) / f"{config.ROLLOUTS_MODULE}@{version}" if gomodcache else None
    return cached if cached and (cached / TR).is_file() else None


@lru_cache(maxsize=None)
def _facts_from_tree(version: str, root: str, digest: str) -> VersionFacts:
    return facts_from_source(version, Path(root))


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for rel in (TR, CANARY, SYNC, RSC, ISTIO, TYPES, VALIDATION, ANALYSIS):
        p = root / rel
        try:
            st = p.stat()
            h.update(f"{rel}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino};".encode())
        except OSError:
            h.update(f"{rel}:-;".encode())
    return h.hexdigest()


def source_root(source: Path) -> Path:
    """The root of an Argo Rollouts source tree named by its root, its ``rollout/`` folder or its
    ``rollout/trafficrouting.go`` (the forms ``--source`` and DRILLS_SOURCE take)."""
    p = Path(source).expanduser()
    if p.is_file():
        p = p.parent
    return p.parent if p.name == "rollout" and (p / "trafficrouting.go").is_file() else p


def facts_for(version: str, source: str | None = None, download: bool = True) -> VersionFacts:
    """The facts of a release (its module source) or of a source tree (``source``), computed when asked for and
    remembered under the source files' identity: never frozen before the source exists.  Without a readable
    source the release ranges stand in, ``derived_from`` says why and every line is unknown."""
    if source:
        root = source_root(Path(source))
        return dataclasses.replace(_facts_from_tree(version, str(root), _tree_digest(root)), root=str(root))
    root, why = source_status(version, download)
    if root is not None:
        try:
            return _facts_from_tree(version, str(root), _tree_digest(root))
        except (SourceMapError, budget.InputError) as e:     # a damaged module copy: said, as an unreadable one
            why = str(e)
    facts = facts_from_releases(version)
    facts.derived_from = f"{NO_SOURCE}: {why}"
    return facts
