"""pytest integration: options, the cluster and namespace fixtures, the ledger.

- ``controller_version``: session-scoped, parametrized over ``--controller`` (default: the versions the
  test run covers); a test marked ``single_version`` runs on the first of them only.
- ``cluster``: a ready embedded cluster at that version (reusing one already up at that version;
  another version replaces it: a fresh cluster, never a controller swapped under a running one).
- ``namespace`` (per test) / ``module_namespace`` (per module, for runbook lanes): a fresh namespace
  with the opt-in label, deleted afterwards together with its availability holds.
- ``ledger``: rows for this run and controller version, in ``--drills-run-dir`` (default: a folder
  under pytest's tmp path, so the framework's own tests never write into reports/).
"""
from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest

from . import config as settings


def pytest_addoption(parser):
    g = parser.getgroup("drills")
    g.addoption("--controller", default=os.environ.get("DRILLS_CONTROLLER"),
                help="Argo Rollouts version(s) to run against, comma-separated or 'all' "
                     f"(default: {','.join(settings.TEST_CONTROLLERS)})")
    g.addoption("--drills-run-dir", default=os.environ.get("DRILLS_RUN_DIR"),
                help="run folder the ledger and evidence go to")
    g.addoption("--drills-run-id", default=os.environ.get("DRILLS_RUN_ID"))
    g.addoption("--controller-binary", default=os.environ.get("DRILLS_CONTROLLER_BINARY"),
                help="a user-built rollouts-controller to run instead of a built release")
    g.addoption("--crds", default=os.environ.get("DRILLS_CRDS"), help="CRD folder for --controller-binary")
    g.addoption("--source", default=os.environ.get("DRILLS_SOURCE"),
                help="Argo Rollouts source (tree root, folder or rollout/trafficrouting.go) of --controller-binary, "
                     "for the branch lines of lane order (without it: 'lines unknown')")
    g.addoption("--availability-control", default=os.environ.get("DRILLS_AVAILABILITY_CONTROL", "on"),
                choices=["on", "off"], help="hold revived pods (on) or let every pod turn Ready at once (off)")
    g.addoption("--rollback-via", default=os.environ.get("DRILLS_ROLLBACK_VIA", "gitops"),
                choices=["gitops", "undo"], help="how drills roll back")
    g.addoption("--lane-a-variant", default=os.environ.get("DRILLS_LANE_A_VARIANT", "stage"),
                choices=["stage", "prod"], help="lane A fixture: the seed's stage shape or the prod-shaped one")


def pytest_configure(config):  # noqa: F811 (pytest names the argument)
    config.addinivalue_line("markers", "single_version: run on the first configured controller version only")
    config.addinivalue_line("markers", "lane(name): the drill lane a test belongs to")


def _versions(pconfig) -> list[str]:
    from .toolchain import resolve_controller_versions
    spec = pconfig.getoption("--controller") or ",".join(settings.TEST_CONTROLLERS)
    return resolve_controller_versions(spec)


def pytest_generate_tests(metafunc):
    if "controller_version" in metafunc.fixturenames:
        versions = _versions(metafunc.config)
        if metafunc.definition.get_closest_marker("single_version"):
            versions = versions[:1]
        metafunc.parametrize("controller_version", versions, scope="session")


@pytest.fixture(scope="session")
def cluster(controller_version, request):
    from .cluster import EmbeddedCluster
    binary = request.config.getoption("--controller-binary")
    crds = request.config.getoption("--crds")
    c = EmbeddedCluster()
    kwargs = {}
    if binary:
        from .controller_binary import inspect_binary
        source = request.config.getoption("--source")
        info = inspect_binary(Path(binary), Path(crds) if crds else None, Path(source) if source else None)
        kwargs = info.cluster_kwargs()
    c.up(controller_version, **kwargs)
    yield c


@pytest.fixture(scope="session")
def kube(cluster):
    return cluster.api_client()


def _ns_name(prefix: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")[:40].strip("-")
    return f"{base}-{uuid.uuid4().hex[:5]}"


def _make_namespace(kube, name: str):
    from kubernetes import client
    from .safety import NAMESPACE_LABEL_VALUE
    client.CoreV1Api(kube).create_namespace(
        {"metadata": {"name": name, "labels": {settings.NAMESPACE_OPT_IN_LABEL: NAMESPACE_LABEL_VALUE}}})


def _drop_namespace(kube, name: str):
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    from .cluster import Availability
    try:
        Availability(kube).clear(name)
    except ApiException:
        pass
    try:
        client.CoreV1Api(kube).delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.fixture
def namespace(kube, request):
    name = _ns_name(request.node.name)
    _make_namespace(kube, name)
    yield name
    _drop_namespace(kube, name)


@pytest.fixture(scope="module")
def module_namespace(kube, request):
    name = _ns_name(Path(str(request.node.fspath)).stem.replace("test_", ""))
    _make_namespace(kube, name)
    yield name
    _drop_namespace(kube, name)


@pytest.fixture(scope="session")
def run_dir(request, tmp_path_factory) -> Path:
    opt = request.config.getoption("--drills-run-dir")
    d = Path(opt) if opt else tmp_path_factory.mktemp("run")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def ledger(run_dir, cluster, request):
    from .ledger import Ledger, new_run_id
    st = cluster.status()
    run_id = request.config.getoption("--drills-run-id") or run_dir.name or new_run_id()
    version = st.get("controller_reported_version") or st["controller_version"]
    if st.get("controller_binary"):
        version = cluster.state().get("controller_reported_version") or version
    return Ledger(run_dir, run_id, target="embedded", controller_version=version,
                  controller_sha256=st.get("controller_sha256") if st.get("controller_binary") else None)


@pytest.fixture(scope="session")
def evidence_dir(run_dir, ledger) -> Path:
    """Per controller: a release by its version, a user-built binary by its reported version and sha256."""
    sha = ledger.controller_sha256
    d = run_dir / (ledger.controller_version + (f"-sha256-{sha[:12]}" if sha else ""))
    d.mkdir(parents=True, exist_ok=True)
    return d
