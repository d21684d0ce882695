"""Manifests as input: files, folders (recursively: *.yaml, *.yml, *.json) and ``-`` (standard input).

A stream may hold many documents (a ``helm template`` or kustomize output) and kubectl Lists
(``kubectl get rollouts -A -o yaml``).  Every Rollout becomes a ScannedRollout whose ``source`` is
``file:line``, every HPA or ScaledObject that targets a Rollout an autoscalers.Autoscaler (joined to its Rollout
by the command); other objects are only counted.  A file that cannot be read (not YAML, not UTF-8) and a Rollout
whose fields cannot be read are each a ScanInputError with file and line in ``ReadResult.unreadable``; the other
files and objects are still read.
"""
from __future__ import annotations

import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..core import inputs
from . import autoscalers as scalers
from .model import ROLLOUT_KINDS, ScanInputError, from_object
from .yamlstream import objects

SUFFIXES = (".yaml", ".yml", ".json")
PARALLEL_BYTES = 4 << 20          # below this a process pool costs more than it saves
STDIN = "-"


@dataclass
class ReadResult:
    rollouts: list = field(default_factory=list)
    kinds: Counter = field(default_factory=Counter)       # every object kind seen
    files: int = 0
    unreadable: list = field(default_factory=list)        # ScanInputError of each file or object not read
    autoscalers: list = field(default_factory=list)       # HPAs and ScaledObjects that target a Rollout


def display_path(path: Path | str, stdin_name: str | None = None) -> str:
    """A path relative to the working directory when it is below it (SARIF wants repository-relative); standard
    input is the name ``--stdin-name`` gives it, else ``<stdin>``."""
    if str(path) == STDIN:
        return stdin_name or "<stdin>"
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def manifest_paths(inputs: list[str]) -> list[str]:
    out: list[str] = []
    for item in inputs:
        if item == STDIN:
            out.append(STDIN)
            continue
        p = Path(item)
        if p.is_dir():
            found = sorted(str(f) for f in p.rglob("*") if f.is_file() and f.suffix.lower() in SUFFIXES
                           and not any(part.startswith(".") for part in f.relative_to(p).parts))
            out.extend(found)
        elif p.is_file():
            out.append(str(p))
        elif p.exists():
            raise ScanInputError("not a regular file or folder", str(p))
        else:
            raise ScanInputError("no such file or folder", str(p))
    return out


def read_text(path: str, stdin=None) -> str:
    """A manifest file or standard input as text, read under the stream budget (drills.core.inputs)."""
    try:
        if path == STDIN:
            raw = inputs.read_stream(stdin if stdin is not None else sys.stdin, inputs.STREAM_BYTES, "<stdin>")
        else:
            raw = inputs.read_bytes(path, inputs.STREAM_BYTES, "manifest")
        return inputs.decode(raw, display_path(path))
    except inputs.InputError as e:
        raise ScanInputError(e.problem, display_path(path), e.line) from None
    except OSError as e:
        raise ScanInputError(f"cannot read: {e.strerror or e}", display_path(path)) from None


def rollouts_in(text: str, label: str, controller_version: str = "", default_namespace: str = "default",
                origin: dict | None = None, result: ReadResult | None = None) -> ReadResult:
    """Every Rollout of one YAML stream; ``label`` names it in sources and messages."""
    return rollouts_of(objects(text, label), label, controller_version, default_namespace, origin, result)


# the lists whose items the scan reads (yamlstream flattens them): one whose items are not a list holds nothing
LIST_KINDS = ("List", *(f"{k}List" for k in (*ROLLOUT_KINDS, *scalers.KINDS)))


def rollouts_of(objs: list, label: str, controller_version: str = "", default_namespace: str = "default",
                origin: dict | None = None, result: ReadResult | None = None) -> ReadResult:
    """RolloutSpecs of objects already read by yamlstream.objects (counted by kind)."""
    res = result or ReadResult()
    for o in objs:
        kind = o.obj.get("kind")
        res.kinds[str(kind)] += 1
        items = o.obj.get("items")
        if kind in LIST_KINDS and items is not None and not isinstance(items, list):
            # yamlstream flattens a List's items only when they are a list: anything else holds no object
            res.unreadable.append(ScanInputError(f"{kind}: items must be a list of objects, found "
                                                 f"{type(items).__name__}", label, o.line))
            continue
        if kind in scalers.KINDS:
            try:
                a = scalers.from_object(o.obj, f"{label}:{o.line}", file=label, line=o.line, lines=o.lines,
                                        default_namespace=default_namespace, origin=origin)
            except ScanInputError as e:
                res.unreadable.append(e)
                continue
            if a is not None:
                res.autoscalers.append(a)
            continue
        if kind not in ROLLOUT_KINDS:
            continue
        try:
            ro = from_object(o.obj, f"{label}:{o.line}", file=label, line=o.line, lines=o.lines,
                             default_namespace=default_namespace)
        except ScanInputError as e:
            res.unreadable.append(e)
            continue
        ro.controller_version = controller_version
        ro.origin = dict(origin or {})
        if o.source_comment:
            ro.origin.setdefault("template", o.source_comment)
        res.rollouts.append(ro)
    return res


def _read_one(path: str, controller_version: str, stdin=None, stdin_name: str | None = None) -> ReadResult:
    try:
        return rollouts_in(read_text(path, stdin), display_path(path, stdin_name), controller_version)
    except ScanInputError as e:
        return ReadResult(unreadable=[e])


def read_manifests(inputs: list[str], controller_version: str, stdin=None, workers: int = 1,
                   stdin_name: str | None = None) -> ReadResult:
    """Every Rollout of the inputs, in input order; files are parsed in ``workers`` processes when there are
    enough of them to pay for the processes (the parse is CPU-bound)."""
    paths = manifest_paths(inputs)
    res = ReadResult()
    big = sum(Path(p).stat().st_size for p in paths if p != STDIN) >= PARALLEL_BYTES
    if workers > 1 and big and STDIN not in paths:
        with ProcessPoolExecutor(workers) as pool:
            parts = list(pool.map(_read_one, paths, [controller_version] * len(paths), chunksize=4))
    else:
        parts = [_read_one(p, controller_version, stdin, stdin_name) for p in paths]
    for part in parts:
        res.rollouts += part.rollouts
        res.kinds.update(part.kinds)
        res.unreadable += part.unreadable
        res.autoscalers += part.autoscalers
        res.files += 1
    return res
