"""The Kubernetes client's packages, each name imported when first read.

``kubernetes/__init__.py``, ``kubernetes/client/__init__.py`` and its ``api`` and ``models`` packages import every API
class and every model up front (~870 modules: 0.6-0.8 CPU-s in every process that talks to a cluster, and a test run
starts hundreds).  Each of those four files is a list of ``from MODULE import NAME`` lines (generated code), so the
same names are served from a package object of the same name that imports ``MODULE`` when ``NAME`` is first read:
``client.CoreV1Api`` loads one API module and the models its answers use, never the rest.

``install()`` places those package objects in ``sys.modules``, once, before anything of the client is imported (on
the first use of the client through drills.kube.k8s or a kubeconfig read: a command that talks to no cluster has no
``kubernetes`` module at all); it does nothing when any part of the client is already imported, or when a file is not the plain list this reads (a
client release that changed its layout is then imported as it is, only slower)."""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import re
import sys
import threading
import types
from pathlib import Path

PACKAGES = ("kubernetes", "kubernetes.client", "kubernetes.client.api", "kubernetes.client.models")
MAX_INIT_BYTES = 4 << 20            # models/__init__.py is ~80 KiB; anything far larger is not the generated list

_FROM = re.compile(r"from\s+([\w.]+)\s+import\s+(\w+)")
_ASSIGN = re.compile(r"(__\w+__)\s*=\s*(['\"])([^'\"]*)\2")
_lock = threading.Lock()
_state: bool | None = None       # decided: served lazily (True) or left as it is (False)


def _parse(init: Path, package: str) -> tuple[dict, dict] | None:
    """(name -> module it comes from, dunder constants) of a package's __init__.py, or None when it holds anything
    but docstrings, comments, ``from __future__``, ``NAME = 'text'`` and ``from MODULE import NAME`` lines."""
    try:
        if init.stat().st_size > MAX_INIT_BYTES:
            return None
        text = init.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    text = re.sub(r'"""(?:.|\n)*?"""', "", text)
    names, consts = {}, {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("from __future__ "):
            continue
        m = _FROM.fullmatch(line)
        if m:
            module = m.group(1)
            if module == ".":
                module = f"{package}.{m.group(2)}"        # from . import client: the subpackage itself
            elif module.startswith("."):
                return None
            names[m.group(2)] = module
            continue
        m = _ASSIGN.fullmatch(line)
        if m:
            consts[m.group(1)] = m.group(3)
            continue
        return None
    return names, consts


def _submodules(folder: Path) -> list[str]:
    """The public modules and subpackages in a package folder (``rest``, ``api``, ``v1_pod`` ...)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    return sorted(e.stem if e.suffix == ".py" else e.name for e in entries
                  if not e.name.startswith("_") and (e.suffix == ".py" or (e / "__init__.py").is_file()))


def _lazy_package(name: str, folder: Path, names: dict, consts: dict) -> types.ModuleType:
    spec = importlib.machinery.ModuleSpec(name, None, origin=str(folder / "__init__.py"), is_package=True)
    spec.submodule_search_locations = [str(folder)]
    spec.has_location = True
    mod = importlib.util.module_from_spec(spec)          # __spec__, __path__, __package__, __file__

    def __getattr__(attr: str):
        module = names.get(attr)
        if attr == "__all__":
            # what `from PACKAGE import *` gives: every name, and the submodules the real package's own imports load
            # (never one of its deprecated ones, such as kubernetes.client.apis, that only a direct import loads)
            below = {m[len(name) + 1:].split(".")[0] for m in set(names.values()) | set(sys.modules)
                     if m.startswith(name + ".")}
            value = sorted(set(names) | below)
        elif module is None:
            # a submodule read as an attribute (client.rest, models.v1_pod): the real package has imported it
            if attr.startswith("_") or attr not in _submodules(folder):
                raise AttributeError(f"module {name!r} has no attribute {attr!r}")
            value = importlib.import_module(f"{name}.{attr}")
        elif module == f"{name}.{attr}":
            value = importlib.import_module(module)        # a subpackage (kubernetes.client, .config, ...)
        else:
            value = getattr(importlib.import_module(module), attr)
        setattr(mod, attr, value)
        return value

    vars(mod).update(consts, __getattr__=__getattr__,
                     __dir__=lambda: sorted(set(names) | set(vars(mod))))
    return mod


def _client_imported() -> bool:
    return any(p == "kubernetes" or p.startswith("kubernetes.") for p in tuple(sys.modules))


def install() -> bool:
    """Serve the client's packages lazily in this process; True when they are (now or already) served so.  Decided
    once per process: a refusal is remembered."""
    global _state
    with _lock:
        if _state is not None:
            return _state
        _state = False
        if _client_imported():
            return False                    # imported already (by drills or by the code drills runs in)
        spec = importlib.util.find_spec("kubernetes")
        if spec is None or not spec.submodule_search_locations:
            return False
        root = Path(list(spec.submodule_search_locations)[0])
        made = []
        for package in PACKAGES:
            folder = root.joinpath(*package.split(".")[1:])
            parsed = _parse(folder / "__init__.py", package)
            if parsed is None:
                return False
            made.append(_lazy_package(package, folder, *parsed))
        # a real import another thread began meanwhile keeps its modules: ours are then taken back, all of them
        placed = [m for m in made if sys.modules.setdefault(m.__name__, m) is m]
        if len(placed) != len(made):
            for m in placed:
                sys.modules.pop(m.__name__, None)
            return False
        for mod in made[1:]:                                # kubernetes.client, kubernetes.client.api, ...
            parent, _, leaf = mod.__name__.rpartition(".")
            setattr(sys.modules[parent], leaf, mod)
        _state = True
        return True
