"""YAML read with PyYAML's safe loader, through libyaml when PyYAML was built with it (the same constructor and
resolver, so the same objects; a Rollout CRD of ~1 MB parses about ten times faster than with the pure-Python
scanner).  For the files these call sites read: CRDs, stages, kubeconfigs and data that drills or a module it built
wrote, and a --crds folder once drills.drill.controller_binary has read it under the input budget.  Input a user
names (a chart's Chart.yaml and templates, manifests, values) goes through the budgeted reader (size, depth,
aliases), drills.core.inputs."""
from __future__ import annotations

from typing import Any, Iterator

import yaml

SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    return yaml.load(text, Loader=SafeLoader)


def safe_load_all(text: str) -> Iterator[Any]:
    return yaml.load_all(text, Loader=SafeLoader)
