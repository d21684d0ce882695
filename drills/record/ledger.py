"""The record: one row per assertion, kept in reports/<run-id>/ledger.json (a JSON array).

Fields (DESIGN.md §4): run_id, target, controller_version, lane, step, assertion, expected, observed,
verdict, evidence; plus reason (for inconclusive / not_applicable), controller_sha256 and controller_name
(user-built controllers: the version they report plus their commit), ``leg`` (the id of the leg of `drills run`
that wrote the row, controller/lane/variant[/router]: a row is tied to its leg), ``router`` (the traffic router it
was observed through: istio, nginx; a row without one is Istio's) and free-form details.  What a row means
for the prescription (drills.record.answer): ``id`` (lane/step/key), ``polarity`` (holds, hazard, neutral), ``shows``,
``fact`` and, for a version hazard, ``condition``.  Provenance: drills_version, drills_commit,
kubernetes_version.  Several processes of one run (one per controller version) append to the same file under
a lock.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path

from ..core import config, inputs
from ..core.errors import BadInput, combine_exit_codes  # noqa: F401  (combine_exit_codes: kept importable here)
from ..core.provenance import stamp

PASS, FAIL, INCONCLUSIVE, UNVERIFIED, NOT_APPLICABLE = "pass", "fail", "inconclusive", "unverified", "not_applicable"
VERDICTS = (PASS, FAIL, INCONCLUSIVE, UNVERIFIED, NOT_APPLICABLE)
# what a row means for the prescription (drills.record.answer): evidence that it works, evidence of exposure, neither
HOLDS, HAZARD, NEUTRAL = "holds", "hazard", "neutral"
POLARITIES = (HOLDS, HAZARD, NEUTRAL)
_KEY_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")


def make_id(lane: str, step: str, key: str) -> str:
    """An assertion's stable id, ``lane/step/key`` (the key: lower-case letters, digits, '.', '_', '-')."""
    if not _KEY_RE.fullmatch(str(key or "")):
        raise ValueError(f"an assertion key is lower-case letters, digits, '.', '_', '-': {key!r}")
    return f"{lane}/{step}/{key}"


def key_of(text: str) -> str:
    """A key made from a sentence, for an assertion that declares none (stable while the sentence is)."""
    return re.sub(r"[^a-z0-9._]+", "-", str(text).lower()).strip("-")[:160] or "row"


def finite_number(v) -> float | None:
    """A row's value as a finite float; None for booleans, missing and non-numeric values."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lk, fcntl.LOCK_UN)


class LedgerError(BadInput):
    """A ledger file that is not a JSON array of rows: exit 2, naming the file."""


REQUIRED = ("lane", "step", "assertion", "verdict", "controller_version")
# the fields a row is keyed, paired, judged and shown on, when it has them (null or missing: not said)
TYPED = {**{k: (str,) for k in ("id", "leg", "router", "run_id", "shard_run_id", "controller_name", "controller_sha256",
                                 "target", "polarity", "fact", "condition", "reason", "recorded_at",
                                 "recorded_verdict")},
         "shows": (bool,), "details": (dict,)}


def read_rows(path: Path) -> list[dict]:
    """The rows of a ledger file ([] when it does not exist); LedgerError when it is not a ledger."""
    path = Path(path)
    try:
        data = inputs.load_json_file(path, inputs.RECORD_BYTES, "ledger")
    except FileNotFoundError:
        return []
    except OSError as e:
        raise LedgerError(f"ledger {path}: cannot read it ({e})") from None
    except BadInput as e:                 # not JSON, or over the size or depth budget
        raise LedgerError(f"ledger {e}") from None
    if not isinstance(data, list):
        raise LedgerError(f"ledger {path}: not a JSON array of rows")
    for i, row in enumerate(data):
        if not isinstance(row, dict) or any(not isinstance(row.get(k), str) for k in REQUIRED):
            raise LedgerError(f"ledger {path}: row {i} lacks {', '.join(REQUIRED)} (or is not an object)")
        if row["verdict"] not in VERDICTS:
            raise LedgerError(f"ledger {path}: row {i} has an unknown verdict {row['verdict']!r}")
        wrong = [k for k, types in TYPED.items() if row.get(k) is not None and not isinstance(row[k], types)]
        if wrong:
            raise LedgerError(f"ledger {path}: row {i}: {', '.join(wrong)} not of the type drills writes "
                              f"({', '.join(f'{k}: {TYPED[k][0].__name__}' for k in wrong)})")
    return data


class Ledger:
    def __init__(self, run_dir: Path, run_id: str, target: str, controller_version: str,
                 controller_sha256: str | None = None, controller_name: str | None = None,
                 kubernetes_version: str | None = None, leg: str | None = None, router: str = "istio"):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "ledger.json"
        self.run_id = run_id
        self.target = target
        self.controller_version = controller_version
        self.controller_sha256 = controller_sha256
        self.controller_name = controller_name        # a user-built controller's: its version plus its commit
        # the embedded cluster runs the pinned Kubernetes; a live target says its own (None: not known)
        self.kubernetes_version = kubernetes_version or (config.KUBERNETES_VERSION if target == "embedded" else None)
        self.leg = leg                                # the leg of `drills run` that writes these rows
        self.router = router                          # the traffic router the rows were observed through
        self.rows: list[dict] = []

    def record(self, lane: str, step: str, assertion: str, expected, observed, verdict: str,
               evidence: str | None = None, reason: str | None = None, *, key: str | None = None,
               polarity: str = NEUTRAL, shows: bool | None = None, fact: str | None = None,
               condition: str | None = None, router: str | None = None, **details) -> dict:
        """One row.  ``key`` makes the stable id lane/step/key; ``polarity``, ``shows``, ``fact`` and
        ``condition`` say what the observation means for the prescription (drills.record.answer); ``router``: the router
        this observation went through when it is not the ledger's (a scan's probe of an nginx Rollout)."""
        if verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {verdict!r}")
        if verdict in (INCONCLUSIVE, NOT_APPLICABLE) and not reason:
            raise ValueError(f"a {verdict} row needs a reason")
        if polarity not in POLARITIES:
            raise ValueError(f"unknown polarity {polarity!r}: {', '.join(POLARITIES)}")
        row = {
            "run_id": self.run_id, "target": self.target, "controller_version": self.controller_version,
            "id": make_id(lane, step, key or key_of(assertion)),
            "lane": lane, "step": step, "router": router or self.router, "assertion": assertion, "expected": expected,
            "observed": observed,
            "verdict": verdict, "evidence": self._rel(evidence), "reason": reason,
            "polarity": polarity,
            "shows": None if polarity == NEUTRAL or verdict not in (PASS, FAIL, UNVERIFIED) else shows,
            "fact": fact, "condition": condition,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **stamp(self.kubernetes_version),
        }
        if self.controller_sha256:
            row["controller_sha256"] = self.controller_sha256
        if self.controller_name:
            row["controller_name"] = self.controller_name
        if self.leg:
            row["leg"] = self.leg
        if details:
            row["details"] = details
        self.rows.append(row)
        with _locked(self.path):
            rows = read_rows(self.path)
            rows.append(row)
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(rows, indent=2, default=str))
            os.replace(tmp, self.path)
        return row

    def _rel(self, evidence):
        if not evidence:
            return None
        p = Path(evidence)
        try:
            return str(p.resolve().relative_to(self.run_dir.resolve()))
        except ValueError:
            return str(p)


def describe_row(row: dict) -> str:
    """One line for a failure message: the assertion, what was expected and observed, the verdict."""
    details = row.get("details") or {}
    return (f"{row['lane']}/{row['step']}: {row['assertion']}: expected {row['expected']!r}, observed "
            f"{row['observed']!r}, verdict {row['verdict']}"
            + (f" ({row['reason']})" if row.get("reason") else "")
            + (f"; {details['series_text']}" if details.get("series_text") else ""))


def exit_code(rows: list[dict]) -> int:
    """0 all pass, 1 any fail, 3 any inconclusive (fail wins)."""
    verdicts = {r.get("verdict") for r in rows}
    if FAIL in verdicts:
        return 1
    if INCONCLUSIVE in verdicts:
        return 3
    return 0


def rewrite_rows(path: Path, change) -> list[dict]:
    """Replace every row of a ledger file by ``change(row)`` under the ledger's lock (a run judging its own rows
    after its legs ended); returns the rows as written."""
    with _locked(path):
        rows = [change(r) for r in read_rows(path)]
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(rows, indent=2, default=str))
        os.replace(tmp, path)
    return rows
