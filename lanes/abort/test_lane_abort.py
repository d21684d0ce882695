"""Lane abort — "the rollback aborts itself" (brief §6, §13; drills.lanes.abort), one fresh Rollout per outcome:
mesh emulator + real Prometheus on 127.0.0.1, the seed's error-rate AnalysisTemplate through Argo's prometheus
provider, load, v2 promoted then broken, a GitOps rollback to v1."""
import pytest

pytestmark = pytest.mark.lane("abort")


def test_whole_service_query_rollback_is_aborted_by_its_own_analysis(lane):
    for row in lane.whole_service_query():
        lane.expect(row)
    obs = lane.observations["whole-service-query"]
    assert obs.aborted and obs.final_canary_weight == 0, obs.summary()


def test_per_revision_query_rollback_completes(lane):
    for row in lane.per_revision_query():
        lane.expect(row)
    obs = lane.observations["per-revision-query"]
    assert obs.healthy_at_v1 and not obs.aborted, obs.summary()


def test_rollback_window_skips_analysis_and_rollback_completes(lane):
    for row in lane.rollback_window():
        lane.expect(row)
    obs = lane.observations["rollback-window"]
    analysed = str(lane.expected("rollback-window") or "").startswith("analysed")     # v1.7.1 runs it
    assert bool(obs.runs) == analysed and obs.healthy_at_v1, obs.summary()
