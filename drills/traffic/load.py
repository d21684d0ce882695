"""Load during drills: Locust, headless, as a subprocess; per-phase statistics; ledger rows.

Locust is never imported here: importing it patches the interpreter with gevent (and breaks the kubernetes
client).  It runs as ``python -m locust --headless`` with a locustfile from fixtures/locustfiles/ that writes
one JSONL record per request (wall start ``t``, latency ``ms``, status ``code``, ``ok``).  Per-phase figures
are cut from those records by the drill's phase windows (Locust's own history is per second and cumulative).

Bounds: at most MAX_USERS users, MAX_TOTAL_RPS requests/second in all, a run time, then a stop (see LoadRun.stop).
On the embedded cluster the target must be a 127.0.0.0/8 address (the mesh emulator); live, the stage's URL.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..core import config
from .load_target import LoadRefused, check_live_target, check_target  # noqa: F401  (also drills.traffic.load.*)
from ..record.ledger import FAIL, HAZARD, HOLDS, INCONCLUSIVE, NEUTRAL, PASS, UNVERIFIED
from ..core.names import is_plain_name
from ..core.procs import die_with_parent
from ..core.wait import until
from ..core import fastyaml

MAX_USERS = 20
MAX_TOTAL_RPS = 200.0          # two cores also run etcd, the apiserver, kcm, kwok and the controller
DEFAULT_USERS = 10
DEFAULT_RATE_PER_USER = 5.0
DEFAULT_LOCUSTFILE = "drill_load.py"
KILL_GRACE_S = 30.0            # after its run time or the stop request, Locust's time to write its stats (1-10+ s)
TERM_GRACE_S = 5.0             # after SIGTERM, how long before SIGKILL
STOP_HOOK = "_drills_stop.py"  # loaded next to every locustfile: the stop request and the users-stopped time
# How a LoadRun ended (``stop_outcome``).  Every outcome keeps the per-request records (the locustfile writes each
# one, line-buffered, when its response arrives): they are the evidence of every phase.  Locust's own final CSV,
# HTML and JSON summaries exist only after EXITED or STOPPED.  After TERMINATED or KILLED the requests in flight at the
# signal are nowhere unless Locust had said its users stopped before it (``users_stopped_at``); otherwise the phase
# that was running then is cut short (``mark_cut_short``): inconclusive, never a figure.
EXITED, STOPPED, TERMINATED, KILLED = "exited", "stopped", "terminated", "killed"
PHASES = ("steady", "exposure", "settled", "exit")
EMULATED_NOTE = ("load figures come from an emulated mesh (drills.traffic.mesh) on the embedded cluster; the drill "
                 "reproduces the weight in force, not the production pod arithmetic")


def locustfile_path(name: str = DEFAULT_LOCUSTFILE) -> Path:
    p = Path(name)
    return p if p.is_absolute() else config.fixtures_dir() / "locustfiles" / name


@dataclass
class LoadSpec:
    host: str
    out_dir: Path
    users: int = DEFAULT_USERS
    spawn_rate: float = 5.0
    run_time_s: float = 60.0
    rate_per_user: float = DEFAULT_RATE_PER_USER
    path: str = "/"
    locustfile: str = DEFAULT_LOCUSTFILE
    target: str = "embedded"
    request_timeout_s: float = 5.0
    name: str = "load"

    def validate(self) -> None:
        check_target(self.host, self.target)
        if not is_plain_name(self.name):       # it names every file of the run in out_dir
            raise LoadRefused(f"load run name {self.name!r:.80} is not a plain name (letters, digits, ._+-)")
        if not 1 <= self.users <= MAX_USERS:
            raise LoadRefused(f"users must be 1..{MAX_USERS}, got {self.users}")
        if self.spawn_rate <= 0:
            raise LoadRefused("spawn_rate must be > 0")
        if not 0 < self.run_time_s <= 3600:
            raise LoadRefused(f"run_time_s must be in (0, 3600], got {self.run_time_s}")
        if self.rate_per_user <= 0 or self.users * self.rate_per_user > MAX_TOTAL_RPS:
            raise LoadRefused(f"total rate {self.users} users x {self.rate_per_user}/s exceeds {MAX_TOTAL_RPS}/s")
        if not self.path.startswith("/"):
            raise LoadRefused(f"path must start with '/', got {self.path!r}")
        if "," in str(locustfile_path(self.locustfile)):      # Locust reads -f as a list
            raise LoadRefused(f"a locustfile path may not contain ',': {locustfile_path(self.locustfile)}")
        if not locustfile_path(self.locustfile).is_file():
            raise LoadRefused(f"no locustfile {locustfile_path(self.locustfile)}")


class LoadRun:
    """A running Locust; ``wait()`` or ``stop()`` ends it, never later than run_time + KILL_GRACE_S."""

    def __init__(self, spec: LoadSpec):
        spec.validate()
        self.spec = spec
        self.out = Path(spec.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.records_path = self.out / f"{spec.name}-requests.jsonl"
        self.records_path.write_text("")
        self.log = self.out / f"{spec.name}-locust.log"
        self.csv_prefix = self.out / f"{spec.name}"
        self.html = self.out / f"{spec.name}-report.html"
        self.json = self.out / f"{spec.name}-stats.json"
        self.stop_file = self.out / f"{spec.name}.stop"                     # drills asks Locust to end the run
        self.stopped_file = self.out / f"{spec.name}-users-stopped.json"    # Locust says its users stopped
        for stale in (self.stop_file, self.stopped_file):
            stale.unlink(missing_ok=True)
        run_time = max(1, math.ceil(spec.run_time_s))
        self.cmd = [sys.executable, "-m", "locust", "-f",
                    f"{locustfile_path(spec.locustfile)},{locustfile_path(STOP_HOOK)}", "--headless",
                    "--host", spec.host, "-u", str(spec.users), "-r", str(spec.spawn_rate), "-t", f"{run_time}s",
                    # a user in a request at the stop finishes it (response or timeout, recorded) before it stops
                    "--stop-timeout", str(math.ceil(spec.request_timeout_s) + 1),
                    "--csv", str(self.csv_prefix), "--csv-full-history",
                    "--html", str(self.html), "--json-file", str(self.json.with_suffix("")),
                    "--only-summary", "--exit-code-on-error", "0", "--loglevel", "WARNING"]
        env = dict(os.environ, DRILLS_LOAD_RECORDS=str(self.records_path), DRILLS_LOAD_PATH=spec.path,
                   DRILLS_LOAD_RATE=str(spec.rate_per_user), DRILLS_LOAD_TIMEOUT=str(spec.request_timeout_s),
                   DRILLS_LOAD_STOP_FILE=str(self.stop_file), DRILLS_LOAD_STOPPED_FILE=str(self.stopped_file),
                   PYTHONUNBUFFERED="1")
        self._logf = open(self.log, "ab")
        self.started_at = time.time()
        self.deadline = time.monotonic() + run_time + KILL_GRACE_S
        self.proc = subprocess.Popen(self.cmd, stdout=self._logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, cwd=str(self.out), start_new_session=True,
                                     preexec_fn=die_with_parent)
        self.ended_at: float | None = None
        self.stop_requested_at: float | None = None     # the stop file written (or the SIGINT sent in its place)
        self.signalled_at: float | None = None          # SIGTERM sent: Locust did not end on the stop request
        self.stopped_at: float | None = None
        self.stop_outcome: str | None = None
        self.killed = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self) -> int:
        try:
            rc = self.proc.wait(max(0.1, self.deadline - time.monotonic()))
            self.stop_outcome = self.stop_outcome or EXITED
        except subprocess.TimeoutExpired:       # past its run time and the grace: not a clean end
            return self.stop()
        return self._done(rc)

    def stop(self) -> int:
        """End the run now: the stop request (a file the stop hook watches: Locust stops its users and writes its
        CSV/HTML/JSON), after KILL_GRACE_S SIGTERM, after TERM_GRACE_S SIGKILL.  ``stop_outcome`` says which ended
        it (see EXITED ... KILLED)."""
        if self.proc.poll() is not None:
            self.stop_outcome = self.stop_outcome or EXITED
            return self._done(self.proc.returncode)
        for sig, grace, outcome in ((None, KILL_GRACE_S, STOPPED), (signal.SIGTERM, TERM_GRACE_S, TERMINATED),
                                    (signal.SIGKILL, 30.0, KILLED)):
            try:
                if sig is None:
                    self.stop_requested_at = time.time()
                    try:
                        self.stop_file.touch()        # an empty file: no data block to find on a full disk
                    except OSError:                   # no file at all: Locust's own SIGINT, as a terminal sends it
                        os.killpg(self.proc.pid, signal.SIGINT)
                else:
                    self.signalled_at = self.signalled_at or time.time()
                    os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                rc = self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                continue
            self.stop_outcome = outcome
            self.killed = outcome == KILLED
            self.stopped_at = time.time()
            return self._done(rc)
        raise RuntimeError(f"Locust (pid {self.proc.pid}) did not exit even after SIGKILL; log {self.log}")

    def _done(self, rc: int) -> int:
        if self.ended_at is None:
            self.ended_at = time.time()
            self._logf.close()
        return rc

    def users_stopped_at(self) -> float | None:
        """When Locust said its users had stopped (wall time, within this run; the stop hook writes it), or None."""
        try:
            with open(self.stopped_file, "rb") as f:          # a few bytes: read under a budget all the same
                at = json.loads(f.read(4096)).get("users_stopped_at")
            at = float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None
        except (OSError, ValueError, TypeError, AttributeError, OverflowError, RecursionError):
            return None
        return at if at is not None and self.started_at - 1.0 <= at <= time.time() + 1.0 else None

    def summary_files(self) -> list[Path]:
        """Locust's own final summaries: written at a clean end (EXITED, STOPPED).  After SIGTERM or SIGKILL none is
        used (the HTML never comes; a CSV or JSON there may be stale or written by a shutdown cut short)."""
        if self.stop_outcome not in (EXITED, STOPPED):
            return []
        return [p for p in (self.out / f"{self.spec.name}_stats.csv", self.html, self.json) if p.is_file()]

    def records(self) -> list[dict]:
        return read_records(self.records_path)

    def wait_first_responses(self, timeout: float = 60.0) -> None:
        """Until Locust has recorded its first responses (its start-up is no part of a phase); a Locust that
        exits first is an error naming its log."""
        def answered() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Locust exited ({self.proc.returncode}) before its first response; log {self.log}")
            return self.records_path.stat().st_size > 0
        until("Locust's first recorded responses", answered, timeout=timeout, interval=0.1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_load(host: str, out_dir: Path, **kw) -> LoadRun:
    return LoadRun(LoadSpec(host=host, out_dir=Path(out_dir), **kw))


def run_load(host: str, out_dir: Path, **kw) -> LoadRun:
    run = start_load(host, out_dir, **kw)
    run.wait()
    return run


def mark_cut_short(stats: dict[str, dict], phases: dict[str, tuple[float, float]], run: LoadRun) -> None:
    """The phases whose load is not all recorded are cut short (inconclusive, naming why):

    - Locust's users stopped before drills asked (its own run time ran out): a phase still open then has no load
      for the rest of it;
    - a signal ended Locust (SIGTERM or SIGKILL after the stop request) before it said its users had stopped: the
      phases open within a request timeout of the signal lose their requests in flight.  One that said so before
      the signal had nothing in flight: it lost only its own summaries."""
    stopped, asked = run.users_stopped_at(), run.stop_requested_at
    if stopped is not None and (asked is None or stopped < asked):
        for name, (_, end) in phases.items():
            if name in stats and end > stopped + 1.0:
                stats[name]["cut_short"] = (f"Locust's users stopped {end - stopped:.1f}s before phase {name} ended "
                                            f"(its run time ran out before drills stopped it): the phase's load is "
                                            f"not all recorded; log {run.log}")
    if run.stop_outcome not in (TERMINATED, KILLED) or run.signalled_at is None:
        return
    if stopped is not None and stopped < run.signalled_at:
        return
    for name, (_, end) in phases.items():
        if name in stats and end > run.signalled_at - run.spec.request_timeout_s:
            stats[name]["cut_short"] = (f"Locust had not stopped its users {KILL_GRACE_S:g}s after the stop request "
                                        f"and was {run.stop_outcome}: the requests in flight at the signal are not "
                                        f"recorded; log {run.log}")


def read_records(path: Path) -> list[dict]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass  # a line cut by a hard kill
    except FileNotFoundError:
        pass
    return out


# ---------------------------------------------------------------------------------------------------------
# per-phase statistics
# ---------------------------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]) of an unsorted list; None when empty."""
    if not values:
        return None
    s = sorted(values)
    k = max(1, math.ceil(q / 100.0 * len(s)))
    return s[min(k, len(s)) - 1]


def phase_stats(records: list[dict], phases: dict[str, tuple[float, float]]) -> dict[str, dict]:
    """{phase: {requests, failures, failure_ratio, p50_ms, p95_ms, codes, window}}.

    A request belongs to the phase in which it was sent (its wall start time ``t``, start inclusive,
    end exclusive).  failure_ratio and the percentiles are None when the phase saw no request.
    """
    out = {}
    for name, (t0, t1) in phases.items():
        if t1 < t0:
            raise ValueError(f"phase {name}: end {t1} before start {t0}")
        sel = [r for r in records if t0 <= r["t"] < t1]
        lat = [float(r["ms"]) for r in sel]
        fails = sum(1 for r in sel if not r["ok"])
        codes: dict[str, int] = {}
        for r in sel:
            codes[str(r["code"])] = codes.get(str(r["code"]), 0) + 1
        out[name] = {"requests": len(sel), "failures": fails,
                     "failure_ratio": (fails / len(sel)) if sel else None,
                     "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95),
                     "codes": codes, "window": [t0, t1], "duration_s": round(t1 - t0, 3)}
    return out


# ---------------------------------------------------------------------------------------------------------
# thresholds and ledger rows
# ---------------------------------------------------------------------------------------------------------
def load_thresholds(path: Path | None = None) -> dict:
    p = Path(path) if path else config.fixtures_dir() / "load" / "thresholds.yaml"
    return fastyaml.safe_load(p.read_text()) or {}


def threshold_for(thresholds: dict, lane: str, step: str, phase: str, metric: str) -> dict | None:
    lanes = thresholds.get("lanes") or {}
    lane_t = lanes.get(lane) or {}
    defaults = thresholds.get("defaults") or {}
    for scope in ((lane_t.get(step) or {}).get(phase), (lane_t.get(step) or {}).get("*"),
                  (lane_t.get("*") or {}).get(phase), defaults.get(phase), defaults.get("*")):
        if scope and metric in scope:
            return scope[metric]
    return None


def _expected_text(th: dict) -> str:
    parts = []
    if "min" in th:
        parts.append(f">= {th['min']}")
    if "max" in th:
        parts.append(f"<= {th['max']}")
    return " and ".join(parts)


def judge(value: float | None, th: dict) -> bool:
    return ("min" not in th or value >= th["min"]) and ("max" not in th or value <= th["max"])


# What a phase's figure means for the prescription: the failures users felt in BEFORE's exposure are the incident
# reproduced (its threshold asks for them: ``min``), AFTER's are the prescription holding (``max``); the rest neutral.
POLARITY = {("before", "exposure", "failure_ratio"): HAZARD, ("after", "exposure", "failure_ratio"): HOLDS}


def _shows(polarity: str, value, th: dict | None) -> bool | None:
    """Whether the figure shows the exposure (hazard) or the prescription holding (holds), by the thresholds."""
    if polarity == NEUTRAL or th is None or value is None:
        return None
    if polarity == HAZARD:
        return value >= th["min"] if "min" in th else not judge(value, th)
    return judge(value, th)


def _unanswered(url: str, phase: str, st: dict) -> str:
    codes = ", ".join(f"{c} x{n}" for c, n in sorted((st.get("codes") or {}).items()))
    return (f"no request to {url} succeeded in phase {phase} ({st['requests']} sent, {st['failures']} failed"
            f"{': ' + codes if codes else ''}): a phase without a successful request is no evidence (is the service "
            f"reachable from here?)")


def record_phase_rows(ledger, lane: str, step: str, stats: dict[str, dict], thresholds: dict, evidence,
                      emulated: bool = True, min_requests: int = 20, judged: str | None = None,
                      url: str | None = None) -> list[dict]:
    """Two ledger rows per phase: ``load.<phase>.failure_ratio`` and ``load.<phase>.p95_ms``.

    A phase with fewer than ``min_requests`` requests is ``inconclusive`` (too little evidence), never ``pass``.
    A metric without a threshold anywhere is recorded ``unverified``.  A phase the load generator did not cover to
    its end (``cut_short``: Locust exited) is ``inconclusive`` whatever its figures.  ``judged`` (a reason): the
    figures are observations, never failed against the thresholds (a user-built controller's); the thresholds
    still say what the figure shows (``shows``).  ``url`` (the load's target): a phase in which no request
    succeeded is ``inconclusive`` naming it: against a live service every such phase (an unreachable URL is no
    evidence), against the emulated mesh when no phase of the step had one (the emulator was never reached; its
    own failures under load are the figures the thresholds ask for).
    """
    rows = []
    reached = any(st["requests"] > st["failures"] for st in stats.values())
    for phase, st in stats.items():
        for metric in ("failure_ratio", "p95_ms"):
            th = threshold_for(thresholds, lane, step, phase, metric)
            value = st.get(metric)
            details = {"requests": st["requests"], "failures": st["failures"], "p50_ms": st.get("p50_ms"),
                       "codes": st.get("codes"), "window": st.get("window"), "phase": phase}
            if emulated:
                details["note"] = EMULATED_NOTE
            reason = None
            if st.get("cut_short"):        # the load generator died during the phase: never pass, never a figure
                verdict, expected, reason = INCONCLUSIVE, _expected_text(th) if th else None, st["cut_short"]
            elif url is not None and st["requests"] <= st["failures"] and (not emulated or not reached):
                verdict, expected, reason = INCONCLUSIVE, _expected_text(th) if th else None, \
                    _unanswered(url, phase, st)
            elif th is None:
                verdict, expected = UNVERIFIED, None
                if not emulated:
                    reason = (f"observed on {url or 'the live service'}: what users saw; no threshold judges a live "
                              f"service's figures")
            elif st["requests"] < min_requests or value is None:
                verdict, expected = INCONCLUSIVE, _expected_text(th)
                reason = f"only {st['requests']} requests in phase {phase} (< {min_requests}): too little evidence"
            elif judged:
                verdict, expected, reason = UNVERIFIED, None, judged
                details["threshold"] = _expected_text(th)
            else:
                expected = _expected_text(th)
                verdict = PASS if judge(value, th) else FAIL
            observed = round(value, 4) if isinstance(value, float) else value
            polarity = POLARITY.get((step, phase, metric), NEUTRAL)
            rows.append(ledger.record(lane, step, f"load.{phase}.{metric}", expected, observed, verdict,
                                      evidence=evidence, reason=reason, key=f"load.{phase}.{metric}",
                                      polarity=polarity, shows=_shows(polarity, value, th), **details))
    return rows
