"""Safety: refused targets send nothing; an interrupted drill restores the Rollout and says inconclusive."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from drills.core import config
from drills.drill.kit import DrillRollout
from drills.kube.rollout import Rollouts, healthy
from drills.drill.shapes import RolloutSpec
from drills.core.wait import WaitTimeout, until

pytestmark = pytest.mark.single_version


def _context(cluster) -> str:
    return yaml.safe_load(Path(cluster.kubeconfig).read_text())["current-context"]


def _prepared(kube, ns, tmp_path, version) -> DrillRollout:
    """A Rollout at v2, v1 scaled to 0: a valid rollback target inside the window."""
    spec = RolloutSpec(steps=[{"setWeight": 5}, {"pause": {"duration": "2s"}}, {"setWeight": 100}], replicas=2,
                     name="svc", scale_down_delay=3)
    d = DrillRollout(kube, ns, spec, tmp_path, controller_version=version)
    d.deploy_v1()
    d.deploy_v2()
    d.wait_scaled_to_zero(d.hash_v1)
    return d


def _run(args, env=None, **kw):
    e = dict(os.environ, DRILLS_REPORTS=str(kw.pop("reports")))
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, env=e,
                          timeout=kw.pop("timeout", 300))


def test_refused_context_and_namespace_send_no_mutation(kube, cluster, namespace, tmp_path, controller_version,
                                                       audit_mutations):
    _prepared(kube, namespace, tmp_path / "ev", controller_version)
    ctx = _context(cluster)
    cfg = tmp_path / "drills.yaml"
    cfg.write_text("allowed_contexts: []\n")
    since = time.time()
    r = _run(["run", "--kubeconfig", str(cluster.kubeconfig), "--context", ctx, "--namespace", namespace,
              "--rollout", "svc"], env={"DRILLS_CONFIG": str(cfg)}, reports=tmp_path / "r1")
    assert r.returncode == 2 and ctx in r.stderr and "allowlist" in r.stderr
    # allowlisted context, but a namespace without the opt-in label
    core = client.CoreV1Api(kube)
    core.patch_namespace(namespace, {"metadata": {"labels": {config.NAMESPACE_OPT_IN_LABEL: None}}})
    cfg.write_text(f"allowed_contexts: [{ctx}]\n")
    r = _run(["run", "--kubeconfig", str(cluster.kubeconfig), "--context", ctx, "--namespace", namespace,
              "--rollout", "svc"], env={"DRILLS_CONFIG": str(cfg)}, reports=tmp_path / "r2")
    assert r.returncode == 2 and namespace in r.stderr and config.NAMESPACE_OPT_IN_LABEL in r.stderr
    assert audit_mutations(namespace, since) == []


def test_dry_run_prints_mutations_and_makes_none(kube, cluster, namespace, tmp_path, controller_version,
                                                audit_mutations):
    _prepared(kube, namespace, tmp_path / "ev", controller_version)
    since = time.time()
    r = _run(["run", "--kubeconfig", str(cluster.kubeconfig), "--context", _context(cluster), "--namespace",
              namespace, "--rollout", "svc", "--allow-context", _context(cluster), "--dry-run"],
             reports=tmp_path / "r")
    assert r.returncode == 0, r.stderr
    assert "dry-run: would" in r.stdout and "roll back" in r.stdout
    assert audit_mutations(namespace, since) == []


def test_sigint_mid_rollback_restores_and_is_inconclusive(kube, cluster, namespace, tmp_path, controller_version):
    d = _prepared(kube, namespace, tmp_path / "ev", controller_version)
    image_v2 = d.spec.image_v2
    reports = tmp_path / "reports"
    proc = subprocess.Popen([sys.executable, "-m", "drills", "run", "--kubeconfig", str(cluster.kubeconfig),
                             "--context", _context(cluster), "--namespace", namespace, "--rollout", "svc",
                             "--allow-context", _context(cluster)],
                            env=dict(os.environ, DRILLS_REPORTS=str(reports)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    ro = Rollouts(kube, namespace)
    try:
        until("the drill's rollback", lambda: ro.get("svc")["spec"]["template"]["spec"]["containers"][0]["image"],
              lambda image: image != image_v2, 60, interval=0.02)
    except WaitTimeout:
        proc.kill()
        raise
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode not in (0, None), err
    obj = ro.get("svc")
    assert obj["spec"]["template"]["spec"]["containers"][0]["image"] == image_v2, err
    assert healthy()(obj) and obj["status"]["stableRS"] == obj["status"]["currentPodHash"], err
    assert "drills.dev/lease" not in (obj["metadata"].get("annotations") or {})
    rows = json.loads(next(reports.glob("*/ledger.json")).read_text())
    assert rows and any(r["verdict"] == "inconclusive" and "SIGINT" in (r["reason"] or "") for r in rows), rows
    assert not any(r["verdict"] == "pass" for r in rows if r["step"] in ("before", "after"))


def test_live_drill_loads_the_named_service_url_and_restores(kube, cluster, namespace, tmp_path, controller_version):
    """Live mode on the embedded cluster used as an allowlisted context, with load sent only to the URL the
    user names (here a small server on loopback); load rows are observations, the Rollout is restored."""
    import http.server
    import threading
    d = _prepared(kube, namespace, tmp_path / "ev", controller_version)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    srv.RequestHandlerClass.do_GET = lambda h: (h.send_response(200), h.end_headers())
    srv.RequestHandlerClass.log_message = lambda *a: None
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        reports = tmp_path / "reports"
        r = _run(["run", "--kubeconfig", str(cluster.kubeconfig), "--context", _context(cluster), "--namespace",
                  namespace, "--rollout", "svc", "--allow-context", _context(cluster),
                  "--service-url", f"http://127.0.0.1:{srv.server_address[1]}/"], reports=reports, timeout=600)
    finally:
        srv.shutdown()
    rows = json.loads(next(reports.glob("*/ledger.json")).read_text())
    assert r.returncode == 0, (r.stderr[-2000:], rows)
    peaks = {row["step"]: row["observed"] for row in rows if row["assertion"].startswith("peak canary weight")}
    assert peaks == {"before": 100, "after": 5}, rows
    load = [row for row in rows if row["assertion"].startswith("load.")]
    assert {row["step"] for row in load} == {"before", "after"}
    assert all(row["verdict"] == "unverified" for row in load)
    assert all(row["details"]["requests"] > 0 for row in load if row["assertion"].endswith("failure_ratio")
               and row["details"]["phase"] in ("steady", "settled"))
    obj = Rollouts(kube, namespace).get("svc")
    assert obj["spec"]["template"]["spec"]["containers"][0]["image"] == d.spec.image_v2
    assert healthy()(obj) and obj["status"]["stableRS"] == d.hash_v2
