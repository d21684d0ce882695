"""The project's own pytest set-up: the drills plugin (opt-in everywhere else: ``pytest -p drills``), and the
older, unprefixed names of its options, fixtures and markers, kept for this project's tests and lanes only."""
from __future__ import annotations

import pytest

from drills import pytest_plugin

pytest_plugins = ["drills.pytest_plugin"]

# the older option names -> the plugin's options (the same destination, the same default)
OPTION_ALIASES = {
    "--controller": "drills_controller",
    "--controller-binary": "drills_controller_binary",
    "--crds": "drills_crds",
    "--source": "drills_source",
    "--availability-control": "drills_availability_control",
    "--rollback-via": "drills_rollback_via",
    "--keep-cluster": "drills_keep_cluster",
    "--lane-a-variant": "drills_lane_a_variant",
}
_CHOICES = {"drills_availability_control": ["on", "off"], "drills_rollback_via": ["gitops", "undo"],
            "drills_lane_a_variant": ["stage", "prod"]}


def pytest_addoption(parser):
    defaults = pytest_plugin.defaults()
    g = parser.getgroup("drills")
    for name, dest in OPTION_ALIASES.items():
        kw = {"action": "store_true"} if isinstance(defaults[dest], bool) else {}
        if dest in _CHOICES:
            kw["choices"] = _CHOICES[dest]
        g.addoption(name, dest=dest, default=defaults[dest], help=f"alias of --{dest.replace('_', '-')}", **kw)


def pytest_configure(config):
    config.addinivalue_line("markers", "single_version: alias of drills_single_version")


# the older fixture names
@pytest.fixture(scope="session")
def controller_version(drills_controller_version):
    return drills_controller_version


@pytest.fixture(scope="session")
def cluster(drills_cluster):
    return drills_cluster


@pytest.fixture(scope="session")
def kube(drills_kube):
    return drills_kube


@pytest.fixture
def namespace(drills_namespace):
    return drills_namespace


@pytest.fixture(scope="module")
def module_namespace(drills_module_namespace):
    return drills_module_namespace


@pytest.fixture(scope="session")
def run_dir(drills_run_dir):
    return drills_run_dir


@pytest.fixture(scope="session")
def ledger(drills_ledger):
    return drills_ledger


@pytest.fixture(scope="session")
def evidence_dir(drills_evidence_dir):
    return drills_evidence_dir

# (the lanes' `lane` fixture and marker: lanes/conftest.py, which the package carries with the lanes)
