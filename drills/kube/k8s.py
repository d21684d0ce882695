"""The Kubernetes client, imported on its first use: ``import kubernetes`` imports every API model of the client
(~870 modules, half a second of CPU), which a command that never talks to a cluster (a plan, a refusal, ``--help``,
a report) should not pay.

``client`` and ``dynamic`` stand for ``kubernetes.client`` and ``kubernetes.dynamic``; ``ApiException`` and the other
names below are looked up here when first read (``except k8s.ApiException`` reads it only when an exception is
being matched, by then the client has made the call that raised it)."""
from __future__ import annotations

import importlib

from .lazy_client import install as serve_lazily

_NAMES = {
    "ApiException": ("kubernetes.client.exceptions", "ApiException"),
    "iter_resp_lines": ("kubernetes.watch.watch", "iter_resp_lines"),
}


class LazyModule:
    """A module imported on the first attribute read through it."""

    def __init__(self, name: str):
        self.__dict__["_name"] = name

    def __getattr__(self, attr: str):
        name = self.__dict__.get("_name")
        if name is None or (attr.startswith("__") and attr.endswith("__")):
            # copy/pickle probe dunders on an empty instance: never an import, never a KeyError
            raise AttributeError(attr)
        serve_lazily()                  # the client's packages, each name imported when first read
        return getattr(importlib.import_module(name), attr)

    def __reduce__(self):
        return LazyModule, (self.__dict__["_name"],)

    def __repr__(self) -> str:
        return f"<module {self.__dict__['_name']} (imported on first use)>"


client = LazyModule("kubernetes.client")
dynamic = LazyModule("kubernetes.dynamic")
config = LazyModule("kubernetes.config")
utils = LazyModule("kubernetes.utils")


def __getattr__(name: str):
    if name in _NAMES:
        module, attr = _NAMES[name]
        serve_lazily()
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
