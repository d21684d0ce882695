"""A user-built controller is labelled by what it is: its reported version, its sha256, its own CRDs.

The controller is built as a user's build of a source tree with a stale version file is (upstream's Makefile
passes ``-X .../utils/version.version=$(cat VERSION)``, 1.2.0 on its main branch): v1.8.2's module with the
reported version 1.2.0, next to a laid-out source tree holding that module's CRD manifests; the upgrade check's is
also stamped with a commit as the Makefile stamps a checkout's HEAD (``v1.2.0+<commit>``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from drills.core import config
from drills.cluster import EmbeddedCluster
from drills.drill.controller_binary import CRDS_FROM_NEAREST, CRDS_FROM_SOURCE, inspect_binary
from drills.record.ledger import read_rows
from drills.toolchain import Toolchain
from drills.toolchain.build import sha256_file

RELEASE, STALE = "v1.8.2", "1.2.0"
STAMPED_COMMIT = "5ca1ab1e" * 5         # a stand-in's gitCommit: a release module carries no checkout's HEAD


def _drills(*args, env=None):
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **(env or {})), cwd=str(config.project_root()))


def _fake_controller(tmp_path: Path, says: str) -> Path:
    """An executable that answers --version as a rollouts controller does (inspection only, never started)."""
    f = tmp_path / "rollouts-controller"
    f.write_text(f'#!/bin/sh\necho "rollouts-controller: {says}"\n')
    f.chmod(0o755)
    return f


def test_crds_come_from_the_flag_then_the_source_tree_then_the_nearest_release_with_a_warning(tmp_path):
    binary = _fake_controller(tmp_path, "v1.2.0+351efb7")
    tree = Toolchain().lay_out_source_tree(RELEASE, tmp_path / "argo-rollouts")
    crds = tree / "manifests" / "crds"
    assert sorted(p.name for p in crds.iterdir()) == sorted(
        p.name for p in (Toolchain().ensure_crds(RELEASE)).glob("*-crd.yaml"))
    assert (tree / "rollout" / "trafficrouting.go").is_file()

    own = tmp_path / "my-crds"
    own.mkdir()
    (own / "rollout-crd.yaml").write_text((crds / "rollout-crd.yaml").read_text())
    flag = inspect_binary(binary, crds=own, source=tree)
    assert (flag.crds_dir, flag.crd_origin, flag.crd_warning) == (own.resolve(), "--crds", None)

    for source in (tree, tree / "rollout", tree / "rollout" / "trafficrouting.go"):
        info = inspect_binary(binary, source=source)
        assert (info.crds_dir, info.crd_origin, info.crd_warning) == (crds.resolve(), CRDS_FROM_SOURCE, None)
        assert (info.version, info.reported, info.nearest_release) == ("v1.2.0", "v1.2.0+351efb7", "v1.7.1")

    bare = tmp_path / "only-the-go-file"
    bare.mkdir()
    (bare / "trafficrouting.go").write_text((tree / "rollout" / "trafficrouting.go").read_text())
    for source, why in ((bare, f"--source {bare} has no manifests/crds"), (None, "neither --crds nor --source")):
        info = inspect_binary(binary, source=source)
        assert info.crd_origin == CRDS_FROM_NEAREST and info.crds_dir == Toolchain().ensure_crds("v1.7.1")
        assert info.crd_warning.startswith(why), info.crd_warning
        assert "those of v1.7.1, the nearest release" in info.crd_warning
        assert info.cluster_kwargs()["crd_warning"] == info.crd_warning


def test_stale_version_build_is_shown_by_its_reported_version_and_source_crds(tmp_path):
    tc = Toolchain()
    binary = tc.build_controller_reporting(RELEASE, STALE, tmp_path / "bin")    # cached: a second run copies it
    tree = tc.lay_out_source_tree(RELEASE, tmp_path / "argo-rollouts")
    info = inspect_binary(binary, source=tree)
    assert info.reported.startswith("v1.2.0") and info.version == "v1.2.0", info
    assert info.crd_origin == CRDS_FROM_SOURCE and info.crd_warning is None
    assert info.nearest_release == "v1.7.1"          # what a version-only lookup would have called it

    cluster = EmbeddedCluster(f"stale-version-{os.getpid()}")   # its own: the session's cluster stays up
    env = {"DRILLS_CLUSTER": cluster.name}
    try:
        cluster.up(info.nearest_release, **info.cluster_kwargs())
        r = _drills("cluster", "status", "--json", env=env)
        st = json.loads(r.stdout)
        api = cluster.api_client()
        installed = api.sanitize_for_serialization(
            client.ApiextensionsV1Api(api).read_custom_resource_definition("rollouts.argoproj.io"))
    finally:
        cluster.down()
    assert r.returncode == 0 and st["ready"], r.stdout + r.stderr
    assert st["controller_version"] == "v1.2.0"
    assert st["controller_reported_version"] == info.reported
    assert st["controller_sha256"] == sha256_file(binary) == info.sha256
    assert st["controller_binary"] == str(binary.resolve())
    assert st["crd_source"] == str((tree / "manifests" / "crds").resolve()) and st["crd_warning"] is None
    # no release is presented as this controller's version; the nearest one is named as what it is
    assert st["controller_version"] not in config.SUPPORTED_CONTROLLERS
    assert st["nearest_release"] == "v1.7.1"
    # the CRDs in the cluster are the tree's (v1.8.2's: with the plugin step), not the nearest release's
    tree_crd = yaml.safe_load((tree / "manifests" / "crds" / "rollout-crd.yaml").read_text())
    near_crd = yaml.safe_load((Toolchain().ensure_crds("v1.7.1") / "rollout-crd.yaml").read_text())
    key = "controller-gen.kubebuilder.io/version"
    assert installed["metadata"]["annotations"][key] == tree_crd["metadata"]["annotations"][key] != \
        near_crd["metadata"]["annotations"][key]
    canary = installed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "strategy"]["properties"]["canary"]["properties"]
    assert "plugin" in canary["steps"]["items"]["properties"]


@pytest.mark.parametrize("reported", ["", "1.2.0 --evil", "../1.2.0"])
def test_a_reported_version_must_be_a_version_string(reported):
    from drills.toolchain.components import user_built_component
    with pytest.raises(ValueError, match="not a version string"):
        user_built_component(RELEASE, reported)


def test_upgrade_check_classifies_a_user_built_controller_against_its_baseline(tmp_path):
    """The stale-version build of v1.8.2 against v1.8.2 itself: one code, so every drill observation is `same`
    (load figures may move with the machine's load: they are classified, not asserted), and the candidate's rows
    are observations, never failed against the expectations of v1.7.1 (the release its version is nearest)."""
    tc = Toolchain()
    # built as upstream's Makefile builds a checkout (version from VERSION, gitCommit, gitTreeState), next to an
    # exported tree (no git), as a PR's head is when taken with `git archive`
    binary = tc.build_controller_reporting(RELEASE, STALE, tmp_path / "bin", commit=STAMPED_COMMIT)
    tree = tc.lay_out_source_tree(RELEASE, tmp_path / "argo-rollouts")
    env = {"DRILLS_REPORTS": str(tmp_path / "reports"), "DRILLS_CLUSTER": f"ub-{os.getpid()}"}
    r = subprocess.run([sys.executable, "-m", "drills", "upgrade-check", "--from", RELEASE, "--to-binary", str(binary),
                        "--source", str(tree), "--lanes", "a", "--json"], capture_output=True, text=True,
                       timeout=1800, env=dict(os.environ, **env), cwd=str(config.project_root()))
    assert r.returncode in (0, 1), r.stdout[-2000:] + r.stderr[-4000:]
    doc = json.loads(r.stdout)
    name = f"v1.2.0+{STAMPED_COMMIT[:7]}"       # the tree is no git checkout: the commit the binary reports
    says = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    assert name in says.stdout + says.stderr                 # what the real binary reports, stamped as the Makefile does
    assert f"+{sha256_file(binary)[:12]}" not in r.stdout + r.stderr          # its sha256 never stands for a commit
    assert (doc["baseline"], doc["candidate"], doc["candidate_sha256"]) == (RELEASE, name, sha256_file(binary))
    assert doc["crd_warning"] is None
    by = {(c["step"], c["assertion"]): c for c in doc["changes"]}
    peaks = [c for (step, a), c in by.items() if a.startswith("peak canary weight while")]
    assert {c["step"] for c in peaks} == {"before", "after"}, sorted(by)
    for c in peaks:
        assert c["class"] == "same", c
        assert c["baseline"]["verdict"] == "pass" and c["candidate"]["verdict"] == "unverified", c
        assert "user-built controller" in c["candidate"]["reason"], c
    drills_rows = [c for (step, a), c in by.items() if not a.startswith("load.")]
    assert not [c for c in drills_rows if c["class"] != "same"], [c for c in drills_rows if c["class"] != "same"]
    assert doc["exit"] == r.returncode
    run_dir = (tmp_path / "reports" / "latest").resolve()
    assert (run_dir / "upgrade.json").is_file(), sorted((tmp_path / "reports").iterdir())
    md = (run_dir / "report.md").read_text()
    assert f"## Upgrade check: {RELEASE} → {name}" in md and f"## {name} · lane a" in md
    assert f"sha256 {sha256_file(binary)[:12]}" in md
    # no row of the candidate fails: its rows are observations (its load rows included: BEFORE's failure ratio
    # is never held to the release threshold)
    cand = [x for x in read_rows(run_dir / "ledger.json") if x.get("controller_sha256")]
    assert cand and not [x for x in cand if x["verdict"] == "fail"], [x for x in cand if x["verdict"] == "fail"]
    assert {x["controller_name"] for x in cand} == {name}
    first_screen = md.split("\n## ")[0]           # both sides' answers before any section
    assert f"**prescription holds on {RELEASE}: yes" in first_screen and \
        f"**prescription holds on {name}: " in first_screen, md[:600]
    # named by what it is everywhere: leg ids, cluster, test ids, plot titles; never by the nearest release
    legs = json.loads((run_dir / "run.json").read_text())["legs"]
    assert {leg["id"] for leg in legs} == {f"{RELEASE}/a/stage", f"{name}/a/stage"}
    junit = [p for p in run_dir.glob("junit-*.xml") if name.replace("+", "-") in p.name or name in p.name]
    assert junit and f"[{name}]" in junit[0].read_text() and "v1.7.1" not in junit[0].read_text()
    titles = [json.loads(p.read_text()).get("title", "") for p in (run_dir / name).rglob("*.series.json")]
    assert titles and all(f"({name})" in t and "v1.7.1" not in t for t in titles), titles

