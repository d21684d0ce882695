"""The embedded default cluster: a real control plane on 127.0.0.1, no containers.

kwokctl (binary runtime, pointed at the toolchain's binaries) runs etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok.  After the CRDs exist, the project starts its own
processes: the real ``rollouts-controller`` at the version under test and the pod releaser of
availability control (later also the mesh emulator, Prometheus, a chart registry).  Each one is recorded
(pid, ports, log) in the cluster folder's state.json, and ``down`` stops them by pid.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from .. import config
from ..toolchain import Toolchain, components_for
from .stages import load_stages

SENTINEL_NS = "drills-system"
SENTINEL = "drills-sentinel"


class ClusterError(RuntimeError):
    """The cluster could not be brought up or reached (a runtime failure)."""


class ClusterInputError(ClusterError):
    """Bad input or a refused start: an occupied port, a missing binary, an unknown version (exit 2)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def listening_ports_of(pids: list[int]) -> list[int]:
    """TCP ports in LISTEN state owned by any of the pids (from /proc)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:
                ports.append(int(parts[1].rsplit(":", 1)[1], 16))
    return sorted(set(ports))


class EmbeddedCluster:
    """One embedded cluster (folder ``$DRILLS_CACHE/clusters/<name>``)."""

    def __init__(self, name: str | None = None, toolchain: Toolchain | None = None, log=None):
        self.name = name or os.environ.get("DRILLS_CLUSTER") or config.EMBEDDED_CLUSTER_NAME
        self.tc = toolchain or Toolchain()
        self.folder = config.clusters_dir() / self.name
        self.kubeconfig = self.folder / "kubeconfig"
        self.state_file = self.folder / "state.json"
        self.kwok_workdir = config.cache_dir() / "kwok-workdir"
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))

    # --- state --------------------------------------------------------------------------------
    def state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _save(self, st: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=2))
        os.replace(tmp, self.state_file)

    @property
    def controller_version(self) -> str | None:
        return self.state().get("controller_version")

    @property
    def api_server(self) -> str | None:
        return self.state().get("api_server")

    def register_process(self, name: str, pid: int, ports: list[int], log: Path | str) -> None:
        st = self.state()
        st.setdefault("processes", [])
        st["processes"] = [p for p in st["processes"] if p["name"] != name]
        st["processes"].append({"name": name, "pid": pid, "ports": list(ports), "log": str(log)})
        self._save(st)

    def unregister_process(self, name: str) -> None:
        st = self.state()
        st["processes"] = [p for p in st.get("processes", []) if p["name"] != name]
        self._save(st)

    def api_client(self):
        from kubernetes import config as kconfig
        return kconfig.new_client_from_config(config_file=str(self.kubeconfig))

    def _kwokctl(self, *args, check=True, timeout=120) -> subprocess.CompletedProcess:
        env = dict(os.environ, KWOK_WORKDIR=str(self.kwok_workdir))
        kwokctl = self.tc.bin("kwok", config.KWOK_VERSION, "kwokctl")
        r = subprocess.run([str(kwokctl), *args], env=env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise ClusterError(f"kwokctl {' '.join(args)} failed: {(r.stderr or r.stdout).strip()[-800:]}")
        return r

    def _kwok_pids(self) -> dict[str, int]:
        """The control-plane processes kwokctl started (its pids folder)."""
        out = {}
        pdir = self.kwok_workdir / "clusters" / self.name / "pids"
        if pdir.is_dir():
            for f in pdir.glob("*.pid"):
                try:
                    out[f.stem] = int(f.read_text().strip())
                except ValueError:
                    continue
        return out

    def all_pids(self) -> list[int]:
        return [p["pid"] for p in self.state().get("processes", [])] + list(self._kwok_pids().values())

    # --- status ---------------------------------------------------------------------------------
    def status(self) -> dict:
        st = self.state()
        if not st:
            return {"ready": False}
        procs = list(st.get("processes", []))
        for name, pid in sorted(self._kwok_pids().items()):
            procs.append({"name": name, "pid": pid, "managed_by": "kwokctl",
                          "log": str(self.kwok_workdir / "clusters" / self.name / "logs" / f"{name}.log")})
        for p in procs:
            p["alive"] = pid_alive(p["pid"])
            if p.get("managed_by"):
                p["ports"] = listening_ports_of([p["pid"]]) if p["alive"] else []
        api_ok = self._api_ready(timeout=2)
        ctrl = next((p for p in procs if p["name"] == "rollouts-controller"), None)
        ready = bool(api_ok and ctrl and ctrl["alive"] and st.get("ready"))
        return {
            "ready": ready, "cluster": self.name, "target": "embedded",
            "controller_version": st.get("controller_version"),
            "controller_reported_version": st.get("controller_reported_version"),
            "controller_sha256": st.get("controller_sha256"),
            "controller_binary": st.get("controller_binary"),
            # a user-built controller: the release used only as a fallback (expectations, CRDs); never its version
            "nearest_release": st.get("nearest_release"),
            "crd_source": st.get("crd_source"), "crd_warning": st.get("crd_warning"),
            "kubeconfig": str(self.kubeconfig), "api_server": st.get("api_server"),
            "api_server_ready": api_ok, "folder": str(self.folder), "processes": procs,
            "audit_log": st.get("audit_log"), "created_at": st.get("created_at"),
        }

    def _api_ready(self, timeout: float = 2) -> bool:
        if not self.kubeconfig.exists():
            return False
        try:
            api = self.api_client()
            resp = api.call_api("/readyz", "GET", auth_settings=["BearerToken"], _preload_content=False,
                                _request_timeout=timeout)
            status = getattr(resp, "status", None) or resp[1]
            return status == 200
        except Exception:
            return False

    # --- up ---------------------------------------------------------------------------------------
    def up(self, controller_version: str | None = None, build: bool = True, api_port: int | None = None,
           controller_binary: Path | None = None, crds_dir: Path | None = None,
           reported_version: str | None = None, crd_warning: str | None = None) -> dict:
        """A cluster at release ``controller_version``; with ``controller_binary`` (a user-built controller,
        drills.controller_binary) that argument is only the nearest release, and the cluster is labelled by the
        binary's reported version, its sha256 and its CRD folder ``crds_dir``."""
        version = controller_version or config.DEFAULT_CONTROLLER
        if controller_binary is not None and crds_dir is None:
            raise ClusterInputError("a user-built controller needs its CRD folder (drills.controller_binary)")
        label = (config.normalise_version(reported_version or "") or reported_version or "unknown"
                 ) if controller_binary is not None else version
        if api_port and port_in_use(api_port):
            raise ClusterInputError(f"port {api_port} on 127.0.0.1 is already in use")
        st = self.state()
        if st:
            same = ((st.get("nearest_release") or st.get("controller_version")) == version and
                    st.get("controller_version") == label and
                    st.get("controller_binary") == (str(controller_binary) if controller_binary else None) and
                    (crds_dir is None or st.get("crd_source") == str(crds_dir)))
            if same and self.status()["ready"]:
                self.log(f"cluster: {self.name} already up with controller {label}")
                return self.status()
            self.log(f"cluster: replacing {self.name} "
                     f"(controller {st.get('controller_version')} -> {label})")
            self.down()
        comps = components_for([] if controller_binary else [version])
        comps = [c for c in comps if c.name != "helm"]
        missing = [c for c in comps if not self.tc.is_built(c)]
        if missing:
            if not build:
                raise ClusterInputError(
                    "missing binary: " + ", ".join(c.key for c in missing) + " (run: drills toolchain build)")
            self.tc.ensure(missing)
        if controller_binary is None:
            controller_binary = self.tc.rollouts_dir(version) / "rollouts-controller"
            crds_dir = crds_dir or self.tc.rollouts_dir(version) / "crds"
        for path in (controller_binary,):
            if not Path(path).is_file() or not os.access(path, os.X_OK):
                raise ClusterInputError(f"missing binary: {path} is not an executable file")
        t0 = time.monotonic()
        if crd_warning:
            self.log(f"cluster: warning: {crd_warning}")
        try:
            self._create(version, api_port, Path(controller_binary), Path(crds_dir), reported_version,
                         label, crd_warning)
        except BaseException:
            self.log("cluster: start failed, cleaning up")
            self.down(quiet=True)
            raise
        st = self.state()
        what = (f"user-built controller {label} (reports {reported_version}, sha256 {st.get('controller_sha256')})"
                if st.get("controller_binary") else f"controller {label}")
        self.log(f"cluster: {self.name} up with {what}, CRDs from {crds_dir}, in {time.monotonic() - t0:.1f}s")
        return self.status()

    def _create(self, version, api_port, controller_binary: Path, crds_dir: Path, reported_version, label=None,
                crd_warning=None):
        from ..toolchain.build import sha256_file
        if self.folder.exists():
            shutil.rmtree(self.folder)
        (self.folder / "logs").mkdir(parents=True)
        self.kwok_workdir.mkdir(parents=True, exist_ok=True)
        k = config.KUBERNETES_VERSION
        audit_policy = self.folder / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            # VirtualServices with their response, so the recorder's completeness can be proved from the
            # apiserver's own record (every resourceVersion it handed out); everything else with metadata.
            "rules": [{"level": "RequestResponse", "verbs": ["create", "update", "patch"],
                       "resources": [{"group": "networking.istio.io", "resources": ["virtualservices"]}]},
                      {"level": "Metadata"}]}))
        opts = {
            "runtime": "binary", "bindAddress": "127.0.0.1",
            "kubeVersion": k, "etcdVersion": config.ETCD_VERSION.lstrip("v"),
            "kubeApiserverBinary": str(self.tc.kube_bin("kube-apiserver")),
            "kubeControllerManagerBinary": str(self.tc.kube_bin("kube-controller-manager")),
            "kubeSchedulerBinary": str(self.tc.kube_bin("kube-scheduler")),
            "kubectlBinary": str(self.tc.kube_bin("kubectl")),
            "kwokControllerBinary": str(self.tc.bin("kwok", config.KWOK_VERSION, "kwok")),
            "etcdBinary": str(self.tc.bin("etcd", config.ETCD_VERSION, "etcd")),
            "kubeAuditPolicy": str(audit_policy),
            "quietPull": True,
        }
        if api_port:
            opts["kubeApiserverPort"] = api_port
        conf = {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokctlConfiguration", "options": opts}
        stages = load_stages(self.tc.bin("kwok", config.KWOK_VERSION, "stages"))
        conf_path = self.folder / "kwokctl.yaml"
        conf_path.write_text(yaml.safe_dump_all([conf, *stages], sort_keys=False))
        user_built = controller_binary != self.tc.rollouts_dir(version) / "rollouts-controller"
        self._save({"name": self.name, "controller_version": label or version, "ready": False,
                    "controller_binary": None, "processes": [],
                    "nearest_release": version if user_built else None, "crd_source": str(crds_dir),
                    "crd_warning": crd_warning,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        self.log("cluster: starting control plane (kwokctl, binary runtime)")
        self._kwokctl("create", "cluster", "--name", self.name, "-c", str(conf_path),
                      "--kubeconfig", str(self.kubeconfig), timeout=180)
        server = yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        audit_log = self.kwok_workdir / "clusters" / self.name / "logs" / "audit.log"
        st = self.state()
        st.update({"api_server": server, "audit_log": str(audit_log),
                   "kwok_cluster_dir": str(self.kwok_workdir / "clusters" / self.name)})
        self._save(st)
        self._wait(lambda: self._api_ready(timeout=1), 60, "the kube-apiserver to answer /readyz")
        self._kwokctl("scale", "node", "--name", self.name, "--replicas", "2")
        api = self.api_client()
        self._install_crds(api, sorted(crds_dir.glob("*.yaml")) +
                           [self.tc.bin("istio-crds", config.ISTIO_API_VERSION, "crds.yaml")])
        self._ensure_system_namespace(api)
        self._start_releaser()
        self._start_controller(controller_binary)
        self._wait_sentinel(api)
        st = self.state()
        st["ready"] = True
        st["controller_binary"] = str(controller_binary) if user_built else None
        st["controller_sha256"] = sha256_file(controller_binary)
        st["controller_reported_version"] = reported_version
        self._save(st)

    @staticmethod
    def _wait(pred, timeout: float, what: str, interval: float = 0.05):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(interval)
        raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")

    def _install_crds(self, api, files: list[Path]):
        from kubernetes import client
        ext = client.ApiextensionsV1Api(api)
        names = []
        for f in files:
            for doc in yaml.safe_load_all(Path(f).read_text()):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                ext.create_custom_resource_definition(doc)
                names.append(doc["metadata"]["name"])

        def established():
            for n in names:
                crd = ext.read_custom_resource_definition(n)
                conds = {c.type: c.status for c in (crd.status.conditions or [])}
                if conds.get("Established") != "True":
                    return False
            return True
        self._wait(established, 30, "the CRDs to be Established", interval=0.1)

    def _ensure_system_namespace(self, api):
        from kubernetes import client
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": SENTINEL_NS}})

    def _spawn(self, name: str, args: list[str], ports: list[int], env: dict | None = None) -> int:
        log = self.folder / "logs" / f"{name}.log"
        with open(log, "ab") as lf:
            proc = subprocess.Popen(args, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env or os.environ.copy(), cwd=str(self.folder))
        self.register_process(name, proc.pid, ports, log)
        return proc.pid

    def _start_releaser(self):
        self._spawn("releaser", [sys.executable, "-m", "drills.cluster.availability",
                                 "--kubeconfig", str(self.kubeconfig)], [])

    def _start_controller(self, binary: Path):
        metrics, healthz = free_port(), free_port()
        pid = self._spawn("rollouts-controller", [
            str(binary), "--kubeconfig", str(self.kubeconfig), "--leader-elect=false",
            "--metricsport", str(metrics), "--healthzPort", str(healthz), "--loglevel", "info",
        ], [metrics, healthz])
        time.sleep(0.05)
        if not pid_alive(pid):
            log = (self.folder / "logs" / "rollouts-controller.log").read_text()[-600:]
            raise ClusterInputError(f"{binary} does not start as a rollouts controller: {log.strip()}")

    def _wait_sentinel(self, api, timeout: float = 60):
        from kubernetes import client
        co = client.CustomObjectsApi(api)
        body = {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": SENTINEL, "namespace": SENTINEL_NS},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": SENTINEL}},
                     "template": {"metadata": {"labels": {"app": SENTINEL}},
                                  "spec": {"containers": [{"name": "c", "image": "sentinel:1"}]}},
                     "strategy": {"canary": {"steps": [{"setWeight": 50}]}}},
        }
        co.create_namespaced_custom_object("argoproj.io", "v1alpha1", SENTINEL_NS, "rollouts", body)
        ctrl_pid = next(p["pid"] for p in self.state()["processes"] if p["name"] == "rollouts-controller")

        def reconciled():
            if not pid_alive(ctrl_pid):
                log = (self.folder / "logs" / "rollouts-controller.log").read_text()[-600:]
                raise ClusterInputError(f"the rollouts controller exited: {log.strip()}")
            obj = co.get_namespaced_custom_object("argoproj.io", "v1alpha1", SENTINEL_NS, "rollouts", SENTINEL)
            return bool((obj.get("status") or {}).get("observedGeneration"))
        self._wait(reconciled, timeout, "the rollouts controller to reconcile the sentinel Rollout", interval=0.05)

    # --- down -------------------------------------------------------------------------------------
    def down(self, quiet: bool = False) -> dict:
        st = self.state()
        procs = st.get("processes", [])
        for p in procs:
            self._terminate(p["pid"], expect=self._expected_cmd(p["name"]))
        r = None
        kwok_pids = self._kwok_pids()
        if self.tc.bin("kwok", config.KWOK_VERSION, "kwokctl").exists():
            r = self._kwokctl("delete", "cluster", "--name", self.name, "--kubeconfig", str(self.kubeconfig),
                              check=False)
        for name, pid in kwok_pids.items():      # kwokctl stops them; make sure of it
            self._terminate(pid, grace=2.0, expect=name.split("-")[0])
        if self.folder.exists():
            shutil.rmtree(self.folder, ignore_errors=True)
        if not quiet:
            self.log(f"cluster: {self.name} down" + (f" ({r.stderr.strip()[-200:]})" if r is not None and
                                                      r.returncode != 0 else ""))
        return {"stopped": [p["name"] for p in procs]}

    def _expected_cmd(self, name: str) -> str:
        return {"rollouts-controller": "--leader-elect=false", "releaser": "drills.cluster.availability"}.get(
            name, str(self.kubeconfig) if name.startswith("mesh") else name.split("-")[0])

    @staticmethod
    def _terminate(pid: int, grace: float = 5.0, expect: str | None = None):
        if not pid_alive(pid):
            return
        if expect:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                return
            if expect not in cmd:
                return      # the pid was reused by another program: not ours to stop
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.05)
        if pid_alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


__all__ = ["EmbeddedCluster", "ClusterError", "ClusterInputError", "free_port", "port_in_use", "pid_alive",
           "listening_ports_of"]
