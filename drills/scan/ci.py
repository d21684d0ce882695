"""CI outputs: SARIF 2.1.0 (code scanning) and JUnit XML.

SARIF results sit on the offending step of the file that declares the steps (a manifest, or the values layer
of a fleet render); a Rollout read from a cluster has a logical location instead.  Rule ids: the lint rules
of advice.py plus ``rollback-exposure`` (the predicted peak is above the share of capacity that carries it).
"""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from urllib.parse import quote

from .. import __version__
from .advice import ERROR, LINT_RULES, WARNING
from .model import last_set_weight_step, steps_text

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
EXPOSURE = "rollback-exposure"
RULES = {EXPOSURE: ("a rollback inside rollbackWindow puts more traffic on the revived pods than their share of "
                    "capacity", ERROR), **{k: (v, WARNING if k in ("above-safe-pod-count", "last-rung-ratio")
                                                else ERROR) for k, v in LINT_RULES.items()}}


def _uri(path: str) -> str:
    p = Path(path)
    return p.resolve().as_uri() if p.is_absolute() else quote(p.as_posix())


def _location(file: str | None, line: int | None, logical: str) -> dict:
    if file and not file.startswith("<") and not file.startswith("render of"):
        loc = {"physicalLocation": {"artifactLocation": {"uri": _uri(file)}}}
        if line:
            loc["physicalLocation"]["region"] = {"startLine": int(line)}
        loc["logicalLocations"] = [{"name": logical, "kind": "resource"}]
        return loc
    return {"logicalLocations": [{"name": logical, "kind": "resource"}]}


def _exposure_message(r) -> str:
    p = r.pred
    return (f"{r.ro.key} ({r.ro.source}, controller {r.ro.controller_version}, {r.ro.routing} routing, steps "
            f"{steps_text(r.ro.steps)}, replicas {r.ro.replicas}): a rollback inside rollbackWindow puts canary "
            f"weight {p.peak} on {p.carrying} revived pod(s) = {p.share:.0%} of capacity. Rule {p.rule}: {p.text}. "
            f"Fix wave {r.wave}.")


def sarif(records) -> dict:
    ids = list(RULES)
    results = []
    for r in records:
        logical = f"{r.ro.origin.get('cluster') or r.ro.origin.get('env') or 'manifest'}/{r.ro.key}"
        for f in r.findings:
            results.append({"ruleId": f.rule, "ruleIndex": ids.index(f.rule), "level": f.level,
                            "message": {"text": f"{r.ro.key} ({r.ro.source}): {f.message}"},
                            "locations": [_location(f.file or r.ro.file, f.line or r.ro.line, logical)],
                            "partialFingerprints": {"rollout": f"{r.ro.source}#{r.ro.key}#{f.rule}"}})
        if r.exposed:
            i, _ = last_set_weight_step(r.ro.steps)
            line = r.ro.step_lines[i] if i is not None and i < len(r.ro.step_lines) and r.ro.step_lines[i] \
                else (r.ro.steps_line or r.ro.line)
            results.append({"ruleId": EXPOSURE, "ruleIndex": ids.index(EXPOSURE), "level": ERROR,
                            "message": {"text": _exposure_message(r)},
                            "locations": [_location(r.ro.steps_file or r.ro.file, line, logical)],
                            "partialFingerprints": {"rollout": f"{r.ro.source}#{r.ro.key}#{EXPOSURE}"},
                            "properties": {"predicted_peak_weight": r.pred.peak, "pods_carrying": r.pred.carrying,
                                           "controller_version": r.ro.controller_version, "wave": r.wave}})
    rules = [{"id": k, "name": k.replace("-", " "), "shortDescription": {"text": text},
              "defaultConfiguration": {"level": level}} for k, (text, level) in RULES.items()]
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "drills scan", "version": __version__,
                                          "informationUri": "https://argo-rollouts.readthedocs.io/", "rules": rules}},
                      "results": results, "columnKind": "utf16CodeUnits"}]}


def write_sarif(records, path: str | Path) -> None:
    Path(path).write_text(json.dumps(sarif(records), indent=1))


def junit(records, verification: list | None = None) -> ET.Element:
    """<testsuites>: per controller version a suite with two cases per Rollout (exposure, lint); the
    verification rows as their own suite."""
    root = ET.Element("testsuites", name="drills scan")
    groups = defaultdict(list)
    for r in records:
        groups[r.ro.controller_version or "unknown"].append(r)
    total = failures = 0
    for version, recs in sorted(groups.items()):
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
