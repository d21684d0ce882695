"""Lane B fixtures: the real helm and a chart registry on loopback."""
from __future__ import annotations

import pytest

from drills.helm import Helm, Registry


@pytest.fixture(scope="module")
def helm():
    with Helm() as h:
        yield h


@pytest.fixture(scope="module")
def registry():
    """distribution's registry on 127.0.0.1, empty at start, stopped (storage removed) at the end."""
    with Registry() as reg:
        yield reg
