"""Canary step lists: the `--steps` text form, and what the weight code reads from a list."""
from __future__ import annotations

import re

_PAUSE_RE = re.compile(r"^pause(?::([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)?)?$", re.ASCII)
_WEIGHT_RE = re.compile(r"^[0-9]{1,3}$", re.ASCII)
MAX_STEPS = 64
MAX_PAUSE_S = 24 * 3600          # a timed pause longer than a day is no drill's step
NO_STEPS = ("none", "[]")


def parse_steps(text: str | None) -> list[dict]:
    """'5,pause:10s,100' -> [{setWeight:5},{pause:{duration:10s}},{setWeight:100}]; 'pause' = indefinite;
    'none' (or an empty string) = no steps at all (``steps: []``).  ValueError names the bad part."""
    if text is None or text.strip().lower() in ("", *NO_STEPS):
        return []
    raw_steps = [s.strip() for s in text.split(",")]
    if any(not s for s in raw_steps):
        raise ValueError(f"empty step in {text!r}: steps are separated by single commas")
    if len(raw_steps) > MAX_STEPS:
        raise ValueError(f"{len(raw_steps)} steps: at most {MAX_STEPS}")
    steps = []
    for raw in raw_steps:
        if _WEIGHT_RE.match(raw):
            w = int(raw)
            if not 0 <= w <= 100:
                raise ValueError(f"setWeight {w} is outside 0..100")
            steps.append({"setWeight": w})
            continue
        m = _PAUSE_RE.match(raw)
        if not m:
            raise ValueError(f"unknown step {raw!r}: use a weight (0-100), 'pause' or 'pause:10s'")
        if m.group(1) is None:
            steps.append({"pause": {}})
        else:
            seconds = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
            if not seconds <= MAX_PAUSE_S:
                raise ValueError(f"pause {raw!r}: a timed pause is at most {MAX_PAUSE_S // 3600}h")
            steps.append({"pause": {"duration": f"{m.group(1)}{m.group(2) or 's'}"}})
    return steps


def last_set_weight(steps: list[dict] | None) -> int:
    """The weight the backward search finds from the end of the list: the last setWeight value, 0 if none."""
    for s in reversed(steps or []):
        if "setWeight" in s:
            return int(s["setWeight"])
    return 0


def steps_text(steps: list[dict] | None) -> str:
    out = []
    for s in steps or []:
        if "setWeight" in s:
            out.append(str(s["setWeight"]))
        elif "pause" in s:
            d = (s["pause"] or {}).get("duration")
            out.append(f"pause:{d}" if d else "pause")
        else:
            out.append(next(iter(s)))
    return ",".join(out) or "none"


def cut_final_full_weight(steps: list[dict]) -> list[dict]:
    """The prescription: the list without its trailing ``setWeight: 100`` step(s)."""
    cut = list(steps)
    while cut and "setWeight" in cut[-1] and cut[-1]["setWeight"] == 100:
        cut = cut[:-1]
    return cut
