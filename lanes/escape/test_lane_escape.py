"""Lane escape — the four escapes from an aborted Rollout (brief §13; drills.lanes.escape), one Rollout each:
the incident's aborted state (a rollback aborted by its own analysis), then retry, promote, promote --full or
undo, and what the controller did."""
import pytest

pytestmark = pytest.mark.lane("escape")


def test_retry_rewalks_the_steps_and_the_analysis_aborts_again(lane):
    for row in lane.retry():
        lane.expect(row)


def test_plain_promote_leaves_the_abort_in_place(lane):
    for row in lane.promote():
        lane.expect(row)


def test_promote_full_clears_the_abort_and_freezes_the_weight_until_available(lane):
    for row in lane.promote_full():
        lane.expect(row)


def test_undo_clears_the_abort_through_the_template_change(lane):
    for row in lane.undo():
        lane.expect(row)
