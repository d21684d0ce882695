"""Legs: the unit a run is made of, planned, balanced into shards, and timed.

A leg is (controller, lane, variant).  A run's legs come in a stable order (versions as given, lanes in registry
order, each lane's variants); ``--shard I/N`` takes a deterministic part of them: legs balanced by their
durations (the longest first onto the least-loaded shard, ties by leg id), so every leg is in exactly one shard
when every shard plans with the same durations.  Durations are measured by every run and kept in the cache
(``$DRILLS_CACHE/legs/durations.json``); a leg never measured counts with its lane's estimate.  The plan records
the digest of what it was balanced with, so a merge of shards can prove they were cut from one plan.
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

from . import config, inputs
from .errors import BadInput
from .lanes import REGISTRY

# a leg never measured: rough minutes per lane on the embedded cluster (replaced by measured durations)
ESTIMATES_S = {"a": 150.0, "b": 120.0, "abort": 330.0, "order": 260.0, "escape": 600.0}
VARIANT_MODES = ("stage", "prod", "both")


@dataclass(frozen=True)
class Leg:
    controller: str          # the release version (the cluster's), e.g. v1.8.2
    lane: str
    variant: str = "stage"
    label: str | None = None  # what the controller is called when it is not a release (user-built)

    @property
    def id(self) -> str:
        return f"{self.label or self.controller}/{self.lane}/{self.variant}"

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9.]+", "-", self.id).strip("-")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["controller"] = self.label or self.controller
        if self.label:
            d["release"] = self.controller
        d.pop("label")
        d["id"] = self.id
        return d


def lane_variants(lane: str, mode: str) -> tuple[str, ...]:
    have = REGISTRY[lane].variants
    if mode == "both":
        return have
    return (mode,) if mode in have else have[:1]


def plan(versions: list[str], lanes: list[str], mode: str = "stage", label: str | None = None) -> list[Leg]:
    if mode not in VARIANT_MODES:
        raise BadInput(f"--variant {mode!r}: choose from {', '.join(VARIANT_MODES)}")
    return [Leg(v, lane, variant, label) for v in versions for lane in lanes for variant in lane_variants(lane, mode)]


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


def estimate(leg: Leg, durations: dict[str, float]) -> float:
    return durations.get(leg.id) or ESTIMATES_S.get(leg.lane, 200.0)


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
