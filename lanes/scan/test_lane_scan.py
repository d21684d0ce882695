"""Lane scan — the scan's predictions judged by the real controller (drills.lanes.scan): the fixture fleet as the
rules predict it on this version (Rollouts per fix wave), then the distinct shapes it holds probed on the embedded
cluster, predicted vs observed peak canary weight while the revived ReplicaSet is partial."""
import pytest

pytestmark = pytest.mark.lane("scan")


def test_fixture_fleet_rollouts_per_fix_wave(lane):
    rows = lane.summary()
    assert sum(r["observed"] for r in rows) == len(lane.records) > 0
    for row in rows:
        lane.expect(row)


def test_prediction_agrees_with_the_probe_on_every_shape_picked(lane):
    rows = lane.verify()
    assert rows and lane.uncovered == [], f"rules left without a probe: {lane.uncovered}"
    for row in rows:
        lane.expect(row)
