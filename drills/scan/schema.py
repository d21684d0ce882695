"""What the apiserver does to a Rollout before the controller sees it, per controller version: the structural
schema of that version's Rollout CRD (the CRDs the toolchain has, ``Toolchain().ensure_crds(version)``, or a
``--source`` tree's ``manifests/crds``) prunes every field it does not know at the place it was put, drops null
values, and rejects a value of the wrong type, outside its enum, or a missing required field.

``seen_by_controller(ro, facts)`` checks the object a ScannedRollout was read from and returns it re-read from the
pruned object, with one SchemaFinding per field pruned or rejected: the field, where it was put, and where a field
of that name belongs in that CRD (``rollbackWindow`` under ``spec.strategy.canary`` belongs at
``spec.rollbackWindow``).  Not checked: ``metadata`` (ObjectMeta, the apiserver's own), ``spec.template`` (the pod
template, which the scan does not read) and ``status``; formats and bounds (the controller's validation has them);
a Rollout read from a cluster (it is what the apiserver already kept).
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..core import config, inputs
from .model import ScanInputError, ScannedRollout, from_object

CRD_FILE = "rollout-crd.yaml"
_NOT_CHECKED = {("apiVersion",), ("kind",), ("metadata",), ("status",), ("spec", "template")}
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


class SchemaUnavailable(Exception):
    """No Rollout CRD for that version (not in the module cache and no module proxy, no such file)."""


@dataclass(frozen=True)
class SchemaFinding:
    kind: str                 # "pruned" | "rejected"
    path: tuple               # where the field was put: ("spec", "strategy", "canary", "rollbackWindow")
    message: str
    belongs: tuple = ()       # dotted paths where a field of that name belongs in this CRD
    line: int | None = None   # the field's line in the Rollout's file

    @property
    def where(self) -> str:
        return dotted(self.path)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "field": self.where, "belongs": list(self.belongs), "message": self.message,
                "line": self.line}


def dotted(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


class RolloutSchema:
    """The openAPIV3Schema of one Rollout CRD, with an index of where each field name is known."""

    def __init__(self, version: str, schema: dict, origin: str):
        self.version, self.schema, self.origin = version, schema, origin
        self._places: dict[str, list[tuple]] | None = None

    def places(self, name: str) -> list[tuple]:
        if self._places is None:
            self._places = {}
            self._index(self.schema, ())
        return self._places.get(name, [])

    def _index(self, node: dict, path: tuple) -> None:
        if path in _NOT_CHECKED:
            return
        for k, sub in (node.get("properties") or {}).items():
            self._places.setdefault(k, []).append(path + (k,))
            self._index(sub, path + (k,))
        if isinstance(node.get("items"), dict):
            self._index(node["items"], path + (0,))
        if isinstance(node.get("additionalProperties"), dict):
            self._index(node["additionalProperties"], path + ("*",))

    def belongs(self, name: str, put: tuple) -> tuple:
        """Dotted places of a field called ``name`` (the nearest to where it was put first; three at most)."""
        def shared(p):
            n = 0
            for a, b in zip(p, put):
                if a != b and not (isinstance(a, int) and isinstance(b, int)):
                    break
                n += 1
            return n
        found = sorted(self.places(name), key=lambda p: (-shared(p), len(p)))
        return tuple(dotted(tuple("[]" if isinstance(x, int) else x for x in p)).replace(".[]", "[]")
                     for p in found[:3])

    def check(self, obj: dict) -> tuple[dict, list[tuple]]:
        """(the object as the apiserver keeps it, [(kind, path, what)] for each field pruned or rejected; for a
        pruned one, ``what`` is the names the schema knows at that place)."""
        out: list = []
        kept = self._walk(obj, self.schema, (), out)
        return kept, out

    def _walk(self, value, node: dict, path: tuple, out: list):
        if path in _NOT_CHECKED:
            return value
        if value is None:
            return value
        if node.get("x-kubernetes-int-or-string"):
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                out.append(("rejected", path, f"must be an integer or a string, found {_kind(value)}"))
            return value
        want = node.get("type")
        if want and not _is(value, want):
            out.append(("rejected", path, f"must be of type {want}, found {_kind(value)}"))
            return value
        if "enum" in node and value not in node["enum"]:
            out.append(("rejected", path, f"must be one of {', '.join(map(str, node['enum']))}, found {value!r}"))
        if isinstance(value, dict):
            props = node.get("properties") or {}
            extra = node.get("additionalProperties")
            keep_unknown = node.get("x-kubernetes-preserve-unknown-fields") or extra is True
            kept = {}
            for k, v in value.items():
                if v is None and not ((props.get(k) or {}).get("nullable")):
                    continue                                     # a null the schema does not allow: dropped
                if k in props:
                    kept[k] = self._walk(v, props[k], path + (k,), out)
                elif isinstance(extra, dict):
                    kept[k] = self._walk(v, extra, path + (k,), out)
                elif keep_unknown or (node.get("x-kubernetes-embedded-resource") and
                                      k in ("apiVersion", "kind", "metadata")):
                    kept[k] = v
                else:
                    out.append(("pruned", path + (k,), tuple(props)))
            for r in node.get("required") or ():
                if r not in kept and path + (r,) not in _NOT_CHECKED:
                    out.append(("rejected", path + (r,), "is required"))
            return kept
        if isinstance(value, list) and isinstance(node.get("items"), dict):
            return [self._walk(v, node["items"], path + (i,), out) for i, v in enumerate(value)]
        return value


def _is(value, want: str) -> bool:
    if want == "integer":
        return not isinstance(value, bool) and (isinstance(value, int) or
                                                (isinstance(value, float) and value.is_integer()))
    if want == "number":
        return not isinstance(value, bool) and isinstance(value, (int, float))
    t = _TYPES.get(want)
    return t is None or isinstance(value, t)


def _kind(value) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__) + \
        (f" {value!r}"[:60] if not isinstance(value, (dict, list)) else "")


# --- the CRDs -------------------------------------------------------------------------------------------
def crd_dir(version: str, source: str | None = None) -> Path:
    if source and (Path(source) / "manifests" / "crds" / CRD_FILE).is_file():
        return Path(source) / "manifests" / "crds"
    from ..toolchain import Toolchain
    try:
        return Toolchain().ensure_crds(version)
    except Exception as e:                # no module cache and no proxy, a version not served, a full disk, ...
        raise SchemaUnavailable(" ".join(str(e).split())[:200] or type(e).__name__) from None


@lru_cache(maxsize=None)
def _load(path: str, mtime: int, version: str) -> RolloutSchema:
    try:
        # a --source tree's CRD is the user's file: read under the input budget (size, depth, aliases)
        doc = inputs.load_one(inputs.read_text(path, inputs.FILE_BYTES, "Rollout CRD"), path, "Rollout CRD")
        entry = next(v for v in doc["spec"]["versions"] if v.get("name") == "v1alpha1")
        schema = entry["schema"]["openAPIV3Schema"]
    except (OSError, inputs.InputError, KeyError, TypeError, StopIteration) as e:
        raise SchemaUnavailable(f"{path}: no v1alpha1 Rollout schema ({type(e).__name__})") from None
    return RolloutSchema(version, schema, path)


def rollout_schema(version: str, source: str | None = None) -> RolloutSchema:
    path = crd_dir(version, source) / CRD_FILE
    try:
        mtime = path.stat().st_mtime_ns
    except OSError as e:
        raise SchemaUnavailable(f"{path}: {e.strerror}") from None
    return _load(str(path), mtime, version)


# --- a Rollout as the controller sees it -----------------------------------------------------------------
def _message(schema: RolloutSchema, kind: str, path: tuple, what) -> tuple[str, tuple]:
    where, v = dotted(path), schema.version
    if kind == "rejected":
        return f"{where} {what} in the {v} CRD schema: the apiserver rejects the Rollout", ()
    name = path[-1]
    places = tuple(p for p in schema.belongs(name, path) if p != where)
    head = (f"{where}: not a field there in the {v} CRD, so the apiserver prunes it (structural schema) and the "
            f"controller never sees it")
    if places:
        return f"{head}; {name} belongs at {' or '.join(places)}", places
    close = difflib.get_close_matches(str(name), list(what or ()), n=1)
    if close:
        return f"{head}; did you mean {close[0]}? ({dotted(path[:-1] + (close[0],))})", \
            (dotted(path[:-1] + (close[0],)),)
    newest = config.SUPPORTED_CONTROLLERS[-1]
    later = ()
    if newest != v:
        try:
            later = rollout_schema(newest).belongs(name, path)
        except SchemaUnavailable:
            pass
    return (f"{head}; no field {name!r} anywhere in the {v} CRD" +
            (f" ({newest}'s has it at {' or '.join(later)})" if later else "")), ()


def seen_by_controller(ro: ScannedRollout, version: str, source: str | None = None) -> ScannedRollout:
    """``ro`` as the controller of ``version`` sees it: re-read from its object pruned by that version's CRD, with
    the schema's findings.  Unchanged when there is nothing to check (no object, a cluster's own); when the CRD
    cannot be had, the reason is the returned copy's ``schema_unavailable``."""
    if ro.raw is None or ro.origin.get("cluster"):
        return ro
    try:
        schema = rollout_schema(version, source)
    except SchemaUnavailable as e:
        return dataclasses.replace(ro, schema_findings=[], schema_unavailable=str(e))
    kept, found = schema.check(ro.raw)
    if not found and kept == ro.raw:
        return ro if not ro.schema_findings else dataclasses.replace(ro, schema_findings=[])
    findings = []
    for kind, path, what in found:
        text, belongs = _message(schema, kind, path, what)
        line = ro.lines.get(path) if ro.line is not None else None
        findings.append(SchemaFinding(kind, path, text, belongs, line))
    try:
        seen = from_object(kept, ro.source, file=ro.file, line=ro.line, lines=ro.lines,
                           default_namespace=ro.namespace)
    except ScanInputError:              # a field the rules read, of a type the schema rejects: keep what was read
        seen = ro
    return dataclasses.replace(
        seen, source=ro.source, file=ro.file, line=ro.line, steps_file=ro.steps_file, step_lines=ro.step_lines,
        steps_line=ro.steps_line, controller_version=ro.controller_version, origin=ro.origin, raw=ro.raw,
        namespace=ro.namespace, schema_findings=findings, autoscalers=ro.autoscalers)
