"""Nothing of a run is left behind: a probe stopped by SIGTERM (how CI cancels) removes its namespace and
Rollout; a pytest session that started an embedded cluster takes it down when it ends."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from tenacity import retry, retry_if_result, stop_after_delay, wait_fixed

from drills.cluster import EmbeddedCluster

pytestmark = pytest.mark.single_version


def until(what: str, fn, timeout: float = 120):
    r = retry(retry=retry_if_result(lambda v: not v), stop=stop_after_delay(timeout), wait=wait_fixed(0.2),
              retry_error_callback=lambda st: pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}"))
    return r(fn)()


def _probe_namespaces(kube) -> list[str]:
    return [n.metadata.name for n in client.CoreV1Api(kube).list_namespace().items
            if n.metadata.name.startswith("probe-") and n.status.phase == "Active"]


def _gone_or_terminating(kube, name: str) -> bool:
    try:
        ns = client.CoreV1Api(kube).read_namespace(name)
    except ApiException as e:
        return e.status == 404
    return ns.status.phase == "Terminating"


def test_probe_stopped_by_sigterm_removes_its_namespace(kube, cluster, controller_version, tmp_path):
    before = set(_probe_namespaces(kube))
    proc = subprocess.Popen([sys.executable, "-m", "drills", "probe", "--steps", "5,pause:2s,100", "--controller",
                             controller_version, "--hold", "20"],
                            env=dict(os.environ, DRILLS_REPORTS=str(tmp_path)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    co = client.CustomObjectsApi(kube)

    def probe_rollout():
        for ns in set(_probe_namespaces(kube)) - before:
            if co.list_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "rollouts")["items"]:
                return ns
        return None
    ns = until("the probe's Rollout", probe_rollout, 180)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 3, err
    assert "Traceback" not in err and "SIGTERM" in err, err
    until(f"namespace {ns} to be deleted", lambda: _gone_or_terminating(kube, ns), 60)


def test_a_test_session_takes_down_the_cluster_it_started(tmp_path, controller_version):
    name = f"leftover-{uuid.uuid4().hex[:6]}"
    test = tmp_path / "test_uses_a_cluster.py"
    test.write_text("def test_up(drills_cluster):\n    assert drills_cluster.status()['ready']\n")
    env = dict(os.environ, DRILLS_CLUSTER=name)
    # a project of a user's own: the plugin is asked for (-p drills), with its own option names
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:locust", "-q", "-p", "no:cacheprovider", "-p", "drills",
                        str(test), "--drills-controller", controller_version, "--rootdir", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    c = EmbeddedCluster(name)
    assert c.status() == {"ready": False}
    assert not c.folder.exists()
    assert c.own_processes() == [] and not c.all_pids()
