"""promtool (built by the toolchain with Prometheus) on the generated rules: ``check rules`` and ``test rules``.

``unit_tests`` writes promtool unit tests for every Rollout of a rules document from the rules' own numbers:
held at the remaining rung past its ``for:`` (fires; resolves once promoted), a ramp that completes within its
expected ramp, a Healthy Rollout and one paused at the end of its steps (never fire), one that timed out at the rung
(Degraded: still fires), an aborted one (RolloutAborted fires, the stuck rule does not), and one whose
kube-state-metrics samples are missing (RolloutAlertMetricsMissing).  ``fill_annotations`` completes a hand-written test file (labels
and times written by hand) with the annotations of the rules it tests, which promtool compares too.
"""
from __future__ import annotations

import copy
import math
import subprocess
from pathlib import Path

import yaml

from ..core.procs import die_with_parent
from ..toolchain import Toolchain
from .metrics import (
    ABORT_PHASE, CANARY_WEIGHT, CURRENT_LABEL, PHASE, PHASES, POD_HASHES, ROLLOUT_INFO, STABLE_LABEL, STEP_INDEX,
    ksm_labels
)
from .ramp import duration, parse_seconds
from .rules import ABORTED, BLIND, GROUP_PREFIX, STUCK, expr_numbers

# a bound, not a pace: `promtool test rules` of the alert drill's generated tests takes ~7 CPU-s, and on two cores
# loaded by a lanes run and seven test workers it passed 120 s of wall once (run s69)
PROMTOOL_TIMEOUT_S = 300.0
RULES_FILE = "rules.yaml"


def promtool() -> Path:
    """The toolchain's promtool, built (with Prometheus) or waited for first."""
    return Toolchain().component("prometheus") / "promtool"


def run_promtool(args: list[str], cwd: Path, timeout: float = PROMTOOL_TIMEOUT_S,
                 stdin: str | None = None) -> tuple[int, str]:
    r = subprocess.run([str(promtool()), *args], cwd=str(cwd), capture_output=True, text=True, timeout=timeout,
                       input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                       preexec_fn=die_with_parent)
    return r.returncode, (r.stdout + r.stderr).strip()


def check_metrics(exposition: str) -> tuple[int, str]:
    """``promtool check metrics`` on a /metrics page (its format and naming lint)."""
    return run_promtool(["check", "metrics"], Path.cwd(), stdin=exposition)


def check_rules(path: Path) -> tuple[int, str]:
    path = Path(path)
    return run_promtool(["check", "rules", "--lint-fatal", path.name], path.parent)


def test_rules(folder: Path, rules_doc: dict, tests: dict[str, dict]) -> tuple[int, str]:
    """Write the rules (``rules.yaml``) and each test file into ``folder``; ``promtool test rules`` on them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RULES_FILE).write_text(yaml.safe_dump(rules_doc, sort_keys=False, width=200))
    names = []
    for name, doc in tests.items():
        (folder / name).write_text(yaml.safe_dump(doc, sort_keys=False, width=200))
        names.append(name)
    return run_promtool(["test", "rules", *names], folder)


# --- the rules' own numbers -------------------------------------------------------------------------------
def _rule(rules_doc: dict, namespace: str, name: str, alert: str) -> dict | None:
    g = next((g for g in rules_doc["groups"] if g["name"] == f"drills.rollout.{namespace}.{name}"), None)
    return next((r for r in (g or {}).get("rules", []) if r["alert"] == alert), None)


def fill_annotations(test_doc: dict, rules_doc: dict) -> dict:
    """A copy of ``test_doc`` whose expected alerts carry the annotations of the rule they name (by alertname and
    the namespace/name labels), unless the test gives its own."""
    doc = copy.deepcopy(test_doc)
    for group in doc.get("tests", []):
        for case in group.get("alert_rule_test", []) or []:
            for exp in case.get("exp_alerts", []) or []:
                labels = exp.get("exp_labels") or {}
                rule = _rule(rules_doc, labels.get("namespace", ""), labels.get("name", ""), case["alertname"])
                if rule is not None and "exp_annotations" not in exp:
                    exp["exp_annotations"] = dict(rule.get("annotations") or {})
    return doc


def series(metric: str, labels: dict) -> str:
    return metric + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _values(*parts: tuple[float, int]) -> str:
    """(value, samples) runs -> promtool's expanding notation."""
    return " ".join(f"{v:g}x{n - 1}" if n > 1 else f"{v:g}" for v, n in parts if n > 0)


def _phases(ksm: dict, *runs: tuple[str, int]) -> list[dict]:
    """kube-state-metrics' status.phase StateSet: one series per phase, 1 while the Rollout is in it."""
    return [{"series": series(PHASE, {**ksm, "phase": p}), "values": _values(*((float(q == p), n) for q, n in runs))}
            for p in PHASES]


def unit_tests(rules_doc: dict, eval_interval_s: float = 10.0) -> dict:
    """promtool unit tests of every Rollout in ``rules_doc``, from each rule's own ``for:`` and expression."""
    e = eval_interval_s
    tests = []
    for g in rules_doc["groups"]:
        ns, name = g["name"][len(GROUP_PREFIX):].split(".", 1)       # a namespace has no dot
        stuck, aborted, blind = (_rule(rules_doc, ns, name, a) for a in (STUCK, ABORTED, BLIND))
        ksm, ctl = ksm_labels(ns, name), {"namespace": ns, "name": name}
        info = {**ctl, "strategy": "canary", "traffic_router": "Istio"}
        if stuck is not None:
            base = {**ctl, **stuck["labels"]}
            firing = [{"exp_labels": base, "exp_annotations": stuck["annotations"]}]
            n_for = math.ceil(parse_seconds(stuck["for"], "for") / e)     # evaluations until it fires
            steps, max_w = expr_numbers(stuck["expr"])
            hold = n_for + 4                         # samples held at the rung, past for:
            total = hold + 6
            ramp = max(1, n_for - 2)                 # samples of a ramp that ends before for:
            rung = max(0, max_w - 1)
            index = {"series": series(STEP_INDEX, ksm), "values": _values((steps, total))}

            def case(title: str, weight_runs, phase_runs, checks, hashes=("stable", "revived")) -> dict:
                return {"name": f"{ns}/{name}: {title}", "interval": duration(e), "input_series": [
                    index, {"series": series(CANARY_WEIGHT, ksm), "values": _values(*weight_runs)},
                    *_phases(ksm, *phase_runs),
                    {"series": series(POD_HASHES, {**ksm, STABLE_LABEL: hashes[0], CURRENT_LABEL: hashes[1]}),
                     "values": _values((1, total))},
                    {"series": series(ROLLOUT_INFO, {**info, "phase": "Progressing"}), "values": _values((1, total))}],
                    "alert_rule_test": [{"eval_time": duration(t * e), "alertname": a, "exp_alerts": x}
                                        for t, a, x in checks]}
            tests += [
                case(f"held at the remaining rung past for: {stuck['for']}", [(rung, hold), (0, total - hold)],
                     [("Progressing", hold), ("Healthy", total - hold)],
                     [(n_for - 1, STUCK, []), (n_for, STUCK, firing), (hold - 1, STUCK, firing), (hold + 1, STUCK, [])]),
                case(f"a ramp that ends within for: {stuck['for']}", [(rung, ramp), (0, total - ramp)],
                     [("Progressing", ramp), ("Healthy", total - ramp)],
                     [(t, STUCK, []) for t in (n_for, hold, total - 1)]),
                case("Healthy", [(0, total)], [("Healthy", total)],
                     [(t, a, []) for t in (n_for, total - 1) for a in (STUCK, ABORTED)]),
                case("paused at the end of its steps", [(rung, total)], [("Paused", total)],
                     [(t, STUCK, []) for t in (n_for, total - 1)]),
                case(f"timed out (Degraded) at the remaining rung past for: {stuck['for']}", [(rung, total)],
                     [("Progressing", 2), ("Degraded", total - 2)], [(n_for, STUCK, firing), (total - 1, STUCK, firing)]),
                case(f"fully promoted, its pods short past for: {stuck['for']} (a first deploy, a scale-up)",
                     [(0, total)], [("Progressing", total)], [(t, STUCK, []) for t in (n_for, hold, total - 1)],
                     hashes=("stable", "stable"))]
        base = {**ctl, **aborted["labels"]}
        n_abort = math.ceil(parse_seconds(aborted["for"], "for") / e)
        total = n_abort + 4
        tests.append({"name": f"{ns}/{name}: aborted", "interval": duration(e), "input_series": [
            {"series": series(ROLLOUT_INFO, {**info, "phase": ABORT_PHASE}), "values": _values((1, total))},
            {"series": series(CANARY_WEIGHT, ksm), "values": _values((0, total))},
            {"series": series(STEP_INDEX, ksm), "values": _values((0, total))}, *_phases(ksm, ("Degraded", total))],
            "alert_rule_test": [
                {"eval_time": duration(max(0, n_abort - 1) * e), "alertname": ABORTED, "exp_alerts": [] if n_abort
                 else [{"exp_labels": base, "exp_annotations": aborted["annotations"]}]},
                {"eval_time": duration(n_abort * e), "alertname": ABORTED,
                 "exp_alerts": [{"exp_labels": base, "exp_annotations": aborted["annotations"]}]},
                {"eval_time": duration((total - 1) * e), "alertname": STUCK, "exp_alerts": []}]})
        if blind is not None:
            n_blind = math.ceil(parse_seconds(blind["for"], "for") / e)
            total = n_blind + 2
            tests.append({"name": f"{ns}/{name}: kube-state-metrics' samples missing", "interval": duration(e),
                          "input_series": [{"series": series(ROLLOUT_INFO, {**info, "phase": "Completed"}),
                                            "values": _values((1, total))}],
                          "alert_rule_test": [
                              {"eval_time": duration(n_blind * e), "alertname": BLIND,
                               "exp_alerts": [{"exp_labels": {**ctl, **blind["labels"]},
                                               "exp_annotations": blind["annotations"]}]}]})
    return {"rule_files": [RULES_FILE], "evaluation_interval": duration(e), "tests": tests}
