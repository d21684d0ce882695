"""Lane B's checks on the fleet, without traffic (brief §9.4, §14.3): render equivalence of two base versions,
publishing a base version alone (merge-alone), and the propagation of a bump to one service."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..charts.fleet import STEPS_PATH, Fleet, Render, Workspace, base_sources, check_base_version, render_app
from ..charts.helm import Helm, Registry, publish
from ..charts.renderdiff import RenderDiff, diff_objects, within

BASE_REPOSITORY = "charts/base"


@dataclass
class AppEquivalence:
    app: str
    steps_declared_at: str | None
    expected: list[str]
    changed: list[str]
    chart_version_only: list[str]
    unexpected: list[str]
    missing: list[str]
    steps: dict[str, dict]
    steps_problems: list[str]

    @property
    def inheritor(self) -> bool:
        return self.steps_declared_at is None

    @property
    def ok(self) -> bool:
        return not (self.unexpected or self.missing or self.steps_problems)


@dataclass
class Equivalence:
    env: str
    from_version: str
    to_version: str
    apps: list[AppEquivalence]

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.apps)

    @property
    def unexpected(self) -> list[str]:
        return [r for a in self.apps for r in a.unexpected]

    def describe(self) -> str:
        bad = [a for a in self.apps if not a.ok]
        if not bad:
            return (f"{self.env}: {self.from_version} -> {self.to_version}: inheritors change only "
                    f"{STEPS_PATH} (final setWeight 100 removed), every other app is unchanged")
        parts = []
        for a in bad:
            bits = []
            if a.unexpected:
                bits.append("unexpected " + ", ".join(a.unexpected))
            if a.missing:
                bits.append("missing " + ", ".join(a.missing))
            bits += a.steps_problems
            parts.append(f"{a.app}: " + "; ".join(bits))
        return f"{self.env}: {self.from_version} -> {self.to_version}: " + " | ".join(parts)

    def to_dict(self) -> dict:
        return {"env": self.env, "from": self.from_version, "to": self.to_version, "ok": self.ok,
                "apps": [{**a.__dict__, "inheritor": a.inheritor, "ok": a.ok} for a in self.apps]}


def _final_weight_removed(before: Any, after: Any) -> str | None:
    if not isinstance(before, list) or not before:
        return f"steps before are {before!r}, expected a list ending in setWeight 100"
    if before[-1] != {"setWeight": 100}:
        return f"last step before is {before[-1]!r}, not setWeight 100"
    if after != before[:-1]:
        return f"steps after are {after!r}, expected {before[:-1]!r}"
    return None


def check_equivalence(fleet: Fleet, env: str, from_version: str, to_version: str, helm: Helm,
                      workdir: Path | str, sources: dict[str, Path] | None = None) -> Equivalence:
    """Render every app of `env` with both base versions; inheritors must change exactly the Rollout's
    canary steps (final setWeight 100 removed), every other app nothing, chart-version restatements aside."""
    sources = base_sources() if sources is None else sources
    results = []
    for app in fleet.apps(env):
        before = render_app(fleet, app, from_version, helm, Path(workdir) / "from", sources)
        after = render_app(fleet, app, to_version, helm, Path(workdir) / "to", sources)
        changes = diff_objects(before.objects, after.objects, (from_version, to_version))
        declared = fleet.steps_declared_at(app)
        rollouts = [k for k in before.objects if k.startswith("Rollout/")]
        expected = [f"{k}:{STEPS_PATH}" for k in rollouts] if declared is None else []
        real = [c.ref for c in changes if not c.chart_version]
        unexpected = [r for r in real if not any(within(r, e) for e in expected)]
        missing = [e for e in expected if not any(within(r, e) for r in real)]
        steps, problems = {}, []
        for k in rollouts:
            s0 = before.objects[k]["spec"]["strategy"]["canary"].get("steps")
            s1 = (after.objects.get(k) or {}).get("spec", {}).get("strategy", {}).get("canary", {}).get("steps")
            steps[k] = {"from": s0, "to": s1}
            if declared is None:
                p = _final_weight_removed(s0, s1)
                if p:
                    problems.append(f"{k}: {p}")
        results.append(AppEquivalence(app.name, declared, expected, real,
                                      [c.ref for c in changes if c.chart_version], unexpected, missing,
                                      steps, problems))
    return Equivalence(env, from_version, to_version, results)


def inheritors(fleet: Fleet, env: str, helm: Helm, workdir: Path | str, version: str,
               sources: dict[str, Path] | None = None) -> list[str]:
    """Apps that declare no canary steps of their own and render a Rollout (with base `version`)."""
    out = []
    for app in fleet.apps(env):
        if fleet.steps_declared_at(app) is None:
            r = render_app(fleet, app, version, helm, workdir, sources)
            if any(k.startswith("Rollout/") for k in r.objects):
                out.append(app.name)
    return out


def ensure_published(helm: Helm, registry: Registry, version: str, workdir: Path | str,
                     sources: dict[str, Path] | None = None) -> dict | None:
    """Publish base `version` (helm package + helm push) unless the registry already holds it."""
    src = check_base_version(version, sources)
    if version.replace("+", "_") in registry.tags(BASE_REPOSITORY):
        return None
    return publish(helm, src, registry, Path(workdir) / "packages")


@dataclass
class FleetChange:
    """What re-rendering a whole environment showed after one action (publish, bump)."""
    env: str
    action: str
    pinned_before: dict[str, str]
    pinned_after: dict[str, str]
    vendored_before: dict[str, str]
    vendored_after: dict[str, str]
    diffs: dict[str, RenderDiff]
    expected_changed: list[str]
    registry_tags: list[str] = field(default_factory=list)
    published: dict | None = None
    precondition: str | None = None   # why the action could not show what it should

    @property
    def changed_apps(self) -> list[str]:
        return sorted(a for a, d in self.diffs.items() if d.changes)

    @property
    def ok(self) -> bool:
        return self.precondition is None and self.changed_apps == sorted(self.expected_changed)

    def describe(self) -> str:
        if self.precondition:
            return f"{self.env}: {self.action}: {self.precondition}"
        lines = [f"{self.env}: {self.action}: changed apps {self.changed_apps or 'none'} "
                 f"(expected {sorted(self.expected_changed) or 'none'})"]
        for a in self.changed_apps:
            d = self.diffs[a]
            lines.append(f"  {a}: changed {[c.ref for c in d.real]}; "
                         f"chart-version only {[c.ref for c in d.chart_version]}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"env": self.env, "action": self.action, "ok": self.ok, "precondition": self.precondition,
                "changed_apps": self.changed_apps, "expected_changed": sorted(self.expected_changed),
                "published": self.published,
                "pinned_before": self.pinned_before, "pinned_after": self.pinned_after,
                "vendored_before": self.vendored_before, "vendored_after": self.vendored_after,
                "registry_tags": self.registry_tags,
                "diffs": {a: d.to_dict() for a, d in self.diffs.items()}}


def _render_env(ws: Workspace, env: str, update: bool) -> dict[str, Render]:
    out = {}
    for app in ws.apps(env):
        if update:
            ws.update(app)
        out[app.name] = ws.render(app)
    return out


def _fleet_change(ws: Workspace, env: str, action: str, before: dict[str, Render], after: dict[str, Render],
                  pinned_before: dict[str, str], registry: Registry, expected: list[str]) -> FleetChange:
    diffs = {}
    for name in before:
        versions = (before[name].base_version, after[name].base_version)
        diffs[name] = RenderDiff(name, env, *versions,
                                 changes=diff_objects(before[name].objects, after[name].objects, versions))
    return FleetChange(env, action, pinned_before, {a.name: ws.pinned(a) for a in ws.apps(env)},
                       {n: r.base_version for n, r in before.items()},
                       {n: r.base_version for n, r in after.items()}, diffs, expected,
                       registry.tags(BASE_REPOSITORY))


def check_merge_alone(fleet: Fleet, env: str, version: str, helm: Helm, registry: Registry,
                      workdir: Path | str, sources: dict[str, Path] | None = None) -> FleetChange:
    """Publish base `version` to the registry without bumping any service, re-run `helm dependency update`
    for every app against the registry, and compare every render with the one before the publish."""
    ws = Workspace(fleet, Path(workdir) / "fleet", helm, registry.url, sources)
    pinned = {a.name: ws.pinned(a) for a in ws.apps(env)}
    for v in sorted(set(pinned.values())):
        ensure_published(helm, registry, v, workdir, sources)
    before = _render_env(ws, env, update=True)
    published = ensure_published(helm, registry, version, workdir, sources)
    after = _render_env(ws, env, update=True)
    res = _fleet_change(ws, env, f"publish base {version}", before, after, pinned, registry, [])
    res.published = published
    if published is None:
        res.precondition = f"base {version} was already in the registry before the step"
    elif version in pinned.values():
        res.precondition = f"a service already pins base {version}"
    return res


def check_propagation(fleet: Fleet, env: str, service: str, version: str, helm: Helm, registry: Registry,
                      workdir: Path | str, sources: dict[str, Path] | None = None) -> FleetChange:
    """Bump one service to base `version` (Chart.yaml edit + `helm dependency update` against the registry)
    and compare every app's render with the one before the bump."""
    ensure_published(helm, registry, version, workdir, sources)
    ws = Workspace(fleet, Path(workdir) / "fleet", helm, registry.url, sources)
    pinned = {a.name: ws.pinned(a) for a in ws.apps(env)}
    before = _render_env(ws, env, update=True)
    ws.bump(ws.fleet.app(service, env), version)
    after = _render_env(ws, env, update=False)
    res = _fleet_change(ws, env, f"bump {service} to base {version}", before, after, pinned, registry, [service])
    if pinned.get(service) == version:
        res.precondition = f"{service} already pinned base {version}"
    return res
