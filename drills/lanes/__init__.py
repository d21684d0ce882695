"""The lanes, registered once, in lane order: runner, report and cli read this registry.

Each lane is a Runbook (drills.lanes.base) in its own module, with its data in fixtures/lanes/<key>/ and its
pytest file(s) in lanes/<key>/.  To add a lane: write the module, add its class to LANES below, add the data
folder and the tests folder (CONTRIBUTING.md).
"""
from __future__ import annotations

from ..errors import BadInput
from .a import LaneA
from .abort import LaneAbort
from .alert import LaneAlert
from .b import LaneB
from .base import LaneContext, Runbook, StepFailed, step  # noqa: F401
from .escape import LaneEscape
from .order import LaneOrder
from .scan import LaneScan

LANES: tuple[type[Runbook], ...] = (LaneA, LaneB, LaneAbort, LaneOrder, LaneEscape, LaneScan, LaneAlert)
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
        raise UnknownLane(f"lane(s) {', '.join(missing)} are not in this checkout")
    return [k for k in REGISTRY if k in wanted]


def describe() -> list[dict]:
    """What `drills lanes --json` prints: key, title, data folder, tests folder, versions with expectations."""
    out = []
    for lane in LANES:
        entries = lane.expectation_versions()
        out.append({"key": lane.key, "title": lane.title, "data": str(lane.data_dir()),
                    "tests": str(lane.tests_dir()), "variants": list(lane.variants), "extras": list(lane.extras),
                    "versions": [v for v, e in entries.items() if not e.get("unverified")],
                    "unverified": {v: e["reason"] for v, e in entries.items() if e.get("unverified")}})
    return out
