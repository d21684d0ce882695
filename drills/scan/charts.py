"""Helm charts among the manifests: a folder that holds a ``Chart.yaml`` is rendered with the real helm
(drills.charts.helm.Helm: ``helm template`` with the chart's own values.yaml, then every ``--values`` file given, in
order) and its render is scanned; no file of a chart is ever read as a manifest (a template is not YAML).  A chart
inside a chart (``charts/<sub>``) is part of its parent's render.  A template file given by itself
(``<chart>/templates/rollout.yaml``) renders its chart and keeps the objects helm says came from it.

Findings sit on the template's own lines where helm's output allows it: each rendered document names its template
(``# Source: <chart>/templates/x.yaml``), and a rendered line that is, character for character, a line of that
template with no template action in it is taken to be that line (matched in order, so repeated lines map to
their own); a line helm computed (``{{ .Values.x }}``, ``toYaml``) has no template line, and a finding on it sits
on the template file.  A chart helm cannot render (a missing dependency, a template error) is a finding on its
Chart.yaml (or on the template and line helm names), and the scan goes on.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..charts.helm import Helm, HelmError
from .model import ScanInputError
from .readers import STDIN, ReadResult, display_path, manifest_paths, rollouts_of
from .yamlstream import objects
from ..core import inputs as budget     # the reader of user input (the name `inputs` is split's)

CHART_FILE = "Chart.yaml"
_SOURCE = re.compile(r"^# Source: (.+?)\s*$")
_RELEASE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,51}[a-z0-9])?$")
_HELM_AT = re.compile(r"([\w.+-]+(?:/charts/[\w.+-]+)*/templates/[^\s:()\"']+):(\d+)")


@dataclass
class ChartInput:
    root: Path                              # the folder with Chart.yaml
    only: str | None = None                 # a template path relative to root: keep only its objects
    release: str = "release-name"
    skipped: str | None = None              # why it is not rendered (a library chart)
    rendered: bool = False


def chart_root_of(path: Path) -> Path | None:
    """The chart folder a file belongs to (the nearest folder above it with a Chart.yaml), or None."""
    return next((parent for parent in Path(path).resolve().parents if (parent / CHART_FILE).is_file()), None)


def _chart(root: Path, only: str | None = None) -> ChartInput:
    try:        # the user's file: read under the input budget (size, depth, aliases); helm then says what is wrong
        meta = budget.load_yaml_file(root / CHART_FILE, budget.FILE_BYTES, CHART_FILE) or {}
    except (OSError, budget.InputError):
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    name = str(meta.get("name") or "")
    c = ChartInput(root, only, name if _RELEASE.match(name) else "release-name")
    if meta.get("type") == "library":
        c.skipped = "a library chart: helm does not render one on its own"
    return c


def split(inputs: list[str]) -> tuple[list[str], list[ChartInput]]:
    """(the manifest inputs with every chart's files taken out, the charts among them), in input order."""
    plain: list[str] = []
    charts: list[ChartInput] = []
    seen: set[Path] = set()

    def add(c: ChartInput):
        key = c.root.resolve()
        if c.only is None and key in seen:
            return
        seen.add(key)
        charts.append(c)
    for item in inputs:
        p = Path(item)
        if item == STDIN:
            plain.append(item)
            continue
        outer = chart_root_of(p / CHART_FILE if p.is_dir() else p)
        if p.is_dir() and (outer is not None):
            add(_chart(outer))
            continue
        if p.is_file() and outer is not None:
            rel = p.resolve().relative_to(outer)
            if rel.parts[0] in ("templates", "charts") or p.name == CHART_FILE:
                add(_chart(outer, None if p.name == CHART_FILE else rel.as_posix()))
                continue
        if not p.is_dir():
            plain.append(item)
            continue
        roots = sorted({f.parent for f in p.rglob(CHART_FILE) if f.is_file() and
                        not any(x.startswith(".") for x in f.relative_to(p).parts)})
        roots = [r for r in roots if not any(o != r and o in r.parents for o in roots)]
        if not roots:
            plain.append(item)
            continue
        plain += [f for f in manifest_paths([item]) if not any(r in Path(f).parents for r in roots)]
        for r in roots:
            add(_chart(r))
    return plain, charts


# --- from the render back to the templates ------------------------------------------------------------------
def _template_file(root: Path, source: str) -> Path | None:
    """`<chart>/templates/x.yaml` or `<chart>/charts/<sub>/templates/x.yaml` -> the file under ``root``."""
    parts = source.split("/")
    f = root.joinpath(*parts[1:]) if len(parts) > 1 else None
    return f if f is not None and f.is_file() else None


def line_map(render: str, root: Path) -> dict[int, tuple[str, int | None]]:
    """Render line -> (template as displayed, its line or None) for every line of a rendered document."""
    out: dict[int, tuple[str, int | None]] = {}
    texts: dict[Path, list[str]] = {}
    at: dict[Path, int] = {}
    cur: tuple[str, Path | None] | None = None
    for n, text in enumerate(render.splitlines(), 1):
        m = _SOURCE.match(text)
        if m:
            f = _template_file(root, m.group(1))
            cur = (display_path(f) if f else m.group(1), f)
            continue
        if cur is None:
            continue
        label, f = cur
        hit = None
        if f is not None and text.strip() and text.strip() != "---":
            if f not in texts:
                try:        # a template of the user's chart: under the input budget, else its lines stay unknown
                    texts[f] = budget.read_text(f, budget.FILE_BYTES, "chart template").splitlines()
                except (OSError, budget.InputError):
                    texts[f] = []
            lines = texts[f]
            want = text.rstrip()
            hit = next((i for i in range(at.get(f, 0), len(lines)) if lines[i].rstrip() == want
                        and "{{" not in lines[i]), None)
            if hit is not None:
                at[f] = hit + 1
        out[n] = (label, None if hit is None else hit + 1)
    return out


def _relocate(ro, where: dict) -> None:
    """A Rollout read from a render, put on its template's file and lines."""
    def line(n):
        return where.get(n, (None, None))[1] if n else None
    file = where.get(ro.line, (ro.file, None))[0]
    ro.file = ro.steps_file = file
    ro.line, ro.steps_line = line(ro.line), line(ro.steps_line)
    ro.step_lines = [line(n) for n in ro.step_lines]
    ro.lines = {k: line(v) for k, v in ro.lines.items() if line(v)}
    ro.source = f"{file}:{ro.line}" if ro.line else file


def _unreadable(e: ScanInputError, where: dict, fallback: str) -> ScanInputError:
    file, line = where.get(e.line, (fallback, None)) if e.line else (fallback, None)
    return ScanInputError(e.problem, file, line)


def _helm_error(c: ChartInput, e: HelmError) -> ScanInputError:
    msg = " ".join(str(e).split())
    m = _HELM_AT.search(msg)
    if m:
        f = _template_file(c.root, m.group(1))
        if f is not None:
            return ScanInputError(f"helm template failed: {msg[-400:]}", display_path(f), int(m.group(2)))
    return ScanInputError(f"helm template failed: {msg[-400:]}", display_path(c.root / CHART_FILE))


def scan_charts(charts: list[ChartInput], values: list[str], controller_version: str, helm: Helm | None = None,
                result: ReadResult | None = None) -> ReadResult:
    """Every chart rendered and its Rollouts read, on their templates' lines; what cannot be rendered or read is
    in ``unreadable``."""
    res = result or ReadResult()
    todo = [c for c in charts if c.skipped is None]
    if not todo:
        return res
    own = helm is None
    try:
        helm = helm or Helm()
    except HelmError as e:
        raise ScanInputError(str(e)) from None
    try:
        for c in todo:
            _one(c, values, controller_version, helm, res)
    finally:
        if own:
            helm.close()
    return res


def _one(c: ChartInput, values: list[str], controller_version: str, helm: Helm, res: ReadResult) -> None:
    chart = display_path(c.root)
    try:
        text = helm.template(c.root, c.release, "default", [Path(v).resolve() for v in values])
    except HelmError as e:
        res.unreadable.append(_helm_error(c, e))
        return
    c.rendered = True
    where = line_map(text, c.root)
    label = f"render of {chart}"
    try:
        objs = objects(text, label)
    except ScanInputError as e:
        res.unreadable.append(_unreadable(e, where, display_path(c.root / CHART_FILE)))
        return
    if c.only is not None:
        objs = [o for o in objs if (o.source_comment or "").split("/", 1)[-1] == c.only]
    part = rollouts_of(objs, label, controller_version, origin={"chart": chart, "release": c.release})
    for ro in part.rollouts:
        _relocate(ro, where)
    res.rollouts += part.rollouts
    res.autoscalers += part.autoscalers
    res.kinds.update(part.kinds)
    res.unreadable += [_unreadable(e, where, display_path(c.root / CHART_FILE)) for e in part.unreadable]
