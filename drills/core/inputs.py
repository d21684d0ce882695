"""Readers of what users hand the product (manifests, values layers, app lists, the config file, kubeconfigs, run
folders, durations): every YAML and JSON document is read under one budget of size, depth and aliases, so a
hostile document is bad input (exit 2, file and line named), never exhausted memory or a RecursionError.

- Size: a file is read up to its budget and refused past it without reading the rest (a FIFO or /dev/zero
  included): ``FILE_BYTES`` for files of configuration size, ``STREAM_BYTES`` for manifest streams,
  ``RECORD_BYTES`` for the JSON a run writes (ledgers, run.json).
- Depth: collections nested deeper than ``MAX_DEPTH`` are refused at the line where the budget runs out.
- Aliases: an alias costs the size of the node it names; a document whose aliases expand to more than
  ``MAX_ALIAS_NODES`` nodes or ``MAX_ALIAS_BYTES`` bytes (a billion-laughs document, one long string named a
  thousand times) is refused, and so is an alias inside the node it names (a cycle).  Aliases stay shared
  references: nothing is copied.
- YAML is parsed into events by libyaml (no recursion there) and composed in Python under these budgets; only
  the safe tags are constructed.  No other loader of user input exists in the package.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import yaml
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent

from .errors import BadInput

FILE_BYTES = 16 << 20
STREAM_BYTES = 256 << 20
RECORD_BYTES = 64 << 20
MAX_DEPTH = 128
MAX_ALIAS_NODES = 100_000
MAX_ALIAS_BYTES = 32 << 20       # what aliases repeat, counted in the bytes of the nodes they name

try:
    from yaml.cyaml import CParser as _Parser      # libyaml's event parser: iterative, fast
except ImportError:                                 # PyYAML without libyaml: the same events, slower
    _Parser = None


class InputError(BadInput):
    """Input that cannot be read within its budget, or is not valid: ``path:line: problem`` (exit 2)."""

    def __init__(self, problem: str, path: str | Path | None = None, line: int | None = None):
        self.problem, self.path, self.line = problem, str(path) if path is not None else None, line
        where = f"{self.path}:{line}: " if self.path and line else (f"{self.path}: " if self.path else "")
        super().__init__(where + problem)

    def __reduce__(self):
        return (type(self), (self.problem, self.path, self.line))


# --- bytes -------------------------------------------------------------------------------------------------
def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def read_bytes(path: str | Path, limit: int = FILE_BYTES, what: str = "file") -> bytes:
    """At most ``limit`` bytes of a file; InputError past it (the rest is never read).  OSError propagates
    (FileNotFoundError included) so each caller says what a missing file means."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if stat.S_ISREG(st.st_mode) and st.st_size > limit:
            raise InputError(f"{what} is larger than {_mib(limit)}: refused unread", path)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{what} is larger than {_mib(limit)}: refused unread", path)
    return data


def read_stream(stream, limit: int = STREAM_BYTES, what: str = "standard input", chunk: int = 1 << 20) -> bytes:
    """A binary (or text) stream read in chunks up to ``limit``; InputError past it.  A signal between chunks
    interrupts the read at once."""
    src = getattr(stream, "buffer", stream)
    parts, size = [], 0
    while True:
        piece = src.read(chunk)
        if not piece:
            break
        if isinstance(piece, str):
            piece = piece.encode("utf-8", "surrogateescape")
        size += len(piece)
        if size > limit:
            raise InputError(f"{what} is larger than {_mib(limit)}: refused", what if what.startswith("<") else None)
        parts.append(piece)
    return b"".join(parts)


def decode(raw: bytes, path: str | Path | None) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError("not UTF-8 text", path, raw[:e.start].count(b"\n") + 1) from None


def read_text(path: str | Path, limit: int = FILE_BYTES, what: str = "file") -> str:
    return decode(read_bytes(path, limit, what), path)


# --- YAML ----------------------------------------------------------------------------------------------------
def yaml_error(e: yaml.YAMLError, path: str | Path | None, line_offset: int = 0) -> InputError:
    """A PyYAML error as ``path:line: not valid YAML: problem (context)``."""
    if isinstance(e, InputError):
        return e
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    ctx, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if ctx and cmark is not None and mark is not None and cmark.line != mark.line:
        ctx = f"{ctx} started at line {cmark.line + 1 + line_offset}"
    return InputError(f"not valid YAML: {problem}" + (f" ({ctx})" if ctx else ""), path,
                      mark.line + 1 + line_offset if mark is not None else None)


class _Budget(yaml.composer.Composer):
    """The composer under the budget: depth, alias expansion and alias cycles checked as nodes are composed."""

    def _budget_init(self, path):
        self._path = path
        self._depth = 0
        self._sizes: dict[int, int] = {}
        self._open: set[str] = set()
        self._expanded = 0
        self._expanded_bytes = 0

    def compose_document(self):
        self._sizes, self._open, self._expanded, self._expanded_bytes = {}, set(), 0, 0
        try:
            return super().compose_document()
        finally:
            self._sizes = {}

    def compose_node(self, parent, index):
        ev = self.peek_event()
        line = ev.start_mark.line + 1 if ev.start_mark is not None else None
        if isinstance(ev, AliasEvent):
            if ev.anchor in self._open:
                raise InputError(f"alias *{ev.anchor} is inside the node it names (a cycle): refused", self._path,
                                 line)
            target = self.anchors.get(ev.anchor)
            if target is not None:
                self._expanded += self._sizes.get(id(target), 1)
                if target.start_mark is not None and target.end_mark is not None:
                    self._expanded_bytes += max(0, target.end_mark.index - target.start_mark.index)
                if self._expanded > MAX_ALIAS_NODES or self._expanded_bytes > MAX_ALIAS_BYTES:
                    raise InputError(f"aliases expand to more than {MAX_ALIAS_NODES} nodes or "
                                     f"{_mib(MAX_ALIAS_BYTES)}: refused (a YAML bomb?)", self._path, line)
            return super().compose_node(parent, index)
        nested = isinstance(ev, (MappingStartEvent, SequenceStartEvent))
        if nested:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise InputError(f"nested deeper than {MAX_DEPTH} levels: refused", self._path, line)
        anchor = ev.anchor
        if anchor:
            self._open.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            if nested:
                self._depth -= 1
            if anchor:
                self._open.discard(anchor)
        size = 1
        if isinstance(node, yaml.MappingNode):
            size += sum(self._sizes.get(id(k), 1) + self._sizes.get(id(v), 1) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            size += sum(self._sizes.get(id(c), 1) for c in node.value)
        self._sizes[id(node)] = size
        return node


if _Parser is not None:
    class _Loader(_Budget, _Parser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        def __init__(self, stream, path=None):
            _Parser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            yaml.composer.Composer.__init__(self)
            self._budget_init(path)
else:                                                    # pragma: no cover - PyYAML without libyaml
    class _Loader(_Budget, yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser,
                  yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        def __init__(self, stream, path=None):
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._budget_init(path)


# what PyYAML's safe constructors raise on a scalar they cannot make (``2024-02-30``, ``!!int abc``,
# ``!!bool maybe``, ``!!timestamp hello``, an integer past Python's digit limit): bad input, as a YAML error is
CONSTRUCT_ERRORS = (ValueError, TypeError, KeyError, AttributeError, OverflowError)


def _construct_error(e: Exception, path) -> InputError:
    return InputError(f"not valid YAML: a value cannot be read ({type(e).__name__}: {str(e)[:120]})", path)


def _loader(text: str, path) -> "_Loader":
    return _Loader(text, path)


def compose_all(text: str, path: str | Path | None = None) -> list[yaml.Node]:
    """Every document's node tree (with marks), under the budget; InputError naming path and line."""
    loader = _loader(text, path)
    try:
        out = []
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                out.append(node)
        return out
    except yaml.YAMLError as e:
        raise yaml_error(e, path) from None
    except RecursionError:
        raise InputError(f"nested too deep to read (budget {MAX_DEPTH} levels): refused", path) from None
    finally:
        loader.dispose()


def construct(node: yaml.Node, path: str | Path | None = None):
    """The Python value of one composed node (safe tags only)."""
    loader = _loader("", path)
    try:
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise yaml_error(e, path) from None
    except CONSTRUCT_ERRORS as e:
        raise _construct_error(e, path) from None
    finally:
        loader.dispose()


def load_all(text: str, path: str | Path | None = None) -> list:
    """Every document of a YAML stream as Python values (empty documents as None), under the budget."""
    loader = _loader(text, path)
    try:
        out = []
        while loader.check_node():
            out.append(loader.construct_document(loader.get_node()))
        return out
    except yaml.YAMLError as e:
        raise yaml_error(e, path) from None
    except RecursionError:
        raise InputError(f"nested too deep to read (budget {MAX_DEPTH} levels): refused", path) from None
    except CONSTRUCT_ERRORS as e:
        raise _construct_error(e, path) from None
    finally:
        loader.dispose()


def load_one(text: str, path: str | Path | None = None, what: str = "file"):
    """One YAML document (None when empty); InputError when the stream holds several."""
    docs = [d for d in load_all(text, path) if d is not None]
    if len(docs) > 1:
        raise InputError(f"{what} holds {len(docs)} YAML documents, expected one", path)
    return docs[0] if docs else None


def load_yaml_file(path: str | Path, limit: int = FILE_BYTES, what: str = "file"):
    """One YAML document of a file, read under the budget (OSError propagates)."""
    return load_one(read_text(path, limit, what), path, what)


# --- JSON ----------------------------------------------------------------------------------------------------
def _json_depth_ok(data) -> bool:
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                return False
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return True


def load_json(text: str | bytes, path: str | Path | None = None, what: str = "file"):
    """A JSON document under the depth budget; InputError naming path (else ``what``) and line when it is not
    JSON."""
    if path is None:
        path = what
    try:
        data = json.loads(text)
    except RecursionError:
        raise InputError(f"nested deeper than {MAX_DEPTH} levels: refused", path) from None
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON ({e.msg})", path, e.lineno) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"not valid JSON ({e})", path) from None
    if not _json_depth_ok(data):
        raise InputError(f"nested deeper than {MAX_DEPTH} levels: refused", path)
    return data


def load_json_file(path: str | Path, limit: int = RECORD_BYTES, what: str = "file"):
    """A JSON file read under the budget (OSError propagates)."""
    return load_json(read_bytes(path, limit, what), path, what)
