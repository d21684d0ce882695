"""Fixtures of the fault suite: the stand-in stage Rollout with everything a case needs around it (its state
before, a watch that names the drill's phases, availability holds that make a phase last, the drills under test
as child processes) and the checks every case ends with."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from checks import World, assert_restored, cluster_whole, lease_of, ledger_rows, passes, target_state
from faultkit import DrillProc, RolloutWatch, app_image, steps_of

from drills.cluster.availability import Availability
from drills.kube.rollout import HASH_LABEL, healthy, healthy_at
from drills.core.steps import cut_final_full_weight

# the runbook steps of the live drill, in order, as its ledger names them; a case interrupted in one of them
# must have no `pass` row for it or any later one
LIVE_STEPS = ("before", "cut-steps", "redeploy", "after", "exit")


def kube_context(cluster) -> str:
    return yaml.safe_load(Path(cluster.kubeconfig).read_text())["current-context"]


def settled(ro: dict) -> bool:
    st, want = ro.get("status") or {}, ro["spec"].get("replicas", 1)
    return healthy()(ro) and all(st.get(k) == want for k in ("replicas", "updatedReplicas", "readyReplicas",
                                                             "availableReplicas"))


class Stage:
    """One case on the stand-in stage: the prepared Rollout ``svc``, its state before the drill, the world around
    it, a watch of it, holds the case places (released at the end), the drills the case starts."""

    def __init__(self, kube, cluster, namespace, tmp_path, drill):
        self.kube, self.cluster, self.ns, self.d = kube, cluster, namespace, drill
        self.name = "svc"
        self.reports = tmp_path / "reports"
        self.tmp = tmp_path
        self.context = kube_context(cluster)
        self.watch = RolloutWatch(kube, namespace, self.name)
        self.steps = steps_of(self.watch.wait("the stage Rollout settled (Healthy, every count at spec.replicas)",
                                              settled, 120))
        self.before = target_state(kube, namespace, self.name)
        self.world = World(kube, cluster)
        self.cut = cut_final_full_weight(self.steps)
        self.holds: list[str] = []
        self.drills: list[DrillProc] = []

    # --- availability: how long a phase lasts ---------------------------------------------------------------
    def hold(self, pod_hash: str, period: float | None = None) -> str:
        """Pods of that revision stay un-Ready (one released per ``period`` seconds, none when None)."""
        hid = Availability(self.kube).hold(self.ns, {HASH_LABEL: pod_hash}, period)
        self.holds.append(hid)
        return hid

    def release(self) -> None:
        for hid in self.holds:
            Availability(self.kube).unhold(hid)
        self.holds = []

    # --- drills under test ----------------------------------------------------------------------------------
    def env(self, **extra) -> dict:
        return dict(os.environ, DRILLS_REPORTS=str(self.reports), DRILLS_CONFIG=str(self.tmp / "none.yaml"),
                    **extra)

    def live_args(self, *extra, kubeconfig=None) -> list[str]:
        return ["run", "--kubeconfig", str(kubeconfig or self.cluster.kubeconfig), "--context", self.context,
                "--namespace", self.ns, "--rollout", self.name, "--allow-context", self.context, *extra]

    def live(self, *extra, kubeconfig=None, env: dict | None = None, wrap=None) -> DrillProc:
        p = DrillProc(self.live_args(*extra, kubeconfig=kubeconfig), self.env(**(env or {})), wrap=wrap)
        self.drills.append(p)
        return p

    def restore(self, journal, timeout: float = 400) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "drills", "restore", "--journal", str(journal),
                               "--allow-context", self.context], capture_output=True, text=True, env=self.env(),
                              timeout=timeout)

    # --- the drill's phases, from the Rollout as the watch delivers it -----------------------------------------
    def reach(self, phase: str, drill: DrillProc, timeout: float = 300) -> dict:
        d, w = self.d, self.watch
        v1, v2, n = d.spec.image_v1, d.spec.image_v2, len(self.steps)
        conds = {
            "before": ("BEFORE's rollback in force (image v1, the controller at the end of the steps)",
                       lambda ro: app_image(ro) == v1 and steps_of(ro) == self.steps
                       and (ro.get("status") or {}).get("currentStepIndex") == n),
            "cut-steps": ("the steps cut", lambda ro: steps_of(ro) == self.cut),
            # the redeploy's last part: v2 stable again on the cut steps, the old v1 ReplicaSet scaling down
            "redeploy": ("the redeploy of v2 after the cut Healthy", lambda ro: steps_of(ro) == self.cut
                         and app_image(ro) == v2 and healthy_at(d.hash_v2)(ro)),
            "after": ("AFTER's rollback in force (steps cut, image v1)",
                      lambda ro: steps_of(ro) == self.cut and app_image(ro) == v1),
            "exit": ("the exit's abort", lambda ro: steps_of(ro) == self.cut and bool((ro.get("status") or {})
                                                                                    .get("abort"))),
        }
        what, pred = conds[phase]
        return w.wait(what, pred, timeout, drill=drill)

    # --- the end of every case --------------------------------------------------------------------------------
    def assert_restored(self, timeout: float = 180, replicas: int | None = None) -> None:
        """The target as before the drill; ``replicas``: as before but at the size another writer set (its
        change kept, every count of the status at it)."""
        self.release()
        want = copy.deepcopy(self.before)
        if replicas is not None:
            want["spec"]["replicas"] = replicas
            want["status"].update({k: replicas for k in ("replicas", "updatedReplicas", "readyReplicas",
                                                         "availableReplicas")})
        assert_restored(self.kube, self.ns, self.name, want, timeout)
        assert not lease_of(self.kube, self.ns, self.name), "the lease must be gone after a restore"

    def rows(self) -> list[dict]:
        return ledger_rows(self.reports)

    def assert_no_pass_from(self, step: str) -> None:
        """No `pass` row for the interrupted step or any later one."""
        later = LIVE_STEPS[LIVE_STEPS.index(step):]
        bad = passes(self.rows(), later)
        assert not bad, f"rows of the interrupted step passed: {bad}"

    def assert_nothing_left(self) -> None:
        left = []
        for p in self.drills:
            left += self.world.leftovers(p, own_namespace=self.ns)
        left = sorted(set(left or self.world.leftovers(None, own_namespace=self.ns)))
        assert left == [], f"left behind: {left}"
        broken = cluster_whole(self.cluster)
        assert broken == [], f"the cluster was left broken: {broken}"

    def close(self) -> None:
        for p in self.drills:
            p.stop()
        self.watch.stop()
        try:
            self.release()
        except Exception:
            pass


@pytest.fixture
def stage(kube, cluster, namespace, tmp_path, stage_rollout):
    """stage(**rollout fields) -> Stage: the stand-in stage Rollout prepared for one case."""
    made: list[Stage] = []

    def make(**over) -> Stage:
        s = Stage(kube, cluster, namespace, tmp_path, stage_rollout(**over))
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


# files whose faults hit the control plane itself (a restarted kube-apiserver, a paused etcd)
CONTROL_PLANE_FAULTS = ("test_fault_apiserver.py", "test_fault_control_plane.py")


@pytest.fixture(autouse=True)
def fresh_controller_after_control_plane_faults(request, cluster):
    """After a control-plane fault the worker's cluster serves the next tests: its rollouts-controller is started
    again so they begin with fresh informers (a watch of the controller's that outlived a paused etcd delivered
    a later test's Rollout update minutes late)."""
    yield
    if request.node.path.name in CONTROL_PLANE_FAULTS:
        from faultkit import kill_registered, restart_registered
        restart_registered(cluster, kill_registered(cluster, "rollouts-controller"))
