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
from pathlib import Path

import pytest

from . import config as settings
from .cluster import EmbeddedCluster
from .cluster.namespaces import drop_namespace, make_namespace, namespace_name
from .controller_binary import inspect_binary
from .lanes import LaneContext
from .lanes import get as lane_class
from .ledger import Ledger, new_run_id
from .names import plain_name
from .toolchain import resolve_controller_versions


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
    g.addoption("--keep-cluster", action="store_true", default=bool(os.environ.get("DRILLS_KEEP_CLUSTER")),
                help="leave the embedded cluster up after the session (default: a cluster the session started is "
                     "taken down)")
    g.addoption("--lane-a-variant", default=os.environ.get("DRILLS_LANE_A_VARIANT", "stage"),
                choices=["stage", "prod"], help="lane A fixture: the seed's stage shape or the prod-shaped one")


def pytest_configure(config):  # noqa: F811 (pytest names the argument)
    # a pytest-xdist worker gets an embedded cluster of its own (named apart; its children inherit the name)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        base = os.environ.get("DRILLS_CLUSTER") or settings.EMBEDDED_CLUSTER_NAME
        if not base.endswith(f"-{worker}"):
            os.environ["DRILLS_CLUSTER"] = f"{base}-{worker}"
    config.addinivalue_line("markers", "single_version: run on the first configured controller version only")
    config.addinivalue_line("markers", "lane(name): the drill lane a test belongs to")


# --- tests that waited for a build (a cold cache): said per test, and listed at the end of the session --------------
_WAITS_REPORTED = [0]        # how many of drills.toolchain.build.WAITS earlier test phases reported


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    from .toolchain import build
    outcome = yield
    new = build.WAITS[_WAITS_REPORTED[0]:]
    _WAITS_REPORTED[0] = len(build.WAITS)
    if new:
        report = outcome.get_result()
        for key, seconds in new:
            report.user_properties.append(("drills_build_wait", f"{key} {seconds:.0f}s ({call.when})"))
            report.sections.append(("drills toolchain", f"waited {seconds:.0f}s for the build of {key} "
                                                        f"({call.when})"))


def pytest_terminal_summary(terminalreporter):
    waits = [(r.nodeid, v) for reports in terminalreporter.stats.values() for r in reports
             if hasattr(r, "user_properties") for k, v in r.user_properties if k == "drills_build_wait"]
    if waits:
        terminalreporter.section("tests that waited for a toolchain build")
        for nodeid, what in waits:
            terminalreporter.write_line(f"{nodeid}: {what}")


def _versions(pconfig) -> list[str]:
    spec = pconfig.getoption("--controller") or ",".join(settings.TEST_CONTROLLERS)
    return resolve_controller_versions(spec)


_USER_BUILT = pytest.StashKey[object]()


def _user_built(pconfig):
    """The --controller-binary's inspection (once per session), or None for a release."""
    binary = pconfig.getoption("--controller-binary")
    if not binary:
        return None
    if _USER_BUILT not in pconfig.stash:
        crds, source = pconfig.getoption("--crds"), pconfig.getoption("--source")
        pconfig.stash[_USER_BUILT] = inspect_binary(Path(binary), Path(crds) if crds else None,
                                                    Path(source) if source else None)
    return pconfig.stash[_USER_BUILT]


def pytest_generate_tests(metafunc):
    if "controller_version" in metafunc.fixturenames:
        versions = _versions(metafunc.config)
        if metafunc.definition.get_closest_marker("single_version"):
            versions = versions[:1]
        info = _user_built(metafunc.config)
        # a user-built controller's tests are named by what it is, never by the release its cluster stands in for
        metafunc.parametrize("controller_version", versions, scope="session",
                             ids=[info.name] * len(versions) if info else None)


@pytest.fixture(scope="session")
def cluster(controller_version, request):
    info = _user_built(request.config)
    c = EmbeddedCluster()
    kwargs = info.cluster_kwargs() if info else {}
    c.hold("a pytest session")      # until the session ends: nobody replaces the cluster under its tests
    before = c.state().get("created_at") if c.status().get("ready") else None
    c.up(controller_version, **kwargs)
    was_up = before is not None and c.state().get("created_at") == before     # reused, not (re)started
    yield c
    # a cluster this session started does not outlive it (one that was already up is left as it was)
    c.release()
    if not was_up and not request.config.getoption("--keep-cluster"):
        c.down(quiet=True, if_unused=True)


@pytest.fixture(scope="session")
def kube(cluster):
    return cluster.api_client()


@pytest.fixture
def namespace(kube, request):
    name = namespace_name(request.node.name)
    make_namespace(kube, name)
    yield name
    drop_namespace(kube, name)


@pytest.fixture(scope="module")
def module_namespace(kube, request):
    name = namespace_name(Path(str(request.node.fspath)).stem.replace("test_", ""))
    make_namespace(kube, name)
    yield name
    drop_namespace(kube, name)


@pytest.fixture(scope="session")
def run_dir(request, tmp_path_factory) -> Path:
    opt = request.config.getoption("--drills-run-dir")
    d = Path(opt) if opt else tmp_path_factory.mktemp("run")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def ledger(run_dir, cluster, request):
    st = cluster.status()
    run_id = plain_name(request.config.getoption("--drills-run-id") or run_dir.name or new_run_id(), "run id")
    version = st.get("controller_reported_version") or st["controller_version"]
    if st.get("controller_binary"):
        version = cluster.state().get("controller_reported_version") or version
    info = _user_built(request.config) if st.get("controller_binary") else None
    return Ledger(run_dir, run_id, target="embedded", controller_version=version,
                  controller_sha256=st.get("controller_sha256") if st.get("controller_binary") else None,
                  controller_name=info.name if info else None)


@pytest.fixture(scope="session")
def evidence_dir(run_dir, ledger) -> Path:
    """Per controller: a release by its version, a user-built binary by its name (version plus commit)."""
    d = run_dir / plain_name(ledger.controller_name or ledger.controller_version, "controller version")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def lane(request, kube, cluster, module_namespace, evidence_dir, ledger, controller_version):
    """The runbook of the module's lane (``pytestmark = pytest.mark.lane("<key>")``), closed afterwards."""
    marker = request.node.get_closest_marker("lane")
    if marker is None:
        raise pytest.UsageError(f"{request.node.nodeid}: the lane fixture needs pytestmark = pytest.mark.lane(key)")
    cls = lane_class(marker.args[0])
    opts = request.config.getoption
    variant = opts("--lane-a-variant") if opts("--lane-a-variant") in cls.variants else cls.variants[0]
    source = opts("--source") or os.environ.get("DRILLS_SOURCE")
    ctx = LaneContext(api=kube, namespace=module_namespace, evidence_dir=evidence_dir, ledger=ledger,
                      version=controller_version, cluster=cluster, audit_log=cluster.status().get("audit_log"),
                      variant=variant,
                      options={"availability_control": opts("--availability-control") == "on",
                               "rollback_via": opts("--rollback-via"), "source": source, "crds": opts("--crds"),
                               "user_built": bool(opts("--controller-binary"))},
                      label=ledger.controller_name)
    runbook = cls(ctx)
    yield runbook
    runbook.close()
