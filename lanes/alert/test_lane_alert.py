"""Lane alert — the stuck-at-the-remaining-rung alert (drills.lanes.alert): the rules `drills alerts` writes for the
drill's Rollouts, checked and unit-tested by promtool, evaluated by the real Prometheus on the real controller's
metrics; the held rollback fires and resolves, the normal rollback and the Healthy Rollout never fire it, the
aborted one fires RolloutAborted until promote --full."""
import pytest

pytestmark = pytest.mark.lane("alert")


def test_rules_are_checked_unit_tested_and_read_metrics_the_cluster_has(lane):
    for row in lane.rules():
        lane.expect(row)


def test_a_rollback_that_completes_within_its_ramp_never_fires(lane):
    for row in lane.normal():
        lane.expect(row)


def test_a_rollback_held_at_the_remaining_rung_fires_and_resolves_after_promote_full(lane):
    for row in lane.held():
        lane.expect(row)


def test_an_aborted_rollout_fires_until_promote_full(lane):
    for row in lane.aborted():
        lane.expect(row)


def test_a_healthy_rollout_never_fires(lane):
    for row in lane.healthy():
        lane.expect(row)
