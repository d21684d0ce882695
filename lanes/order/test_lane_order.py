"""Lane `order` — the branch order proven per controller version (drills.lanes.order), one test per step.

(a) end-of-steps: [5, pause 10s, 50], roll back inside rollbackWindow -> 50 while partial (100 = end-of-steps first)
(b) mid-steps: replicas 4, [25, pause 10s, 75, pause], new pods held -> 25 while short at 75 (75 = mid-steps first)
(c) hazard: [5, pause 10s] + replicaProgressThreshold {Pods, 1}: the weight while partial against the last rung.
(d) scale-out: [5, pause 10s], replicas 4 scaled to 8 by the cluster's HPA controller (an external metric raised)
    while the revived pods are held: the weight while partial against the last rung, and what the controller did.
"""
import pytest

from drills.drill.branches import BACKWARD, END, MID
from drills.record.ledger import NOT_APPLICABLE

pytestmark = pytest.mark.lane("order")


def test_source_map_puts_backward_search_first(lane):
    bm = lane.source_map()
    if bm is None:
        pytest.skip(f"branch lines unknown: {lane.source_note} (pass --source to read them)")
    assert bm.order == [BACKWARD, MID, END], bm


def test_end_of_steps_probe_deploys_v1_then_v2_and_waits_for_scale_down(lane):
    lane.end_of_steps_deploy()


def test_rollback_in_window_gives_last_setweight_not_max_weight(lane):
    lane.expect(lane.end_of_steps_rollback())


def test_mid_steps_probe_deploys_v1(lane):
    lane.mid_steps_deploy_v1()


def test_deploy_keeps_previous_rung_while_canary_short_at_higher_rung(lane):
    lane.expect(lane.mid_steps_deploy_v2())


def test_replica_progress_threshold_rollback_outcome_is_recorded(lane):
    row = lane.hazard()
    applicable, _ = lane.hazard_applicable()
    if not applicable:
        assert row["verdict"] == NOT_APPLICABLE and row["reason"], row
        return
    # conclusive, and what this version is known to do (a known hazard passes as an observation; the matrix
    # calls the version out because the peak is above the last rung)
    lane.expect(row)
    upstream = (lane.expected("hazard_replica_progress_threshold") or {}).get("upstream_peak")
    if upstream is not None:
        assert row["observed"] == upstream, (
            f"{lane.ctx.version}: with replicaProgressThreshold the peak weight while partial was {row['observed']}, "
            f"fixtures/lanes/order/expectations.yaml says {upstream}; {row['details'].get('series_text')}")


def test_scale_out_while_partial_keeps_the_last_rung_and_says_what_the_controller_did(lane):
    row = lane.expect(lane.scale_out())
    did = row["details"]["scale_out"]
    assert did["revived_resized"] and did["revived_spec_after"] == did["to"] == 8, did
    assert row["details"]["controller_did"].startswith("the controller resized the revived ReplicaSet"), row
    if lane.ctx.cluster is not None:         # the embedded cluster: the real HPA controller wrote the scale-out
        assert did["by"] == "hpa" and did["hpa_wrote_within_s"] is not None and did["hpa_last_scale_time"], did
        assert "HPA controller" in row["details"]["written_by"] and "by the HPA controller" in row["assertion"]
