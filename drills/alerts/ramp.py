"""The expected ramp of a rollback, from a Rollout's sizes and a stated readiness time per pod.

A rollback inside rollbackWindow jumps to the end of the steps and revives the old ReplicaSet from 0 pods.  Its
pods come up in two waves: first the pods the remaining rung needs (the weight lands on that rung once they are
available), then the rest, up to ``spec.replicas``; only then is the rollback promoted.  The weight sits below 100
for the whole ramp, so the alert waits for the ramp, with a margin, before it fires:

    c     = min(R, max(ceil(w * R / maxW), M))    pods of the first wave (R without a setWeight)
    waves = ceil(c / P) + ceil((R - c) / P)       P: pods that turn Ready at a time (default: all of them)
    ramp  = waves * T                             T: the stated readiness time of one pod
    for   = ceil(ramp * (1 + margin))

R ``spec.replicas``, M ``minPodsPerReplicaSet`` (1 when unset: a non-zero weight gets at least one pod), w the
remaining rung (the last setWeight, what the backward search lands on), maxW ``maxTrafficWeight`` (100).  The
pod count of the first wave is the controller's own (``utils/replicaset/canary.go``: max(ceil(V*R/maxW), M)).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..core.errors import BadInput

DEFAULT_READINESS_S = 30.0     # one pod: scheduled, image pulled, started, its readiness probe's first success
DEFAULT_MARGIN = 0.5           # the alert waits 50 % longer than the expected ramp
DEFAULT_ABORT_FOR_S = 60.0     # an abort followed at once by the operator's own escape does not page


class AlertInputError(BadInput):
    """Parameters of the rules that cannot give a ramp (exit 2)."""


@dataclass(frozen=True)
class RampParams:
    readiness_s: float = DEFAULT_READINESS_S
    margin: float = DEFAULT_MARGIN
    pods_at_once: int | None = None          # None: every pod of a wave turns Ready together
    abort_for_s: float = DEFAULT_ABORT_FOR_S

    def check(self) -> "RampParams":
        if not (isinstance(self.readiness_s, (int, float)) and 0 < self.readiness_s <= 86400):
            raise AlertInputError(f"--readiness {self.readiness_s!r}: give seconds, > 0 and at most a day")
        if not (isinstance(self.margin, (int, float)) and 0 <= self.margin <= 100):
            raise AlertInputError(f"--margin {self.margin!r}: give a fraction >= 0 (0.5 = 50 %)")
        if self.pods_at_once is not None and not (isinstance(self.pods_at_once, int) and self.pods_at_once >= 1):
            raise AlertInputError(f"--pods-at-once {self.pods_at_once!r}: give a pod count >= 1")
        if not (isinstance(self.abort_for_s, (int, float)) and 0 <= self.abort_for_s <= 86400):
            raise AlertInputError(f"--abort-for {self.abort_for_s!r}: give seconds, >= 0 and at most a day")
        return self


@dataclass(frozen=True)
class Ramp:
    replicas: int
    min_pods: int
    rung: int | None              # the remaining rung (last setWeight); None: no setWeight
    max_weight: int
    first_wave: int
    waves: int
    readiness_s: float
    ramp_s: float
    for_s: int
    margin: float
    pods_at_once: int | None

    def formula(self) -> str:
        """The formula with this Rollout's numbers in it (the rules' annotations and the README say the same)."""
        p = "all" if self.pods_at_once is None else str(self.pods_at_once)
        if self.rung is None:
            c = f"c = R = {self.replicas} (no setWeight)"
        else:
            c = (f"c = min(R, max(ceil(w*R/maxW), M)) = min({self.replicas}, max(ceil({self.rung}*{self.replicas}/"
                 f"{self.max_weight}), {self.min_pods})) = {self.first_wave}")
        return (f"{c}; waves = ceil(c/P) + ceil((R-c)/P) = {self.waves} (R {self.replicas}, P {p}); "
                f"ramp = waves * T = {self.waves} * {duration(self.readiness_s)} = {duration(self.ramp_s)}; "
                f"for = ceil(ramp * (1 + {self.margin:g})) = {duration(self.for_s)}")


def _waves(n: int, at_once: int | None) -> int:
    if n <= 0:
        return 0
    return 1 if at_once is None else math.ceil(n / at_once)


def expected_ramp(replicas: int, min_pods: int | None, rung: int | None, max_weight: int = 100,
                  params: RampParams = RampParams()) -> Ramp:
    r = max(1, int(replicas))
    m = 1 if min_pods is None else max(1, int(min_pods))
    mw = max(1, int(max_weight))
    first = r if not rung else min(r, max(math.ceil(rung * r / mw), m))
    waves = _waves(first, params.pods_at_once) + _waves(r - first, params.pods_at_once)
    ramp = waves * float(params.readiness_s)
    return Ramp(replicas=r, min_pods=m, rung=rung or None, max_weight=mw, first_wave=first, waves=waves,
                readiness_s=float(params.readiness_s), ramp_s=ramp,
                for_s=max(1, math.ceil(ramp * (1 + params.margin) - 1e-9)), margin=params.margin,
                pods_at_once=params.pods_at_once)


def duration(seconds: float) -> str:
    """A Prometheus duration: 1h2m3s, 1m30s, 16s, 500ms."""
    if seconds < 1 and seconds > 0:
        return f"{round(seconds * 1000)}ms"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    out = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{sec}s" if sec or not (h or m) else "")
    return out


def parse_seconds(text: str | float | int, what: str) -> float:
    """'90', '90s', '1m30s', '2m', '500ms' -> seconds (BadInput otherwise)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    t = str(text).strip()
    try:
        return float(t)
    except ValueError:
        pass
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)", t)
    if not parts or "".join(v + u for v, u in parts) != t:
        raise AlertInputError(f"{what} {text!r}: give seconds (90) or a duration (1m30s, 2m, 500ms)")
    return sum(float(v) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[u] for v, u in parts)
