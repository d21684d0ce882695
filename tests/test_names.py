"""Names that become paths are plain names: a cluster (``$DRILLS_CLUSTER``), a namespace, a Rollout, a version,
an environment, a run id.  Anything else is refused with exit 2 and one line, before any file is read, written or
removed and before any process is signalled (no cluster needed)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from drills.core import config
from drills.cluster import EmbeddedCluster
from drills.charts.fleet import Fleet
from drills.core.names import MAX_NAME, BadName, is_plain_name, plain_name

NOT_PLAIN = ["../../victim", "..", ".", "a/b", "/abs", "x/..", "../x", ".hidden", "-rf", "a b", "ünï", "a" * 129,
             "v1.8.2/../../..", "..\\x", "a\tb", "~", "*"]
PLAIN = ["drills", "alice-ci.1", "v1.8.2", "v1.8.2+unknown", "drills-gw0", "x" * MAX_NAME, "A_b.c+d-e"]


def _tree(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` with its kind, size, mode and mtime (a changed or removed one differs)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(dirpath) / n
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def scratch(tmp_path):
    """A cache with two clusters' folders, built binaries and a victim folder beside it."""
    cache = tmp_path / "cache"
    for name in ("drills", "other"):
        (cache / "clusters" / name / "logs").mkdir(parents=True)
        (cache / "clusters" / name / "state.json").write_text('{"name": "%s", "processes": []}' % name)
    (cache / "kwok" / "v0.8.0").mkdir(parents=True)
    (cache / "kwok" / "v0.8.0" / "kwokctl").write_text("a built binary")
    (cache / "kwok-workdir" / "clusters" / "drills").mkdir(parents=True)
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "precious.txt").write_text("mine")
    (tmp_path / "reports").mkdir()
    return tmp_path


@pytest.mark.parametrize("name", ["../../victim", "..", ".", "x/..", "-rf"])
@pytest.mark.parametrize("args", [["cluster", "down"], ["cluster", "status", "--json"], ["cluster", "up", "--no-build"],
                                  ["probe", "--steps", "5,100"], ["run", "--lanes", "a"]])
def test_a_cluster_name_that_is_not_plain_is_refused_and_nothing_is_touched(scratch, name, args):
    before = _tree(scratch)
    env = dict(os.environ, DRILLS_CACHE=str(scratch / "cache"), DRILLS_CLUSTER=name,
               DRILLS_REPORTS=str(scratch / "reports"), DRILLS_CONFIG=str(scratch / "config.yaml"))
    r = subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, (args, name, r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("drills: DRILLS_CLUSTER") and "not a plain name" in lines[0], \
        r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert _tree(scratch) == before


@pytest.mark.parametrize("name", NOT_PLAIN)
def test_the_validator_refuses_every_name_that_is_not_one_plain_entry(name):
    assert not is_plain_name(name)
    with pytest.raises(BadName, match="not a plain name"):
        plain_name(name, "cluster name")
    with pytest.raises(BadName):
        EmbeddedCluster(name)


@pytest.mark.parametrize("name", PLAIN)
def test_a_plain_name_stays_one_entry_of_its_folder(name, tmp_path, monkeypatch):
    monkeypatch.setenv("DRILLS_CACHE", str(tmp_path))
    assert plain_name(name, "x") == name
    c = EmbeddedCluster(name)
    assert c.folder.parent == config.clusters_dir().absolute() and c.folder.name == name
    assert c.kwok_dir.parent == c.kwok_workdir / "clusters"


def test_non_text_names_are_refused():
    for value in (None, 7, b"drills", ["drills"], ""):
        assert not is_plain_name(value)
        with pytest.raises(BadName):
            plain_name(value, "name")


def test_the_cluster_name_comes_from_the_environment_through_the_validator(monkeypatch):
    monkeypatch.setenv("DRILLS_CLUSTER", "../x")
    with pytest.raises(BadName, match="DRILLS_CLUSTER"):
        config.cluster_name()
    monkeypatch.setenv("DRILLS_CLUSTER", "")
    assert config.cluster_name() == config.EMBEDDED_CLUSTER_NAME
    monkeypatch.setenv("DRILLS_CLUSTER", "ci-7")
    assert config.cluster_name() == "ci-7" and EmbeddedCluster().name == "ci-7"


def test_a_run_refuses_a_cluster_name_before_its_run_folder_exists(tmp_path, monkeypatch):
    from drills.run import runner
    from drills.run.legs import Leg
    monkeypatch.setenv("DRILLS_CLUSTER", "..")
    with pytest.raises(BadName):
        runner.run([Leg("v1.8.2", "a")], run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("env", ["../stage", "stage/../../x", ".", ""])
def test_an_environment_of_the_fleet_is_a_plain_name(env):
    with pytest.raises(BadName):
        Fleet().apps(env)


def test_an_app_whose_release_name_is_not_plain_is_refused_naming_the_file(tmp_path):
    from drills.charts.helm import ChartInputError
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "stage.yaml").write_text(
        "metadata: {name: cart}\nspec:\n  source: {path: charts/cart, helm: {releaseName: ../../cart}}\n"
        "  destination: {namespace: shop}\n")
    with pytest.raises(ChartInputError, match=r"stage\.yaml:1: releaseName '\.\./\.\./cart' is not a plain name"):
        Fleet(tmp_path).apps("stage")


@pytest.mark.parametrize("flag,value", [("--namespace", "../ns"), ("--rollout", "svc/../../x"), ("--rollout", "..")])
def test_live_targets_are_plain_names_checked_before_any_request(flag, value, drills_cmd, status_server_factory,
                                                                  kubeconfig_to, tmp_path):
    srv = status_server_factory(200, "OK")
    kc = kubeconfig_to(tmp_path / "kc", srv.url, context="stage")
    args = {"--namespace": "ns", "--rollout": "svc", flag: value}
    r = drills_cmd("run", "--kubeconfig", kc, "--context", "stage", "--allow-context", "stage",
                   *[x for kv in args.items() for x in kv])
    assert r.returncode == 2 and f"{flag} {value!r} is not a plain name" in r.stderr, r.stderr
    assert srv.requests == []
