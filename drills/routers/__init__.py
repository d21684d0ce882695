"""The traffic routers a drill runs with, one module each behind one interface (drills.routers.base), picked as
the controller picks them: by the key under the Rollout's ``trafficRouting``.

A run's router is a run dimension (``--router``): legs, rows, the report and the matrix carry it.
"""
from __future__ import annotations

from ..core.errors import BadInput
from .base import Route, Source, TrafficRouter, Watch
from .istio import ROUTER as ISTIO
from .nginx import ROUTER as NGINX

ROUTERS: dict[str, TrafficRouter] = {r.name: r for r in (ISTIO, NGINX)}
DEFAULT = ISTIO.name
NAMES = tuple(ROUTERS)
# the record kinds that carry weights, whatever the router
ROUTE_KINDS = tuple(r.route_kind for r in ROUTERS.values())
# the kinds of every router's own objects (a chart's render brings its router's)
OBJECT_KINDS = tuple(k for r in ROUTERS.values() for k in r.object_kinds)
# a sync error that is a router's readiness guard holding a weight by design (the sync did its work), any router
GUARD_DELAYS = tuple(r.guard_delay for r in ROUTERS.values() if r.guard_delay)

__all__ = ["DEFAULT", "GUARD_DELAYS", "NAMES", "OBJECT_KINDS", "ROUTERS", "ROUTE_KINDS", "Route", "Source", "TrafficRouter", "Watch", "get",
           "of_canary", "of_record", "parse_names"]


def get(name: str | None) -> TrafficRouter:
    try:
        return ROUTERS[name or DEFAULT]
    except KeyError:
        raise BadInput(f"router {name!r}: choose from {', '.join(NAMES)}") from None


def of_canary(canary: dict) -> TrafficRouter | None:
    """The router of a canary strategy, by its trafficRouting key as the controller dispatches (None: none of
    ours, or no trafficRouting)."""
    tr = canary.get("trafficRouting") or {}
    if not isinstance(tr, dict):
        return None
    return next((r for r in ROUTERS.values() if tr.get(r.key) is not None), None)     # `istio: {}` is Istio


def of_record(rollout: dict) -> TrafficRouter:
    """The router of a condensed Rollout record (timelines recorded before routers were a dimension: Istio)."""
    return ROUTERS.get(rollout.get("router") or DEFAULT, ISTIO)


def parse_names(text: str | None) -> list[str]:
    """``--router istio,nginx`` (``all``: every router): known names, in the order given, each once; None (the
    flag left out): the default.  An empty value is an unset variable, never the default."""
    if text is None:
        return [DEFAULT]
    out: list[str] = []
    for name in (x.strip() for x in text.split(",")):
        if not name:
            continue
        if name != "all" and name not in ROUTERS:
            raise BadInput(f"--router {text!r}: {name!r} is no router: choose from {', '.join(NAMES)}, or all")
        out += [n for n in (NAMES if name == "all" else (name,)) if n not in out]
    if not out:
        raise BadInput(f"--router {text!r}: empty (an unset variable?); name {', '.join(NAMES)} or all, or leave "
                       f"the flag out for the default ({DEFAULT})")
    return out
