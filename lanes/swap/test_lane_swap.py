"""Lane swap — the controller upgrade under live Rollouts (drills.lanes.swap): the states a fleet has, made by the
``from`` controller; the chart upgrade to ``to``; what the new controller did with each; then its next rollback."""
import pytest

pytestmark = pytest.mark.lane("swap")


def _expect(lane, rows):
    """A regression the expectation file names for the pair (its upstream reference in the reason) is the lane
    working; any other row must pass."""
    for row in rows:
        known = lane.known(row["step"], row["assertion"])
        lane.expect(row, also=("fail",) if known else ())


def test_given_every_state_under_the_old_controller(lane):
    before = lane.given_states()
    templates = {k for k in before if k.startswith("template-")}
    assert set(before) - templates == {"healthy", "paused", "timed-pause", "aborted", "rollback"} and templates
    assert all(before[k].phase == "Healthy" for k in templates), {k: before[k].phase for k in templates}
    assert before["healthy"].phase == "Healthy" and before["paused"].pauses == ["CanaryPauseStep"]
    assert before["timed-pause"].step == 1 and before["aborted"].abort
    rb = before["rollback"]
    assert 0 < (rb.replicasets.get(lane.drills["rollback"].hash_v1) or {}).get("available", 0) < 2, rb.replicasets


def test_when_the_chart_upgrade_swaps_the_controller(lane):
    info = lane.swap()
    assert info["from"] == lane.ctx.version and info["to"] == lane.to
    assert lane.ctx.cluster.state()["controller_version"] == lane.to


def test_then_nothing_the_old_controller_left_moves_the_wrong_way(lane):
    _expect(lane, lane.verdicts())


def test_then_the_next_rollback_under_the_new_controller(lane):
    _expect(lane, lane.next_rollback())


def test_then_the_new_controller_finishes_what_the_old_one_started(lane):
    _expect(lane, lane.finish_what_from_started())
