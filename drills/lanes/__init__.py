"""The lanes, registered once, in lane order: runner, report and cli read this registry.

Each lane is a Runbook (drills.lanes.base) in its own module, with its data in fixtures/lanes/<key>/ and its
pytest file(s) in lanes/<key>/.  To add a lane: write the module, add its class to BUILTIN below, add the data
folder and the tests folder (CONTRIBUTING.md).

Another installed package adds lanes of its own through the ``drills.lanes`` entry point group (name: the lane's
key, value: its Runbook class, e.g. ``mine = "mypkg.lane:LaneMine"``); they follow the built-in lanes, in the
order of their names.  Such a lane names its own folders (``data_dir()``, ``tests_dir()``).  An entry point that
does not load, or that is no Runbook with a key of its own, is said on stderr and left out.
"""
from __future__ import annotations

import re
import sys
from importlib.metadata import entry_points

from ..core.errors import BadInput
from .a import LaneA
from .abort import LaneAbort
from .alert import LaneAlert
from .b import LaneB
from .base import LaneContext, Runbook, StepFailed, step  # noqa: F401
from .escape import LaneEscape
from .order import LaneOrder
from .scan import LaneScan
from .swap import LaneSwap

BUILTIN: tuple[type[Runbook], ...] = (LaneA, LaneB, LaneAbort, LaneOrder, LaneEscape, LaneScan, LaneAlert,
                                      LaneSwap)
ENTRY_POINT_GROUP = "drills.lanes"
KEY_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def registered(builtin: tuple[type[Runbook], ...] = BUILTIN, warn=None) -> tuple[type[Runbook], ...]:
    """The built-in lanes, then those installed packages register (entry point group ``drills.lanes``)."""
    warn = warn or (lambda msg: print(f"drills: {msg}", file=sys.stderr, flush=True))
    out, keys = list(builtin), {lane.key for lane in builtin}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        where = f"lane entry point {ep.name!r} ({ep.value}" + (f", from {dist.name}" if dist else "") + ")"
        try:
            cls = ep.load()
        except Exception as e:                 # a broken package never takes the built-in lanes down
            warn(f"{where} does not load: {type(e).__name__}: {e}; left out")
            continue
        if not (isinstance(cls, type) and issubclass(cls, Runbook) and getattr(cls, "title", None)
                and isinstance(getattr(cls, "key", None), str) and KEY_RE.fullmatch(cls.key)):
            warn(f"{where} is not a Runbook subclass with a title and a key of lower-case letters, digits, '-' "
                 f"and '_'; left out")
        elif cls.key in keys:
            warn(f"{where}: lane {cls.key!r} is registered already; left out")
        else:
            out.append(cls)
            keys.add(cls.key)
    return tuple(out)


LANES: tuple[type[Runbook], ...] = registered()
REGISTRY: dict[str, type[Runbook]] = {lane.key: lane for lane in LANES}
DEFAULT_LANES = ("a", "b")


class UnknownLane(BadInput):
    pass


def get(key: str) -> type[Runbook]:
    try:
        return REGISTRY[key]
    except KeyError:
        raise UnknownLane(f"unknown lane {key!r}: choose from {', '.join(REGISTRY)} or all") from None


def resolve(spec: str | None) -> list[str]:
    """'a,b' / 'all' / None (the default lanes) -> lane keys in registry order, each once."""
    if not spec:
        return list(DEFAULT_LANES)
    wanted: list[str] = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        if item == "all":
            wanted.extend(REGISTRY)
        else:
            get(item)
            wanted.append(item)
    missing = [k for k in wanted if not REGISTRY[k].tests_dir().is_dir()]
    if missing:
        folders = ", ".join(str(REGISTRY[k].tests_dir()) for k in missing)
        raise UnknownLane(f"lane(s) {', '.join(missing)}: no tests folder ({folders})")
    return [k for k in REGISTRY if k in wanted]


def describe() -> list[dict]:
    """What `drills lanes --json` prints: key, title, data folder, tests folder, versions with expectations."""
    out = []
    for lane in LANES:
        entries = lane.expectation_versions()
        out.append({"key": lane.key, "title": lane.title, "data": str(lane.data_dir()),
                    "tests": str(lane.tests_dir()), "variants": list(lane.variants), "extras": list(lane.extras),
                    "routers": list(lane.routers),
                    "versions": [v for v, e in entries.items() if not e.get("unverified")],
                    "unverified": {v: e["reason"] for v, e in entries.items() if e.get("unverified")}})
    return out
