"""Lane A — live rollback drill (brief §14.2), one test per runbook step.

deploy v1 -> update to v2 and let it promote -> wait until v1 is scaled to 0
-> BEFORE: roll back to v1 inside rollbackWindow, observe the last setWeight (100) on a partial ReplicaSet
-> cut the steps to [5, pause 10s] -> deploy v2 again, promote, wait for scale-down
-> AFTER: roll back, observe 5 -> exit: abort while partial, then promote --full.
"""
from __future__ import annotations

import pytest

from drills import lane_a

pytestmark = pytest.mark.lane("a")


@pytest.fixture(scope="module")
def drill(kube, cluster, module_namespace, evidence_dir, ledger, request, controller_version):
    d = lane_a.LaneA.create(kube, module_namespace, evidence_dir, ledger, controller_version,
                            variant=request.config.getoption("--lane-a-variant"),
                            availability_control=request.config.getoption("--availability-control") == "on",
                            rollback_via=request.config.getoption("--rollback-via"),
                            audit_log=cluster.status().get("audit_log"), cluster=cluster)
    yield d
    d.close()


def test_deploy_v1_and_wait_healthy(drill):
    drill.step("deploy-v1", drill.deploy_v1)


def test_update_to_v2_and_let_it_promote(drill):
    drill.step("deploy-v2", drill.deploy_v2, needs="deploy-v1")


def test_wait_until_v1_replicaset_is_scaled_to_zero(drill):
    drill.step("v1-scaled-down", drill.wait_v1_scaled_down, needs="deploy-v2")


def test_before_rollback_weight_reaches_last_setweight(drill):
    row = drill.step("before", drill.before, needs="v1-scaled-down")
    drill.assert_row(row)


def test_cut_steps_to_drop_final_setweight(drill):
    row = drill.step("cut-steps", drill.cut_steps, needs="before-ran")
    drill.assert_row(row)


def test_deploy_v2_again_and_wait_for_scale_down(drill):
    drill.step("redeploy-v2", drill.redeploy_v2, needs="cut-steps")


def test_after_rollback_weight_stays_at_first_rung(drill):
    row = drill.step("after", drill.after, needs="redeploy-v2")
    drill.assert_row(row)


def test_exit_with_promote_full_keeps_weight_until_available(drill):
    rows = drill.step("exit", drill.exit_promote_full, needs="after-ran")
    for row in rows:
        drill.assert_row(row)


def test_users_felt_the_exposure_before_and_not_after(drill):
    """Load through the (emulated) mesh: failures in the BEFORE exposure window, (nearly) none AFTER."""
    rows = drill.step("load", drill.load_rows_checked, needs="exit")
    for row in rows:
        drill.assert_row(row)
