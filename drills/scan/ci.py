"""CI outputs: SARIF 2.1.0 (code scanning) and JUnit XML.

SARIF results sit on the offending step of the file that declares the steps (a manifest, or the values layer
of a fleet render; else the fleet's apps file).  Every result has a physical location, which code scanning
requires, in every input mode: standard input is the path ``--stdin-name`` gives (default ``stdin.yaml``,
described as standard input in the location), a Rollout read from a cluster is ``cluster/<context>/<ns>/<name>``
(no file holds it; the location says so).  Each rule has a full description and a markdown help with the fix;
each result names the controller version it was predicted on, in its message and in its fingerprint (a
two-version scan gives one result per version, never two with one fingerprint).  The run's
``automationDetails.id`` says what was scanned, so uploads of different environments stay apart.  Rule ids:
the lint rules of advice.py plus ``rollback-exposure`` (the predicted peak is above the share of capacity that
carries it), ``not-modelled`` (a note: what the prediction of that Rollout leaves out, ``not modelled: <what>``)
and ``unreadable-input`` (a file or object the scan could not read, on its file and line).
"""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from urllib.parse import quote

from .. import __version__
from ..core import config
from .advice import ABOVE_SAFE, CRD_PRUNED, CRD_REJECTED, ERROR, FINAL_100, INVALID_SPEC, LINT_RULES, RATIO, WARNING
from .autoscalers import conflict_text
from .model import last_set_weight_step, steps_text

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
EXPOSURE, NOT_MODELLED, UNREADABLE, NOTE = "rollback-exposure", "not-modelled", "unreadable-input", "note"
AT_MAX, UNJOINED, CONFLICT = "rollback-exposure-at-max", "autoscaler-unjoined", "autoscaler-conflict"
STDIN_PATH = "stdin.yaml"          # where results read from standard input sit without --stdin-name
RULES = {EXPOSURE: ("a rollback inside rollbackWindow puts more traffic on the revived pods than their share of "
                    "capacity", ERROR), **{k: (v, WARNING if k in (ABOVE_SAFE, RATIO) else ERROR)
                                           for k, v in LINT_RULES.items()},
         NOT_MODELLED: ("what the prediction of this Rollout does not model", NOTE),
         UNREADABLE: ("a file or an object the scan could not read", ERROR),
         AT_MAX: ("at its autoscaler's maxReplicas a rollback inside rollbackWindow puts more traffic on the revived "
                  "pods than their share of capacity", ERROR),
         UNJOINED: ("an autoscaler names a Rollout the scan did not read", WARNING),
         CONFLICT: ("two autoscalers target one Rollout", WARNING)}
WHY = ("Inside `rollbackWindow` a rollback jumps `status.currentStepIndex` to the end of the steps; while the "
       "revived ReplicaSet is still partly available the traffic code searches backwards for the last `setWeight`, "
       "so that weight lands on the few pods that are up.")
FULL = {
    EXPOSURE: "The predicted peak canary weight while the revived ReplicaSet is partly available is above the share "
              "of the Rollout's pods that carry it: users see errors or latency from the few revived pods. " + WHY,
    FINAL_100: "The last setWeight of the canary steps is 100. " + WHY + " With a final `setWeight: 100` that is all "
               "traffic.",
    RATIO: "Once the final 100 is removed, the remaining last rung is more than three times the first rung; the "
           "pods the first rung sized may not carry it.",
    ABOVE_SAFE: "spec.replicas is above the largest replica count whose rollback puts no more than its share of "
                "traffic on the pods that first carry the remaining rung.",
    INVALID_SPEC: "The controller's validation refuses the spec (an InvalidSpec condition): a step sets two of "
                  "`setWeight`, `pause`, `experiment` and `analysis`, or none of the step fields. The controller "
                  "reconciles nothing of this Rollout.",
    CRD_PRUNED: "The Rollout CRD of this controller version has no such field where it was put. The apiserver prunes "
                "unknown fields (structural schema), so the controller never sees it: `rollbackWindow` under "
                "`strategy.canary` means no rollbackWindow at all. The prediction is made without it.",
    CRD_REJECTED: "A value the Rollout CRD's schema refuses (its type, its enum, a required field missing): the "
                  "apiserver rejects the Rollout.",
    NOT_MODELLED: "Something the controller does on this Rollout's rollback that the prediction leaves out (a step "
                  "field at steps[0] such as `setHeaderRoute`, or an analysis the version does not skip).",
    UNREADABLE: "The scan could not read this file or object (not valid YAML, a chart template read as a manifest, a "
                "field of the wrong type); it went on with the rest and exits 2.",
    AT_MAX: "An autoscaler (HorizontalPodAutoscaler or KEDA ScaledObject) may scale this Rollout to maxReplicas. At "
            "that size the pods that first carry the rung the backward search picks are a smaller share of the "
            "Rollout than the weight they get: the window that is closed at the current size is open there. " + WHY,
    UNJOINED: "An autoscaler's scaleTargetRef names a Rollout that is not among the Rollouts read (same namespace and "
              "name, apiVersion argoproj.io/v1alpha1): its sizes are not predicted.",
    CONFLICT: "Two autoscalers target the same Rollout and fight over spec.replicas. Neither is picked: the range "
              "either allows is predicted.",
}
FIX = {
    EXPOSURE: "Delete the final `setWeight: 100` step (the controller still goes to 100 after the last step, by "
              "its own default). When the remaining rung is high, lower the earlier rungs or raise "
              "`minPodsPerReplicaSet`; when `replicaProgressThreshold` is set (v1.9+), drop it: the end-of-steps "
              "branch writes 100 whatever the steps.",
    FINAL_100: "Delete the final `setWeight: 100` step, for example `[5, pause: 10m, 100]` becomes "
               "`[5, pause: 10m]`: the Rollout still reaches 100 % after its last step.",
    RATIO: "Keep the last rung at most three times the first (`w_last <= 3 x w_first`), or raise "
           "`minPodsPerReplicaSet` so the first revived pods carry it.",
    ABOVE_SAFE: "Raise `minPodsPerReplicaSet` or lower the remaining rung so its pods carry its share.",
    INVALID_SPEC: "Split the step: one of `setWeight`, `pause`, `experiment` or `analysis` per step (the others, "
                  "such as `setCanaryScale` or `setHeaderRoute`, may go with it).",
    CRD_PRUNED: "Move the field where the message says it belongs (for example `spec.rollbackWindow`), or drop it "
                "when this controller version has no such field.",
    CRD_REJECTED: "Give the field the type or value the CRD asks for.",
    NOT_MODELLED: "Nothing to fix for the scan: judge that part of the rollback yourself, or probe it "
                  "(`drills probe`).",
    UNREADABLE: "Fix the file where it says; for a chart, scan the chart folder (it is rendered with helm).",
    AT_MAX: "Delete the final `setWeight: 100` if there is one; then lower the remaining rung or raise "
            "`minPodsPerReplicaSet` to the numbers the message gives for maxReplicas, or lower maxReplicas.",
    UNJOINED: "Scan the Rollout with its autoscaler (the same input, cluster or app), or fix scaleTargetRef "
              "(`apiVersion: argoproj.io/v1alpha1`, `kind: Rollout`, the Rollout's name).",
    CONFLICT: "Keep one autoscaler per Rollout (KEDA makes its own HPA: do not add another).",
}


def _uri(path: str) -> str:
    p = Path(path)
    return p.resolve().as_uri() if p.is_absolute() else quote(p.as_posix())


def _artifact(r, file: str | None) -> tuple[str, str | None]:
    """The artifact a result sits on (a URI) and, for one that is no file of the repository, what it stands for."""
    ro = r.ro
    if ro.origin.get("cluster"):
        parts = [ro.origin["cluster"], ro.namespace or "default", ro.name]
        return ("cluster/" + "/".join(quote(str(x), safe="") for x in parts),
                f"Rollout {ro.key} read from the live cluster (context {ro.origin['cluster']}), not from a file")
    if file and file.startswith("render of"):
        file = ro.origin.get("apps_file")
    if not file or file.startswith("<"):
        return STDIN_PATH, "standard input (no --stdin-name given): a path drills scan stands in for it"
    return _uri(file), None


def _location(r, file: str | None, line: int | None, logical: str) -> dict:
    uri, described = _artifact(r, file)
    art = {"uri": uri}
    if described:
        art["description"] = {"text": described}
    loc = {"physicalLocation": {"artifactLocation": art}}
    if line and not r.ro.origin.get("cluster"):
        loc["physicalLocation"]["region"] = {"startLine": int(line)}
    loc["logicalLocations"] = [{"name": logical, "kind": "resource"}]
    return loc


def _version(r) -> str:
    return r.ro.controller_version or "unknown"


def _exposure_message(r) -> str:
    p = r.pred
    return (f"{r.ro.key} ({r.ro.source}, controller {_version(r)}, {r.ro.routing} routing, steps "
            f"{steps_text(r.ro.steps)}, replicas {r.ro.replicas}): a rollback inside rollbackWindow puts canary "
            f"weight {p.peak} on {p.carrying} revived pod(s) = {p.share:.0%} of capacity. Rule {p.rule}: {p.text}. "
            f"Fix wave {r.wave}.")


def _fingerprint(r, rule: str) -> dict:
    return {"rollout/v1": f"{r.ro.source}#{r.ro.key}#{rule}#{_version(r)}"}


def automation_id(records, scope: str | None = None) -> str:
    """What was scanned, as code scanning's category (the part before the last '/') plus the run."""
    where = scope or ", ".join(sorted({str(r.ro.origin.get("cluster") or r.ro.origin.get("env") or "manifests")
                                       for r in records})) or "nothing"
    return "drills-scan/" + (re.sub(r"[^A-Za-z0-9._-]+", "-", where).strip("-") or "scan") + "/"


def _at_max_message(r) -> str:
    lo, hi = r.ro.size_range
    p, close = r.sizes["max"], r.sizes.get("close")
    fix = close["text"] if close else "deleting the final setWeight 100 closes it"
    return (f"{r.ro.key} ({r.ro.source}, controller {_version(r)}, steps {steps_text(r.ro.steps)}, autoscaled "
            f"{lo}..{hi} by {', '.join(a.describe() for a in r.ro.autoscalers)}): at maxReplicas {hi} a rollback "
            f"inside rollbackWindow puts canary weight {p.peak} on {p.carrying} revived pod(s) = {p.share:.1%} of "
            f"capacity (window {r.sizes['window']}). Rule {p.rule}. {fix}.")


def _autoscaler_results(records, unjoined, ids) -> list[dict]:
    out = []
    for u in unjoined:
        file = u.get("file")
        uri = ("cluster/" + quote(file.split(":", 1)[1], safe="") + f"/{quote(u['namespace'], safe='')}/"
               f"{quote(u['name'], safe='')}" if file and file.startswith("cluster:")
               else _uri(file) if file and not file.startswith(("<", "render of")) else STDIN_PATH)
        loc = {"physicalLocation": {"artifactLocation": {"uri": uri}}}
        if u.get("line") and not uri.startswith("cluster/"):
            loc["physicalLocation"]["region"] = {"startLine": int(u["line"])}
        out.append({"ruleId": UNJOINED, "ruleIndex": ids.index(UNJOINED), "level": WARNING,
                    "message": {"text": f"{u['kind']} {u['namespace']}/{u['name']} ({u['source']}): {u['why']}"},
                    "locations": [loc],
                    "partialFingerprints": {"rollout/v1": f"{u['source']}#{u['kind']}/{u['name']}#{UNJOINED}"}})
    for r in records:
        logical = f"{r.ro.origin.get('cluster') or r.ro.origin.get('env') or 'manifest'}/{r.ro.key}"
        where = [_location(r, r.ro.file, r.ro.line, logical)]
        if len(r.ro.autoscalers) > 1:
            out.append({"ruleId": CONFLICT, "ruleIndex": ids.index(CONFLICT), "level": WARNING,
                        "message": {"text": f"{r.ro.key} ({r.ro.source}, controller {_version(r)}): "
                                            f"{conflict_text(r.ro)}"},
                        "locations": where, "partialFingerprints": _fingerprint(r, CONFLICT),
                        "properties": {"controller_version": _version(r)}})
        if r.sizes and r.exposed_at_max:
            i, _ = last_set_weight_step(r.ro.steps)
            line = r.ro.step_lines[i] if i is not None and i < len(r.ro.step_lines) and r.ro.step_lines[i] \
                else (r.ro.steps_line or r.ro.line)
            close = r.sizes.get("close") or {}
            out.append({"ruleId": AT_MAX, "ruleIndex": ids.index(AT_MAX), "level": ERROR,
                        "message": {"text": _at_max_message(r)},
                        "locations": [_location(r, r.ro.steps_file or r.ro.file, line, logical)],
                        "partialFingerprints": _fingerprint(r, AT_MAX),
                        "properties": {"max_replicas": r.ro.size_range[1], "controller_version": _version(r),
                                       "predicted_peak_weight": r.sizes["max"].peak,
                                       "pods_carrying": r.sizes["max"].carrying,
                                       "rung_at_most": close.get("rung_at_most"),
                                       "min_pods_at_least": close.get("min_pods_at_least")}})
    return out


def sarif(records, scope: str | None = None, unreadable=(), unjoined=()) -> dict:
    ids = list(RULES)
    results = []
    for e in unreadable:
        loc = {"physicalLocation": {"artifactLocation": {"uri": _uri(e.file) if e.file and not e.file.startswith("<")
                                                         else STDIN_PATH}}}
        if e.line:
            loc["physicalLocation"]["region"] = {"startLine": int(e.line)}
        results.append({"ruleId": UNREADABLE, "ruleIndex": ids.index(UNREADABLE), "level": ERROR,
                        "message": {"text": f"cannot read: {e.problem}"}, "locations": [loc],
                        "partialFingerprints": {"rollout/v1": f"{e.file}#{UNREADABLE}#{e.problem[:80]}"}})
    for r in records:
        logical = f"{r.ro.origin.get('cluster') or r.ro.origin.get('env') or 'manifest'}/{r.ro.key}"
        for f in r.findings:
            results.append({"ruleId": f.rule, "ruleIndex": ids.index(f.rule), "level": f.level,
                            "message": {"text": f"{r.ro.key} ({r.ro.source}, controller {_version(r)}): {f.message}"},
                            "locations": [_location(r, f.file or r.ro.file, f.line or r.ro.line, logical)],
                            "partialFingerprints": _fingerprint(r, f.rule),
                            "properties": {"controller_version": _version(r)}})
        for what in r.not_modelled:
            line = (r.ro.step_lines[0] if r.ro.step_lines and "steps[0]" in what else None) or r.ro.line
            results.append({"ruleId": NOT_MODELLED, "ruleIndex": ids.index(NOT_MODELLED), "level": NOTE,
                            "message": {"text": f"{r.ro.key} ({r.ro.source}, controller {_version(r)}): {what}"},
                            "locations": [_location(r, r.ro.steps_file or r.ro.file, line, logical)],
                            "partialFingerprints": _fingerprint(r, f"{NOT_MODELLED}:{what.split(':')[1].strip()}"),
                            "properties": {"controller_version": _version(r)}})
        if r.exposed:
            i, _ = last_set_weight_step(r.ro.steps)
            line = r.ro.step_lines[i] if i is not None and i < len(r.ro.step_lines) and r.ro.step_lines[i] \
                else (r.ro.steps_line or r.ro.line)
            results.append({"ruleId": EXPOSURE, "ruleIndex": ids.index(EXPOSURE), "level": ERROR,
                            "message": {"text": _exposure_message(r)},
                            "locations": [_location(r, r.ro.steps_file or r.ro.file, line, logical)],
                            "partialFingerprints": _fingerprint(r, EXPOSURE),
                            "properties": {"predicted_peak_weight": r.pred.peak, "pods_carrying": r.pred.carrying,
                                           "controller_version": _version(r), "wave": r.wave}})
    results += _autoscaler_results(records, unjoined, ids)
    rules = [{"id": k, "name": "".join(w.capitalize() for w in k.split("-")), "shortDescription": {"text": text},
              "fullDescription": {"text": FULL[k].replace("`", "")},
              "help": {"text": f"{FULL[k]} Fix: {FIX[k]}".replace("`", ""),
                       "markdown": f"{FULL[k]}\n\n**Fix:** {FIX[k]}"},
              "defaultConfiguration": {"level": level}} for k, (text, level) in RULES.items()]
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "drills scan", "version": __version__,
                                          "informationUri": "https://argo-rollouts.readthedocs.io/", "rules": rules}},
                      "automationDetails": {"id": automation_id(records, scope)},
                      "results": results, "columnKind": "utf16CodeUnits"}]}


def write_sarif(records, path: str | Path, scope: str | None = None, unreadable=(), unjoined=()) -> None:
    Path(path).write_text(json.dumps(sarif(records, scope, unreadable, unjoined), indent=1))


def junit(records, verification: list | None = None) -> ET.Element:
    """<testsuites>: per controller version a suite with two cases per Rollout (exposure, lint); the
    verification rows as their own suite."""
    root = ET.Element("testsuites", name="drills scan")
    groups = defaultdict(list)
    for r in records:
        groups[r.ro.controller_version or "unknown"].append(r)
    total = failures = 0
    for version in config.version_order(groups):
        recs = groups[version]
        suite = ET.SubElement(root, "testsuite", name=f"scan controller {version}")
        n = f = 0
        for r in recs:
            cls = r.ro.source
            case = ET.SubElement(suite, "testcase", classname=cls, name=f"{r.ro.key}: rollback exposure")
            n += 1
            if r.pred is None or r.pred.peak is None:
                ET.SubElement(case, "skipped", message=(r.pred.text if r.pred else "controller version unknown"))
            elif r.exposed:
                f += 1
                ET.SubElement(case, "failure", message=f"peak {r.pred.peak} on {r.pred.carrying} pod(s)",
                              type=r.pred.rule).text = _exposure_message(r)
            case = ET.SubElement(suite, "testcase", classname=cls, name=f"{r.ro.key}: last-rung lint")
            n += 1
            errs = [x for x in r.findings if x.level == ERROR]
            if errs:
                f += 1
                ET.SubElement(case, "failure", message="; ".join(x.rule for x in errs), type="lint").text = \
                    "\n".join(f"{x.file}:{x.line}: {x.message}" for x in errs)
            warns = [x for x in r.findings if x.level != ERROR]
            if warns:
                ET.SubElement(case, "system-out").text = "\n".join(f"{x.rule}: {x.message}" for x in warns)
            if r.ro.autoscalers:          # autoscaled: the exposure at the maximum is a case of its own
                n += 1
                f += _at_max_case(suite, r, cls)
        suite.set("tests", str(n))
        suite.set("failures", str(f))
        suite.set("errors", "0")
        total, failures = total + n, failures + f
    if verification:
        suite = ET.SubElement(root, "testsuite", name="scan verification on the real controller")
        f = 0
        for v in verification:
            case = ET.SubElement(suite, "testcase", classname=f"verify {v['controller_version']}", name=v["shape"])
            if v["verdict"] == "fail":
                f += 1
                ET.SubElement(case, "failure", message=f"predicted {v['predicted']}, observed {v['observed']}",
                              type=v["rule"]).text = json.dumps(v, default=str)
            elif v["verdict"] != "pass":
                ET.SubElement(case, "skipped", message=f"{v['verdict']}: {v.get('reason')}")
        suite.set("tests", str(len(verification)))
        suite.set("failures", str(f))
        suite.set("errors", "0")
        total, failures = total + len(verification), failures + f
    root.set("tests", str(total))
    root.set("failures", str(failures))
    return root


def _at_max_case(suite, r, cls: str) -> int:
    """The case of an autoscaled Rollout's exposure at its maxReplicas; 1 when it fails."""
    hi = r.ro.size_range[1]
    case = ET.SubElement(suite, "testcase", classname=cls, name=f"{r.ro.key}: rollback exposure at maxReplicas {hi}")
    p = r.sizes.get("max") if r.sizes else None
    if p is None or p.peak is None:
        ET.SubElement(case, "skipped", message=(p.text if p else "controller version unknown"))
        return 0
    if not p.exposed:
        return 0
    close = r.sizes.get("close")
    ET.SubElement(case, "failure", message=f"at maxReplicas {hi}: peak {p.peak} on {p.carrying} pod(s)"
                  + (f"; closes with the remaining rung at most {close['rung_at_most']:.2f} %" if close else "")
                  + (f" or minPodsPerReplicaSet at least {close['min_pods_at_least']}"
                     if close and close["min_pods_at_least"] is not None else ""),
                  type=AT_MAX).text = _at_max_message(r)
    return 1


# characters XML 1.0 cannot carry, even escaped (a control character in a Rollout's name, say)
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text):
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text) if isinstance(text, str) else text


def write_junit(records, path: str | Path, verification: list | None = None) -> None:
    root = junit(records, verification)
    for el in root.iter():          # every text and attribute made writable as XML (shown as \xNN)
        el.text, el.tail = _xml_text(el.text), _xml_text(el.tail)
        for k, v in list(el.attrib.items()):
            el.set(k, _xml_text(v))
    tree = ET.ElementTree(root)
    ET.indent(tree)
    tree.write(str(path), encoding="utf-8", xml_declaration=True)
