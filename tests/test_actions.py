"""Each action applied by drills and by the kubectl-argo-rollouts plugin of the same module version, to two
identical Rollouts, leaves both in the same state."""
from __future__ import annotations

import subprocess

import pytest

from drills.kube.rollout import Predicate, Rollouts, aborted, healthy, paused
from drills.drill.shapes import RolloutSpec, install
from drills.toolchain import Toolchain
from drills.core.wait import WaitTimeout, hold_for, until


def _state(ro: dict) -> dict:
    spec, st = ro["spec"], ro.get("status") or {}
    return {
        "image": spec["template"]["spec"]["containers"][0]["image"],
        "replicas": spec.get("replicas"), "paused": spec.get("paused", False),
        "restartAt": bool(spec.get("restartAt")),
        "steps": spec["strategy"]["canary"]["steps"],
        "abort": st.get("abort", False), "promoteFull": st.get("promoteFull", False),
        "currentStepIndex": st.get("currentStepIndex"), "phase": st.get("phase"),
        "pauseConditions": sorted(p["reason"] for p in st.get("pauseConditions") or []),
        "stable_is_current": st.get("stableRS") == st.get("currentPodHash"),
    }


class Pair:
    def __init__(self, kube, cluster, ns, version):
        self.ro = Rollouts(kube, ns)
        self.ns = ns
        self.plugin = Toolchain().rollouts(version) / "kubectl-argo-rollouts"
        self.kubeconfig = str(cluster.kubeconfig)
        for name in ("by-drills", "by-plugin"):
            install(kube, ns, RolloutSpec(steps=[{"setWeight": 25}, {"pause": {}}, {"setWeight": 50}, {"pause": {}}],
                                        replicas=2, name=name))
        for name in ("by-drills", "by-plugin"):
            self.ro.wait(name, healthy(), 90)

    def plugin_run(self, *args):
        r = subprocess.run([str(self.plugin), "--kubeconfig", self.kubeconfig, "-n", self.ns, *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def settle(self, pred: Predicate, timeout=90) -> tuple[dict, dict]:
        self.ro.wait("by-drills", pred, timeout)
        self.ro.wait("by-plugin", pred, timeout)
        # both stable under the same predicate: compare what matters, once both settled alike
        try:
            until("the two Rollouts in the same state", lambda: (_state(self.ro.get("by-drills")),
                                                                 _state(self.ro.get("by-plugin"))),
                  lambda ab: ab[0] == ab[1], 15, interval=0.3)
        except WaitTimeout:
            pass
        return _state(self.ro.get("by-drills")), _state(self.ro.get("by-plugin"))


def _at(index, phase):
    return Predicate(f"step {index}, {phase}", lambda o: (o.get("status") or {}).get("currentStepIndex") == index
                     and (o.get("status") or {}).get("phase") == phase
                     and str(o["status"].get("observedGeneration")) == str(o["metadata"]["generation"]))


def test_actions_match_the_plugin(kube, cluster, namespace, controller_version):
    p = Pair(kube, cluster, namespace, controller_version)

    # set image
    p.ro.set_image("by-drills", "registry.local/probe:v2")
    p.plugin_run("set", "image", "by-plugin", "*=registry.local/probe:v2")
    a, b = p.settle(_at(1, "Paused"))
    assert a == b and a["image"] == "registry.local/probe:v2" and a["pauseConditions"] == ["CanaryPauseStep"]

    # promote (plain)
    p.ro.promote("by-drills")
    p.plugin_run("promote", "by-plugin")
    a, b = p.settle(_at(3, "Paused"))
    assert a == b and a["currentStepIndex"] == 3

    # abort
    p.ro.abort("by-drills")
    p.plugin_run("abort", "by-plugin")
    a, b = p.settle(Predicate("aborted and Degraded", lambda o: aborted()(o) and o["status"].get("phase") == "Degraded"))
    assert a == b and a["abort"] is True

    # retry
    p.ro.retry("by-drills")
    p.plugin_run("retry", "rollout", "by-plugin")
    a, b = p.settle(Predicate("retried, paused again", lambda o: not aborted()(o) and paused()(o)))
    assert a == b and a["abort"] is False

    # promote --full
    p.ro.promote("by-drills", full=True)
    p.plugin_run("promote", "by-plugin", "--full")
    a, b = p.settle(Predicate("Healthy at v2", lambda o: healthy()(o) and o["status"]["stableRS"] ==
                              o["status"]["currentPodHash"] and
                              o["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":v2")))
    assert a == b and a["phase"] == "Healthy" and a["stable_is_current"]

    # restart
    p.ro.restart("by-drills")
    p.plugin_run("restart", "by-plugin")
    # the restart is done when the controller has restarted every pod (status.restartedAt catches up with
    # spec.restartAt) and the Rollout is Healthy again: compared before that, one may still be Progressing
    a, b = p.settle(Predicate("restart done, Healthy", lambda o: bool(o["spec"].get("restartAt")) and
                              (o.get("status") or {}).get("restartedAt") == o["spec"]["restartAt"] and healthy()(o)))
    assert a == b and a["restartAt"] is True

    # undo (to the previous revision: v1); ReplicaSets compared by creation time at 1 s precision
    hold_for(1.0, "a second between the ReplicaSets compared")
    p.ro.undo("by-drills")
    p.plugin_run("undo", "by-plugin")
    a, b = p.settle(Predicate("back on v1", lambda o: o["spec"]["template"]["spec"]["containers"][0]["image"]
                              .endswith(":v1") and str(o["status"].get("observedGeneration")) ==
                              str(o["metadata"]["generation"])))
    assert a == b and a["image"].endswith(":v1")
    ra, rb = p.ro.get("by-drills"), p.ro.get("by-plugin")
    assert ra["spec"]["template"] == {**rb["spec"]["template"], "metadata": {
        **rb["spec"]["template"]["metadata"], "labels": {**rb["spec"]["template"]["metadata"]["labels"],
                                                        "app.kubernetes.io/name": "by-drills",
                                                        "app.kubernetes.io/instance": "by-drills"}}}

    # scale (kubectl scale goes through the scale subresource too)
    p.ro.scale("by-drills", 3)
    kubectl = Toolchain().kubernetes("kubectl")
    r = subprocess.run([str(kubectl), "--kubeconfig", p.kubeconfig, "-n", namespace, "scale", "rollout/by-plugin",
                        "--replicas=3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # observed and Healthy again: the undo's rollout back to v1 may still be going on in one of them (compared before
    # it ends, one is Progressing and the other Healthy on a loaded machine)
    a, b = p.settle(Predicate("3 replicas observed, Healthy", lambda o: o["spec"]["replicas"] == 3 and
                              str(o["status"].get("observedGeneration")) == str(o["metadata"]["generation"]) and
                              healthy()(o)))
    assert a == b and a["replicas"] == 3


@pytest.mark.single_version
def test_status_write_with_stale_resource_version_is_refused(kube, namespace):
    """A retried status write never advances a Rollout twice: it carries the resourceVersion it was computed from."""
    from kubernetes.client.rest import ApiException
    ro = install(kube, namespace, RolloutSpec(steps=[{"setWeight": 25}, {"pause": {}}], replicas=1, name="rv"))
    ro.wait("rv", healthy(), 60)
    stale = ro.get("rv")["metadata"]["resourceVersion"]
    ro.abort("rv")
    with pytest.raises(ApiException) as e:
        ro._patch_status("rv", "abort (stale)", {"abort": False}, stale)
    assert e.value.status == 409
