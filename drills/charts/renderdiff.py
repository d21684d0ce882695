"""Render diffs: an app rendered with two base chart versions, and the paths that change per object.

Paths in a diff are JSON-pointer-like: ``Rollout/checkout:spec.strategy.canary.steps``; a map key that holds
a dot or a bracket is written in brackets (``metadata.labels[helm.sh/chart]``), a list element as ``[i]``.
Lists of different lengths are reported at the list itself (Helm replaces lists whole).  A string change that
only restates the base chart version is a chart-version change, reported apart.
"""
from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fleet import Fleet, base_sources, check_base_version, render_app
from .helm import Helm


def _key(k: str) -> str:
    return f"[{k}]" if (not k or re.search(r"[.\[\]]", k)) else k


def _join(path: str, k: str) -> str:
    part = _key(k)
    if part.startswith("["):
        return path + part
    return f"{path}.{part}" if path else part


@dataclass(frozen=True)
class Change:
    object: str
    path: str
    before: Any
    after: Any
    chart_version: bool = False     # the change only restates the base chart version

    @property
    def ref(self) -> str:
        return f"{self.object}:{self.path}" if self.path else self.object

    @property
    def op(self) -> str:
        return "added" if self.before is None else "removed" if self.after is None else "changed"

    def to_dict(self) -> dict:
        return {"object": self.object, "path": self.path, "ref": self.ref, "op": self.op,
                "before": self.before, "after": self.after, "chart_version": self.chart_version}


def _restates_version(before: Any, after: Any, versions: tuple[str, str] | None) -> bool:
    if not versions or versions[0] == versions[1]:
        return False
    old, new = versions
    return (isinstance(before, str) and isinstance(after, str) and old in before
            and before.replace(old, new) == after)


def _diff_value(obj: str, path: str, a: Any, b: Any, versions, out: list[Change]) -> None:
    if a == b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            _diff_value(obj, _join(path, str(k)), a.get(k), b.get(k), versions, out)
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff_value(obj, f"{path}[{i}]", x, y, versions, out)
        return
    out.append(Change(obj, path, a, b, _restates_version(a, b, versions)))


def diff_objects(before: dict[str, dict], after: dict[str, dict],
                 versions: tuple[str, str] | None = None) -> list[Change]:
    """Changed paths between two normalised renders.  `versions` (from, to) base chart versions lets a
    string change that only swaps one version for the other count as a chart-version restatement."""
    out: list[Change] = []
    for key in sorted(set(before) | set(after)):
        if key not in before or key not in after:
            out.append(Change(key, "", before.get(key), after.get(key)))
            continue
        _diff_value(key, "", before[key], after[key], versions, out)
    return out


def within(ref: str, prefix: str) -> bool:
    return ref == prefix or ref.startswith(prefix + ".") or ref.startswith(prefix + "[")


@dataclass
class RenderDiff:
    app: str
    env: str
    from_version: str
    to_version: str
    changes: list[Change] = field(default_factory=list)

    @property
    def real(self) -> list[Change]:
        return [c for c in self.changes if not c.chart_version]

    @property
    def chart_version(self) -> list[Change]:
        return [c for c in self.changes if c.chart_version]

    @staticmethod
    def by_object(changes: list[Change]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for c in changes:
            out.setdefault(c.object, []).append(c.path or f"({c.op})")
        return out

    def to_dict(self) -> dict:
        return {"app": self.app, "env": self.env, "from": self.from_version, "to": self.to_version,
                "identical": not self.changes,
                "changed": self.by_object(self.real),
                "chart_version_only": self.by_object(self.chart_version),
                "details": [c.to_dict() for c in self.changes]}

    def format(self) -> str:
        lines = [f"render-diff {self.app} ({self.env}): base {self.from_version} -> {self.to_version}"]
        if not self.changes:
            lines.append("  no changes")
            return "\n".join(lines)
        real = self.by_object(self.real)
        lines.append("changed:" if real else "changed: none")
        for obj, paths in real.items():
            lines.append(f"  {obj}")
            lines += [f"    {p}" for p in paths]
        cv = self.by_object(self.chart_version)
        if cv:
            lines.append("chart-version restatements (reported apart; in a pod template they alone "
                         "make a bump redeploy):")
            for obj, paths in cv.items():
                lines.append(f"  {obj}")
                lines += [f"    {p}" for p in paths]
        return "\n".join(lines)


def render_diff(fleet: Fleet, app_name: str, env: str, from_version: str, to_version: str, helm: Helm,
                workdir: Path | str | None = None, sources: dict[str, Path] | None = None) -> RenderDiff:
    sources = base_sources() if sources is None else sources
    check_base_version(from_version, sources)
    check_base_version(to_version, sources)
    app = fleet.app(app_name, env)
    with tempfile.TemporaryDirectory(prefix="drills-render-") as tmp:
        wd = Path(workdir) if workdir else Path(tmp)
        before = render_app(fleet, app, from_version, helm, wd / "from", sources)
        after = render_app(fleet, app, to_version, helm, wd / "to", sources)
    return RenderDiff(app.name, env, from_version, to_version,
                      diff_objects(before.objects, after.objects, (from_version, to_version)))
