"""Lane swap's machinery: the pairs it plans, the controller swap itself, and a break injected into the swap that
the lane must catch (a new controller that ignores every Rollout; an abort lost while no controller runs)."""
from __future__ import annotations

import time

import pytest

from drills.cluster.swap import swap_controller
from drills.core import config
from drills.core.errors import BadInput
from drills.drill.shapes import RolloutSpec, install
from drills.kube.rollout import healthy
from drills.lanes.base import LaneContext
from drills.lanes.swap import LaneSwap
from drills.record.ledger import FAIL, PASS, Ledger
from drills.run import legs
from drills.run.runner import Run


def test_pairs_are_the_neighbouring_upgrades_then_the_fleets_jump():
    assert config.swap_pairs(["v1.10.2", "v1.8.2"]) == [("v1.8.2", "v1.10.2")]
    assert config.swap_pairs(config.SUPPORTED_CONTROLLERS) == [
        ("v1.7.1", "v1.7.2"), ("v1.7.2", "v1.8.2"), ("v1.8.2", "v1.8.5"), ("v1.8.5", "v1.9.3"), ("v1.9.3", "v1.10.2"),
        ("v1.8.2", "v1.10.2")]
    assert config.swap_pairs(["v1.8.2"]) == []


def test_a_swap_leg_carries_its_pair_in_its_id_and_runs_on_a_cluster_of_its_own():
    plan = legs.plan(["v1.8.2", "v1.10.2"], ["a", "swap"], named=True)
    ids = [x.id for x in plan]
    assert ids == ["v1.8.2/a/stage", "v1.10.2/a/stage", "v1.8.2->v1.10.2/swap/stage"], ids
    swap = plan[-1]
    assert swap.to_dict()["to"] == "v1.10.2" and "to" not in plan[0].to_dict()
    assert Run._key(swap) == "v1.8.2-to-v1.10.2" and Run._key(plan[0]) == "v1.8.2"


def test_close_puts_the_controller_back_even_when_a_drills_cleanup_fails_or_is_interrupted(monkeypatch):
    """A cleanup that raises (an error, or a signal) never skips the swap-back nor the namespaces' removal."""
    from types import SimpleNamespace
    from drills.core.signals import Interrupted
    from drills.lanes import swap as swap_lane
    calls: list = []

    class Cluster:
        def update_state(self, **kw):
            calls.append(("state", kw))

    class Drill:
        def __init__(self, error):
            self.error = error

        def cleanup(self):
            calls.append(("cleanup", type(self.error).__name__ if self.error else None))
            if self.error:
                raise self.error

    monkeypatch.setattr(swap_lane, "swap_controller", lambda cluster, version, log: calls.append(("swap", version)))
    monkeypatch.setattr(swap_lane, "drop_namespace", lambda api, ns: calls.append(("drop", ns)))
    for first, raised in ((RuntimeError("cleanup broke"), None), (Interrupted(2), Interrupted)):
        calls.clear()
        lane = object.__new__(LaneSwap)
        lane.ctx = SimpleNamespace(cluster=Cluster(), version="v1.8.2", log=lambda m: None, api=None)
        lane.to, lane.swapping = "v1.10.2", True
        lane.drills = {"healthy": Drill(first), "paused": Drill(None)}
        lane.namespaces = {"healthy": "ns-a", "paused": "ns-b"}
        if raised:
            with pytest.raises(raised):
                lane.close()
        else:
            lane.close()
        assert ("swap", "v1.8.2") in calls and ("drop", "ns-a") in calls and ("drop", "ns-b") in calls, calls
        assert ("state", {"swapped_from": None}) in calls, calls
        # an error: the next drill is still cleaned up; a signal: the rest of the cleanups is skipped, not the swap
        assert (("cleanup", None) in calls) == (raised is None), calls


def test_swap_named_with_one_version_is_bad_input_and_all_lanes_leave_it_out():
    with pytest.raises(BadInput, match="give two versions or more"):
        legs.plan(["v1.8.2"], ["swap"], named=True)
    assert all(x.lane != "swap" for x in legs.plan(["v1.8.2"], ["a", "swap"], named=False))


def _at(t: int, line: str) -> str:
    return time.strftime('time="%Y-%m-%dT%H:%M:%SZ" ', time.gmtime(t)) + line


def test_a_sync_that_logged_an_error_is_no_reconcile_and_names_match_whole():
    # the order the controller logs in: the completion (deferred), then the work queue's "syncHandler error"
    from drills.record.controller_log import SyncLog
    of, t = 'generation=3 namespace=sw-a resourceVersion=1 rollout=', 1_800_000_000
    lines = [_at(t, f'level=info msg="Started syncing rollout" {of}paused'),
             _at(t, f'level=info msg="Reconciliation completed" {of}paused time_ms=3.3'),
             _at(t, 'level=error msg="rollout syncHandler error: failed to scale: Operation cannot be fulfilled on '
                 f'replicasets.apps \\"p-1\\": the object has been modified" {of}paused'),
             _at(t, f'level=info msg="Started syncing rollout" {of}paused2'),
             _at(t, f'level=info msg="Reconciliation completed" {of}paused2 time_ms=3.3'),
             _at(t, f'level=info msg="Started syncing rollout" {of}paused3'),
             _at(t, f'level=info msg="Reconciliation completed" {of}paused3 time_ms=3.3'),
             _at(t, f'level=error msg="Recovered from panic: boom\\ngoroutine 1" {of}paused3'),
             _at(t, f'level=error msg="rollout syncHandler error: Recovered from Panic" {of}paused3')]
    log = SyncLog({("sw-a", "paused"): "paused", ("sw-a", "paused2"): "p2", ("sw-a", "paused3"): "p3"})
    # within SETTLE_S of the completion nothing counts yet (its error may still come)
    assert log.read("\n".join(lines) + "\n", 1.0, now=t + 1) == {}
    # later: `paused2` (a name that starts with `paused`) reconciled; the failed sync and the panic did not
    assert log.read("\n".join(lines) + "\n", 1.5, now=t + 3) == {"p2": 1.5}
    assert log.error_count == {"paused": 1, "p3": 2} and "the object has been modified" in log.errors["paused"][0]
    # its next sync completes without an error: reconciled at the next sync's start, whatever the clock
    more = [_at(t + 4, f'level=info msg="Started syncing rollout" {of}paused'),
            _at(t + 4, f'level=info msg="Reconciliation completed" {of}paused time_ms=3.3'),
            _at(t + 5, f'level=info msg="Started syncing rollout" {of}paused')]
    assert log.read("\n".join(lines + more) + "\n", 6.0, now=t + 5) == {"p2": 1.5, "paused": 6.0}
    # a line still being written (no newline yet) is left for the next read: `rollout=paused` of `paused3`
    log = SyncLog({("sw-a", "paused"): "paused"})
    assert log.read(_at(t, f'level=info msg="Started syncing rollout" {of}paused\n')
                    + _at(t, f'level=info msg="Reconciliation completed" {of}paused'), 1.0, now=t + 9) == {}


def test_the_readiness_guards_hold_is_a_sync_doing_its_work_not_an_error():
    # the Istio subset guard returns an error while it holds the weight (the ReplicaSet not fully available):
    # rollout/trafficrouting/istio/istio.go; an in-flight rollback logs it on every sync until its pods are up
    from drills import routers
    from drills.record.controller_log import SyncLog
    of, t = 'namespace=sw-r rollout=rollback', 1_800_000_000
    lines = [_at(t, f'level=info msg="Started syncing rollout" generation=5 {of}'),
             _at(t, 'level=error msg="roCtx.reconcile err delaying destination rule switch: ReplicaSet '
                 f'rollback-784f8856bc not fully available" generation=5 {of} resourceVersion=941'),
             _at(t, 'level=error msg="delaying destination rule switch: ReplicaSet rollback-784f8856bc not fully '
                 'available" error="<nil>"'),
             _at(t, f'level=info msg="Reconciliation completed" generation=5 {of} time_ms=2.1'),
             _at(t, 'level=error msg="rollout syncHandler error: delaying destination rule switch: ReplicaSet '
                 f'rollback-784f8856bc not fully available" {of}')]
    text = "\n".join(lines) + "\n"
    log = SyncLog({("sw-r", "rollback"): "rollback"}, routers.get("istio"))
    assert log.read(text, 2.0, now=t + 3) == {"rollback": 2.0}
    assert log.guard_delays == {"rollback": 2} and log.error_count == {}
    # a router without that guard: the same lines are errors
    log = SyncLog({("sw-r", "rollback"): "rollback"}, routers.get("nginx"))
    assert log.read(text, 2.0, now=t + 3) == {} and log.error_count == {"rollback": 2}
    # any other error of the sync still makes it none
    other = lines + [_at(t, f'level=error msg=boom {of}')]
    log = SyncLog({("sw-r", "rollback"): "rollback"}, routers.get("istio"))
    assert log.read("\n".join(other) + "\n", 2.0, now=t + 3) == {} and log.errors == {"rollback": ["boom"]}


def test_lanes_left_out_say_why():
    plan = legs.plan(["v1.8.2"], ["a", "swap"])
    assert legs.left_out(["a", "swap"], plan, None) == [
        "lane swap runs on a pair of releases: none in this run (give two versions or more)"]
    plan = legs.plan(["v1.8.2", "v1.10.2"], ["a", "swap"], router_names=["nginx"])
    assert legs.left_out(["a", "swap"], plan, "nginx") == [
        "lane(s) swap run on istio only: not in this run (--router nginx)"]


def test_the_expectation_file_has_every_pair_both_ways():
    keys = LaneSwap.expectation_keys()
    assert "v1.8.2->v1.10.2" in keys and "v1.10.2->v1.8.2" in keys and len(keys) == 2 * len(set(keys) & set(
        f"{a}->{b}" for a, b in config.swap_pairs(config.SUPPORTED_CONTROLLERS)))


def _other(request, version: str) -> str:
    versions = (request.config.getoption("--controller") or ",".join(config.TEST_CONTROLLERS)).split(",")
    return next((v for v in versions if v != version), next(v for v in config.FLEET_UPGRADE if v != version))


def _lane(kube, cluster, namespace, tmp_path, version, to, **options) -> LaneSwap:
    ledger = Ledger(tmp_path / "run", "swap-break", target="embedded", controller_version=version)
    ctx = LaneContext(api=kube, namespace=namespace, evidence_dir=tmp_path / "run" / version, ledger=ledger,
                      version=version, cluster=cluster, audit_log=cluster.status().get("audit_log"),
                      options={"swap_to": to, **options})
    return LaneSwap(ctx)


def _verdicts(rows, assertion: str) -> list[str]:
    return [r["verdict"] for r in rows if r["assertion"] == assertion]


@pytest.mark.single_version
def test_a_new_controller_with_another_instance_id_fails_the_lane_and_the_old_one_comes_back(
        kube, cluster, namespace, tmp_path, controller_version, request):
    to = _other(request, controller_version)
    lane = _lane(kube, cluster, namespace, tmp_path, controller_version, to, swap_states=["healthy"],
                 swap_controller_args=["--instance-id", "elsewhere"])
    try:
        lane.given_states()
        lane.swap()
        rows = lane.verdicts()
    finally:
        lane.close()
    # the new controller ignores every Rollout without its instance label: none is reconciled
    assert _verdicts(rows, "reconciled") == [FAIL], rows
    assert _verdicts(rows, "no-new-replicaset") == [PASS]
    # the lane put the controller it found back (its own flags): it reconciles a new Rollout
    assert cluster.state()["controller_version"] == controller_version
    ro = install(kube, namespace, RolloutSpec(steps=[], replicas=1, name="after-swap", rollback_window=None))
    ro.wait("after-swap", healthy(), 120)


@pytest.mark.single_version
def test_an_abort_lost_while_no_controller_runs_fails_the_lane(kube, cluster, namespace, tmp_path, controller_version,
                                                               request):
    to = _other(request, controller_version)

    def drop_abort(api):
        from kubernetes import client
        client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            config.ARGO_GROUP, config.ARGO_VERSION, lane.drills["aborted"].ns, "rollouts", "aborted",
            {"status": {"abort": False}})
    lane = _lane(kube, cluster, namespace, tmp_path, controller_version, to, swap_states=["aborted"],
                 swap_between=drop_abort)
    try:
        assert lane.given_states()["aborted"].abort
        lane.swap()
        rows = lane.verdicts()
    finally:
        lane.close()
    assert _verdicts(rows, "abort-kept") == [FAIL], rows
    assert "lost across the swap" in next(r["reason"] for r in rows if r["assertion"] == "abort-kept")


@pytest.mark.single_version
def test_a_swap_refuses_a_cluster_that_is_not_up(tmp_path):
    from drills.cluster import EmbeddedCluster
    from drills.cluster.errors import ClusterInputError
    with pytest.raises(ClusterInputError, match="not up"):
        swap_controller(EmbeddedCluster("swap-nothing-here"), "v1.10.2")
