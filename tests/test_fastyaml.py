"""drills.core.fastyaml reads every YAML file of the project's own data into the same objects as PyYAML's safe
loader, through libyaml when PyYAML has it."""
from __future__ import annotations

import yaml

from drills.core import config, fastyaml


def test_the_fast_loader_reads_the_project_data_as_the_safe_loader_does():
    root = config.project_root()
    files = sorted(p for d in ("fixtures", "examples") for p in (root / d).rglob("*.yaml")
                   if "templates" not in p.parts)          # chart templates are Go templates, not YAML yet
    assert len(files) > 20, files
    for p in files:
        text = p.read_text()
        assert list(fastyaml.safe_load_all(text)) == list(yaml.safe_load_all(text)), p
        one = text.split("\n---")[0]
        assert fastyaml.safe_load(one) == yaml.safe_load(one), p
