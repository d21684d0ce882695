"""Lane `order` — branch-order proof per controller version (issue 8), one test per runbook step.

In reconcileTrafficRouting the backward search ("not at desired replica counts": keep the previous
setWeight) must be evaluated before the mid-steps branch (GetCurrentSetWeight) and the end-of-steps branch
(MaxTrafficWeight); the prescription (delete the final setWeight) is only safe while it is.

(a) end-of-steps: steps [5, pause 10s, 50], roll back inside rollbackWindow -> 50 while the revived
    ReplicaSet is partial (100 would mean end-of-steps first).
(b) mid-steps: replicas 4, steps [25, pause 10s, 75, pause], new pods held -> 25 while the canary
    ReplicaSet is short at the 75 rung (75 would mean mid-steps first).
(c) hazard: the prescription [5, pause 10s] plus replicaProgressThreshold {type: Pods, value: 1}, roll back
    inside the window -> the weight while partial, asserted against the last rung (5); not applicable where
    the version's Rollout CRD lacks the field.
"""
from __future__ import annotations

import pytest

from order_drills import LaneOrder, expectations
from drills.ledger import NOT_APPLICABLE

pytestmark = pytest.mark.lane("order")


@pytest.fixture(scope="module")
def lane(kube, cluster, module_namespace, evidence_dir, ledger, controller_version, branch_map, crds_dir, request):
    note = "" if branch_map else "user-built controller without --source"
    lo = LaneOrder(kube, module_namespace, evidence_dir, ledger, controller_version, branch_map, crds_dir,
                   audit_log=cluster.status().get("audit_log"), source_note=note)
    yield lo
    lo.close()


def test_source_map_puts_backward_search_first(lane):
    if lane.bm is None:
        assert lane.source_note, "no source map and no reason for it"
        return
    assert lane.bm.order == ["backward-search", "mid-steps", "end-of-steps"], lane.bm


# (a) end-of-steps
def test_end_of_steps_probe_deploys_v1_then_v2_and_waits_for_scale_down(lane):
    lane.step("eos-deploy", lane.end_of_steps_deploy)


def test_rollback_in_window_gives_last_setweight_not_max_weight(lane):
    row = lane.step("eos-rollback", lane.end_of_steps_rollback, needs="eos-deploy")
    lane.assert_row(row)


# (b) mid-steps
def test_mid_steps_probe_deploys_v1(lane):
    lane.step("mid-deploy-v1", lane.mid_steps_deploy_v1)


def test_deploy_keeps_previous_rung_while_canary_short_at_higher_rung(lane):
    row = lane.step("mid-deploy-v2", lane.mid_steps_deploy_v2, needs="mid-deploy-v1")
    lane.assert_row(row)


# (c) hazard
def test_replica_progress_threshold_rollback_outcome_is_recorded(lane, controller_version):
    row = lane.step("hazard", lane.hazard)
    applicable, where = lane.hazard_applicable()
    if not applicable:
        assert row["verdict"] == NOT_APPLICABLE and row["reason"], row
        return
    exp = expectations(controller_version).get("hazard_replica_progress_threshold") or {}
    # the outcome must be conclusive and be what this version is known to do (a known hazard passes as an
    # observation; the report calls the version out because the peak is above the last rung)
    lane.assert_row(row)
    if exp.get("upstream_peak") is not None:
        assert row["observed"] == exp["upstream_peak"], (
            f"{controller_version}: with replicaProgressThreshold the peak weight while partial was "
            f"{row['observed']}, fixtures/branch_order/expectations.yaml says {exp['upstream_peak']}; "
            f"{row['details'].get('series_text')}")
