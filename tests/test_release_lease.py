"""The way out of a restore that refuses: `drills restore --release-lease --journal J` removes the lease the
journal's drill left (only that one), after the allowlist and the opt-in label, and records who released it; the
restore refusals (an edited journal, a Rollout moved on) send nothing and point to it.  On the embedded cluster,
used as an allowlisted stand-in stage."""
from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from kubernetes import client

from drills.cluster.namespaces import make_namespace, namespace_name
from drills.core.journal_file import digest_of
from drills.drill.lease import RELEASED_ANNOTATION
from drills.kube.rollout import GROUP, PLURAL, VERSION
from drills.drill.safety import LEASE_ANNOTATION, Journal, lease_value


def kube_context(cluster) -> str:
    return yaml.safe_load(Path(cluster.kubeconfig).read_text())["current-context"]

pytestmark = pytest.mark.single_version


def _rollout(co, ns: str, name: str = "svc", image: str = "registry.local/svc:v1") -> dict:
    body = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "app", "image": image}]}},
                     "strategy": {"canary": {"steps": [{"setWeight": 5}, {"setWeight": 100}]}}}}
    return co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


@pytest.fixture
def leased(cluster, kube, namespace, tmp_path):
    """A Rollout a drill (run r1) journalled and leased, as a drill killed with SIGKILL leaves it."""
    co = client.CustomObjectsApi(kube)
    ro = _rollout(co, namespace)
    j = Journal(tmp_path / "run" / "journal.json", kubeconfig=str(cluster.kubeconfig), context=kube_context(cluster),
                run_id="r1")
    j.before_spec_change(ro)
    key = f"{namespace}/svc"
    value = lease_value("r1", j.path, j.original_digest(key))
    co.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "svc",
                                      {"metadata": {"annotations": {LEASE_ANNOTATION: value}}})
    return SimpleNamespace(path=j.path, data=j.data, co=co, ns=namespace, lease=value, ctx=kube_context(cluster))


def _get(j) -> dict:
    return j.co.get_namespaced_custom_object(GROUP, VERSION, j.ns, PLURAL, "svc")


def _image(ro: dict) -> str:
    return ro["spec"]["template"]["spec"]["containers"][0]["image"]


def test_an_edited_journal_whose_digest_was_recomputed_is_told_by_the_lease_and_nothing_is_sent(leased, drills_cmd,
                                                                                                 audit_mutations):
    data = json.loads(leased.path.read_text())
    data["rollouts"][f"{leased.ns}/svc"]["original"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    data["digest"] = digest_of(data)              # as anyone who can write the file can
    leased.path.write_text(json.dumps(data))
    since = time.time()
    r = drills_cmd("restore", "--journal", leased.path, "--allow-context", leased.ctx)
    assert r.returncode == 2 and "the drill's lease records" in r.stderr and "--release-lease" in r.stderr, r.stderr
    assert audit_mutations(leased.ns, since) == []
    assert _image(_get(leased)) == "registry.local/svc:v1"


def test_release_lease_removes_only_this_journals_lease_and_records_who(leased, drills_cmd, audit_mutations):
    data = json.loads(leased.path.read_text())
    data["rollouts"][f"{leased.ns}/svc"]["original"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    leased.path.write_text(json.dumps(data))      # edited: a restore refuses it, the way out still works
    r = drills_cmd("restore", "--journal", leased.path, "--allow-context", leased.ctx)
    assert r.returncode == 2 and "--release-lease" in r.stderr, r.stderr
    since = time.time()
    r = drills_cmd("restore", "--release-lease", "--journal", leased.path, "--allow-context", leased.ctx)
    assert r.returncode == 0, r.stderr
    sent = audit_mutations(leased.ns, since)
    assert [(e["verb"], e["objectRef"]["resource"], e["objectRef"]["name"]) for e in sent] == [
        ("patch", "rollouts", "svc")], sent
    ro = _get(leased)
    notes = ro["metadata"].get("annotations") or {}
    assert LEASE_ANNOTATION not in notes
    who = json.loads(notes[RELEASED_ANNOTATION])
    assert who["run"] == "r1" and who["by"] and who["journal"] == str(leased.path)
    assert _image(ro) == "registry.local/svc:v1"          # nothing else sent: the Rollout is not restored
    j = json.loads(leased.path.read_text())
    assert j["state"] == "lease-released" and j["lease_released"]["by"] == who["by"]
    # the edited journal did not get a fresh digest on the way: a restore still refuses it
    r = drills_cmd("restore", "--journal", leased.path, "--allow-context", leased.ctx)
    assert r.returncode == 2 and "digest" in r.stderr, r.stderr


def test_release_lease_refuses_a_lease_that_is_another_drills(leased, drills_cmd):
    other = json.dumps({"run": "r9", "journal": "/elsewhere/journal.json"})
    leased.co.patch_namespaced_custom_object(GROUP, VERSION, leased.ns, PLURAL, "svc",
                                             {"metadata": {"annotations": {LEASE_ANNOTATION: other}}})
    r = drills_cmd("restore", "--release-lease", "--journal", leased.path, "--allow-context", leased.ctx)
    assert r.returncode == 2 and "not this journal's" in r.stderr, r.stderr
    assert _get(leased)["metadata"]["annotations"][LEASE_ANNOTATION] == other


def test_release_lease_checks_the_namespace_opt_in_label(leased, kube, drills_cmd):
    client.CoreV1Api(kube).patch_namespace(leased.ns, {"metadata": {"labels": {"drills.dev/allow": None}}})
    r = drills_cmd("restore", "--release-lease", "--journal", leased.path, "--allow-context", leased.ctx)
    assert r.returncode == 2 and "opt-in label" in r.stderr, r.stderr
    assert _get(leased)["metadata"]["annotations"][LEASE_ANNOTATION] == leased.lease


def test_a_rollout_moved_on_is_refused_pointing_to_the_way_out(leased, drills_cmd, audit_mutations):
    leased.co.patch_namespaced_custom_object(
        GROUP, VERSION, leased.ns, PLURAL, "svc", {"spec": {"template": {"spec": {"containers": [
            {"name": "app", "image": "registry.local/svc:v3"}]}}}})
    since = time.time()
    r = drills_cmd("restore", "--journal", leased.path, "--allow-context", leased.ctx)
    assert r.returncode == 2 and "moved on" in r.stderr, r.stderr
    assert f"drills restore --release-lease --journal {leased.path}" in r.stderr and "A way out" in r.stderr
    assert audit_mutations(leased.ns, since) == [] and _image(_get(leased)) == "registry.local/svc:v3"
    r = drills_cmd("restore", "--release-lease", "--journal", leased.path, "--allow-context", leased.ctx)
    assert r.returncode == 0 and LEASE_ANNOTATION not in _get(leased)["metadata"]["annotations"], r.stderr
    # the Rollout is free again: another drill's preflight no longer names that lease
    assert "held by another drill" not in drills_cmd(
        "run", "--kubeconfig", leased.data["kubeconfig"], "--context", leased.ctx, "--namespace", leased.ns,
        "--rollout", "svc", "--allow-context", leased.ctx, "--dry-run").stderr


def test_a_namespace_without_the_label_is_never_released_into(cluster, kube, tmp_path, drills_cmd):
    ns = make_namespace(kube, namespace_name("unlabelled"))
    try:
        client.CoreV1Api(kube).patch_namespace(ns, {"metadata": {"labels": {"drills.dev/allow": None}}})
        co = client.CustomObjectsApi(kube)
        ro = _rollout(co, ns)
        j = Journal(tmp_path / "j.json", kubeconfig=str(cluster.kubeconfig), context=kube_context(cluster), run_id="r")
        j.before_spec_change(ro)
        value = lease_value("r", j.path)
        co.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "svc",
                                          {"metadata": {"annotations": {LEASE_ANNOTATION: value}}})
        r = drills_cmd("restore", "--release-lease", "--journal", j.path, "--allow-context", kube_context(cluster))
        assert r.returncode == 2 and "opt-in label" in r.stderr, r.stderr
        got = co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "svc")
        assert got["metadata"]["annotations"][LEASE_ANNOTATION] == value
    finally:
        client.CoreV1Api(kube).delete_namespace(ns)
