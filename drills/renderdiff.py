"""Render fleet apps with the real helm, normalise the manifests, diff two renders; lane B's checks.

A *fleet* is a folder shaped like the seed's GitOps repositories: service charts that depend on the platform
`base` chart pinned by version, value files in layers, and per environment an ArgoCD-Application-like list
(`apps/<env>.yaml`) naming each app's chart, release, namespace and valueFiles in order.  Fixtures are never
modified: every render happens in a working copy (`Workspace`).

Paths in a diff are JSON-pointer-like: ``Rollout/checkout:spec.strategy.canary.steps``; a map key that holds
a dot or a bracket is written in brackets (``metadata.labels[helm.sh/chart]``), a list element as ``[i]``.
Lists of different lengths are reported at the list itself (Helm replaces lists whole).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import config
from .helm import ChartInputError, Helm, HelmError, Registry, copy_tree, publish

REPOSITORY_PLACEHOLDER = "${BASE_REPOSITORY}"
STEPS_PATH = "spec.strategy.canary.steps"
BASE = "base"


# --- YAML with file and line ----------------------------------------------------------------------
def _yaml_error(path: Path, e: yaml.YAMLError) -> ChartInputError:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    if mark is not None:
        return ChartInputError(f"{path}:{mark.line + 1}: not valid YAML: {problem}")
    return ChartInputError(f"{path}: not valid YAML: {problem}")


def load_yaml_file(path: Path | str, what: str = "file") -> Any:
    """One YAML document; ChartInputError naming file and line when missing or not YAML."""
    path = Path(path)
    if not path.is_file():
        raise ChartInputError(f"{path}: {what} does not exist")
    text = path.read_text()
    try:
        docs = [d for d in yaml.safe_load_all(text)]
    except yaml.YAMLError as e:
        raise _yaml_error(path, e) from None
    docs = [d for d in docs if d is not None]
    if len(docs) > 1:
        raise ChartInputError(f"{path}: {what} holds {len(docs)} YAML documents, expected one")
    return docs[0] if docs else None


def _compose(path: Path) -> list[yaml.Node]:
    try:
        return [n for n in yaml.compose_all(path.read_text()) if n is not None]
    except yaml.YAMLError as e:
        raise _yaml_error(path, e) from None


def _child(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return v
    return None


def _walk(node: yaml.Node | None, keys: list[str]) -> yaml.Node | None:
    for k in keys:
        node = _child(node, k)
        if node is None:
            return None
    return node


def load_values_file(path: Path | str) -> dict:
    data = load_yaml_file(path, "values file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ChartInputError(f"{path}:1: values file must be a YAML mapping, found {type(data).__name__}")
    return data


def find_key_line(path: Path | str, keys: list[str]) -> int | None:
    """1-based line where the nested key `keys` is set in a YAML file, None when it is not."""
    for doc in _compose(Path(path)):
        node = doc
        for k in keys[:-1]:
            node = _child(node, k)
        if isinstance(node, yaml.MappingNode):
            for kn, _v in node.value:
                if isinstance(kn, yaml.ScalarNode) and kn.value == keys[-1]:
                    return kn.start_mark.line + 1
    return None


# --- the fleet --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class App:
    name: str                    # release name, the service's name
    env: str
    application: str             # the Application's metadata.name
    chart: str                   # chart folder, relative to the fleet root
    namespace: str
    value_files: tuple[str, ...]  # relative to the fleet root, in order
    source: Path                 # apps/<env>.yaml
    value_file_lines: tuple[int, ...]


class Fleet:
    def __init__(self, root: Path | str | None = None, apps_dir: str = "apps"):
        self.root = Path(root or config.fixtures_dir() / "fleet").resolve()
        self.apps_dir = apps_dir
        if not self.root.is_dir():
            raise ChartInputError(f"{self.root}: fleet folder does not exist")

    def envs(self) -> list[str]:
        return sorted(p.stem for p in (self.root / self.apps_dir).glob("*.yaml"))

    def apps(self, env: str) -> list[App]:
        path = self.root / self.apps_dir / f"{env}.yaml"
        if not path.is_file():
            raise ChartInputError(f"{path}: unknown environment {env!r} (known: {', '.join(self.envs()) or 'none'})")
        apps = []
        for doc in _compose(path):
            line = doc.start_mark.line + 1
            data = yaml.safe_load(yaml.serialize(doc))
            try:
                helm = data["spec"]["source"]["helm"]
                files_node = _walk(doc, ["spec", "source", "helm", "valueFiles"])
                app = App(
                    name=str(helm["releaseName"]), env=env, application=str(data["metadata"]["name"]),
                    chart=str(data["spec"]["source"]["path"]),
                    namespace=str(data["spec"]["destination"]["namespace"]),
                    value_files=tuple(str(v) for v in helm.get("valueFiles") or ()),
                    source=path,
                    value_file_lines=tuple(n.start_mark.line + 1 for n in getattr(files_node, "value", []) or []),
                )
            except (KeyError, TypeError) as e:
                raise ChartInputError(f"{path}:{line}: Application lacks {e} (needs metadata.name, "
                                      f"spec.source.path, spec.source.helm.releaseName, spec.destination.namespace)")
            apps.append(app)
        return apps

    def app(self, name: str, env: str) -> App:
        apps = self.apps(env)
        for a in apps:
            if name in (a.name, a.application):
                return a
        raise ChartInputError(f"{self.root / self.apps_dir / (env + '.yaml')}: no app {name!r} in {env} "
                              f"(known: {', '.join(a.name for a in apps)})")

    def chart_dir(self, app: App) -> Path:
        return self.root / app.chart

    def value_paths(self, app: App) -> list[Path]:
        """The app's valueFiles in order, each checked: it exists and it is a YAML mapping."""
        out = []
        for i, rel in enumerate(app.value_files):
            p = self.root / rel
            line = app.value_file_lines[i] if i < len(app.value_file_lines) else 0
            if not p.is_file():
                raise ChartInputError(f"{app.source}:{line}: valueFile {rel} of app {app.name} ({app.env}) "
                                      f"does not exist ({p})")
            load_values_file(p)
            out.append(p)
        return out

    def steps_declared_at(self, app: App) -> str | None:
        """`file:line` of the last layer that declares base canary steps for this app, None for an inheritor."""
        found = None
        keys = [BASE, "rollout", "canary", "steps"]
        for p in [self.chart_dir(app) / "values.yaml", *self.value_paths(app)]:
            if p.is_file():
                line = find_key_line(p, keys)
                if line:
                    found = f"{p.relative_to(self.root)}:{line}"
        return found


def base_sources(root: Path | str | None = None) -> dict[str, Path]:
    """Base chart source folders by the version their Chart.yaml declares."""
    root = Path(root or config.fixtures_dir() / "charts" / BASE)
    out = {}
    for chart_yaml in sorted(root.glob("*/Chart.yaml")):
        meta = load_yaml_file(chart_yaml, "Chart.yaml") or {}
        if meta.get("name") == BASE:
            out[str(meta["version"])] = chart_yaml.parent
    return out


def check_base_version(version: str, sources: dict[str, Path] | None = None) -> Path:
    sources = base_sources() if sources is None else sources
    if version not in sources:
        raise ChartInputError(f"unknown base chart version {version!r} (known: {', '.join(sources) or 'none'})")
    return sources[version]


# --- Chart.yaml: the base dependency ----------------------------------------------------------------
@dataclass
class Dependency:
    chart_yaml: Path
    version: str
    repository: str
    version_line: int


def _base_dep_nodes(chart_yaml: Path):
    docs = _compose(chart_yaml)
    deps = _child(docs[0], "dependencies") if docs else None
    for item in getattr(deps, "value", []) or []:
        name = _child(item, "name")
        if isinstance(name, yaml.ScalarNode) and name.value == BASE:
            return item
    raise ChartInputError(f"{chart_yaml}:1: no dependency named {BASE!r}")


def base_dependency(chart_dir: Path | str) -> Dependency:
    chart_yaml = Path(chart_dir) / "Chart.yaml"
    if not chart_yaml.is_file():
        raise ChartInputError(f"{chart_yaml}: Chart.yaml does not exist")
    item = _base_dep_nodes(chart_yaml)
    v, r = _child(item, "version"), _child(item, "repository")
    if v is None or r is None:
        raise ChartInputError(f"{chart_yaml}:{item.start_mark.line + 1}: base dependency needs version and repository")
    return Dependency(chart_yaml, v.value, r.value, v.start_mark.line + 1)


def set_base_dependency(chart_dir: Path | str, version: str | None = None, repository: str | None = None) -> None:
    """Edit Chart.yaml in place (text edit of the scalar, the rest of the file untouched)."""
    chart_yaml = Path(chart_dir) / "Chart.yaml"
    for key, value in (("version", version), ("repository", repository)):
        if value is None:
            continue
        text = chart_yaml.read_text()
        node = _child(_base_dep_nodes(chart_yaml), key)
        rendered = json.dumps(value) if node.style in ('"', "'") or key == "repository" else value
        text = text[:node.start_mark.index] + rendered + text[node.end_mark.index:]
        chart_yaml.write_text(text)


# --- normalise and diff -------------------------------------------------------------------------------
def _sorted(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _sorted(obj[k]) for k in sorted(obj, key=str)}
    if isinstance(obj, list):
        return [_sorted(v) for v in obj]
    return obj


def normalise(text: str) -> dict[str, dict]:
    """Rendered manifests -> {"Kind/name": object} with keys in stable (sorted) order."""
    objs: dict[str, dict] = {}
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        if not isinstance(doc, dict) or "kind" not in doc:
            raise HelmError(f"rendered document is not a Kubernetes object: {str(doc)[:200]}")
        key = f"{doc['kind']}/{(doc.get('metadata') or {}).get('name', '')}"
        if key in objs:
            ns = (doc.get("metadata") or {}).get("namespace")
            key = f"{key}@{ns}" if ns else f"{key}#{sum(k.startswith(key) for k in objs)}"
        objs[key] = _sorted(doc)
    return {k: objs[k] for k in sorted(objs)}


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


# --- working copies and renders ---------------------------------------------------------------------
@dataclass
class Render:
    app: str
    env: str
    base_version: str           # the base package vendored into charts/ when rendered
    objects: dict[str, dict]
    text: str


def _is_loopback_oci(repo: str) -> bool:
    return bool(re.match(r"^oci://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?/", repo))


class Workspace:
    """A working copy of a fleet.  `repository` is the OCI repository the base dependency comes from
    (e.g. a Registry's url); None means offline: each chart's dependency points at the base chart source
    folder of its pinned version (file://)."""

    def __init__(self, fleet: Fleet, dest: Path | str, helm: Helm, repository: str | None = None,
                 sources: dict[str, Path] | None = None):
        self.helm = helm
        self.repository = repository
        self.sources = base_sources() if sources is None else sources
        copy_tree(fleet.root, dest)
        self.fleet = Fleet(dest, fleet.apps_dir)
        for chart_yaml in Path(dest).rglob("Chart.yaml"):
            text = chart_yaml.read_text()
            if REPOSITORY_PLACEHOLDER not in text:
                continue
            dep = base_dependency(chart_yaml.parent)
            set_base_dependency(chart_yaml.parent, repository=self._repo_for(dep.version, dep))

    def _repo_for(self, version: str, dep: Dependency | None = None) -> str:
        if self.repository:
            return self.repository
        if version not in self.sources:
            where = f"{dep.chart_yaml}:{dep.version_line}: " if dep else ""
            raise ChartInputError(f"{where}unknown base chart version {version!r} "
                                  f"(known: {', '.join(self.sources) or 'none'})")
        return "file://" + str(self.sources[version].resolve())

    def apps(self, env: str) -> list[App]:
        return self.fleet.apps(env)

    def chart_dir(self, app: App) -> Path:
        return self.fleet.chart_dir(app)

    def pinned(self, app: App) -> str:
        return base_dependency(self.chart_dir(app)).version

    def set_base_version(self, app: App, version: str) -> None:
        """The Chart.yaml edit of a bump (the dependency's version; offline also its file:// source)."""
        repo = None if self.repository else self._repo_for(version)
        set_base_dependency(self.chart_dir(app), version=version, repository=repo)

    def update(self, app: App) -> str:
        """`helm dependency update` of the app's chart against its repository."""
        chart = self.chart_dir(app)
        dep = base_dependency(chart)
        try:
            return self.helm.dependency_update(chart, plain_http=_is_loopback_oci(dep.repository))
        except HelmError as e:
            msg = str(e)
            if re.search(r"not found|can't get a valid version|no chart version|manifest unknown|"
                         r"does not satisfy|no such file|failed to fetch", msg, re.I):
                raise ChartInputError(f"{dep.chart_yaml}:{dep.version_line}: base chart version {dep.version} "
                                      f"not available from {dep.repository}: {msg}") from None
            raise

    def bump(self, app: App, version: str) -> str:
        """A service's bump: Chart.yaml edit plus `helm dependency update`."""
        self.set_base_version(app, version)
        return self.update(app)

    def vendored(self, app: App) -> str | None:
        pkgs = sorted((self.chart_dir(app) / "charts").glob(f"{BASE}-*.tgz"))
        return pkgs[0].name[len(BASE) + 1:-4] if pkgs else None

    def render(self, app: App) -> Render:
        values = self.fleet.value_paths(app)
        if (self.chart_dir(app) / "values.yaml").is_file():
            load_values_file(self.chart_dir(app) / "values.yaml")
        if self.vendored(app) is None:
            self.update(app)
        text = self.helm.template(self.chart_dir(app), app.name, app.namespace, values)
        return Render(app.name, app.env, self.vendored(app) or "", normalise(text), text)


def render_app(fleet: Fleet, app: App, version: str, helm: Helm, workdir: Path | str,
               sources: dict[str, Path] | None = None) -> Render:
    """Render one app (valueFiles in order) with base `version` from its source folder (offline)."""
    sources = base_sources() if sources is None else sources
    check_base_version(version, sources)
    fleet.value_paths(app)
    ws = Workspace(fleet, Path(workdir) / f"{app.name}-{app.env}-{version}", helm, None, sources)
    wapp = ws.fleet.app(app.name, app.env)
    ws.set_base_version(wapp, version)
    ws.update(wapp)
    return ws.render(wapp)


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


# --- lane B checks ----------------------------------------------------------------------------------
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
    if version.replace("+", "_") in registry.tags(f"charts/{BASE}"):
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
                       registry.tags(f"charts/{BASE}"))


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


# --- `drills render-diff` ---------------------------------------------------------------------------
def add_render_diff_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("render-diff", help="render an app with two base chart versions and list what changes")
    p.add_argument("--app", required=True, help="the app (release name or Application name)")
    p.add_argument("--env", required=True, help="environment: the apps/<env>.yaml list it is declared in")
    p.add_argument("--from", dest="from_version", required=True, help="base chart version to render first")
    p.add_argument("--to", dest="to_version", required=True, help="base chart version to compare with")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--fleet", default=None, help="fleet folder (default: fixtures/fleet)")
    p.add_argument("--apps-dir", default="apps", help="folder of the per-environment app lists, in the fleet")
    p.add_argument("--charts", default=None, help="base chart source folders (default: fixtures/charts/base)")
    p.set_defaults(func=cmd_render_diff)
    return p


def cmd_render_diff(args) -> int:
    from .errors import BadInput
    try:
        sources = base_sources(args.charts)
        fleet = Fleet(args.fleet, args.apps_dir)
        with Helm() as helm:
            d = render_diff(fleet, args.app, args.env, args.from_version, args.to_version, helm, sources=sources)
    except ChartInputError as e:
        raise BadInput(str(e)) from None
    except HelmError as e:
        print(f"drills: {e}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps(d.to_dict(), indent=2, default=str) if args.json else d.format())
    return 0


# --- ledger rows --------------------------------------------------------------------------------------
def record_step(ledger, step: str, assertion: str, expected, observed, ok: bool, evidence: dict,
                **details) -> dict:
    """One lane B ledger row; the full result goes to <run_dir>/lane_b/<step>.json as evidence."""
    from .ledger import FAIL, PASS
    path = Path(ledger.run_dir) / "lane_b" / f"{step}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(evidence, indent=2, default=str))
    return ledger.record("b", step, assertion, expected, observed, PASS if ok else FAIL,
                         evidence=str(path), **details)
