"""Fixtures of the framework's own tests: small API servers on 127.0.0.1 that misbehave on purpose (silent,
refusing, failing), and kubeconfigs pointing at them, for the failures a real apiserver cannot be made to
produce on demand."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from scheduling import VersionGroupedFileScheduling

from drills.core import config as settings
from drills.kube.lazy_client import install as serve_the_client_lazily
from drills.drill.kit import DrillRollout
from drills.core.names import is_plain_name
from drills.core.procs import die_with_parent
from drills.drill.shapes import RolloutSpec
from drills.toolchain import Toolchain, components_for, resolve_controller_versions
from drills.core.wait import WaitTimeout, until

serve_the_client_lazily()        # before the test modules' own `from kubernetes import client`

# --- a cold cache: the session builds its whole toolchain in the background from its first second ------------------
# in the order the tests need it (etcd beside Kubernetes, kwok, the first controller, helm, then the second
# controller, Prometheus, the registry, kube-state-metrics), two components at a time (drills.toolchain.build_jobs);
# a test that needs a component before it is built waits for it (drills.toolchain's locks) and says so.  Prometheus, the
# longest build, starts as soon as a slot frees after the first controller: the lanes and tests that need it
# (alert, abort, escape) come last in a cold session.  Off with DRILLS_BACKGROUND_BUILD=0.
SESSION_EXTRAS = ("prometheus", "registry", "kube-state-metrics")     # the Makefile's TEST_EXTRAS (tests/test_packaging.py)
_BUILDER: list[subprocess.Popen] = []     # ended with the session (and with the process, whatever way it ends)


def pytest_configure(config):
    if hasattr(config, "workerinput") or os.environ.get("DRILLS_BACKGROUND_BUILD") == "0":
        return              # an xdist worker: the controller process builds for the session
    spec = config.getoption("--controller", None) or ",".join(settings.TEST_CONTROLLERS)
    try:
        versions = resolve_controller_versions(spec, check_served=False)
    except Exception:        # a bad --controller is the tests' own error to report
        return
    tc = Toolchain()
    todo = [c for c in components_for(versions, list(SESSION_EXTRAS)) if not tc.is_built(c)]
    if not todo:
        return
    (tc.root / "logs").mkdir(parents=True, exist_ok=True)
    log_path = tc.root / "logs" / f"session-build-{os.getpid()}.log"
    log = open(log_path, "ab")
    proc = subprocess.Popen([sys.executable, "-m", "drills", "toolchain", "build", "--controller", ",".join(versions),
                             "--extra", ",".join(SESSION_EXTRAS)], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
    log.close()
    _BUILDER.append(proc)
    print(f"drills: {len(todo)} toolchain component(s) to build ({', '.join(c.key for c in todo)}): building them in "
          f"the background (log {log_path}); tests that need one first wait for it", file=sys.stderr, flush=True)


def pytest_unconfigure(config):
    for proc in _BUILDER:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


class SilentServer:
    """Accepts TCP connections and never answers; counts them."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            self.conns.append(c)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def close(self):
        self._stop.set()
        for c in self.conns:
            c.close()
        self.sock.close()


class StatusServer:
    """An HTTP server answering every request with one Kubernetes Status (code), recording requests."""

    def __init__(self, code: int, reason: str = "Forbidden", require_auth: bool = False):
        self.requests: list[tuple[str, str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self):
                outer.requests.append((self.command, self.path, dict(self.headers)))
                status = code
                if require_auth and "Authorization" not in self.headers:
                    status = 401
                body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "message": f"{reason.lower()}: drills test server", "reason": reason,
                                   "code": status}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mutations(self) -> list:
        return [r for r in self.requests if r[0] in ("POST", "PATCH", "PUT", "DELETE")]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def write_kubeconfig(path: Path, server: str, context: str = "stage", user: dict | None = None,
                     cluster_extra: dict | None = None, with_user: bool = True) -> Path:
    cluster = {"server": server, **(cluster_extra or {})}
    if server.startswith("https") and "certificate-authority-data" not in cluster:
        cluster["insecure-skip-tls-verify"] = True
    ctx = {"cluster": "c"}
    if with_user:
        ctx["user"] = "u"
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": context,
           "clusters": [{"name": "c", "cluster": cluster}],
           "contexts": [{"name": context, "context": ctx}],
           "users": [{"name": "u", "user": user if user is not None else {"token": "t"}}]}
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def kubeconfig_to():
    """write_kubeconfig(path, server, ...): a kubeconfig file for one of these servers."""
    return write_kubeconfig


@pytest.fixture
def silent_server():
    s = SilentServer()
    yield s
    s.close()


@pytest.fixture
def status_server_factory():
    made = []

    def make(code: int, reason: str = "Forbidden", require_auth: bool = False) -> StatusServer:
        s = StatusServer(code, reason, require_auth)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


def run_drills(*args, env: dict | None = None, timeout: float = 180, cwd: str | None = None
               ) -> subprocess.CompletedProcess:
    """`python -m drills ARGS` with a private config/reports folder unless env says otherwise."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "drills", *map(str, args)], capture_output=True, text=True,
                          env=e, timeout=timeout, cwd=cwd)


@pytest.fixture
def drills_cmd(tmp_path):
    """Runs the drills command with DRILLS_CONFIG and DRILLS_REPORTS in the test's own folder."""
    cfg = tmp_path / "drills-config.yaml"

    def run(*args, env: dict | None = None, timeout: float = 180):
        e = {"DRILLS_CONFIG": str(cfg), "DRILLS_REPORTS": str(tmp_path / "reports")}
        e.update(env or {})
        return run_drills(*args, env=e, timeout=timeout)
    run.config = cfg
    return run


# --- a stage Rollout on the embedded cluster, ready to be drilled in live mode -----------------------------
def kube_context(cluster) -> str:
    return yaml.safe_load(Path(cluster.kubeconfig).read_text())["current-context"]


@pytest.fixture
def stage_rollout(kube, cluster, namespace, tmp_path, controller_version):
    """prepare(**spec) -> DrillRollout: a Rollout at v2, v1 scaled to 0, a valid rollback target inside the
    window (the stand-in for a stage service that live mode drills)."""
    def prepare(**over) -> DrillRollout:
        fields = {"steps": [{"setWeight": 5}, {"pause": {"duration": "2s"}}, {"setWeight": 100}], "replicas": 2,
                  "name": "svc", "scale_down_delay": 3, "image_v1": "registry.local/svc:v1",
                  "image_v2": "registry.local/svc:v2"}
        fields.update(over)
        d = DrillRollout(kube, namespace, RolloutSpec(**fields), tmp_path / "prepare",
                         controller_version=controller_version)
        d.deploy_v1()
        try:
            d.deploy_v2()
        except WaitTimeout as e:
            if not _generation_unobserved(e.last):
                raise
            # set-up only: the worker's controller never took the new spec (a stalled watch on a loaded machine);
            # what it logged for the namespace is said, it is started again, and the deploy is waited for once more
            print(f"set-up: the rollouts controller did not observe the new spec: {e}\n"
                  f"its log for {namespace}:\n{_controller_log_for(cluster, namespace)}")
            _restart_controller(cluster)
            d.deploy_v2()
        d.wait_scaled_to_zero(d.hash_v1)
        return d
    return prepare


def _generation_unobserved(ro) -> bool:
    if not ro:
        return False
    return str(ro.get("status", {}).get("observedGeneration")) != str(ro["metadata"].get("generation"))


def _controller_log_for(cluster, namespace: str, lines: int = 40) -> str:
    entry = next(p for p in cluster.state()["processes"] if p["name"] == "rollouts-controller")
    try:
        text = Path(entry["log"]).read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(unreadable: {e})"
    mine = [x for x in text if namespace in x]
    return "\n".join((mine or text)[-lines:])


def _restart_controller(cluster) -> None:
    """The worker's rollouts controller killed and started again with its own command line, environment and log;
    returns once the new one reconciles the cluster's sentinel Rollout."""
    from drills.core.procs import pid_alive
    entry = next(p for p in cluster.state()["processes"] if p["name"] == "rollouts-controller")
    pid = entry["pid"]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    env = dict(x.split(b"=", 1) for x in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in x)
    cwd = os.readlink(f"/proc/{pid}/cwd")
    os.kill(pid, signal.SIGKILL)
    until(f"the rollouts controller (pid {pid}) to exit after SIGKILL", lambda: not pid_alive(pid), timeout=60)
    with open(entry["log"], "ab") as lf:
        new = subprocess.Popen(argv, env=env, cwd=cwd, stdout=lf, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    cluster.register_process("rollouts-controller", new.pid, entry.get("ports") or [], entry["log"])
    cluster._wait_sentinel(cluster.api_client())


@pytest.fixture
def live_cmd(cluster, namespace, tmp_path):
    """live(*extra, rollout="svc", env=None) -> CompletedProcess of `drills run` in live mode against the
    embedded cluster used as an allowlisted stand-in stage; the run writes under tmp_path/reports."""
    ctx = kube_context(cluster)

    def args(rollout: str = "svc", *extra) -> list[str]:
        return ["run", "--kubeconfig", str(cluster.kubeconfig), "--context", ctx, "--namespace", namespace,
                "--rollout", rollout, "--allow-context", ctx, *extra]

    def run(*extra, rollout: str = "svc", env: dict | None = None, timeout: float = 600):
        e = {"DRILLS_REPORTS": str(tmp_path / "reports"), "DRILLS_CONFIG": str(tmp_path / "none.yaml")}
        e.update(env or {})
        return run_drills(*args(rollout, *extra), env=e, timeout=timeout)
    run.args = args
    run.context = ctx
    run.reports = tmp_path / "reports"
    return run


AUDIT_FLUSH_S = 1.0     # evidence window: the apiserver's audit log has written the requests of a finished command


@pytest.fixture
def audit_mutations(cluster):
    """mutations(namespace, since) -> the mutating requests of the Python client in the namespace since then."""
    from drills.core.wait import hold_for

    def mutations(namespace: str, since: float) -> list[dict]:
        hold_for(AUDIT_FLUSH_S, "the audit log catching up")
        return mutations_since(cluster.status()["audit_log"], namespace, since)
    return mutations


def mutations_since(audit_log: str | Path, namespace: str, since: float) -> list[dict]:
    """Mutating requests drills (or the test itself) sent into ``namespace`` since ``since`` (wall time), from the
    apiserver's own audit log; the controllers' and the pod releaser's writes are not counted."""
    from datetime import datetime
    out = []
    with open(audit_log) as f:
        for line in f:
            ev = json.loads(line)
            if ev.get("verb") not in ("create", "update", "patch", "delete", "deletecollection"):
                continue
            if (ev.get("objectRef") or {}).get("namespace") != namespace:
                continue
            if not (ev.get("userAgent") or "").startswith("drills/"):
                continue        # the controllers' and the releaser's own writes
            if (ev.get("objectRef") or {}).get("resource") == "namespaces":
                continue
            ts = datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if ts >= since:
                out.append(ev)
    return out


# --- the order the files are handed to the workers (make test: --dist loadfile --no-loadscope-reorder) --------------
FIRST_FILES = ("tests/test_lanes.py",)      # the drills themselves: the longest file, run beside all the others
# the files that need Prometheus (promtool), the component a cold session builds last: handed out last, so that no
# worker waits for that build while the other files could run
LAST_FILES = ("tests/test_alerts.py", "tests/test_mesh_cluster.py")
# the longest files of their group, longest first (seconds of tests on a warm eight-worker run), handed out first within
# it: a worker takes each beside the shorter ones instead of alone at the end, and the last files handed out are short
LONG_FILES = ("tests/test_branch_order.py",                 # 372
              "tests/test_probe.py",                        # 367 (and 131 on the second version)
              "tests/test_user_built.py",                   # 363
              "tests/faults/test_fault_control_plane.py",   # 311
              "tests/faults/test_fault_api.py",             # 289
              "tests/faults/test_fault_signals.py",         # 258
              "tests/test_install.py",                      # 256
              "tests/faults/test_fault_cancel.py",          # 245 (158 before its two-probe cases)
              "tests/faults/test_fault_sigkill.py",         # 233
              "tests/faults/test_fault_apiserver.py",       # 223
              "tests/test_live_safety.py",                  # 178
              "tests/test_safety.py",                       # 146
              "tests/test_containerfile.py",                # 137
              "tests/test_swap.py",                         # 133
              "tests/test_routers_cluster.py",              # 119
              "tests/faults/test_fault_disk.py",            # 108
              "tests/test_load.py",                         # 106
              "tests/test_scan_verify.py",                  # 105 (219 before its shapes ran side by side)
              "tests/test_scan_steps.py",                   # 101
              "tests/test_live_runbook.py",                 # 97
              "tests/test_snapshot.py",                     # 94
              "tests/faults/test_fault_mesh.py",            # 91
              "tests/faults/test_fault_load.py",            # 90
              "tests/test_output_paths.py",                 # 82
              "tests/test_runner.py")                       # 76
CLUSTER_FIXTURES = ("cluster", "drills_cluster")     # every fixture that needs the embedded cluster requests one
TOOLCHAIN_MARKS = ("Toolchain(", "EmbeddedCluster(", "components_for(", "ensure_binary(", '"probe"', '"up"')
# a file that renders charts (fleet scans, chart folders, render-diff) runs helm: its tests wait for helm's build
# in-process first (drills.toolchain's lock, said in the log), never inside a command's subprocess timeout
HELM_MARKS = ('"--fleet"', "Chart.yaml", '"render-diff"', "helm_binary(", "drills.charts.helm", "from drills.charts import helm")
_HELM_READY: list[bool] = []


def _file_text(item) -> str:
    try:
        return Path(str(item.fspath)).read_text(errors="replace")
    except OSError:
        return ""


def needs_helm(item) -> bool:
    return any(mark in _file_text(item) for mark in HELM_MARKS)


_CPU_GROUP: list = []


def _cpu_group() -> Path | None:
    """With DRILLS_TEST_CPU_GROUP set (a cgroup-v1 cpuacct folder the benchmark made): this worker's own group in it,
    joined on first use, so that each test's CPU (its commands, clusters and daemons included: they are forked from
    the worker and stay in its group) is the group's usage over the test; None without it or where it can't be made."""
    if not _CPU_GROUP:
        group = None
        parent = os.environ.get("DRILLS_TEST_CPU_GROUP")
        # (only where cpuacct is a hierarchy of its own: a group joined with the cpu controller would give each
        # worker an equal share of the cores, and change what is measured)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")      # a folder name: a plain name, or no group
        if (parent and os.environ.get("DRILLS_TEST_TIMELINE") and is_plain_name(worker)
                and not (Path(parent) / "cpu.shares").exists()):
            try:
                group = Path(parent) / worker
                group.mkdir(exist_ok=True)
                (group / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                group = None
        _CPU_GROUP.append(group)
    return _CPU_GROUP[0]


def _cpu_usage(group: Path | None) -> float | None:
    try:
        return int((group / "cpuacct.usage").read_text()) / 1e9 if group else None
    except (OSError, ValueError):
        return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With DRILLS_TEST_TIMELINE set (benchmarks/bench_make_test.py sets it): one JSON line per test, its worker and
    its wall start and end, so a benchmark can say what each worker did when."""
    group = _cpu_group()
    start, cpu = time.time(), _cpu_usage(group)
    yield
    path = os.environ.get("DRILLS_TEST_TIMELINE")
    if path:
        row = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
               "start": round(start, 3), "end": round(time.time(), 3)}
        after = _cpu_usage(group)
        if cpu is not None and after is not None:
            row["cpu"] = round(after - cpu, 2)
        line = json.dumps(row)
        with open(path, "a") as f:          # one short line per append: the workers' lines never interleave
            f.write(line + "\n")


def pytest_runtest_setup(item):
    if _HELM_READY or not needs_helm(item):
        return
    helm = next(c for c in components_for([]) if c.name == "helm")
    Toolchain().ensure([helm])              # built, or waited for while the session's build makes it
    _HELM_READY.append(True)


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist", None) != "loadfile":
        return None
    sched = VersionGroupedFileScheduling(config, log)
    try:
        versions = resolve_controller_versions(config.getoption("--controller", None) or
                                               ",".join(settings.TEST_CONTROLLERS), check_served=False)
    except Exception as e:   # a bad --controller is the tests' own error to report; the files are handed out whole
        print(f"drills: tests handed to the workers by file only ({e})", file=sys.stderr)
        return sched
    sched.first, sched.later = tuple(versions[:1]), tuple(versions[1:])
    return sched


@pytest.hookimpl(trylast=True)         # after pytest has grouped the items by their session-scoped parameters
def pytest_collection_modifyitems(session, config, items):
    """The longest file first, so that it runs beside the others instead of alone at the end; then the files that
    need no embedded cluster (on a cold machine they run while the toolchain builds); then the files that need
    one; then those that need the last component built; each group its longest files first (LONG_FILES), then in
    collection order."""
    def path(item) -> str:
        return item.nodeid.split("::", 1)[0]
    needs_cluster = {path(i) for i in items if set(CLUSTER_FIXTURES) & set(getattr(i, "fixturenames", ()))}
    texts: dict[str, str] = {}

    def builds(p: str, item) -> bool:
        """The file starts a cluster or a drill, asks the toolchain without the fixture, or renders charts (it waits
        for builds)."""
        if p not in texts:
            texts[p] = _file_text(item)
        return any(mark in texts[p] for mark in TOOLCHAIN_MARKS + HELM_MARKS)

    def rank(item) -> tuple[int, int]:     # a file's items keep together: --dist loadfile hands out whole files
        p = path(item)
        group = (0 if p in FIRST_FILES else 3 if p in LAST_FILES else
                 2 if p in needs_cluster or p.startswith("tests/faults/") or builds(p, item) else 1)
        return group, LONG_FILES.index(p) if p in LONG_FILES else len(LONG_FILES)
    items.sort(key=rank)
