"""The Runbook base every lane is written on.

A lane is a runbook: a class whose methods marked ``@step(...)`` are its steps, run in order by the lane's
pytest file (lanes/<key>/), one test per step.  A step runs only when the steps it ``needs`` completed; it
records its ledger rows through ``row()`` (which stamps the lane), and the test asserts them with
``expect(row)``.  Each lane's data lives in fixtures/lanes/<key>/ with one ``expectations.yaml`` per lane:

    defaults: &seed {...}            # optional anchor
    versions:
      v1.8.2: *seed
      v1.8.5: {unverified: true, reason: "..."}   # a supported version not yet observed in this lane

A version with no entry runs and its rows are ``unverified`` (the expectations test refuses that for a
supported version, unless the entry says ``unverified: true`` with a reason).
"""
from __future__ import annotations

import functools
import json
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

import yaml

from ..core import config
from ..cluster.namespaces import drop_namespace, make_namespace, namespace_name
from ..core.errors import BadInput
from ..core.signals import Interrupted
from ..drill.together import Together, raising
from ..drill.kit import NO_EXPECTATION
from ..record.ledger import PASS, UNVERIFIED, Ledger, describe_row
from ..core import fastyaml

EXPECTATIONS = "expectations.yaml"
USER_BUILT = ("a user-built controller: its rows are observations, classified against a baseline release by "
              "drills upgrade-check, not held to a release's expectations")


def drop_namespaces(api, namespaces: list[str], log) -> None:
    """A lane's probe namespaces removed at its close, each on its own (one that cannot be removed is said, and the
    others are still removed)."""
    for ns in namespaces:
        try:
            drop_namespace(api, ns)
        except Exception as e:
            log(f"namespace {ns} could not be removed ({e}); the cluster's next `down` removes it")


class StepFailed(AssertionError):
    """A runbook step could not run or did not complete."""


class ExpectationsError(BadInput):
    """An expectations file that is not in the one layout."""


def step(*needs: str):
    """Mark a Runbook method as a runbook step that runs only after ``needs`` (step names) completed."""
    def deco(fn):
        @functools.wraps(fn)
        def run(self: "Runbook", *args, **kwargs):
            missing = [n for n in needs if n not in self.done]
            if missing:
                raise StepFailed(f"step {fn.__name__!r} cannot run: its prerequisite "
                                 f"{', '.join(repr(m) for m in missing)} did not complete")
            self.started.add(fn.__name__)
            out = fn(self, *args, **kwargs)
            self.done.add(fn.__name__)
            return out
        run.runbook_step = True
        run.needs = needs
        return run
    return deco


@dataclass
class LaneContext:
    """What a lane runs against: the API, its namespace and evidence folder, the ledger, the version."""
    api: object
    namespace: str
    evidence_dir: Path
    ledger: Ledger
    version: str
    cluster: object = None                     # the embedded cluster (None against a live one)
    audit_log: Path | None = None
    variant: str = "stage"
    options: dict = field(default_factory=dict)   # availability_control, rollback_via, source, crds, user_built
    log: Callable[[str], None] = print
    label: str | None = None       # a user-built controller's name (its version plus its commit); None: a release
    router: str = "istio"          # the traffic router the lane's Rollouts are routed by (drills.routers)

    @property
    def name(self) -> str:
        """What the controller is called in titles, captions and logs: the release, or a user-built one's name
        (``version`` stays the release its cluster stands in for, for lookups)."""
        return self.label or self.version


def load_expectations(key: str, data_dir: Path | None = None) -> dict[str, dict]:
    """version -> entry of fixtures/lanes/<key>/expectations.yaml (the one layout; ``data_dir``: the lane's own
    data folder, for a lane a package registers)."""
    path = (data_dir or config.fixtures_dir() / "lanes" / key) / EXPECTATIONS
    try:
        data = fastyaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        return {}
    except yaml.YAMLError as e:
        raise ExpectationsError(f"{path}: not valid YAML: {e}") from None
    versions = data.get("versions") if isinstance(data, dict) else None
    if not isinstance(versions, dict) or not all(isinstance(v, dict) for v in versions.values()):
        raise ExpectationsError(f"{path}: expected 'versions: {{<version>: {{...}}}}'")
    for v, entry in versions.items():
        if entry.get("unverified") and not entry.get("reason"):
            raise ExpectationsError(f"{path}: {v} is 'unverified: true' without a reason")
    return versions


class Runbook:
    key: ClassVar[str]
    title: ClassVar[str]
    variants: ClassVar[tuple[str, ...]] = ("stage",)
    extras: ClassVar[tuple[str, ...]] = ()          # toolchain components the lane needs besides the cluster
    estimate_s: ClassVar[float] = 200.0             # a leg's seconds before one was measured (plans, shards)
    routers: ClassVar[tuple[str, ...]] = ("istio",)  # the traffic routers the lane makes sense for
    # a leg stopped (SIGINT, or a step that ends the session): how long its probes in flight may unwind before the
    # lane removes what they made; the run SIGKILLs a leg 60 s after its SIGINT (drills.run.run_stop)
    probes_stop_s: ClassVar[float] = 30.0
    uses_helm: ClassVar[bool] = False                # the lane runs helm (its leg waits for the helm build)

    def __init__(self, ctx: LaneContext):
        self.ctx = ctx
        self.done: set[str] = set()
        self.started: set[str] = set()
        user_built = bool(ctx.options.get("user_built"))
        # a user-built controller is classified against a baseline (drills upgrade-check), never held to the
        # expectations of the release it is nearest to
        entry = None if user_built else load_expectations(self.key, self.data_dir()).get(ctx.version)
        self.verified = bool(entry) and not entry.get("unverified")
        self.expectations: dict = (entry or {}) if self.verified else {}
        self.no_expectation = USER_BUILT if user_built else NO_EXPECTATION
        self.probes: Together | None = None
        self.namespaces: list[str] = []      # the probes' namespaces (start_in_namespaces), removed at close

    # --- probes side by side --------------------------------------------------------------------------------
    def together(self) -> Together:
        """The lane's probes side by side (drills.drill.together); their lines (``Together.lines_of``) are written in
        the step that reads each, so a failing step's report holds its own probe's lines."""
        if self.probes is None:
            self.probes = Together(self.key, self.ctx.log, stop_s=self.probes_stop_s, hold_lines=True)
        return self.probes

    def run_together(self, jobs) -> Together:
        """The lane's independent probes (name -> ``fn(reached=...)``), started once, at the first step that asks,
        side by side: each step then reads its own probe's result, or a point it reached, and records its rows
        itself.  Each probe's Rollout is in a namespace of its own, made before this (a probe whose set-up failed:
        ``drills.drill.together.raising``, its failure raised in its own step)."""
        t = self.together()
        for name, fn in jobs.items():
            if name not in t:
                t.start(name, fn)
        return t

    def start_in_namespaces(self, prefix: str, names, probe) -> Together:
        """``probe(name, namespace, reached=...)`` for each of ``names``, side by side, each in a namespace of its own
        (``<prefix>-<name>``, made here, recorded before it is made); one that cannot be made fails its own step."""
        if self.probes is None or not any(n in self.probes for n in names):
            jobs = {}
            for name in names:
                ns = namespace_name(f"{prefix}-{name}")
                self.namespaces.append(ns)      # recorded first: a signal inside the create still finds it
                try:
                    make_namespace(self.ctx.api, ns)
                except Exception as e:          # raised in its own step, not the others'
                    jobs[name] = raising(e)
                    continue
                jobs[name] = functools.partial(probe, name, ns)
            self.run_together(jobs)
        return self.probes

    def stop_probes(self, leftovers: str = "") -> list[str]:
        """Probes still in flight (the leg stopped, or a step failed and the session ended) are told to stop and
        unwind: the names of those that did not within ``probes_stop_s``."""
        if self.probes is None:
            return []
        return self.probes.stop(Interrupted(signal.SIGINT, f"lane {self.key} ended with its probes in flight"),
                                leftovers=leftovers)

    # --- data (a lane another package registers, through the drills.lanes entry point group, overrides both) ----
    @classmethod
    def data_dir(cls) -> Path:
        return config.fixtures_dir() / "lanes" / cls.key

    @classmethod
    def tests_dir(cls) -> Path:
        return config.lanes_dir() / cls.key

    @classmethod
    def expectation_versions(cls) -> dict[str, dict]:
        return load_expectations(cls.key, cls.data_dir())

    @classmethod
    def expectation_keys(cls) -> list[str]:
        """What the expectation file is keyed by, each of which it must have an entry for (or say why not): the
        supported versions (lane swap: the version pairs)."""
        return list(config.SUPPORTED_CONTROLLERS)

    def data(self, name: str) -> dict:
        path = self.data_dir() / name
        return fastyaml.safe_load(path.read_text())

    def expected(self, key: str, default=None):
        return self.expectations.get(key, default)

    # --- rows ----------------------------------------------------------------------------------------
    def row(self, step: str, assertion: str, expected, observed, verdict: str, evidence=None, reason=None,
            **details) -> dict:
        return self.ctx.ledger.record(self.key, step, assertion, expected, observed, verdict, evidence=evidence,
                                      reason=reason, **details)

    def observation(self, name: str, data) -> Path:
        """A row's evidence when no recording holds it (what was read back from the API, what a scan computed): the
        observation written whole as JSON under the lane's evidence folder, its path for the row's ``evidence``."""
        folder = Path(self.ctx.evidence_dir) / self.key
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / (re.sub(r"[^A-Za-z0-9._-]+", "-", f"{self.ctx.name}-{name}").strip("-.") + ".json")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str, sort_keys=True))
        tmp.replace(path)              # whole or not at all: a cut write is never taken as the observation
        return path

    def expect(self, row: dict, also: tuple[str, ...] = ()) -> dict:
        """The row must pass (``unverified`` only on a version this lane has no expectations for)."""
        allowed = (PASS, *also) if self.verified else (PASS, UNVERIFIED, *also)
        assert row["verdict"] in allowed, describe_row(row)
        return row

    # what a probe of the lane leaves when it is stopped, besides its namespace (said if it does not stop)
    probes_leave: ClassVar[str] = ""

    def close(self) -> None:
        """Stop what the lane started (always called): the probes in flight, then their namespaces (a lane that
        overrides it and runs probes side by side calls ``stop_probes`` first)."""
        self.stop_probes(leftovers=f"namespaces {', '.join(self.namespaces)}{self.probes_leave} (the cluster's next "
                                   f"`down` removes the namespaces)")
        drop_namespaces(self.ctx.api, self.namespaces, self.ctx.log)

    # --- the report ----------------------------------------------------------------------------------
    @classmethod
    def report_sections(cls, cells: dict, out_dir: Path | None = None) -> list[dict]:
        """Sections of this lane in the matrix (override): ``cells`` maps (version, step, assertion) to the
        newest row; pictures go under ``out_dir``.  A section: {"title", "note", "columns", "rows": [[label,
        [row, ...], ...]], "callouts": [text], "figures": [{"png", "caption"}]}."""
        return []
