"""Lane B runbook: the base chart path, verified without live traffic, then the first real deploy (brief §9.4,
§14.3; drills.lanes.b).  Working copies of fixtures/fleet; the real helm; the real registry on 127.0.0.1."""
import pytest

pytestmark = pytest.mark.lane("b")


def test_step1_render_equivalence(lane):
    lane.expect(lane.render_equivalence())


def test_step2_merge_alone_changes_no_service(lane):
    lane.expect(lane.merge_alone())


def test_step3_propagation_to_one_inheritor(lane):
    lane.expect(lane.propagation())


def test_step4_first_real_deploy_of_the_bumped_inheritor(lane):
    for row in lane.first_deploy():
        lane.expect(row, also=("not_applicable",))
