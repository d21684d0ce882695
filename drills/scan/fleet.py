"""The fleet layout lane B renders (service charts on the base chart, value layers, ArgoCD-like app lists per
environment), rendered with the real helm and scanned.

Renders are deduplicated by a digest of the chart (every file, the vendored base package included), the
values files in order, the release name and the namespace, and run in parallel.  Each Rollout is traced back
to the value layer that declares its steps (the last layer setting ``<component>.rollout.canary.steps``, or
the base chart's own values.yaml for an inheritor), so a lint finding points at the offending step's line.
"""
from __future__ import annotations

import hashlib
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from ..core import inputs
from ..core.errors import BadInput
from ..charts.fleet import BASE, Fleet, Workspace, base_dependency, load_values_file
from ..charts.helm import ChartInputError, Helm, HelmError
from ..core.procs import kill_running
from .model import ScanInputError
from .readers import ReadResult, display_path, rollouts_of
from .yamlstream import objects

STEPS_KEYS = ["rollout", "canary", "steps"]


class Progress:
    """A progress bar on stderr (a line per 10 % when stderr is not a terminal)."""

    def __init__(self, total: int, what: str, stream=None):
        self.total, self.what, self.done = total, what, 0
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self._last_decile = -1

    def step(self, n: int = 1) -> None:
        with self.lock:
            self.done += n
            frac = self.done / self.total if self.total else 1.0
            bar = "#" * int(frac * 30)
            line = (f"{self.what} [{bar:<30}] {self.done}/{self.total} {frac:4.0%} "
                    f"{time.monotonic() - self.t0:5.1f}s")
            if self.tty:
                self.stream.write("\r" + line + ("\n" if self.done >= self.total else ""))
                self.stream.flush()
            elif int(frac * 10) != self._last_decile or self.done >= self.total:
                self._last_decile = int(frac * 10)
                print(line, file=self.stream, flush=True)


def _digest_tree(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        with open(f, "rb") as fh:           # in pieces: a chart's file is hashed, never held whole, whatever its size
            for piece in iter(lambda: fh.read(1 << 20), b""):
                h.update(piece)
        h.update(b"\0")
    return h.hexdigest()


class _ValuesIndex:
    """Lines of `<prefix>.rollout.canary.steps` items in values files (each file composed once)."""

    def __init__(self):
        self.nodes: dict[str, yaml.Node | None] = {}
        self.cache: dict[tuple, tuple | None] = {}
        self.lock = threading.Lock()

    def _node(self, path: Path):
        key = str(path)
        if key not in self.nodes:
            try:           # read under the input budget (the layers were checked already)
                docs = inputs.compose_all(inputs.read_text(path, inputs.FILE_BYTES, "values file"), path)
                self.nodes[key] = docs[0] if docs else None
            except (OSError, BadInput):
                self.nodes[key] = None
        return self.nodes[key]

    def steps_at(self, path: Path, prefix: list[str]) -> tuple[list, list, int] | None:
        key = (str(path), tuple(prefix))
        with self.lock:
            if key not in self.cache:
                self.cache[key] = self._find(self._node(path), prefix, path)
            return self.cache[key]

    @staticmethod
    def _find(node, prefix: list[str], path=None):
        key_node = None
        for k in prefix + STEPS_KEYS:
            nxt = None
            if isinstance(node, yaml.MappingNode):
                for kn, vn in node.value:
                    if isinstance(kn, yaml.ScalarNode) and kn.value == k:
                        nxt = (kn, vn)
            if nxt is None:
                return None
            key_node, node = nxt
        if not isinstance(node, yaml.SequenceNode):
            return [], [], key_node.start_mark.line + 1
        try:
            value = inputs.construct(node, path)
        except BadInput:
            return None
        return (value if isinstance(value, list) else [], [n.start_mark.line + 1 for n in node.value],
                key_node.start_mark.line + 1)


def _component(template: str | None, chart: str) -> list[str]:
    """Values prefix of a rendered object from helm's `# Source:` path: `<chart>/charts/<sub>/...` -> [sub]."""
    parts = (template or "").split("/")
    prefix = []
    while len(parts) > 2 and parts[1] == "charts":
        prefix.append(parts[2])
        parts = parts[2:]
    return prefix


def _trace_steps(ro, layers: list[tuple[Path, list[str]]], index: _ValuesIndex) -> None:
    """Point ro.steps_file/step_lines at the last layer declaring its steps (suffix-matched)."""
    for path, prefix in reversed(layers):
        hit = index.steps_at(path, prefix)
        if hit is None:
            continue
        declared, lines, key_line = hit
        ro.steps_file, ro.steps_line = display_path(path), key_line
        off = len(ro.steps) - len(declared)
        if declared == ro.steps[off:] and off >= 0:
            ro.step_lines = [None] * off + lines
        else:
            ro.step_lines = [None] * len(ro.steps)
        return


class FleetScan:
    def __init__(self, root: str | Path, envs: list[str] | None, apps: list[str] | None, controller_version: str,
                 helm: Helm, workers: int = 2, progress_stream=None, sources: dict | None = None):
        try:
            self.fleet = Fleet(root)
        except ChartInputError as e:
            raise ScanInputError(str(e)) from None
        self.envs = envs or self.fleet.envs()
        if not self.envs:
            raise ScanInputError(f"{self.fleet.root}: no apps/<env>.yaml app lists")
        self.app_filter = set(apps or [])
        self.version = controller_version
        self.helm = helm
        self.workers = max(1, workers)
        self.progress_stream = progress_stream
        self.sources = sources
        self.index = _ValuesIndex()
        self.pinned: dict[Path, str] = {}
        self.checked: set[Path] = set()
        self.stats = {"apps": 0, "renders": 0, "unique_renders": 0, "charts": 0}

    def _apps(self):
        """The apps of the chosen environments, read from the user's fleet (messages name its files)."""
        out = []
        for env in self.envs:
            for a in self.fleet.apps(env):
                if self.app_filter and not ({a.name, a.application} & self.app_filter):
                    continue
                out.append(a)
        if self.app_filter and not out:
            raise ScanInputError(f"no app named {', '.join(sorted(self.app_filter))} in {', '.join(self.envs)}")
        return out

    def _value_paths(self, a) -> list[Path]:
        """An app's valueFiles in order; each file is checked once (Fleet.value_paths' checks: it exists, it is
        one YAML mapping), however many apps share it."""
        paths = [self.fleet.root / rel for rel in a.value_files]
        if any(not p.is_file() for p in paths):
            return self.fleet.value_paths(a)           # raises, naming the app list's line
        for p in paths:
            if p not in self.checked:
                load_values_file(p)
                self.checked.add(p)
        return paths

    def run(self) -> ReadResult:
        res = ReadResult()
        apps = self._apps()
        values = {a: self._value_paths(a) for a in apps}
        with tempfile.TemporaryDirectory(prefix="drills-scan-") as tmp:
            work = Path(tmp) / "fleet"
            try:
                ws = Workspace(self.fleet, work, self.helm, None, self.sources)
            except ChartInputError as e:
                raise ScanInputError(str(e).replace(str(work), str(self.fleet.root))) from None
            charts = sorted({ws.chart_dir(a) for a in apps})
            by_chart = {c: next(a for a in apps if ws.chart_dir(a) == c) for c in charts}
            prog = Progress(len(charts) + len(apps), f"fleet {','.join(self.envs)}", self.progress_stream)
            chart_digest = {}

            def vendor(chart: Path):
                try:
                    ws.update(by_chart[chart])
                except ChartInputError as e:
                    raise ScanInputError(str(e).replace(str(work), str(self.fleet.root))) from None
                except HelmError as e:
                    raise ScanInputError(f"helm dependency update: {e}",
                                         display_path(self.fleet.root / chart.relative_to(work))) from None
                chart_digest[chart] = _digest_tree(chart)
                prog.step()
            self._each(vendor, charts)
            keys = {}
            for a in apps:
                h = hashlib.sha256(chart_digest[ws.chart_dir(a)].encode())
                for p in values[a]:
                    h.update(b"\0" + p.read_bytes())
                h.update(f"\0{a.name}\0{a.namespace}".encode())
                keys[a] = h.hexdigest()
            unique = {}
            for a in apps:
                unique.setdefault(keys[a], a)
            rendered: dict[str, str] = {}

            def render(key: str):
                a = unique[key]
                try:
                    rendered[key] = self.helm.template(ws.chart_dir(a), a.name, a.namespace, values[a])
                except HelmError as e:
                    raise ScanInputError(f"helm template of app {a.name} ({a.env}) failed: {e}",
                                         display_path(a.source)) from None
                prog.step(sum(1 for b in apps if keys[b] == key))
            self._each(render, list(unique))
            parsed = {k: objects(t, f"render of {unique[k].name}") for k, t in rendered.items()}
            for a in apps:
                self._collect(ws, a, values[a], parsed[keys[a]], res)
            self.stats.update(apps=len(apps), renders=len(apps), unique_renders=len(unique), charts=len(charts))
        return res

    def _each(self, fn, items: list) -> None:
        """``fn`` over ``items`` in the worker threads; a signal (or an error) cancels what has not started and kills
        the helm children under way, then waits for their threads: the command ends without running every queued
        render, and nothing still writes into the work tree when it is removed."""
        pool = ThreadPoolExecutor(self.workers)
        workers: set[int] = set()

        def one(item):
            workers.add(threading.get_ident())
            return fn(item)
        try:
            list(pool.map(one, items))
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            kill_running(workers)
            pool.shutdown(wait=True)
            raise
        pool.shutdown(wait=True)

    def _collect(self, ws: Workspace, a, value_paths: list[Path], objs, res: ReadResult) -> None:
        label = f"fleet:{a.env}/{a.name}"
        before = len(res.rollouts)
        rollouts_of(objs, label, self.version, default_namespace=a.namespace,
                    origin={"env": a.env, "app": a.name, "application": a.application,
                            "chart": a.chart, "apps_file": display_path(a.source)},
                    result=res)
        chart = ws.chart_dir(a)
        if chart not in self.pinned:
            self.pinned[chart] = base_dependency(chart).version
        pinned = self.pinned[chart]
        base_src = ws.sources.get(pinned)
        for ro in res.rollouts[before:]:
            prefix = _component(ro.origin.get("template"), Path(a.chart).name)
            comp = prefix[-1] if prefix else ""
            ro.origin["component"] = comp
            ro.origin["base_chart"] = pinned
            ro.source = f"{label}" + (f"/{comp}" if comp and comp != BASE else "")
            ro.file = ro.origin["apps_file"]
            ro.line = None
            layers: list[tuple[Path, list[str]]] = []
            if base_src is not None and prefix:
                layers.append((Path(base_src) / "values.yaml", []))
            chart_values = self.fleet.root / a.chart / "values.yaml"
            if chart_values.is_file():
                layers.append((chart_values, prefix))
            layers += [(p, prefix) for p in value_paths]
            ro.steps_file, ro.step_lines, ro.steps_line = None, [None] * len(ro.steps), None
            _trace_steps(ro, layers, self.index)
