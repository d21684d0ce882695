"""The general rollback probe: any step list, one rollback inside rollbackWindow, on a fresh namespace.

Deploy v1, deploy v2 and let it promote, wait until the v1 ReplicaSet is scaled to 0, roll back while
availability control holds the revived pods, and observe the peak canary weight while the revived
ReplicaSet is partial.  Waits scale with the shape (replicas x hold); a wait that still runs out ends the probe
``inconclusive`` with the evidence kept and said, never with a traceback.  Lane A is two probes and an exit
on one DrillRollout.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from .kit import DrillRollout, Observation
from .shapes import RolloutSpec
from .steps import steps_text
from .wait import WaitTimeout


def run_probe(api, namespace: str, spec: RolloutSpec, evidence_dir: Path, controller_version: str, journal=None,
              log=None, audit_log: Path | None = None) -> tuple[Observation, DrillRollout]:
    drill = DrillRollout(api, namespace, spec, evidence_dir, journal=journal, log=log,
                         controller_version=controller_version, audit_log=audit_log)
    try:
        drill.log(f"probe: deploy v1 (steps [{steps_text(spec.steps)}], replicas {spec.replicas}, "
                  f"minPodsPerReplicaSet {spec.min_pods}, routing {spec.routing})")
        drill.deploy_v1()
        drill.log("probe: deploy v2 and let it promote")
        drill.deploy_v2()
        drill.log(f"probe: wait until the v1 ReplicaSet {drill.hash_v1} is scaled to 0")
        drill.wait_scaled_to_zero(drill.hash_v1)
        drill.log("probe: roll back to v1 inside rollbackWindow")
        rec = drill.start_rollback("probe")
        stopped = None
        try:
            drill.wait_settled()
        except WaitTimeout as e:
            stopped = f"the rollback did not settle: {e}"
            drill.log(f"probe: {stopped}; the evidence so far is kept")
        drill.release_holds()
        return rec.finish(stopped_early=stopped), drill
    finally:
        drill.cleanup()


def observation_dict(obs: Observation, controller_version: str, routing: str) -> dict:
    d = asdict(obs)
    d.update({"controller_version": controller_version, "routing": routing})
    return d
