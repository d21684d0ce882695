"""A fast, line-keeping reader of Kubernetes objects in YAML streams.

libyaml's parser emits events with line marks quickly; building every node of every document in Python is
what makes a plain load slow (and a compose slower still).  This reader walks the events once and builds only
what a scan reads -- apiVersion, kind, metadata (without annotations and managedFields), spec (without the
pod template) and the items of a List -- and records the 1-based line of every mapping key and list item it
builds.  A document that uses what this walker does not follow (an alias into a part it skipped, a merge key,
an unusual tag) is read again whole with PyYAML's own loader, so the result never depends on the shortcut.

``objects(text, path)`` yields ``Obj`` (the object, its first line, the path->line map, the document index
and the helm ``# Source:`` comment above the document).  A kubectl List (``kind: List`` or ``*List`` with
``items``) yields its items instead of itself.  Bad YAML raises ScanInputError naming the file and line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml
from yaml.events import (AliasEvent, DocumentEndEvent, DocumentStartEvent, MappingEndEvent, MappingStartEvent,
                         ScalarEvent, SequenceEndEvent, SequenceStartEvent)

from .model import ScanInputError

try:
    _Parser = yaml.CSafeLoader
except AttributeError:                     # PyYAML without libyaml: same results, slower
    _Parser = yaml.SafeLoader

_STR = "tag:yaml.org,2002:str"
_RESOLVER = yaml.resolver.Resolver()
_CONSTRUCTOR = yaml.constructor.SafeConstructor()
_CORE = {"tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null")}
# parts of an object a scan never reads (skipped without building)
_SKIP = {("spec", "template"), ("status",), ("metadata", "annotations"), ("metadata", "managedFields"),
         ("data",), ("stringData",), ("binaryData",)}
_SOURCE_RE = re.compile(r"^# Source: (.+)$", re.M)


class _Complex(Exception):
    """The document needs the full loader."""


@dataclass
class Obj:
    obj: dict
    line: int
    lines: dict = field(default_factory=dict)
    doc: int = 0
    source_comment: str | None = None


class _Walker:
    def __init__(self, events):
        self.events = events
        self.anchors: dict = {}
        self.cache: dict = {}

    def scalar(self, ev: ScalarEvent):
        if ev.tag is None or ev.tag == "!":
            if not ev.implicit[0] or ev.style:        # quoted or block scalar: a string
                return ev.value
            v = ev.value
            try:
                return self.cache[v]
            except KeyError:
                pass
            tag = _RESOLVER.resolve(yaml.ScalarNode, v, (True, False))
            if tag != _STR and tag not in _CONSTRUCTOR.yaml_constructors:
                raise _Complex(f"scalar {v!r} resolves to {tag}")       # the merge key `<<`
            out = v if tag == _STR else _CONSTRUCTOR.yaml_constructors[tag](_CONSTRUCTOR, yaml.ScalarNode(tag, v))
            self.cache[v] = out
            return out
        if ev.tag in _CORE:
            return _CONSTRUCTOR.yaml_constructors[ev.tag](_CONSTRUCTOR, yaml.ScalarNode(ev.tag, ev.value))
        raise _Complex(f"tag {ev.tag}")

    def build(self, ev, path: tuple, lines: dict):
        if isinstance(ev, ScalarEvent):
            v = self.scalar(ev)
        elif isinstance(ev, MappingStartEvent):
            if ev.tag not in (None, "tag:yaml.org,2002:map"):
                raise _Complex(f"tag {ev.tag}")
            v = {}
            for k in self._pairs():
                key = self.scalar(k) if isinstance(k, ScalarEvent) else self._complex_key(k)
                if key == "<<":
                    raise _Complex("merge key")
                val = next(self.events)
                lines[path + (key,)] = k.start_mark.line + 1
                if path + (key,) in _SKIP:
                    self.skip(val)
                    continue
                v[key] = self.build(val, path + (key,), lines)
        elif isinstance(ev, SequenceStartEvent):
            if ev.tag not in (None, "tag:yaml.org,2002:seq"):
                raise _Complex(f"tag {ev.tag}")
            v = []
            while True:
                item = next(self.events)
                if isinstance(item, SequenceEndEvent):
                    break
                lines[path + (len(v),)] = item.start_mark.line + 1
                v.append(self.build(item, path + (len(v),), lines))
        elif isinstance(ev, AliasEvent):
            if ev.anchor not in self.anchors:
                raise _Complex(f"alias *{ev.anchor}")
            return self.anchors[ev.anchor]
        else:
            raise _Complex(type(ev).__name__)
        if getattr(ev, "anchor", None):
            self.anchors[ev.anchor] = v
        return v

    def _pairs(self):
        while True:
            k = next(self.events)
            if isinstance(k, MappingEndEvent):
                return
            yield k

    def _complex_key(self, k):
        raise _Complex("non-scalar mapping key")

    def skip(self, ev) -> None:
        if getattr(ev, "anchor", None):
            raise _Complex(f"anchor &{ev.anchor} in a skipped part")
        if isinstance(ev, (ScalarEvent, AliasEvent)):
            return
        depth = 1
        while depth:
            e = next(self.events)
            if getattr(e, "anchor", None):
                raise _Complex(f"anchor &{e.anchor} in a skipped part")
            if isinstance(e, (MappingStartEvent, SequenceStartEvent)):
                depth += 1
            elif isinstance(e, (MappingEndEvent, SequenceEndEvent)):
                depth -= 1

    def root(self, ev) -> tuple[object, dict]:
        """The top-level node of a document: a mapping is built selectively (stops building once its
        kind is known not to be a Rollout or a List)."""
        lines: dict = {}
        if not isinstance(ev, MappingStartEvent):
            self.skip(ev)
            return None, lines
        if ev.tag not in (None, "tag:yaml.org,2002:map") or ev.anchor:
            raise _Complex("tagged or anchored document")
        obj: dict = {}
        for k in self._pairs():
            key = self.scalar(k) if isinstance(k, ScalarEvent) else self._complex_key(k)
            if key == "<<":
                raise _Complex("merge key")
            val = next(self.events)
            lines[(key,)] = k.start_mark.line + 1
            kind = obj.get("kind")
            wanted = kind is None or kind == "Rollout" or (isinstance(kind, str) and kind.endswith("List"))
            if not wanted or (key,) in _SKIP or key not in ("apiVersion", "kind", "metadata", "spec", "items"):
                self.skip(val)
                continue
            obj[key] = self.build(val, (key,), lines)
        return obj, lines


def _error(path: str, e: yaml.YAMLError, line_offset: int = 0) -> ScanInputError:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    ctx = getattr(e, "context", None)
    cmark = getattr(e, "context_mark", None)
    if ctx and cmark is not None and mark is not None and cmark.line != mark.line:
        ctx = f"{ctx} started at line {cmark.line + 1 + line_offset}"
    text = f"not valid YAML: {problem}" + (f" ({ctx})" if ctx else "")
    return ScanInputError(text, path, mark.line + 1 + line_offset if mark is not None else None)


def _source_comment(text: str, start: int, root: int) -> str | None:
    """The helm `# Source: chart/templates/x.yaml` comment of a document (after its `---`, before its root)."""
    head = text[max(0, start - 400):root]
    found = _SOURCE_RE.findall(head)
    return found[-1].strip() if found else None


def _full(text: str, path: str, start, end) -> tuple[object, dict, int]:
    """One document read with PyYAML's loader (line map from its nodes)."""
    chunk = text[start.index:end.index] if end is not None else text[start.index:]
    offset = start.line
    try:
        node = yaml.compose(chunk, Loader=yaml.SafeLoader)
        data = yaml.load(chunk, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise _error(path, e, offset) from None
    lines: dict = {}

    def walk(n, p):
        if isinstance(n, yaml.MappingNode):
            for kn, vn in n.value:
                if isinstance(kn, yaml.ScalarNode):
                    lines[p + (kn.value,)] = kn.start_mark.line + 1 + offset
                    walk(vn, p + (kn.value,))
        elif isinstance(n, yaml.SequenceNode):
            for i, vn in enumerate(n.value):
                lines[p + (i,)] = vn.start_mark.line + 1 + offset
                walk(vn, p + (i,))
    if node is not None:
        walk(node, ())
    first = (node.start_mark.line + 1 + offset) if node is not None else start.line + 1
    return data, lines, first


def _emit(obj, lines: dict, first: int, doc: int, comment) -> list[Obj]:
    if not isinstance(obj, dict):
        return []
    kind = obj.get("kind")
    items = obj.get("items")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
        out = []
        for i, item in enumerate(items):
            sub = {k[2:]: v for k, v in lines.items() if len(k) > 2 and k[0] == "items" and k[1] == i}
            out.append(Obj(item, lines.get(("items", i), first), sub, doc, comment))
        return out
    return [Obj(obj, first, lines, doc, comment)]


def objects(text: str, path: str) -> list[Obj]:
    """Every Kubernetes object of a YAML stream (List items flattened), with lines."""
    out: list[Obj] = []
    walker = _Walker(iter(yaml.parse(text, Loader=_Parser)))
    doc = -1
    try:
        for ev in walker.events:
            if not isinstance(ev, DocumentStartEvent):
                continue
            doc += 1
            start = ev.start_mark
            walker.anchors = {}
            root_index = start.index
            try:
                root_ev = next(walker.events)
                root_index = root_ev.start_mark.index
                obj, lines = walker.root(root_ev)
                next(walker.events)                 # DocumentEndEvent
                first = root_ev.start_mark.line + 1
            except _Complex:
                depth_end = _skip_to_document_end(walker)
                obj, lines, first = _full(text, path, start, depth_end)
            if obj is None:
                continue
            out.extend(_emit(obj, lines, first, doc, _source_comment(text, start.index, root_index)))
    except yaml.YAMLError as e:
        raise _error(path, e) from None
    return out


def _skip_to_document_end(walker: _Walker):
    """After a _Complex, consume the rest of the document; returns the DocumentEndEvent's mark."""
    for e in walker.events:
        if isinstance(e, DocumentEndEvent):
            return e.end_mark
    return None
