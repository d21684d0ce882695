"""pytest integration, opt-in: ``pytest -p drills`` (or ``-p drills.pytest_plugin``, or ``pytest_plugins =
["drills.pytest_plugin"]`` in a conftest.py).  Nothing loads it by itself: an environment with drills installed
runs other projects' pytest sessions without its options, fixtures or start-up time.  Every option is
``--drills-...`` and every fixture ``drills_...``:

- ``drills_controller_version``: session-scoped, parametrized over ``--drills-controller`` (default: the versions
  the test run covers); a test marked ``drills_single_version`` runs on the first of them only.
- ``drills_cluster``: a ready embedded cluster at that version (reusing one already up at that version;
  another version replaces it: a fresh cluster, never a controller swapped under a running one; lane swap
  replaces the controller for its own steps and puts the one it found back when it closes).
- ``drills_kube``: an API client of that cluster (drills.kube.api.new_client).
- ``drills_namespace`` (per test) / ``drills_module_namespace`` (per module, for runbook lanes): a fresh namespace
  with the opt-in label, deleted afterwards together with its availability holds.
- ``drills_ledger``: rows for this run and controller version, in ``--drills-run-dir`` (default: a folder
  under pytest's tmp path, so the framework's own tests never write into reports/).
- ``drills_lane``: the runbook of the module's lane (``pytestmark = pytest.mark.drills_lane("<key>")``).

The project's own conftest.py keeps the older, unprefixed names (``--controller``, ``cluster``, ...) as aliases.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from .core import config as settings
from . import routers
from .cluster import EmbeddedCluster
from .cluster.namespaces import drop_namespace, make_namespace, namespace_name
from .drill.controller_binary import inspect_binary
from .lanes import LaneContext
from .lanes import get as lane_class
from .record.ledger import Ledger, new_run_id
from .core.names import plain_name
from .toolchain import resolve_controller_versions


def defaults() -> dict:
    """Each option's default (dest -> value): the environment's DRILLS_* settings."""
    env = os.environ.get
    return {"drills_controller": env("DRILLS_CONTROLLER"), "drills_run_dir": env("DRILLS_RUN_DIR"),
            "drills_run_id": env("DRILLS_RUN_ID"), "drills_leg": env("DRILLS_LEG"),
            "drills_controller_binary": env("DRILLS_CONTROLLER_BINARY"),
            "drills_crds": env("DRILLS_CRDS"), "drills_source": env("DRILLS_SOURCE"),
            "drills_availability_control": env("DRILLS_AVAILABILITY_CONTROL", "on"),
            "drills_rollback_via": env("DRILLS_ROLLBACK_VIA", "gitops"),
            "drills_keep_cluster": bool(env("DRILLS_KEEP_CLUSTER")),
            "drills_lane_a_variant": env("DRILLS_LANE_A_VARIANT", "stage"),
            "drills_router": env("DRILLS_ROUTER", routers.DEFAULT), "drills_swap_to": env("DRILLS_SWAP_TO")}


def pytest_addoption(parser):
    d = defaults()
    g = parser.getgroup("drills")
    g.addoption("--drills-controller", dest="drills_controller", default=d["drills_controller"],
                help="Argo Rollouts version(s) to run against, comma-separated or 'all' "
                     f"(default: {','.join(settings.TEST_CONTROLLERS)})")
    g.addoption("--drills-run-dir", dest="drills_run_dir", default=d["drills_run_dir"],
                help="run folder the ledger and evidence go to")
    g.addoption("--drills-run-id", dest="drills_run_id", default=d["drills_run_id"])
    g.addoption("--drills-leg", dest="drills_leg", default=d["drills_leg"],
                help="the leg of `drills run` this session is (controller/lane/variant): every row names it")
    g.addoption("--drills-controller-binary", dest="drills_controller_binary", default=d["drills_controller_binary"],
                help="a user-built rollouts-controller to run instead of a built release")
    g.addoption("--drills-crds", dest="drills_crds", default=d["drills_crds"],
                help="CRD folder for --drills-controller-binary")
    g.addoption("--drills-source", dest="drills_source", default=d["drills_source"],
                help="Argo Rollouts source (tree root, folder or rollout/trafficrouting.go) of "
                     "--drills-controller-binary, for the branch lines of lane order (without it: 'lines unknown')")
    g.addoption("--drills-availability-control", dest="drills_availability_control",
                default=d["drills_availability_control"], choices=["on", "off"],
                help="hold revived pods (on) or let every pod turn Ready at once (off)")
    g.addoption("--drills-rollback-via", dest="drills_rollback_via", default=d["drills_rollback_via"],
                choices=["gitops", "undo"], help="how drills roll back")
    g.addoption("--drills-keep-cluster", dest="drills_keep_cluster", action="store_true",
                default=d["drills_keep_cluster"],
                help="leave the embedded cluster up after the session (default: a cluster the session started is "
                     "taken down)")
    g.addoption("--drills-lane-a-variant", dest="drills_lane_a_variant", default=d["drills_lane_a_variant"],
                choices=["stage", "prod"], help="lane A fixture: the seed's stage shape or the prod-shaped one")
    g.addoption("--drills-router", dest="drills_router", default=d["drills_router"], choices=list(routers.NAMES),
                help=f"the traffic router the lanes' Rollouts are routed by (default {routers.DEFAULT}); a lane that "
                     f"does not run on it is skipped, saying so")
    g.addoption("--drills-swap-to", dest="drills_swap_to", default=d["drills_swap_to"],
                help="lane swap: the controller version the cluster's controller is replaced by (the pair is "
                     "--drills-controller -> this)")


def pytest_configure(config):  # noqa: F811 (pytest names the argument)
    # a pytest-xdist worker gets an embedded cluster of its own (named apart; its children inherit the name)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        base = os.environ.get("DRILLS_CLUSTER") or settings.EMBEDDED_CLUSTER_NAME
        if not base.endswith(f"-{worker}"):
            os.environ["DRILLS_CLUSTER"] = f"{base}-{worker}"
    config.addinivalue_line("markers", "drills_single_version: run on the first configured controller version only")
    config.addinivalue_line("markers", "drills_lane(key): the drill lane a test module belongs to")


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


def _marker(node, name: str):
    """A drills marker by its name, or by its older unprefixed name (``lane``, ``single_version``)."""
    return node.get_closest_marker(f"drills_{name}") or node.get_closest_marker(name)


def _versions(pconfig) -> list[str]:
    spec = pconfig.getoption("drills_controller") or ",".join(settings.TEST_CONTROLLERS)
    return resolve_controller_versions(spec)


_USER_BUILT = pytest.StashKey[object]()


def _user_built(pconfig):
    """The --drills-controller-binary's inspection (once per session), or None for a release."""
    binary = pconfig.getoption("drills_controller_binary")
    if not binary:
        return None
    if _USER_BUILT not in pconfig.stash:
        crds, source = pconfig.getoption("drills_crds"), pconfig.getoption("drills_source")
        pconfig.stash[_USER_BUILT] = inspect_binary(Path(binary), Path(crds) if crds else None,
                                                    Path(source) if source else None)
    return pconfig.stash[_USER_BUILT]


def pytest_generate_tests(metafunc):
    if "drills_controller_version" in metafunc.fixturenames:
        versions = _versions(metafunc.config)
        if _marker(metafunc.definition, "single_version"):
            versions = versions[:1]
        info = _user_built(metafunc.config)
        # a user-built controller's tests are named by what it is, never by the release its cluster stands in for
        metafunc.parametrize("drills_controller_version", versions, scope="session",
                             ids=[info.name] * len(versions) if info else None)


@pytest.fixture(scope="session")
def drills_controller_version(request):
    """The controller version this test runs on: one run per version of --drills-controller (pytest_generate_tests
    parametrizes it)."""
    return getattr(request, "param", None) or _versions(request.config)[0]


@pytest.fixture(scope="session")
def drills_cluster(drills_controller_version, request):
    info = _user_built(request.config)
    c = EmbeddedCluster()
    kwargs = info.cluster_kwargs() if info else {}
    c.hold("a pytest session")      # until the session ends: nobody replaces the cluster under its tests
    before = c.state().get("created_at") if c.status().get("ready") else None
    c.up(drills_controller_version, **kwargs)
    was_up = before is not None and c.state().get("created_at") == before     # reused, not (re)started
    yield c
    # a cluster this session started does not outlive it (one that was already up is left as it was)
    c.release()
    if not was_up and not request.config.getoption("drills_keep_cluster"):
        c.down(quiet=True, if_unused=True)


@pytest.fixture(scope="session")
def drills_kube(drills_cluster):
    return drills_cluster.api_client()


@pytest.fixture
def drills_namespace(drills_kube, request):
    name = namespace_name(request.node.name)
    make_namespace(drills_kube, name)
    yield name
    drop_namespace(drills_kube, name)


@pytest.fixture(scope="module")
def drills_module_namespace(drills_kube, request):
    name = namespace_name(Path(str(request.node.fspath)).stem.replace("test_", ""))
    make_namespace(drills_kube, name)
    yield name
    drop_namespace(drills_kube, name)


@pytest.fixture(scope="session")
def drills_run_dir(request, tmp_path_factory) -> Path:
    opt = request.config.getoption("drills_run_dir")
    d = Path(opt) if opt else tmp_path_factory.mktemp("run")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def drills_ledger(drills_run_dir, drills_cluster, request):
    st = drills_cluster.status()
    run_id = plain_name(request.config.getoption("drills_run_id") or drills_run_dir.name or new_run_id(), "run id")
    version = st.get("controller_reported_version") or st["controller_version"]
    if st.get("controller_binary"):
        version = drills_cluster.state().get("controller_reported_version") or version
    info = _user_built(request.config) if st.get("controller_binary") else None
    return Ledger(drills_run_dir, run_id, target="embedded", controller_version=version,
                  controller_sha256=st.get("controller_sha256") if st.get("controller_binary") else None,
                  controller_name=info.name if info else None, leg=request.config.getoption("drills_leg") or None,
                  router=request.config.getoption("drills_router") or routers.DEFAULT)


@pytest.fixture(scope="session")
def drills_evidence_dir(drills_run_dir, drills_ledger) -> Path:
    """Per controller: a release by its version, a user-built binary by its name (version plus commit); a router
    other than the default in a folder of its own below it (both routers' legs of one run never share files)."""
    d = drills_run_dir / plain_name(drills_ledger.controller_name or drills_ledger.controller_version,
                                    "controller version")
    if drills_ledger.router != routers.DEFAULT:
        d = d / drills_ledger.router
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def drills_lane(request, drills_kube, drills_cluster, drills_module_namespace, drills_evidence_dir, drills_ledger,
                drills_controller_version):
    """The runbook of the module's lane (``pytestmark = pytest.mark.drills_lane("<key>")``), closed afterwards."""
    marker = _marker(request.node, "lane")
    if marker is None:
        raise pytest.UsageError(f"{request.node.nodeid}: the drills_lane fixture needs "
                                f"pytestmark = pytest.mark.drills_lane(key)")
    cls = lane_class(marker.args[0])
    opts = request.config.getoption
    variant = opts("drills_lane_a_variant") if opts("drills_lane_a_variant") in cls.variants else cls.variants[0]
    router = opts("drills_router") or routers.DEFAULT
    if router not in cls.routers:
        pytest.skip(f"lane {cls.key} runs on {', '.join(cls.routers)}, not on {router}: it makes sense for those "
                    f"routers only (its Runbook's routers)")
    source = opts("drills_source") or os.environ.get("DRILLS_SOURCE")
    ctx = LaneContext(api=drills_kube, namespace=drills_module_namespace, evidence_dir=drills_evidence_dir,
                      ledger=drills_ledger, version=drills_controller_version, cluster=drills_cluster,
                      audit_log=drills_cluster.status().get("audit_log"), variant=variant,
                      options={"availability_control": opts("drills_availability_control") == "on",
                               "rollback_via": opts("drills_rollback_via"), "source": source,
                               "crds": opts("drills_crds"), "user_built": bool(opts("drills_controller_binary")),
                               "swap_to": opts("drills_swap_to")},
                      label=drills_ledger.controller_name, router=router)
    runbook = cls(ctx)
    yield runbook
    runbook.close()
