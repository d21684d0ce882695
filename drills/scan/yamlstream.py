"""A fast, line-keeping reader of Kubernetes objects in YAML streams, under the input budget (drills.core.inputs).

libyaml's parser emits events with line marks quickly; building every node of every document in Python is
what makes a plain load slow (and a compose slower still).  This reader walks the events once and builds only
what a scan reads -- apiVersion, kind, metadata (without annotations and managedFields), spec (without the
pod template) and the items of a List -- and records the 1-based line of every mapping key and list item it
builds.  It follows YAML itself, so the result is what a safe load gives: anchors and aliases (an anchor in a
skipped part is built for its aliases), merge keys, the safe tags; anything else is bad input.  The budget holds
on every event: nesting deeper than ``inputs.MAX_DEPTH``, aliases expanding to more than
``inputs.MAX_ALIAS_NODES`` nodes, or an alias inside the node it names are refused naming the file and line;
no other loader ever reads the document.

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

from ..core.inputs import CONSTRUCT_ERRORS, MAX_ALIAS_BYTES, MAX_ALIAS_NODES, MAX_DEPTH
from .model import ScanInputError

try:
    _Parser = yaml.CSafeLoader
except AttributeError:                     # PyYAML without libyaml: same results, slower
    _Parser = yaml.SafeLoader

_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_MAP_TAGS = (None, "!", "tag:yaml.org,2002:map")
_SEQ_TAGS = (None, "!", "tag:yaml.org,2002:seq")
_RESOLVER = yaml.resolver.Resolver()
_CONSTRUCTOR = yaml.constructor.SafeConstructor()
_SCALAR_TAGS = {"tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "binary", "timestamp")}
# parts of an object a scan never reads (skipped without building)
_SKIP = {("spec", "template"), ("status",), ("metadata", "annotations"), ("metadata", "managedFields"),
         ("data",), ("stringData",), ("binaryData",)}
_WANTED = ("apiVersion", "kind", "metadata", "spec", "items")
_BUILT = ("Rollout", "HorizontalPodAutoscaler", "ScaledObject")     # the kinds built whole (else: kind and apiVersion)
_SOURCE_RE = re.compile(r"^# Source: (.+)$", re.M)
_MERGE_KEY = object()          # a `<<` key


@dataclass
class Obj:
    obj: dict
    line: int
    lines: dict = field(default_factory=dict)
    doc: int = 0
    source_comment: str | None = None


def _line(ev) -> int | None:
    return ev.start_mark.line + 1 if getattr(ev, "start_mark", None) is not None else None


def _depth_budget(events, path: str, walker=None):
    """The events, refused past MAX_DEPTH levels of nesting (before anything deeper is built); the walker keeps
    the last one (where a node it built ended)."""
    depth = 0
    for ev in events:
        if walker is not None:
            walker.last = ev
        t = type(ev)
        if t is MappingStartEvent or t is SequenceStartEvent:
            depth += 1
            if depth > MAX_DEPTH:
                raise ScanInputError(f"nested deeper than {MAX_DEPTH} levels: refused", path, _line(ev))
        elif t is MappingEndEvent or t is SequenceEndEvent:
            depth -= 1
        yield ev


class _Walker:
    def __init__(self, events, path: str):
        self.path = path
        self.last = None
        self.events = _depth_budget(events, path, self)
        self.cache: dict = {}
        self.new_document()

    def new_document(self) -> None:
        self.anchors: dict = {}
        self.sizes: dict = {}
        self.open: set = set()
        self.count = 0               # nodes built in this document, an alias counting what it names
        self.expanded = 0            # of which through aliases
        self.bytes: dict = {}        # anchor -> the bytes of the node it names
        self.expanded_bytes = 0

    def fail(self, problem: str, ev) -> ScanInputError:
        return ScanInputError(problem, self.path, _line(ev))

    def scalar(self, ev: ScalarEvent, key: bool = False):
        if ev.tag is None or ev.tag == "!":
            if not ev.implicit[0] or ev.style:        # quoted or block scalar: a string
                return ev.value
            v = ev.value
            try:
                return self.cache[v]
            except KeyError:
                pass
            tag = _RESOLVER.resolve(yaml.ScalarNode, v, (True, False))
            if tag == _MERGE:
                if key:
                    return _MERGE_KEY
                raise self.fail(f"not valid YAML: could not determine a constructor for the tag {tag!r}", ev)
            if tag != _STR and tag not in _SCALAR_TAGS:
                raise self.fail(f"not valid YAML: could not determine a constructor for the tag {tag!r}", ev)
            out = v if tag == _STR else self._construct(tag, ev)
            self.cache[v] = out
            return out
        if ev.tag in _SCALAR_TAGS:
            return self._construct(ev.tag, ev)
        raise self.fail(f"not valid YAML: could not determine a constructor for the tag {ev.tag!r}", ev)

    def _construct(self, tag: str, ev: ScalarEvent):
        try:
            return _CONSTRUCTOR.yaml_constructors[tag](_CONSTRUCTOR, yaml.ScalarNode(tag, ev.value))
        except (yaml.YAMLError, *CONSTRUCT_ERRORS) as e:     # the same errors drills.core.inputs refuses
            raise self.fail(f"not valid YAML: cannot read {ev.value[:40]!r} as {tag} ({e})"[:300], ev) from None

    def _key(self, k):
        if not isinstance(k, ScalarEvent):
            raise self.fail("not valid YAML: found unhashable key (a mapping key that is not a scalar)", k)
        return self.scalar(k, key=True)

    def _alias(self, ev: AliasEvent):
        if ev.anchor in self.open:
            raise self.fail(f"alias *{ev.anchor} is inside the node it names (a cycle): refused", ev)
        if ev.anchor not in self.anchors:
            raise self.fail(f"not valid YAML: found undefined alias {ev.anchor!r}", ev)
        size = self.sizes.get(ev.anchor, 1)
        self.count += size
        self.expanded += size
        self.expanded_bytes += self.bytes.get(ev.anchor, 0)
        if self.expanded > MAX_ALIAS_NODES or self.expanded_bytes > MAX_ALIAS_BYTES:
            raise self.fail(f"aliases expand to more than {MAX_ALIAS_NODES} nodes or {MAX_ALIAS_BYTES >> 20} MiB: "
                            f"refused (a YAML bomb?)", ev)
        return self.anchors[ev.anchor]

    def build(self, ev, path: tuple, lines: dict):
        if isinstance(ev, AliasEvent):
            return self._alias(ev)
        anchor = getattr(ev, "anchor", None)
        start = self.count
        self.count += 1
        if anchor:
            self.open.add(anchor)
        if isinstance(ev, ScalarEvent):
            v = self.scalar(ev)
        elif isinstance(ev, MappingStartEvent):
            if ev.tag not in _MAP_TAGS:
                raise self.fail(f"tag {ev.tag} is not supported in a Kubernetes object", ev)
            v = self._mapping(path, lines, lambda key: path + (key,) in _SKIP)
        elif isinstance(ev, SequenceStartEvent):
            if ev.tag not in _SEQ_TAGS:
                raise self.fail(f"tag {ev.tag} is not supported in a Kubernetes object", ev)
            v = []
            while True:
                item = next(self.events)
                if isinstance(item, SequenceEndEvent):
                    break
                lines[path + (len(v),)] = item.start_mark.line + 1
                v.append(self.build(item, path + (len(v),), lines))
        else:
            raise self.fail(f"not valid YAML: unexpected {type(ev).__name__}", ev)
        if anchor:
            self.open.discard(anchor)
            self.anchors[anchor] = v
            self.sizes[anchor] = self.count - start
            end = getattr(self.last, "end_mark", None)
            self.bytes[anchor] = max(0, end.index - ev.start_mark.index) if end is not None else 0
        return v

    def _mapping(self, path: tuple, lines: dict, skipped, wanted=None) -> dict:
        """A mapping's pairs (after its start event): ``skipped(key)`` values are skipped unbuilt, ``wanted``
        (the document root) decides per key from what is built so far; merge keys (``<<``) as YAML merges them:
        the mapping's own keys first, then the merged mappings in order."""
        v: dict = {}
        merged: list[tuple[dict, int]] = []
        while True:
            k = next(self.events)
            if isinstance(k, MappingEndEvent):
                break
            key = self._key(k)
            val = next(self.events)
            if key is _MERGE_KEY:
                merged.append((self._merge_value(val), k.start_mark.line + 1))
                continue
            lines[path + (key,)] = k.start_mark.line + 1
            if skipped(key) or (wanted is not None and not wanted(key, v)):
                self.skip(val)
                continue
            v[key] = self.build(val, path + (key,), lines)
        for maps, line in merged:
            for m in maps:
                for key, value in m.items():
                    if key not in v and not skipped(key) and (wanted is None or wanted(key, v)):
                        v[key] = value
                        lines.setdefault(path + (key,), line)
        return v

    def _merge_value(self, ev) -> list[dict]:
        """The mappings a `<<` merges, in precedence order."""
        value = self.build(ev, ("<<",), {})
        if isinstance(value, dict):
            return [value]
        if isinstance(value, list) and all(isinstance(m, dict) for m in value):
            return list(value)
        raise self.fail("not valid YAML: expected a mapping or list of mappings for merging", ev)

    def skip(self, ev) -> None:
        """Pass over a part the scan does not read, building only what an alias may name (anchored nodes)."""
        if getattr(ev, "anchor", None) and not isinstance(ev, AliasEvent):
            self.build(ev, ("&",), {})
            return
        if isinstance(ev, AliasEvent):
            if ev.anchor in self.open:
                raise self.fail(f"alias *{ev.anchor} is inside the node it names (a cycle): refused", ev)
            if ev.anchor not in self.anchors:
                raise self.fail(f"not valid YAML: found undefined alias {ev.anchor!r}", ev)
            return
        if isinstance(ev, ScalarEvent):
            return
        depth = 1
        while depth:
            e = next(self.events)
            if getattr(e, "anchor", None) and not isinstance(e, AliasEvent):
                self.build(e, ("&",), {})
            elif isinstance(e, AliasEvent):
                self.skip(e)
            elif isinstance(e, (MappingStartEvent, SequenceStartEvent)):
                depth += 1
            elif isinstance(e, (MappingEndEvent, SequenceEndEvent)):
                depth -= 1

    def root(self, ev) -> tuple[object, dict]:
        """The top-level node of a document: a mapping is built selectively (stops building once its
        kind is known not to be a Rollout, an autoscaler or a List)."""
        lines: dict = {}
        if not isinstance(ev, MappingStartEvent):
            self.skip(ev)
            return None, lines
        if ev.tag not in _MAP_TAGS:
            raise self.fail(f"tag {ev.tag} is not supported on a Kubernetes object", ev)
        if ev.anchor:
            self.open.add(ev.anchor)

        def wanted(key, obj) -> bool:
            kind = obj.get("kind")
            return key in _WANTED and (kind is None or kind in _BUILT or
                                       (isinstance(kind, str) and kind.endswith("List")))
        obj = self._mapping((), lines, lambda key: (key,) in _SKIP, wanted)
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


def _emit(obj, lines: dict, first: int, doc: int, comment) -> list[Obj]:
    if not isinstance(obj, dict):
        return []
    kind = obj.get("kind")
    items = obj.get("items")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
        out = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):         # as a document that is not a mapping: no object in it
                continue
            sub = {k[2:]: v for k, v in lines.items() if len(k) > 2 and k[0] == "items" and k[1] == i}
            out.append(Obj(item, lines.get(("items", i), first), sub, doc, comment))
        return out
    return [Obj(obj, first, lines, doc, comment)]


def objects(text: str, path: str) -> list[Obj]:
    """Every Kubernetes object of a YAML stream (List items flattened), with lines."""
    out: list[Obj] = []
    walker = _Walker(iter(yaml.parse(text, Loader=_Parser)), path)
    doc = -1
    try:
        for ev in walker.events:
            if not isinstance(ev, DocumentStartEvent):
                continue
            doc += 1
            walker.new_document()
            root_ev = next(walker.events)
            obj, lines = walker.root(root_ev)
            end = next(walker.events)
            if not isinstance(end, DocumentEndEvent):
                raise walker.fail(f"not valid YAML: unexpected {type(end).__name__}", end)
            if obj is None:
                continue
            out.extend(_emit(obj, lines, root_ev.start_mark.line + 1, doc,
                             _source_comment(text, ev.start_mark.index, root_ev.start_mark.index)))
    except yaml.YAMLError as e:
        raise _error(path, e) from None
    return out
