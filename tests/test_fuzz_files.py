"""Fuzzing (Hypothesis) of what a user does not write by hand but may find changed: the environment variables
drills reads, the embedded cluster's state.json and kwokctl's pid files, and the journals `drills restore` sends
from.  Never a traceback, never a hang; a name that is not plain is refused; nothing a record does not prove is
ever signalled (a process of the test's own, named in every way a hostile file can name it, must survive every
input); an edited journal never gets a request out.

A few hundred inputs per entry point by default; DRILLS_FUZZ=long runs 10,000 per entry point.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import string
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from drills.core import config
from drills.kube import api as kube
from drills.cluster import ClusterStateError, EmbeddedCluster
from drills.core.errors import BadInput
from drills.core.names import BadName, is_plain_name
from drills.core.procs import boot_id, start_time
from drills.drill.safety import Journal, restore_journal

LONG = os.environ.get("DRILLS_FUZZ") == "long"
EXAMPLES = 10_000 if LONG else 300
fuzz = settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

NAME_CHARS = string.ascii_letters + string.digits + "._+-/\\ \t\n~*$`'\"" + "ünï．／"
names = st.one_of(st.text(alphabet=NAME_CHARS, max_size=140), st.text(max_size=40),
                  st.sampled_from(["..", ".", "../..", "../../victim", "a/../..", "-rf", ".ports.lock", "x" * 129]))


# --- environment variables ------------------------------------------------------------------------------------
@fuzz
@given(names.filter(lambda s: "\x00" not in s))
def test_drills_cluster_is_one_plain_entry_of_the_clusters_folder_or_refused(monkeypatch, tmp_path_factory, value):
    monkeypatch.setenv("DRILLS_CACHE", str(tmp_path_factory.getbasetemp() / "fuzz-cache"))
    monkeypatch.setenv("DRILLS_CLUSTER", value)
    try:
        c = EmbeddedCluster()
    except BadName as e:
        assert "DRILLS_CLUSTER" in str(e) and "\n" not in str(e) and value and not is_plain_name(value)
        return
    assert c.folder.parent == config.clusters_dir().absolute()
    assert c.name == (value or config.EMBEDDED_CLUSTER_NAME) and os.sep not in c.name and c.name not in (".", "..")
    assert c.usage.dir.parent == c.folder.parent and c.kwok_dir.parent == c.kwok_workdir / "clusters"


@fuzz
@given(st.one_of(st.text(max_size=12), st.floats().map(repr), st.integers().map(str)).filter(lambda s: "\x00" not in s))
@example("nan")
@example("-inf")
@example("1e400")
def test_the_request_timeout_from_the_environment_is_always_a_usable_number(monkeypatch, value):
    monkeypatch.setenv("DRILLS_REQUEST_TIMEOUT", value)
    v = kube.read_timeout()
    assert isinstance(v, float) and 0 < v < 3600


# --- state.json and kwokctl's pid files -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def bystander():
    """A process of the test's own: every hostile record below names it; it must outlive them all."""
    p = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True)
    yield p
    assert p.poll() is None, "a fuzzed state file got a process signalled that drills never started"
    p.kill()
    p.wait(10)


def _pids(bystander) -> st.SearchStrategy:
    return st.one_of(st.sampled_from([bystander.pid, os.getpid(), 1, 0, -1, 2 ** 31, 10 ** 30]),
                     st.integers(-5, 5), st.text(max_size=6), st.none(), st.booleans(), st.floats())


def _records(bystander) -> st.SearchStrategy:
    real = {"start_time": start_time(bystander.pid), "boot_id": boot_id()}
    leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
    return st.one_of(leaf, st.fixed_dictionaries({"pid": _pids(bystander)}, optional={
        "name": st.one_of(st.sampled_from(["", "etcd", "kube", "rollouts-controller", "mesh-x", "releaser"]), leaf),
        "start_time": st.one_of(st.just(real["start_time"]), leaf),
        "boot_id": st.one_of(st.just(real["boot_id"]), leaf),
        "group": st.one_of(st.booleans(), leaf), "ports": st.one_of(st.lists(st.integers(), max_size=3), leaf),
        "log": leaf}))


def _state_docs(bystander) -> st.SearchStrategy:
    rec = _records(bystander)
    return st.one_of(
        st.text(max_size=60),
        st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=6)),
                     lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner,
                                                                                        max_size=3)),
                     max_leaves=10).map(json.dumps),
        st.fixed_dictionaries({}, optional={
            "processes": st.one_of(st.lists(rec, max_size=5), rec),
            "control_plane": st.one_of(st.dictionaries(st.sampled_from(["etcd", "kube-apiserver", "kwok-controller"]),
                                                       rec, max_size=3), rec),
            "ready": st.booleans(), "audit_log": st.one_of(st.none(), st.just("/etc/shadow")),
            "controller_version": st.one_of(st.none(), st.text(max_size=8))}).map(json.dumps),
        st.integers(1, 3000).map(lambda n: "[" * n + "]" * n))


def _pid_files(bystander) -> st.SearchStrategy:
    return st.dictionaries(st.sampled_from(["etcd", "kube-apiserver", "kube-scheduler"]), st.one_of(
        st.sampled_from([str(bystander.pid), str(os.getpid()), "1", "0", "-1", f" {bystander.pid}\n"]),
        st.text(max_size=10)), max_size=3)


@pytest.fixture(scope="module")
def fuzzed_cluster(tmp_path_factory):
    cache = tmp_path_factory.mktemp("fuzz-state")
    old = os.environ.get("DRILLS_CACHE")
    os.environ["DRILLS_CACHE"] = str(cache)
    try:
        yield EmbeddedCluster("fuzzed", log=lambda m: None)
    finally:
        if old is None:
            os.environ.pop("DRILLS_CACHE")
        else:
            os.environ["DRILLS_CACHE"] = old


def _lay_out(c: EmbeddedCluster, doc: str, pid_files: dict) -> None:
    shutil.rmtree(c.folder, ignore_errors=True)
    shutil.rmtree(c.kwok_dir, ignore_errors=True)
    c.folder.mkdir(parents=True)
    c.state_file.write_text(doc)
    (c.kwok_dir / "pids").mkdir(parents=True)
    for name, text in pid_files.items():
        (c.kwok_dir / "pids" / f"{name}.pid").write_text(text)


@fuzz
@given(st.data())
def test_a_fuzzed_state_file_reads_checks_and_comes_down_signalling_nothing_unproven(fuzzed_cluster, bystander, data):
    c = fuzzed_cluster
    doc, pid_files = data.draw(_state_docs(bystander)), data.draw(_pid_files(bystander))
    _lay_out(c, doc, pid_files)
    st_ = c.status()
    assert isinstance(st_, dict) and st_["ready"] is False
    for p in st_.get("processes", []):
        assert isinstance(p["pid"], int) and p["alive"] is False, p
    assert st_.get("audit_log") in (None, str(c.kwok_dir / "logs" / "audit.log"))
    try:
        c.check_state()
    except ClusterStateError as e:
        assert str(c.state_file) in str(e) and "\n" not in str(e)
    res = c.down(quiet=True)
    assert res["stopped"] == [] and not c.folder.exists()
    assert bystander.poll() is None
    assert not [f for f in (c.kwok_dir / "pids").glob("*.pid")]        # nothing left for kwokctl to signal


# --- journals --------------------------------------------------------------------------------------------------
def _journal(tmp_path, kubeconfig) -> Journal:
    j = Journal(tmp_path / "journal.json", kubeconfig=str(kubeconfig), context="stage", run_id="r1")
    ro = {"metadata": {"namespace": "ns", "name": "svc"}, "spec": {
        "replicas": 3, "template": {"metadata": {"labels": {"app": "svc"}},
                                    "spec": {"containers": [{"name": "app", "image": "svc:v2"}]}},
        "strategy": {"canary": {"steps": [{"setWeight": 5}, {"pause": {"duration": "10s"}}]}}},
        "status": {"phase": "Healthy", "stableRS": "abc"}}
    after = copy.deepcopy(ro)
    after["spec"]["template"]["spec"]["containers"][0]["image"] = "svc:v1"
    j.before_spec_change(ro, intended=after)
    j.held("ns", "hold-1")
    return j


def _paths(value, here=()):
    yield here
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, here + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, here + (i,))


def _mutate(doc: dict, data) -> dict:
    out = copy.deepcopy(doc)
    paths = [p for p in _paths(out) if p]
    path = data.draw(st.sampled_from(paths))
    parent = out
    for k in path[:-1]:
        parent = parent[k]
    how = data.draw(st.sampled_from(["replace", "delete", "add"]))
    leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12),
                     st.sampled_from(["evil.example/miner:latest", "ns/svc/../../x", {"privileged": True}]))
    if how == "delete":
        del parent[path[-1]]
    elif how == "add" and isinstance(parent, dict):
        parent[data.draw(st.text(max_size=8))] = data.draw(leaf)
    else:
        parent[path[-1]] = data.draw(leaf)
    return out


@pytest.fixture
def journal_target(tmp_path, status_server_factory, kubeconfig_to):
    """A signed journal (its text) whose kubeconfig names a recording API server: one per test, every example."""
    srv = status_server_factory(200, "OK")
    j = _journal(tmp_path, kubeconfig_to(tmp_path / "kc", srv.url, context="stage"))
    return j.path, j.path.read_text(), srv


@fuzz
@given(st.data())
def test_an_edited_journal_is_refused_before_any_request(journal_target, data):
    path, text, srv = journal_target
    signed = json.loads(text)
    edited = _mutate(signed, data)
    if edited == signed:
        return
    path.write_text(json.dumps(edited))
    with pytest.raises(BadInput) as e:
        restore_journal(path, allow=["stage"], log=lambda m: None)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert srv.requests == []


def test_the_journal_mutations_reach_every_field():
    """The fuzzer above edits every field a journal has, the original template's image among them."""
    signed = json.loads(_journal_text())
    paths = {p for p in _paths(signed) if p}
    assert ("rollouts", "ns/svc", "original", "template", "spec", "containers", 0, "image") in paths
    assert ("digest",) in paths and ("kubeconfig",) in paths and ("holds", 0, "id") in paths


def _journal_text() -> str:
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        return _journal(Path(d), Path(d) / "kc").path.read_text()
