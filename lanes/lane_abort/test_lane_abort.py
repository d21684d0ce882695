"""Lane abort — "rollback aborts itself" (brief §6, §13; DESIGN.md §6 Load), one fresh Rollout per outcome.

Each outcome: mesh emulator + real Prometheus on 127.0.0.1, AnalysisTemplate with Argo's prometheus provider
(interval shortened, failureLimit 2 and `result[0] >= 0.001` as in the seed) -> deploy v1 -> Locust load ->
deploy v2 (healthy: its analysis passes) -> v2, now the stable, breaks (injected errors) -> GitOps rollback to v1.

- whole-service query, no rollbackWindow: the rollback's own AnalysisRun fails, the Rollout is aborted and
  traffic returns to the broken release;
- per-revision query (revision = podTemplateHashValue Latest): the same rollback completes;
- whole-service query with rollbackWindow (revisions 3): no analysis, the rollback completes.
"""
from __future__ import annotations

import pytest

from drills import self_abort

pytestmark = pytest.mark.lane("abort")


def _run(step, kube, cluster, namespace, evidence_dir, ledger, controller_version):
    drill = self_abort.SelfAbortDrill(kube, cluster, namespace, step, evidence_dir, ledger, controller_version)
    rows, obs = drill.run()
    assert rows, f"no ledger rows for {step}"
    for row in rows:
        self_abort.assert_row(row)
    return obs


def test_whole_service_query_rollback_is_aborted_by_its_own_analysis(kube, cluster, namespace, evidence_dir,
                                                                      ledger, controller_version):
    obs = _run("whole-service-query", kube, cluster, namespace, evidence_dir, ledger, controller_version)
    assert obs.aborted and obs.final_canary_weight == 0, obs.summary()


def test_per_revision_query_rollback_completes(kube, cluster, namespace, evidence_dir, ledger, controller_version):
    obs = _run("per-revision-query", kube, cluster, namespace, evidence_dir, ledger, controller_version)
    assert obs.healthy_at_v1 and not obs.aborted, obs.summary()


def test_rollback_window_skips_analysis_and_rollback_completes(kube, cluster, namespace, evidence_dir, ledger,
                                                               controller_version):
    obs = _run("rollback-window", kube, cluster, namespace, evidence_dir, ledger, controller_version)
    assert not obs.runs and obs.healthy_at_v1, obs.summary()
