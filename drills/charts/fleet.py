"""The fleet model: a folder shaped like the seed's GitOps repositories, rendered with the real helm.

Service charts depend on the platform ``base`` chart pinned by version; value files come in layers; per
environment an ArgoCD-Application-like list (``apps/<env>.yaml``) names each app's chart, release, namespace and
valueFiles in order.  Fixtures are never modified: every render happens in a working copy (``Workspace``).
Errors name the file and line (``path:line: what``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..core import config, inputs
from ..core.errors import BadInput
from .helm import ChartInputError, Helm, HelmError, copy_tree
from ..core.names import is_plain_name, plain_name

REPOSITORY_PLACEHOLDER = "${BASE_REPOSITORY}"
STEPS_PATH = "spec.strategy.canary.steps"
BASE = "base"


# --- YAML with file and line (read under the input budget, drills.core.inputs) -------------------------------
def _yaml_error(path: Path, e: BadInput) -> ChartInputError:
    return ChartInputError(str(e) if str(path) in str(e) else f"{path}: {e}")


def _text(path: Path, what: str) -> str:
    try:
        return inputs.read_text(path, inputs.FILE_BYTES, what)
    except BadInput as e:
        raise _yaml_error(path, e) from None
    except OSError as e:
        raise ChartInputError(f"{path}: cannot read the {what} ({e.strerror or e})") from None


def load_yaml_file(path: Path | str, what: str = "file") -> Any:
    """One YAML document; ChartInputError naming file and line when missing or not YAML."""
    path = Path(path)
    if not path.is_file():
        raise ChartInputError(f"{path}: {what} does not exist")
    try:
        return inputs.load_one(_text(path, what), path, what)
    except ChartInputError:
        raise
    except BadInput as e:
        raise _yaml_error(path, e) from None


def _compose(path: Path) -> list[yaml.Node]:
    try:
        return inputs.compose_all(_text(path, "file"), path)
    except ChartInputError:
        raise
    except BadInput as e:
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
        path = self.root / self.apps_dir / f"{plain_name(env, 'environment')}.yaml"
        if not path.is_file():
            raise ChartInputError(f"{path}: unknown environment {env!r} (known: {', '.join(self.envs()) or 'none'})")
        apps = []
        for doc in _compose(path):
            line = doc.start_mark.line + 1
            try:
                data = inputs.construct(doc, path)
            except BadInput as e:             # composed, but not constructible (e.g. an unknown tag)
                raise _yaml_error(path, e) from None
            try:
                helm = data["spec"]["source"]["helm"]
                if not isinstance(helm.get("valueFiles") or [], list):
                    raise TypeError("spec.source.helm.valueFiles is not a list")
                files_node = _walk(doc, ["spec", "source", "helm", "valueFiles"])
                app = App(
                    name=str(helm["releaseName"]), env=env, application=str(data["metadata"]["name"]),
                    chart=str(data["spec"]["source"]["path"]),
                    namespace=str(data["spec"]["destination"]["namespace"]),
                    value_files=tuple(str(v) for v in helm.get("valueFiles") or ()),
                    source=path,
                    value_file_lines=tuple(n.start_mark.line + 1 for n in getattr(files_node, "value", []) or []),
                )
            except (KeyError, TypeError, AttributeError) as e:
                raise ChartInputError(f"{path}:{line}: Application lacks {e} (needs metadata.name, "
                                      f"spec.source.path, spec.source.helm.releaseName, spec.destination.namespace)")
            if not is_plain_name(app.name):        # it names the app's render folder
                raise ChartInputError(f"{path}:{line}: releaseName {app.name[:80]!r} is not a plain name (letters, "
                                      f"digits and ._+-, starting with a letter or a digit)")
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
        if isinstance(meta, dict) and meta.get("name") == BASE and meta.get("version") is not None:
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
        text = _text(chart_yaml, "Chart.yaml")
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
    try:
        docs = inputs.load_all(text, "the rendered manifests")
    except BadInput as e:
        raise HelmError(str(e)) from None
    for doc in docs:
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
            text = _text(chart_yaml, "Chart.yaml")
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
