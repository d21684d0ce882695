"""Branch-order proof: the per-version source map, user-built controllers by path, bad input."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from drills.drill import branches
from drills.core import config
from drills.lanes.base import USER_BUILT, load_expectations
from drills.record.ledger import read_rows
from drills.toolchain import Toolchain
from drills.toolchain.build import sha256_file

# DESIGN.md §2: backward search / mid-steps / end of steps
DESIGN_LINES = {"v1.7.2": (217, 227, 233), "v1.8.2": (245, 255, 261), "v1.10.2": (250, 260, 266)}


def _drills(*args, env=None, timeout=1800):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, env=e,
                          timeout=timeout, cwd=str(config.project_root()))


def _processes_mentioning(text: str) -> list[str]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append(f"{d.name}: {cmd}")
    return out


# --- the source map ------------------------------------------------------------------------------
@pytest.mark.parametrize("version", sorted(DESIGN_LINES, key=config.version_tuple))
def test_source_map_of_release_matches_design_table(version):
    bm = branches.branch_map_for(version)
    assert (bm.backward_search, bm.mid_steps, bm.end_of_steps) == DESIGN_LINES[version], bm
    assert bm.order == [branches.BACKWARD, branches.MID, branches.END]
    lines = Path(bm.source).read_text().splitlines()
    assert "!atDesiredReplicaCount" in lines[bm.backward_search - 1]
    assert "int32(len(c.rollout.Spec.Strategy.Canary.Steps))" in lines[bm.mid_steps - 1]
    assert lines[bm.end_of_steps - 1].strip() == "} else {"
    assert "MaxTrafficWeight" in lines[bm.end_of_steps]


def test_source_map_is_read_from_the_code_not_a_table(tmp_path):
    src = Path(branches.release_source("v1.8.2")).read_text()
    # a source tree with three more lines on top: every line moves by three
    tree = tmp_path / "tree"
    (tree / "rollout").mkdir(parents=True)
    (tree / "rollout" / "trafficrouting.go").write_text("// a\n// b\n// c\n" + src)
    for given in (tree, tree / "rollout", tree / "rollout" / "trafficrouting.go"):
        bm = branches.branch_map_for("v1.8.2", user_built=True, source=given)
        assert (bm.backward_search, bm.mid_steps, bm.end_of_steps) == (248, 258, 264)
    assert "(:248)" in branches.order_assertion(bm, branches.END) and "(:264)" in \
        branches.order_assertion(bm, branches.END)
    # a user-built controller without --source: lines unknown
    assert branches.branch_map_for("v1.8.2", user_built=True) is None
    text = branches.order_assertion(None, branches.MID)
    assert text.startswith("branch order: backward search before mid-steps") and "lines unknown" in text
    # without the backward search the map refuses
    broken = tmp_path / "broken.go"
    broken.write_text(src.replace("if !atDesiredReplicaCount && !c.rollout.Status.PromoteFull {",
                                  "if !atDesiredReplicaCount {"))
    with pytest.raises(branches.SourceMapError, match="atDesiredReplicaCount"):
        branches.find_branches(broken)
    with pytest.raises(branches.SourceMapError, match="no rollout/trafficrouting.go"):
        branches.source_file(tmp_path / "nowhere")


@pytest.mark.parametrize("version,has", [("v1.7.2", False), ("v1.8.2", False), ("v1.10.2", True)])
def test_replica_progress_threshold_presence_read_from_the_crd(version, has):
    found, where = branches.crd_has_canary_field(Toolchain().ensure_crds(version), "replicaProgressThreshold")
    assert found is has and where.endswith("rollout-crd.yaml")


# --- user-built controllers: bad input --------------------------------------------------------------
BAD_CLUSTER = "order-bad-input"


def _assert_nothing_running(path: Path):
    st = _drills("cluster", "status", "--json", env={"DRILLS_CLUSTER": BAD_CLUSTER})
    assert st.returncode == 1 and json.loads(st.stdout) == {"ready": False}, st.stdout + st.stderr
    assert not (config.clusters_dir() / BAD_CLUSTER).exists()
    assert not (config.cache_dir() / "kwok-workdir" / "clusters" / BAD_CLUSTER).exists()
    assert _processes_mentioning(str(path)) == []


def test_controller_binary_not_executable_is_bad_input(tmp_path):
    f = tmp_path / "rollouts-controller"
    f.write_bytes(b"\x7fELF not really")
    f.chmod(0o644)
    r = _drills("run", "--controller-binary", str(f), "--lanes", "order", env={"DRILLS_CLUSTER": BAD_CLUSTER,
                                                                              "DRILLS_REPORTS": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert "not an executable" in r.stderr
    _assert_nothing_running(f)


def test_executable_that_is_not_a_controller_is_bad_input(tmp_path):
    f = tmp_path / "not-a-controller"
    f.write_text("#!/bin/sh\necho hello\n")
    f.chmod(0o755)
    r = _drills("run", "--controller-binary", str(f), "--lanes", "order", env={"DRILLS_CLUSTER": BAD_CLUSTER,
                                                                              "DRILLS_REPORTS": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert "does not start as a rollouts controller" in r.stderr
    _assert_nothing_running(f)


def test_binary_that_answers_version_but_does_not_run_is_bad_input(tmp_path):
    """It passes '--version' but exits when started: the cluster brought up for it is taken down again."""
    f = tmp_path / "fake-rollouts-controller"
    f.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo "rollouts-controller v1.8.2"; exit 0; fi\n'
                 'echo "flag provided but not defined: $1" >&2\nexit 1\n')
    f.chmod(0o755)
    r = _drills("run", "--controller-binary", str(f), "--lanes", "order", env={"DRILLS_CLUSTER": BAD_CLUSTER,
                                                                              "DRILLS_REPORTS": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert re.search(r"(does|did) not start as a rollouts controller|rollouts controller exited", r.stderr), r.stderr
    assert "flag provided but not defined" in r.stderr
    _assert_nothing_running(f)


def test_bad_source_is_bad_input(tmp_path):
    binary = Toolchain().controller("v1.8.2")
    r = _drills("run", "--controller-binary", str(binary), "--source", str(tmp_path), "--lanes", "order",
                env={"DRILLS_CLUSTER": BAD_CLUSTER, "DRILLS_REPORTS": str(tmp_path)})
    assert r.returncode == 2 and "no rollout/trafficrouting.go" in r.stderr, r.stderr
    r = _drills("run", "--controller", "v1.8.2", "--source", str(tmp_path), "--lanes", "order",
                env={"DRILLS_CLUSTER": BAD_CLUSTER, "DRILLS_REPORTS": str(tmp_path)})
    assert r.returncode == 2 and "--source goes with --controller-binary" in r.stderr, r.stderr
    _assert_nothing_running(binary.parent / "nothing")


# --- user-built controllers: a copied v1.8.2 binary run by path ------------------------------------
def test_copied_controller_by_path_runs_lane_order_with_its_version_and_sha256(tmp_path):
    src = Toolchain().rollouts("v1.8.2")
    copy = tmp_path / "bin" / "my-rollouts-controller"
    copy.parent.mkdir()
    shutil.copy2(src / "rollouts-controller", copy)
    reported = subprocess.run([str(copy), "--version"], capture_output=True, text=True).stdout.strip()
    cluster = f"order-copy-{os.getpid()}"          # a cluster of its own: the session's stays up for the others
    env = {"DRILLS_CLUSTER": cluster, "DRILLS_REPORTS": str(tmp_path / "reports")}
    try:
        r = _drills("run", "--controller-binary", str(copy), "--source", str(src / "source"), "--lanes", "order",
                    "--keep-cluster", env=env)
        st = json.loads(_drills("cluster", "status", "--json", env=env).stdout)
    finally:
        _drills("cluster", "down", env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert st["ready"] and st["controller_binary"] == str(copy.resolve())
    run_dir = Path(tmp_path / "reports" / "latest").resolve()
    rows = read_rows(run_dir / "ledger.json")
    assert {r["step"] for r in rows} == {"end-of-steps", "mid-steps", "hazard-replica-progress-threshold",
                                         "scale-out-while-partial"}, rows
    for row in rows:
        assert row["lane"] == "order"
        assert row["controller_version"] == reported == "v1.8.2+unknown"
        assert row["controller_sha256"] == sha256_file(copy)
    by_step = {r["step"]: r for r in rows}
    assert by_step["end-of-steps"]["assertion"] == "branch order: backward search (:245) before end-of-steps (:261)"
    assert by_step["mid-steps"]["assertion"] == "branch order: backward search (:245) before mid-steps (:255)"
    # a user-built controller is observed, never held to the release's expectations (drills upgrade-check
    # classifies it against a baseline): the observation is there, the verdict unverified with the reason
    for step in ("end-of-steps", "mid-steps", "scale-out-while-partial"):
        assert by_step[step]["verdict"] == "unverified", by_step[step]
        assert by_step[step]["reason"] == USER_BUILT
    # and it is the v1.8.2 binary: it shows what the release shows (the backward search first)
    release = load_expectations("order")["v1.8.2"]
    assert by_step["end-of-steps"]["observed"] == release["end_of_steps"]["expected"] == 50
    assert by_step["mid-steps"]["observed"] == release["mid_steps"]["expected"] == 25
    assert by_step["scale-out-while-partial"]["observed"] == release["scale_out"]["expected"] == 5
    assert by_step["hazard-replica-progress-threshold"]["verdict"] == "not_applicable"
    assert (run_dir / by_step["end-of-steps"]["evidence"]).is_file()
