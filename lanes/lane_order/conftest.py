"""Fixtures of lane `order`: the source map of the version under test and the lane's drills."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from drills import branches


@pytest.fixture(scope="module")
def branch_map(request, controller_version):
    source = request.config.getoption("--source") or os.environ.get(branches.SOURCE_ENV)
    user_built = bool(request.config.getoption("--controller-binary"))
    return branches.branch_map_for(controller_version, user_built=user_built, source=source)


@pytest.fixture(scope="module")
def crds_dir(request, controller_version) -> Path:
    crds = request.config.getoption("--crds")
    if crds:
        return Path(crds)
    from drills.toolchain import Toolchain
    return Toolchain().ensure_crds(controller_version)
