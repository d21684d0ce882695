"""`drills scan`: the rollback exposure of every Rollout, predicted from its manifest and controller version.

Modules: model (what a Rollout is to the scan; not drills.drill.shapes.RolloutSpec, which is what a drill deploys),
yamlstream / readers / fleet / live (inputs: manifests, the fleet layout rendered with helm, live clusters),
autoscalers (HPAs and KEDA ScaledObjects on a Rollout: the join, the predictions at their minimum and
maximum, what closes the remaining rung at the maximum), sources (what a controller version does, read from its own source), predict (the rules), advice (lint, safe pod
count, fix wave), records / ci (one record per Rollout, the summary, table, JSON, SARIF, JUnit), verify (a shape
probed on the real controller; lane ``scan`` in drills.lanes.scan records it).  What `drills scan` does with its
arguments is drills.commands.scan (drills.cli owns them).
"""
from .model import ScannedRollout, ScanInputError  # noqa: F401
