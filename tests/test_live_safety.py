"""Live mode against the embedded cluster used as an allowlisted stand-in stage: what a careful platform
engineer tried before pointing the drill at a real stage cluster (multi-container Rollouts, kill -9, repeated
signals, someone else changing the Rollout, Argo CD tracking, shapes the drill cannot handle)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tenacity import retry, retry_if_result, stop_after_delay, wait_fixed

from drills.drill import safety
from drills.record import timeline
from drills.core.errors import Refused
from drills.run.live import check_shape
from drills.core.podtemplate import container_images
from drills.kube.rollout import GROUP, PLURAL, RESYNC_ANNOTATION, VERSION, Rollouts, healthy_at

pytestmark = pytest.mark.single_version

SIDECAR = {"name": "istio-proxy", "image": "registry.local/proxy:1.0"}


def until(what: str, fn, timeout: float = 120, every: float = 0.1, detail=None):
    """Wait for fn() to return something truthy; the error names the wait (and ``detail()``: what was seen)."""
    r = retry(retry=retry_if_result(lambda v: not v), stop=stop_after_delay(timeout), wait=wait_fixed(every),
              retry_error_callback=lambda st: pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}"
                                                          + (f"\n{detail()}" if detail else "")))
    return r(fn)()


def _spec(ro: dict) -> dict:
    return {"template": ro["spec"]["template"], "steps": ro["spec"]["strategy"]["canary"]["steps"],
            "replicas": ro["spec"]["replicas"], "paused": ro["spec"].get("paused")}


def _lease(ro: dict) -> str | None:
    return (ro["metadata"].get("annotations") or {}).get(safety.LEASE_ANNOTATION)


def _ledger(reports: Path) -> list[dict]:
    return json.loads(next(reports.glob("*/ledger.json")).read_text())


class Stderr:
    """Collects a child's stderr lines as they come."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self.t = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.t.start()

    def _read(self, proc):
        for line in proc.stderr:
            self.lines.append(line)

    def seen(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    @property
    def text(self) -> str:
        return "".join(self.lines)


def _start_live(live_cmd, *extra) -> tuple[subprocess.Popen, Stderr]:
    import os
    env = dict(os.environ, DRILLS_REPORTS=str(live_cmd.reports), DRILLS_CONFIG="/nonexistent/drills.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "drills", *live_cmd.args("svc", *extra)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, Stderr(proc)


def _rollback_sent(kube, namespace, image_v2):
    ro = Rollouts(kube, namespace).get("svc")
    return container_images(ro["spec"]["template"]).get("app") != image_v2


# --- 1 and 7: only the app container changes; restore gives back the spec exactly -------------------------------
def test_app_and_sidecar_drill_changes_only_the_app_and_restores_the_spec_exactly(kube, namespace, stage_rollout,
                                                                                  live_cmd, drills_cmd):
    d = stage_rollout(sidecars=[SIDECAR])
    before = Rollouts(kube, namespace).get("svc")
    r = live_cmd()
    rows = _ledger(live_cmd.reports)
    assert r.returncode == 0, (r.stderr[-3000:], rows)
    peaks = {row["step"]: row["observed"] for row in rows if row["assertion"].startswith("peak canary weight")}
    assert peaks == {"before": 100, "after": 5}, rows
    exit_rows = [row for row in rows if row["step"] == "exit"]
    assert len(exit_rows) == 3 and all(row["verdict"] == "pass" for row in exit_rows), exit_rows
    redeploy = next(row for row in rows if row["step"] == "redeploy")
    assert redeploy["verdict"] == "pass" and redeploy["observed"]["istio-proxy"] == SIDECAR["image"], redeploy
    # the sidecar's image never changed, in any Rollout the recorder saw or any ReplicaSet the Rollout owns
    for tl in (live_cmd.reports).glob("*/live/*.timeline.jsonl"):
        for rec in timeline.load(tl):
            if rec["kind"] == "Rollout" and rec["type"] != "DELETED":
                assert rec["obj"]["images"]["istio-proxy"] == SIDECAR["image"], (tl, rec)
    rl = Rollouts(kube, namespace)
    after = rl.get("svc")
    for rs in rl.owned_replicasets(after):
        assert {c.name: c.image for c in rs.spec.template.spec.containers}["istio-proxy"] == SIDECAR["image"]
    # restored exactly: no field of the ReplicaSet's defaulted template merged into the spec
    assert _spec(after) == _spec(before)
    assert healthy_at(d.hash_v2)(after) and _lease(after) is None
    journal = next(live_cmd.reports.glob("*/journal.json"))
    assert safety.Journal.load(journal).state == "restored"
    # a restored journal is not replayed: nothing to do, nothing sent
    r = drills_cmd("restore", "--journal", journal, "--allow-context", live_cmd.context)
    assert r.returncode == 0 and "nothing to do" in r.stdout, r.stderr
    assert rl.get("svc")["metadata"]["generation"] == after["metadata"]["generation"]


# --- the rollback target differs in a sidecar: v1 = (svc:v1, sidecar:1), v2 = (svc:v2, sidecar:2) ----------------
SIDECAR_V1 = {"name": "sidecar", "image": "registry.local/sidecar:1"}
SIDECAR_V2 = "registry.local/sidecar:2"


def _sidecar_differs(kube, namespace, tmp_path, controller_version):
    """A Rollout at (svc:v2, sidecar:2) whose rollback target, scaled to 0 inside the window, is (svc:v1, sidecar:1):
    a chart release that pinned a new sidecar with the new app image."""
    from drills.drill.kit import DrillRollout
    from drills.kube.rollout import Predicate, healthy
    from drills.drill.shapes import RolloutSpec
    d = DrillRollout(kube, namespace, RolloutSpec(
        steps=[{"setWeight": 5}, {"pause": {"duration": "2s"}}, {"setWeight": 100}], replicas=2, name="svc",
        scale_down_delay=3, image_v1="registry.local/svc:v1", image_v2="registry.local/svc:v2",
        sidecars=[SIDECAR_V1]), tmp_path / "prepare", controller_version=controller_version)
    d.deploy_v1()
    d.space_replicasets()
    rl = Rollouts(kube, namespace)
    v2 = rl.get("svc")["spec"]["template"]
    for c in v2["spec"]["containers"]:
        c["image"] = {"app": d.spec.image_v2, "sidecar": SIDECAR_V2}[c["name"]]
    rl.gitops_rollback("svc", v2)           # one write of the whole v2 template: both images at once
    ro = rl.wait("svc", Predicate("Healthy at the v2 template", lambda o: healthy()(o) and o["status"].get(
        "stableRS") not in (None, d.hash_v1) and o["status"].get("stableRS") == o["status"].get("currentPodHash")),
        d.deploy_timeout())
    d.hash_v2 = ro["status"]["stableRS"]
    d.wait_scaled_to_zero(d.hash_v1)
    return d


def _sidecar_images_seen(reports: Path) -> set[str]:
    return {rec["obj"]["images"]["sidecar"] for tl in reports.glob("*/live/*.timeline.jsonl")
            for rec in timeline.load(tl) if rec["kind"] == "Rollout" and rec["type"] != "DELETED"}


def test_a_rollback_target_whose_sidecar_differs_is_refused_before_the_first_write_naming_the_sidecar(
        kube, namespace, tmp_path, controller_version, live_cmd, audit_mutations):
    _sidecar_differs(kube, namespace, tmp_path, controller_version)
    before = Rollouts(kube, namespace).get("svc")
    since = time.time()
    r = live_cmd("--container", "app", "--dry-run")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "also differs in: container sidecar: image registry.local/sidecar:2 -> registry.local/sidecar:1" \
        in r.stdout and "other containers unchanged" not in r.stdout, r.stdout
    r = live_cmd("--container", "app")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "container sidecar: image registry.local/sidecar:2 -> registry.local/sidecar:1" in r.stderr \
        and "--allow-other-changes" in r.stderr, r.stderr
    sent = audit_mutations(namespace, since)
    assert sent == [], [(e["verb"], e["objectRef"], e["userAgent"], e["requestReceivedTimestamp"]) for e in sent]
    after = Rollouts(kube, namespace).get("svc")
    assert _spec(after) == _spec(before) and _lease(after) is None
    assert not list(live_cmd.reports.glob("*/journal.json"))


def test_with_allow_other_changes_the_drill_writes_only_the_app_image_and_never_changes_the_sidecar(
        kube, namespace, tmp_path, controller_version, live_cmd):
    d = _sidecar_differs(kube, namespace, tmp_path, controller_version)
    rl = Rollouts(kube, namespace)
    before = rl.get("svc")
    target_rs = {(rs.metadata.labels or {}).get("rollouts-pod-template-hash") for rs in rl.owned_replicasets(before)}
    r = live_cmd("--container", "app", "--allow-other-changes")
    rows = _ledger(live_cmd.reports)
    assert "left as they are now" in r.stderr, r.stderr
    # every template the Rollout had during the drill, as the recorder saw it, kept sidecar:2
    assert _sidecar_images_seen(live_cmd.reports) == {SIDECAR_V2}, rows
    # every ReplicaSet the drill made runs sidecar:2; the old v1 one (sidecar:1) was never revived
    after = rl.get("svc")
    for rs in rl.owned_replicasets(after):
        images = {c.name: c.image for c in rs.spec.template.spec.containers}
        h = (rs.metadata.labels or {}).get("rollouts-pod-template-hash")
        if h == d.hash_v1:
            assert images["sidecar"] == SIDECAR_V1["image"] and not rs.status.replicas, rs.status
        else:
            assert images["sidecar"] == SIDECAR_V2, (h, images, target_rs)
    redeploy = next(row for row in rows if row["step"] == "redeploy")
    assert redeploy["verdict"] == "pass" and redeploy["details"]["sent_differences"] == [], redeploy
    assert redeploy["observed"] == {"app": d.spec.image_v2, "sidecar": SIDECAR_V2}, redeploy
    before_row = next(row for row in rows if row["step"] == "before")
    assert before_row["details"]["other_differences_left_as_they_are"] == [
        "container sidecar: image registry.local/sidecar:2 -> registry.local/sidecar:1"], before_row
    assert _spec(after) == _spec(before) and _lease(after) is None, r.stderr[-3000:]
    # BEFORE's template matches no ReplicaSet: the controller walks it as a new revision, not a rollback inside
    # rollbackWindow, so its peak row is no evidence of the exposure (inconclusive, never a pass); the later
    # rollbacks revive the ReplicaSet BEFORE made, judged on what the controller says of the window
    assert before_row["verdict"] == "inconclusive" and "rollbackWindow" in before_row["reason"], before_row
    assert r.returncode == 3 and "Traceback" not in r.stderr, (r.stderr[-3000:], rows)


# --- 2 and 4: kill -9, the lease stays and names the journal; restore refuses a Rollout that moved on -----------
def test_sigkill_leaves_the_lease_and_restore_finishes_it_unless_someone_else_changed_the_rollout(
        kube, namespace, stage_rollout, live_cmd, drills_cmd):
    d = stage_rollout()
    original = _spec(Rollouts(kube, namespace).get("svc"))
    proc, err = _start_live(live_cmd)
    until("the drill's rollback", lambda: _rollback_sent(kube, namespace, d.spec.image_v2), 180)
    proc.kill()
    proc.wait(30)
    rl = Rollouts(kube, namespace)
    lease = safety.parse_lease(_lease(rl.get("svc")))
    assert lease.get("journal"), "the lease must stay after kill -9 and name the journal"
    journal = lease["journal"]
    r = live_cmd("--dry-run")
    assert r.returncode == 2 and "held by another drill" in r.stderr and journal in r.stderr, r.stderr
    # someone else moves the Rollout on: restore must not overwrite it
    moved = rl.set_image("svc", "registry.local/svc:v3", container="app")
    r = drills_cmd("restore", "--journal", journal, "--allow-context", live_cmd.context)
    assert r.returncode == 2, r.stderr
    assert "moved on" in r.stderr and "spec.template" in r.stderr and "svc:v3" in r.stderr
    # nothing sent: the spec is the other writer's (the controller keeps writing the status, not the spec)
    now = rl.get("svc")
    assert now["metadata"]["generation"] == moved["metadata"]["generation"]
    assert container_images(now["spec"]["template"])["app"] == "registry.local/svc:v3"
    # that change undone (the Rollout back where the drill left it): restore finishes and releases the lease, and
    # removes a resync annotation the killed drill left between setting and removing it
    rl.set_image("svc", d.spec.image_v1, container="app")
    rl.co.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "svc",
                                         {"metadata": {"annotations": {RESYNC_ANNOTATION: "7"}}})
    r = drills_cmd("restore", "--journal", journal, "--allow-context", live_cmd.context, timeout=400)
    assert r.returncode == 0, r.stderr
    ro = rl.get("svc")
    assert _spec(ro) == original and healthy_at(d.hash_v2)(ro) and _lease(ro) is None
    assert RESYNC_ANNOTATION not in (ro["metadata"].get("annotations") or {}), ro["metadata"]
    assert safety.Journal.load(Path(journal)).state == "restored"


# --- 4 and 9: a second signal abandons the restore and keeps the lease; a third is only noted --------------------
def test_second_signal_abandons_restore_keeps_lease_third_is_noted(kube, namespace, cluster, stage_rollout,
                                                                   live_cmd, drills_cmd):
    d = stage_rollout()
    proc, err = _start_live(live_cmd)
    until("the drill's rollback", lambda: _rollback_sent(kube, namespace, d.spec.image_v2), 180)
    # the controller stopped: the restore's wait for Healthy cannot end before the second signal comes (a
    # restore that finished first would leave nothing to abandon)
    controller = next(p["pid"] for p in cluster.state()["processes"] if p["name"] == "rollouts-controller")
    os.kill(controller, signal.SIGSTOP)
    try:
        proc.send_signal(signal.SIGINT)
        until("restore to start", lambda: err.seen("restore: "), 120, detail=lambda: err.text)
        proc.send_signal(signal.SIGINT)
        until("the restore to be abandoned", lambda: err.seen("restore abandoned"), 60, detail=lambda: err.text)
    finally:
        os.kill(controller, signal.SIGCONT)
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(120)
    err.t.join(10)
    assert rc == 3, err.text
    assert "Traceback" not in err.text, err.text
    ro = Rollouts(kube, namespace).get("svc")
    lease = safety.parse_lease(_lease(ro))
    assert lease.get("journal"), "an abandoned restore keeps the lease: a restore is owed"
    assert safety.Journal.load(Path(lease["journal"])).state == "abandoned"
    rows = _ledger(live_cmd.reports)
    assert not any(r["verdict"] == "pass" for r in rows if r["step"] in ("before", "after")), rows
    r = drills_cmd("restore", "--journal", lease["journal"], "--allow-context", live_cmd.context, timeout=400)
    assert r.returncode == 0, r.stderr
    ro = Rollouts(kube, namespace).get("svc")
    assert healthy_at(d.hash_v2)(ro) and _lease(ro) is None


# --- 5: Argo CD's default tracking label ----------------------------------------------------------------------
def test_argocd_default_tracking_label_is_refused_without_sync_paused(kube, namespace, stage_rollout, live_cmd):
    from kubernetes import client
    stage_rollout()
    client.CustomObjectsApi(kube).patch_namespaced_custom_object(
        "argoproj.io", "v1alpha1", namespace, "rollouts", "svc",
        {"metadata": {"labels": {"app.kubernetes.io/instance": "svc"}}})
    r = live_cmd("--dry-run")
    assert r.returncode == 2 and "Argo CD" in r.stderr and "app.kubernetes.io/instance" in r.stderr, r.stderr
    r = live_cmd("--dry-run", "--sync-paused")
    assert r.returncode == 0 and "dry-run: would" in r.stdout, r.stderr


# --- 9: valid Rollouts the drill cannot handle -------------------------------------------------------------------
def _ro(**spec) -> dict:
    base = {"selector": {"matchLabels": {"app": "x"}},
            "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "x", "image": "i"}]}},
            "strategy": {"canary": {"steps": [{"setWeight": 5}], "trafficRouting": {"istio": {}}}}}
    base.update(spec)
    return {"metadata": {"namespace": "ns", "name": "x"}, "spec": base}


@pytest.mark.parametrize("spec,needle", [
    ({"strategy": {"canary": {"trafficRouting": {"istio": {}}}}}, "no steps"),
    ({"strategy": {"canary": {"steps": None, "trafficRouting": {"istio": {}}}}}, "steps: null"),
    ({"strategy": {"canary": {"steps": [{"pause": {}}], "trafficRouting": {"istio": {}}}}}, "no canary setWeight"),
    ({"workloadRef": {"kind": "Deployment", "name": "x"}, "template": None}, "workloadRef"),
    ({"template": {"spec": {"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "j"}]}}},
     "--container"),
    ({"selector": {}}, "selects nothing"),
])
def test_shapes_the_drill_cannot_handle_are_refused(spec, needle):
    with pytest.raises(Refused, match=needle.replace("-", "\\-")):
        check_shape(_ro(**spec), None)


def test_match_expressions_selector_is_handled():
    ro = _ro(selector={"matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]})
    assert check_shape(ro, None) == "x"


def test_canary_without_steps_on_a_real_rollout_is_exit_2_and_sends_nothing(kube, namespace, live_cmd,
                                                                           audit_mutations):
    from kubernetes import client

    from drills.drill.shapes import RolloutSpec, install
    install(kube, namespace, RolloutSpec(steps=[{"setWeight": 5}], name="svc"))
    client.CustomObjectsApi(kube).patch_namespaced_custom_object(
        "argoproj.io", "v1alpha1", namespace, "rollouts", "svc",
        [{"op": "remove", "path": "/spec/strategy/canary/steps"}],
        _content_type="application/json-patch+json")
    since = time.time()
    r = live_cmd()
    assert r.returncode == 2 and "no steps" in r.stderr and "Traceback" not in r.stderr, r.stderr
    sent = audit_mutations(namespace, since)
    assert sent == [], [(e["verb"], e["objectRef"], e["userAgent"], e["requestReceivedTimestamp"]) for e in sent]
