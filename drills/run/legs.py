"""Legs: the unit a run is made of, planned, balanced into shards, and timed.

A leg is (controller, lane, variant, router): its id ``controller/lane/variant``, with ``/router`` after it for a
router other than the default (Istio), so the ids of Istio legs are those of runs before routers were a dimension.
A run's legs come in a stable order (versions as given, lanes in registry order, each lane's variants, the routers
each lane runs on); ``--shard I/N`` takes a deterministic part of them: legs balanced by their
durations (the longest first onto the least-loaded shard, ties by leg id), so every leg is in exactly one shard
when every shard plans with the same durations.  Durations are measured by every run and kept in the cache
(``$DRILLS_CACHE/legs/durations.json``); a leg never measured counts with its lane's estimate.  The plan records
the digest of what it was balanced with, so a merge of shards can prove they were cut from one plan.  Every row
names the leg that wrote it; ``coverage`` says what a run folder's legs lack (a leg that did not run, was killed or
recorded nothing), which makes a run, a merge or an upgrade-check inconclusive.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core import config, inputs
from .. import routers
from ..core.errors import BadInput
from ..lanes import REGISTRY
from ..lanes.base import Runbook
from ..record import swap_rows
from ..record.ledger import exit_code

# a leg never measured: rough minutes per lane on the embedded cluster (replaced by measured durations)
VARIANT_MODES = config.VARIANT_MODES


@dataclass(frozen=True)
class Leg:
    controller: str          # the release version (the cluster's), e.g. v1.8.2
    lane: str
    variant: str = "stage"
    label: str | None = None  # what the controller is called when it is not a release (user-built)
    router: str = routers.DEFAULT
    to: str | None = None     # lane swap: the release the controller is replaced by (the pair is controller -> to)

    @property
    def id(self) -> str:
        tail = "" if self.router == routers.DEFAULT else f"/{self.router}"
        pair = f"->{self.to}" if self.to else ""
        return f"{self.label or self.controller}{pair}/{self.lane}/{self.variant}{tail}"

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9.]+", "-", self.id).strip("-")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["controller"] = self.label or self.controller
        if self.label:
            d["release"] = self.controller
        d.pop("label")
        if not self.to:
            d.pop("to")
        d["id"] = self.id
        return d


SWAP_LANE = swap_rows.LANE      # the lane that runs on a pair of releases


def lane_variants(lane: str, mode: str) -> tuple[str, ...]:
    have = REGISTRY[lane].variants
    if mode == "both":
        return have
    return (mode,) if mode in have else have[:1]


def router_options(lanes_text: str | None, router_text: str | None) -> dict:
    """``plan``'s router arguments from ``--lanes`` and ``--router`` as given: the routers; whether the lanes were
    named one by one (no ``all`` among them); whether ``all`` routers were asked for."""
    lanes_given = {t.strip() for t in (lanes_text or "").split(",")}
    return {"router_names": routers.parse_names(router_text), "named": bool(lanes_text) and "all" not in lanes_given,
            "every_router": "all" in {t.strip() for t in (router_text or "").split(",")}}


def left_out(lanes: list[str], legs: list[Leg], router_text: str | None) -> list[str]:
    """Why lanes asked for (``all``) have no leg in the plan: a router they do not run on, or (lane swap) no pair."""
    planned = {x.lane for x in legs}
    names = routers.parse_names(router_text) if router_text else [routers.DEFAULT]
    out = []
    paired = SWAP_LANE in lanes and SWAP_LANE not in planned and set(names) & set(REGISTRY[SWAP_LANE].routers)
    if paired:
        out.append(f"lane {SWAP_LANE} runs on a pair of releases: none in this run (give two versions or more)")
    left = [k for k in lanes if k not in planned and not (k == SWAP_LANE and paired)]
    if left:
        where = ", ".join(sorted({r for k in left for r in REGISTRY[k].routers}))
        out.append(f"lane(s) {', '.join(left)} run on {where} only: not in this run (--router {router_text})")
    return out


def plan(versions: list[str], lanes: list[str], mode: str = "stage", label: str | None = None,
         router_names: list[str] | None = None, named: bool = False, every_router: bool = False) -> list[Leg]:
    """Versions as given, then lanes in order, each lane's variants, then routers; a lane runs on the routers its
    Runbook names (``routers``).  Routers asked for that no lane asked for runs on: BadInput; ``named`` (the lanes
    were named one by one, not ``all``): a lane that runs on none of the routers asked for is BadInput too."""
    if mode not in VARIANT_MODES:
        raise BadInput(f"--variant {mode!r}: choose from {', '.join(VARIANT_MODES)}")
    names = router_names or [routers.DEFAULT]
    idle = [lane for lane in lanes if not set(names) & set(REGISTRY[lane].routers)]
    if named and idle:
        raise BadInput(f"--lanes {','.join(idle)}: " + "; ".join(
            f"lane {k} runs on {', '.join(REGISTRY[k].routers)}" for k in idle) + f", not on {', '.join(names)}")
    for name in ([] if every_router else names):
        if not any(name in REGISTRY[lane].routers for lane in lanes):
            raise BadInput(f"--router {name}: none of the lanes {', '.join(lanes)} runs on it (lanes that do: "
                           f"{', '.join(k for k, c in REGISTRY.items() if name in c.routers) or 'none'})")
    pairs = config.swap_pairs(versions) if SWAP_LANE in lanes and not label else []
    if named and SWAP_LANE in lanes and not pairs:
        raise BadInput(f"--lanes {SWAP_LANE}: the lane swaps one release for another; give two versions or more "
                       f"(--controller A,B; a user-built controller is not swapped)")
    legs = [Leg(v, lane, variant, label, router) for v in versions for lane in lanes if lane != SWAP_LANE
            for variant in lane_variants(lane, mode) for router in names if router in REGISTRY[lane].routers]
    return legs + [Leg(a, SWAP_LANE, variant, None, router, to=b) for a, b in pairs
                   for variant in lane_variants(SWAP_LANE, mode) for router in names
                   if router in REGISTRY[SWAP_LANE].routers]


# --- durations ---------------------------------------------------------------------------------------------
def durations_file() -> Path:
    return config.cache_dir() / "legs" / "durations.json"


def read_durations(path: Path | None = None) -> dict[str, float]:
    p = Path(path) if path else durations_file()
    try:
        data = inputs.load_json_file(p, inputs.FILE_BYTES, "durations file")
    except FileNotFoundError:
        if path:
            raise BadInput(f"--durations {p}: no such file") from None
        return {}
    except (BadInput, OSError) as e:       # not JSON, over the size or depth budget, unreadable
        if path:
            raise BadInput(f"--durations {p}: not a JSON object of leg id -> seconds ({e})") from None
        return {}
    if not isinstance(data, dict):
        if path:
            raise BadInput(f"--durations {p}: not a JSON object of leg id -> seconds")
        return {}
    return {str(k): float(v) for k, v in data.items() if _seconds(v)}


def _seconds(v) -> bool:
    """A usable duration: a finite number of seconds above 0 (an integer too large for a float is not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v)) and v > 0
    except OverflowError:
        return False


def record_duration(leg: Leg, seconds: float) -> None:
    """Keep a leg's measured duration (the newest; a file lock makes concurrent writers safe)."""
    p = durations_file()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(str(p) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = read_durations()
        data[leg.id] = round(seconds, 1)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, p)


MAX_ESTIMATE_S = 24 * 3600.0


def estimate(leg: Leg, durations: dict[str, float]) -> float:
    lane = REGISTRY.get(leg.lane)
    own = getattr(lane, "estimate_s", None)           # a plugin lane's may be anything: a sane number or the default
    ok = isinstance(own, (int, float)) and not isinstance(own, bool) and 0 < own <= MAX_ESTIMATE_S
    return durations.get(leg.id) or (float(own) if ok else Runbook.estimate_s)


# --- shards ------------------------------------------------------------------------------------------------
def parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    m = re.fullmatch(r"([0-9]+)/([0-9]+)", text.strip(), re.ASCII)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)) <= 1000:
        raise BadInput(f"--shard {text!r}: give I/N with 1 <= I <= N (e.g. 2/3)")
    return int(m.group(1)), int(m.group(2))


def assign_shards(legs: list[Leg], n: int, durations: dict[str, float]) -> dict[str, int]:
    """leg id -> shard (1-based): the longest leg first onto the least-loaded shard (ties: lower index)."""
    load = [0.0] * n
    out: dict[str, int] = {}
    for leg in sorted(legs, key=lambda x: (-estimate(x, durations), x.id)):
        i = min(range(n), key=lambda k: (load[k], k))
        load[i] += estimate(leg, durations)
        out[leg.id] = i + 1
    return out


def digest(legs: list[Leg], durations: dict[str, float]) -> str:
    """What a shard cut depends on: the legs and the durations they were balanced with."""
    text = json.dumps({"legs": [x.id for x in legs], "durations": {x.id: estimate(x, durations) for x in legs}},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_document(legs: list[Leg], durations: dict[str, float], shard: tuple[int, int] | None,
                  durations_source: str) -> dict:
    """What `drills run --plan --json` prints: every leg of the run, its estimate and shard."""
    n = shard[1] if shard else 1
    shards = assign_shards(legs, n, durations)
    chosen = [x for x in legs if not shard or shards[x.id] == shard[0]]
    return {"legs": [dict(x.to_dict(), shard=shards[x.id], estimate_s=estimate(x, durations)) for x in chosen],
            "total_legs": len(legs), "shard": f"{shard[0]}/{shard[1]}" if shard else None,
            "plan_digest": digest(legs, durations), "durations_source": durations_source}


# --- a run folder's record of its legs ---------------------------------------------------------------------
def read_run_meta(run_dir: Path) -> dict:
    """A run folder's run.json (read under the input budget): an object whose ``legs`` are objects with a string
    ``id``; BadInput naming the folder otherwise (a merge or an upgrade check reads folders a user hands it)."""
    p = Path(run_dir) / "run.json"
    try:
        meta = inputs.load_json_file(p, inputs.RECORD_BYTES, "run.json")
    except (OSError, BadInput) as e:
        raise BadInput(f"{run_dir}: not a run folder of drills run (no readable run.json: {e})") from None
    if not isinstance(meta, dict):
        raise BadInput(f"{p}: not a run record (a JSON object with the run's legs)")
    legs_ = meta.get("legs", [])
    if not isinstance(legs_, list) or not all(isinstance(x, dict) and isinstance(x.get("id"), str) for x in legs_):
        raise BadInput(f"{p}: legs must be a list of objects with a string id")
    all_legs = meta.get("all_legs", []) or []
    if not isinstance(all_legs, list) or not all(isinstance(x, str) for x in all_legs):
        raise BadInput(f"{p}: all_legs must be a list of leg ids")
    return meta


# --- what a leg's record and rows say: coverage ---------------------------------------------------------------
PYTEST_EXITS = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests collected"}


@dataclass(frozen=True)
class Gap:
    """Something a run, a merge or an upgrade-check expected and lacks: a leg that did not run or did not finish,
    or ended with no rows.  ``code``: 3 inconclusive; 2 a leg refused before it started (bad input); 1 pytest failed
    a test of the leg while none of its rows failed (a step stopped before it could record its row)."""
    leg: str
    code: int
    cause: str

    @property
    def text(self) -> str:
        return f"leg {self.leg}: {self.cause}"


def split_router(leg_id: str) -> tuple[str, str]:
    """(controller/lane/variant, router) of a leg id (a router other than the default is its last part)."""
    head, _, tail = leg_id.rpartition("/")
    if head and tail in routers.NAMES and tail != routers.DEFAULT:
        return head, tail
    return leg_id, routers.DEFAULT


def rows_of(rows: list[dict], record: dict) -> list[dict]:
    """The rows a leg wrote (``record``: its entry in run.json): the rows naming it (``leg``); a row recorded
    without a leg, by its lane, controller and (when it says one) variant."""
    leg_id, router = split_router(str(record.get("id") or ""))
    router = record.get("router") or router
    parts = leg_id.rsplit("/", 2)        # controller/lane/variant, when the record lacks them
    controller, lane, want = (record.get(k) or (parts[i] if len(parts) == 3 else None)
                              for i, k in enumerate(("controller", "lane", "variant")))

    def mine(r: dict) -> bool:
        if r.get("leg"):
            return r["leg"] == record.get("id")
        if r.get("lane") != lane or (r.get("router") or routers.DEFAULT) != router:
            return False
        variant = (r.get("details") or {}).get("variant") if isinstance(r.get("details"), dict) else None
        if variant and want and variant != want:
            return False
        if record.get("release"):          # a user-built controller: its name (version plus commit)
            return r.get("controller_name") == controller
        return r.get("controller_version") == controller and not r.get("controller_sha256")
    return [r for r in rows if isinstance(r, dict) and mine(r)]


def leg_gap(record: dict, rows: list[dict]) -> Gap | None:
    """What a leg's end says of its rows (``rows``: the leg's own): None when pytest finished (exit 0, or 1 with a
    failing row) and recorded rows; else the Gap, its cause named."""
    leg, rc, error = str(record.get("id")), record.get("rc"), record.get("error")
    state = record.get("state")           # drills.run.run_stop's: a run stopped by a signal says each leg's state
    if state == "interrupted":
        return Gap(leg, 3, "stopped when the run was interrupted" + (f" after {len(rows)} row(s): its rows are "
                                                                    f"incomplete" if rows else ", before any row"))
    if state == "not started":
        return Gap(leg, 3, "not started: the run was interrupted first")
    if error:
        if rc == 2:
            return Gap(leg, 2, f"refused before it started: {error}")
        return Gap(leg, 3, f"did not run to its end: {error}")
    if isinstance(rc, bool) or not isinstance(rc, int):
        return Gap(leg, 3, "no exit recorded: it did not finish")
    if rc < 0:
        return Gap(leg, 3, f"pytest was killed by signal {-rc}" + (f" after {len(rows)} row(s): its rows are "
                                                                  f"incomplete" if rows else ", before any row"))
    if rc not in (0, 1):
        return Gap(leg, 3, f"pytest exit {rc} ({PYTEST_EXITS.get(rc, 'not a finished test run')}): it did not "
                           f"finish" + (f", its {len(rows)} row(s) are incomplete" if rows else ", no row"))
    if not rows:
        return Gap(leg, 3, f"pytest exit {rc} and no row recorded: nothing shows what it observed")
    if rc == 1 and exit_code(rows) == 0:
        return Gap(leg, 1, "pytest exit 1 while none of its rows failed: a step stopped before it recorded its "
                           "row (its log in legs/)")
    return None


def coverage(meta: dict, rows: list[dict], whole: bool = False) -> list[Gap]:
    """Every gap of a run folder (``meta``: its run.json): each leg's (leg_gap) and, ``whole`` (a merge: the plan
    is expected), each leg of the plan no folder ran, first."""
    ran = [x for x in meta.get("legs") or [] if isinstance(x, dict)]
    out = []
    if whole:
        have = {x.get("id") for x in ran}
        out += [Gap(i, 3, "no shard ran it (its run folder was not given, or its upload is missing)")
                for i in meta.get("all_legs") or [] if i not in have]
    for record in ran:
        gap = leg_gap(record, rows_of(rows, record))
        if gap is not None:
            out.append(gap)
    return out
