"""A cluster in use is never replaced, and two `up` of one name are serialised (the real embedded cluster, with
the two controllers of the README's test command).  "In use" is provable: a holder marker under a lock that
ends with its process (a run, a probe, a test session), or a drill's lease on a Rollout in the cluster."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from kubernetes import client

from drills.core import config
from drills.cluster import EmbeddedCluster
from drills.cluster.namespaces import make_namespace
from drills.drill.safety import LEASE_ANNOTATION
from drills.core.wait import until

pytestmark = pytest.mark.single_version
FIRST, OTHER = config.TEST_CONTROLLERS[0], config.TEST_CONTROLLERS[-1]

HOLDER = """
import sys
from drills.cluster import EmbeddedCluster
c = EmbeddedCluster(sys.argv[1])
c.hold(sys.argv[2])
print("held", flush=True)
sys.stdin.read()          # until the test closes stdin
"""


def _drills(*args, name: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, DRILLS_CLUSTER=name))


def _status(name: str) -> dict:
    return json.loads(_drills("cluster", "status", "--json", name=name).stdout)


@pytest.fixture(scope="module")
def own():
    """A cluster of this module's own at the first controller (never the session's)."""
    c = EmbeddedCluster(f"usage-{os.getpid()}", log=lambda m: None)
    r = _drills("cluster", "up", "--controller", FIRST, name=c.name)
    assert r.returncode == 0, r.stderr
    yield c
    c.down(quiet=True)


@pytest.fixture
def holder(own):
    """holder(purpose) -> a process of its own holding the cluster until the test ends (as a session does)."""
    made = []

    def start(purpose: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", HOLDER, own.name, purpose], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "held"
        made.append(p)
        return p
    yield start
    for p in made:
        p.stdin.close()
        p.wait(30)


def test_up_with_another_controller_refuses_a_cluster_someone_holds_and_changes_nothing(own, holder):
    api = own.api_client()
    ns = make_namespace(api, f"in-use-{os.getpid()}")
    before = _status(own.name)
    h = holder("a pytest session of alice")
    for args in (["cluster", "up", "--controller", OTHER], ["probe", "--controller", OTHER, "--steps", "5,100"]):
        r = _drills(*args, name=own.name)
        assert r.returncode == 2, (args, r.stderr)
        line = [x for x in r.stderr.strip().splitlines() if x.startswith("drills:")]
        assert len(line) == 1 and f"pid {h.pid}" in line[0] and "a pytest session of alice" in line[0], r.stderr
        assert "in use by" in line[0] and "nothing was changed" in line[0], r.stderr
    after = _status(own.name)
    assert after["ready"] and after["controller_version"] == FIRST and after["created_at"] == before["created_at"]
    assert client.CoreV1Api(api).read_namespace(ns).status.phase == "Active"
    # the same controller: reused, not replaced, whoever holds it
    r = _drills("cluster", "up", "--controller", FIRST, name=own.name)
    assert r.returncode == 0 and "already up" in r.stderr, r.stderr
    assert _status(own.name)["created_at"] == before["created_at"]


def test_a_holder_that_is_gone_holds_nothing(own):
    """A holder killed with SIGKILL (or a reboot) leaves a marker whose lock is free: it is a leftover."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, own.name, "killed"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    assert [h["pid"] for h in own.holders()] == [p.pid]
    p.kill()
    p.wait(30)
    assert own.holders() == [] and not list(own.usage.dir.glob("*.json"))


def test_up_refuses_a_cluster_whose_rollout_carries_a_drills_lease(own):
    api = own.api_client()
    ns = make_namespace(api, f"leased-{os.getpid()}")
    body = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "svc", "namespace": ns,
                         "annotations": {LEASE_ANNOTATION: json.dumps({"run": "r-live", "journal": "/j.json"})}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "svc"}},
                     "template": {"metadata": {"labels": {"app": "svc"}},
                                  "spec": {"containers": [{"name": "app", "image": "svc:1"}]}},
                     "strategy": {"canary": {"steps": [{"setWeight": 50}]}}}}
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "rollouts", body)
    try:
        r = _drills("cluster", "up", "--controller", OTHER, name=own.name)
        assert r.returncode == 2 and f"rollout {ns}/svc" in r.stderr and "r-live" in r.stderr, r.stderr
        assert _status(own.name)["controller_version"] == FIRST
    finally:
        co.delete_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "rollouts", "svc")


def test_a_session_ending_leaves_up_a_cluster_someone_else_holds(own, holder):
    h = holder("the other session")
    res = own.down(quiet=True, if_unused=True)
    assert f"pid {h.pid}" in res["left_up"] and _status(own.name)["ready"]


def test_two_ups_of_one_name_at_once_end_with_the_cluster_the_last_one_printed(tmp_path):
    name = f"race-{os.getpid()}"
    procs = []
    try:
        for version in (FIRST, OTHER):
            procs.append((version, subprocess.Popen(
                [sys.executable, "-m", "drills", "cluster", "up", "--controller", version],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, DRILLS_CLUSTER=name))))
        ended = []

        def finished():
            for v, p in procs:
                if p.poll() is not None and v not in [e[0] for e in ended]:
                    out, err = p.communicate()
                    ended.append((v, p.returncode, out, err, time.monotonic()))
            return len(ended) == 2
        until("both `cluster up` to end", finished, timeout=900, interval=0.2)
        assert all(rc == 0 for _, rc, _, _, _ in ended), ended
        assert all(json.loads(out)["ready"] for _, _, out, _, _ in ended), ended
        assert any("waiting for" in err for _, _, _, err, _ in ended), ended
        last = max(ended, key=lambda e: e[4])
        st = _status(name)
        assert st["ready"] and st["controller_version"] == last[0] == json.loads(last[2])["controller_version"]
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        EmbeddedCluster(name, log=lambda m: None).down(quiet=True)
