"""The kwok Stages the embedded cluster runs.

kwok's own general stages (taken from its module by the toolchain) with two changes of the project's:
- no built-in delays or jitter: timing belongs to availability control, not to chance;
- pod-ready only fires for pods that carry the release annotation, so every pod starts un-Ready and
  becomes Ready when the releaser (availability control) annotates it.
"""
from __future__ import annotations

from pathlib import Path

from ..core import fastyaml

RELEASE_ANNOTATION = "drills.dev/release"

STAGE_FILES = ("node-initialize.yaml", "node-heartbeat-with-lease.yaml", "pod-create.yaml",
               "pod-init-container-running.yaml", "pod-init-container-completed.yaml", "pod-ready.yaml",
               "pod-complete.yaml", "pod-delete.yaml")


def load_stages(stage_dir: Path) -> list[dict]:
    out = []
    for name in STAGE_FILES:
        doc = fastyaml.safe_load((stage_dir / name).read_text())
        if doc["spec"]["resourceRef"]["kind"] == "Pod":
            delay = doc["spec"].get("delay")
            if delay:
                delay["durationMilliseconds"] = 0
                delay.pop("jitterDurationMilliseconds", None)
        if doc["metadata"]["name"] == "pod-ready":
            doc["spec"]["selector"]["matchExpressions"].append(
                {"key": f'.metadata.annotations["{RELEASE_ANNOTATION}"]', "operator": "Exists"})
        out.append(doc)
    return out
