"""Lane A — live rollback drill (brief §14.2), one test per runbook step (drills.lanes.a).

deploy v1 -> update to v2 and let it promote -> wait until v1 is scaled to 0
-> BEFORE: roll back to v1 inside rollbackWindow, observe the last setWeight (100) on a partial ReplicaSet
-> cut the steps to [5, pause 10s] -> deploy v2 again, promote, wait for scale-down
-> AFTER: roll back, observe 5 -> exit: abort while partial, then promote --full -> what users felt.
"""
import pytest

pytestmark = pytest.mark.lane("a")


def test_deploy_v1_and_wait_healthy(lane):
    lane.deploy_v1()


def test_update_to_v2_and_let_it_promote(lane):
    lane.deploy_v2()


def test_wait_until_v1_replicaset_is_scaled_to_zero(lane):
    lane.wait_v1_scaled_down()


def test_before_rollback_weight_reaches_last_setweight(lane):
    lane.expect(lane.before())


def test_cut_steps_to_drop_final_setweight(lane):
    lane.expect(lane.cut_steps())


def test_deploy_v2_again_and_wait_for_scale_down(lane):
    lane.redeploy_v2()


def test_after_rollback_weight_stays_at_first_rung(lane):
    lane.expect(lane.after())


def test_exit_with_promote_full_keeps_weight_until_available(lane):
    for row in lane.exit():
        lane.expect(row)


def test_users_felt_the_exposure_before_and_not_after(lane):
    """Load through the (emulated) mesh: failures in the BEFORE exposure window, (nearly) none AFTER."""
    for row in lane.load_felt():
        lane.expect(row)
