"""Manifests nobody here wrote: Argo Rollouts' own examples/ and test/e2e/ from the module source of a release
(v1.8.2, and v1.10.2, the newest release the module proxy serves, standing in for master).  Every YAML file that
holds a Rollout and is valid YAML gets a verdict, and the whole examples/ folder is scanned to its end with its
chart (examples/helm-blue-green) rendered by helm.

The module proxy serves releases only.  ``DRILLS_UPSTREAM_TREE=DIR`` adds a tree that holds examples/ and test/e2e/ of
any other revision (master: ``git archive HEAD examples test/e2e | tar -x -C DIR`` in a clone), scanned on every
tested controller version at once (their CRDs differ: v1.7.x prunes a step plugin)."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

import os

from drills import cli
from drills.core import config
from drills.scan.charts import chart_root_of
from drills.toolchain.modsource import ModuleUnavailable, rollouts_source

RELEASES = ("v1.8.2", "v1.10.2")
FOLDERS = ("examples", "test/e2e")
TREE = "tree"               # the revision DRILLS_UPSTREAM_TREE holds
SOURCES = RELEASES + ((TREE,) if os.environ.get("DRILLS_UPSTREAM_TREE") else ())


def versions_for(source: str) -> list[str]:
    return list(config.SUPPORTED_CONTROLLERS) if source == TREE else [source]


def upstream(version: str) -> Path:
    if version == TREE:
        root = Path(os.environ["DRILLS_UPSTREAM_TREE"]).resolve()
        assert all((root / f).is_dir() for f in FOLDERS), f"DRILLS_UPSTREAM_TREE={root} lacks {FOLDERS}"
        return root
    try:
        root = rollouts_source(version).dir
    except ModuleUnavailable as e:
        pytest.skip(f"argo-rollouts {version} is neither in the Go module cache nor served by the proxy: {e}")
    assert all((root / f).is_dir() for f in FOLDERS), f"{root}: the module zip lacks {FOLDERS}"
    return root


def rollouts_in_file(path: Path) -> int | None:
    """How many Rollouts a valid YAML file holds (kubectl Lists' items included); None when it is not YAML."""
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except (yaml.YAMLError, UnicodeDecodeError):
        return None
    n = 0
    for d in docs:
        if isinstance(d, dict) and str(d.get("kind", "")).endswith("List") and isinstance(d.get("items"), list):
            n += sum(isinstance(i, dict) and i.get("kind") == "Rollout" for i in d["items"])
        elif isinstance(d, dict) and d.get("kind") == "Rollout":
            n += 1
    return n


def drills(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("version", SOURCES)
def test_every_upstream_yaml_file_with_a_rollout_gets_a_verdict(version, monkeypatch):
    root, versions = upstream(version), versions_for(version)
    monkeypatch.chdir(root)
    files = sorted(p for f in FOLDERS for p in (root / f).rglob("*") if p.suffix in (".yaml", ".yml"))
    judged = 0
    for path in files:
        want = rollouts_in_file(path)
        if not want:
            continue
        rel = str(path.relative_to(root))
        code, out, err = drills("scan", rel, "--controller", ",".join(versions), "--json")
        assert code in (0, 1), f"{rel}: exit {code}: {err}"
        doc = json.loads(out)
        assert "unreadable" not in doc and len(doc["rollouts"]) == want * len(versions), \
            f"{rel}: {err} {doc.get('unreadable')}"
        for r in doc["rollouts"]:
            assert r["rule"]["id"] and r["controller_version"] in versions, (rel, r["rule"])
            assert r["file"] == rel and r["line"], (rel, r["source"])
        judged += 1
    assert judged >= 40, judged         # upstream holds some 80 such files; a reader that skips them fails here
    # the apisix example (setCanaryScale with setHeaderRoute in one step) is read, not refused
    code, out, _ = drills("scan", "examples/apisix/rollout.yaml", "--controller", ",".join(versions), "--json")
    for ro in json.loads(out)["rollouts"]:
        assert "setCanaryScale" in ro["steps"][0] and "setHeaderRoute" in ro["steps"][0] and not ro["rule"]["id"] == \
            "invalid-spec"


@pytest.mark.parametrize("version", SOURCES)
def test_the_whole_examples_folder_is_scanned_with_its_chart_rendered(version, monkeypatch, tmp_path):
    root, versions = upstream(version), versions_for(version)
    monkeypatch.chdir(root)
    chart = root / "examples" / "helm-blue-green"
    assert (chart / "Chart.yaml").is_file() and chart_root_of(chart / "templates" / "rollout.yaml") == chart
    code, out, err = drills("scan", "examples/", "--controller", ",".join(versions), "--json", "--sarif",
                            str(tmp_path / "s.sarif"))
    assert code in (0, 1), err
    doc = json.loads(out)
    assert "unreadable" not in doc, doc.get("unreadable")
    by_file = {}
    for r in doc["rollouts"]:
        by_file.setdefault(r["file"], []).append(r)
    helms = by_file["examples/helm-blue-green/templates/rollout.yaml"]
    assert len(helms) == len(versions)
    for helm in helms:
        assert helm["origin"]["chart"] == "examples/helm-blue-green" and helm["strategy"] == "blueGreen"
    assert doc["stats"]["charts_rendered"] == 1
    for p in (root / "examples").rglob("*"):
        want = rollouts_in_file(p) if p.suffix in (".yaml", ".yml") and chart not in p.parents else None
        if want:
            rel = str(p.relative_to(root))
            assert len(by_file.get(rel, [])) == want * len(versions), rel
    assert json.loads((tmp_path / "s.sarif").read_text())["version"] == "2.1.0"
