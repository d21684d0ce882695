"""The per-version source map of the weight chain in ``reconcileTrafficRouting`` (rollout/trafficrouting.go).

Branch-order verdicts name the lines of three branches of that version's own source; the lines are read
here from the code, never typed in by hand (DESIGN.md §6 "Branch lines"):

- ``backward-search``: ``if !atDesiredReplicaCount && !c.rollout.Status.PromoteFull {`` whose block walks the
  steps backwards from ``*index - 1`` looking for a setWeight;
- ``mid-steps``: ``} else if *index != int32(len(c.rollout.Spec.Strategy.Canary.Steps)) {`` (GetCurrentSetWeight);
- ``end-of-steps``: the final ``} else {`` of that chain, whose block sets ``MaxTrafficWeight``.

A release's source is the copy the toolchain keeps (``<cache>/rollouts/<v>/source/trafficrouting.go``), or
the file in the Go module cache.  A user-built controller takes ``--source`` (a source tree root, a folder
holding trafficrouting.go, or the file itself); without it its rows say ``lines unknown``.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from ..core import fastyaml
from ..core import inputs as budget

BACKWARD, MID, END = "backward-search", "mid-steps", "end-of-steps"
LINES_UNKNOWN = "lines unknown"
SOURCE_ENV = "DRILLS_SOURCE"

_FUNC_RE = re.compile(r"^func\s+\([^)]*\)\s+reconcileTrafficRouting\s*\(")
_BACKWARD_RE = re.compile(r"^\s*if\s+(?:!atDesiredReplicaCount\s*&&\s*!c\.rollout\.Status\.PromoteFull|"
                          r"!c\.rollout\.Status\.PromoteFull\s*&&\s*!atDesiredReplicaCount)\s*\{\s*(//.*)?$")
_BACKWARD_LOOP_RE = re.compile(r"for\s+i\s*:=\s*\*index\s*-\s*1\s*;\s*i\s*>=\s*0\s*;\s*i--")
_MID_RE = re.compile(r"^\s*\}\s*else\s+if\s+\*index\s*!=\s*int32\(\s*len\(\s*c\.rollout\.Spec\.Strategy\.Canary\.Steps"
                     r"\s*\)\s*\)\s*\{\s*(//.*)?$")
_ELSE_RE = re.compile(r"^\s*\}\s*else\s*\{\s*(//.*)?$")
_CLOSE_RE = re.compile(r"^\s*\}\s*(//.*)?$")


class SourceMapError(ValueError):
    """The three branches could not be found by their code in the given source."""


@dataclass
class BranchMap:
    source: str                      # the file the lines were read from
    sha256: str
    backward_search: int
    mid_steps: int
    end_of_steps: int
    order: list                      # branch names in source (= evaluation) order of the if/else chain

    def line(self, branch: str) -> int:
        return {BACKWARD: self.backward_search, MID: self.mid_steps, END: self.end_of_steps}[branch]

    def as_dict(self) -> dict:
        return asdict(self)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip("\t "))


def find_branches(path: Path) -> BranchMap:
    """Find the three branches in one trafficrouting.go by their code; lines are 1-based.  A file past the
    budget or not UTF-8 (a --source is the user's) is InputError (exit 2) naming it, never a crash."""
    path = Path(path)
    text = budget.read_text(path, what="Go source")
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if _FUNC_RE.match(l)), None)
    if start is None:
        raise SourceMapError(f"{path}: no func reconcileTrafficRouting")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("}")), len(lines))
    body = range(start, end)
    backward = next((i for i in body if _BACKWARD_RE.match(lines[i])), None)
    if backward is None:
        raise SourceMapError(f"{path}: no 'if !atDesiredReplicaCount && !c.rollout.Status.PromoteFull {{' "
                             f"in reconcileTrafficRouting")
    ind = _indent(lines[backward])
    # the rest of that if/else chain: lines at the same indentation that continue it
    chain = []
    for i in range(backward + 1, end):
        line = lines[i]
        if not line.strip() or _indent(line) != ind:
            continue
        if _MID_RE.match(line):
            chain.append((MID, i))
        elif _ELSE_RE.match(line):
            chain.append((END, i))
        elif re.match(r"^\s*\}\s*else\s+if\b", line):
            chain.append(("other", i))
        elif _CLOSE_RE.match(line):
            break                                    # the chain ends
        else:
            break
    mid = next((i for name, i in chain if name == MID), None)
    final = next((i for name, i in chain if name == END), None)
    if mid is None:
        raise SourceMapError(f"{path}:{backward + 1}: the chain has no "
                             f"'}} else if *index != int32(len(c.rollout.Spec.Strategy.Canary.Steps)) {{'")
    if final is None:
        raise SourceMapError(f"{path}:{backward + 1}: the chain has no final '}} else {{'")
    if not any(_BACKWARD_LOOP_RE.search(lines[i]) for i in range(backward + 1, mid)):
        raise SourceMapError(f"{path}:{backward + 1}: that block does not search the steps backwards "
                             f"from *index - 1")
    if not any("GetCurrentSetWeight" in lines[i] for i in range(mid + 1, final)):
        raise SourceMapError(f"{path}:{mid + 1}: the mid-steps block does not call GetCurrentSetWeight")
    close = next((i for i in range(final + 1, end) if _indent(lines[i]) == ind and _CLOSE_RE.match(lines[i])), end)
    if not any(re.search(r"desiredWeight\s*=\s*.*MaxTrafficWeight\(", lines[i]) for i in range(final + 1, close)):
        raise SourceMapError(f"{path}:{final + 1}: the final else does not set desiredWeight from MaxTrafficWeight")
    order = [name for name, _ in sorted([(BACKWARD, backward), (MID, mid), (END, final)], key=lambda x: x[1])]
    return BranchMap(source=str(path), sha256=hashlib.sha256(text.encode()).hexdigest(),
                     backward_search=backward + 1, mid_steps=mid + 1, end_of_steps=final + 1, order=order)


def source_file(source: Path) -> Path:
    """--source: a source tree root (rollout/trafficrouting.go), a folder holding trafficrouting.go, or the file."""
    source = Path(source).expanduser()
    for cand in (source, source / "rollout" / "trafficrouting.go", source / "trafficrouting.go",
                 source / "source" / "trafficrouting.go"):
        if cand.is_file():
            return cand.resolve()
    raise SourceMapError(f"--source {source}: no rollout/trafficrouting.go there")


def release_source(version: str) -> Path:
    """trafficrouting.go of a release: the toolchain's copy beside a built controller, else the module's source
    (downloaded under the toolchain's Go rule, never built).  SourceMapError when neither can be had."""
    from ..toolchain import Toolchain
    from ..toolchain.components import rollouts_component
    from ..toolchain.modsource import ModuleUnavailable, rollouts_source
    tc = Toolchain()
    if tc.is_built(rollouts_component(version)):        # its stamp is written after the copy
        return tc.rollouts_dir(version) / "source" / "trafficrouting.go"
    try:
        return rollouts_source(version).dir / "rollout" / "trafficrouting.go"
    except ModuleUnavailable as e:
        raise SourceMapError(str(e)) from None


def branch_map_for(version: str, user_built: bool = False, source: str | Path | None = None) -> BranchMap | None:
    """The map the rows of this run use: --source when given; a release's own source; None (lines unknown)
    for a user-built controller without --source."""
    if source:
        return find_branches(source_file(Path(source)))
    if user_built:
        return None
    return find_branches(release_source(version))


def branch_ref(bm: BranchMap | None, branch: str) -> str:
    """'(:245)' for a branch, or '' when the lines are unknown."""
    return f" (:{bm.line(branch)})" if bm else ""


def order_assertion(bm: BranchMap | None, later: str) -> str:
    """'branch order: backward search (:245) before end-of-steps (:261)' (or '... (lines unknown)')."""
    text = f"branch order: backward search{branch_ref(bm, BACKWARD)} before {later}{branch_ref(bm, later)}"
    return text if bm else f"{text} ({LINES_UNKNOWN})"


# --- CRD schema --------------------------------------------------------------------------------------
def crd_has_canary_field(crds_dir: Path, field: str) -> tuple[bool, str]:
    """Whether the Rollout CRD in ``crds_dir`` declares spec.strategy.canary.<field> (every served version)."""
    for f in sorted(Path(crds_dir).glob("*.yaml")):
        for doc in fastyaml.safe_load_all(f.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition" or \
                    doc.get("metadata", {}).get("name") != "rollouts.argoproj.io":
                continue
            found = []
            for v in doc["spec"].get("versions") or []:
                props = (((v.get("schema") or {}).get("openAPIV3Schema") or {}).get("properties") or {})
                try:
                    canary = props["spec"]["properties"]["strategy"]["properties"]["canary"]["properties"]
                except KeyError:
                    found.append(False)
                    continue
                found.append(field in canary)
            return (bool(found) and all(found)), str(f)
    raise SourceMapError(f"{crds_dir}: no CustomResourceDefinition rollouts.argoproj.io")
