"""The lanes' own pytest set-up, shipped with them (an installed drills runs them from its package data with
``-p drills.pytest_plugin``): the ``lane`` fixture and marker the runbook tests are written with, the plugin's
``drills_lane`` fixture and marker under their older names."""
from __future__ import annotations

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "lane(key): alias of drills_lane")


@pytest.fixture(scope="module")
def lane(drills_lane):
    return drills_lane
