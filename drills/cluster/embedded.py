"""The embedded default cluster: a real control plane on 127.0.0.1, no containers.

kwokctl (binary runtime, pointed at the toolchain's binaries) runs etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok.  After the CRDs exist, the project starts its own
processes: the real ``rollouts-controller`` at the version under test and the pod releaser of
availability control (later also the mesh emulator, Prometheus, a chart registry).  Each one is recorded
(pid, ports, log) in the cluster folder's state.json, and ``down`` stops them by pid.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import yaml

from .. import config
from ..procs import free_port, listening_ports_of, pid_alive, port_in_use, terminate
from ..toolchain import Toolchain, check_built, components_for
from ..wait import WaitTimeout, until
from .snapshot import SnapshotStore, snapshot_inputs, snapshot_key, stamped_sha256
from .startup import (SENTINEL_NS, PhaseClock, create_sentinel, crds_served, install_crds, kwokctl_configuration,
                      nodes_ready, polling_client, reserve_ports, revive_exited, sentinel_reconciled)

NODES = 2
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")


class ClusterError(RuntimeError):
    """The cluster could not be brought up or reached (a runtime failure)."""


class ControlPlaneExited(ClusterError):
    """A control-plane process exited while the cluster started (seen on a loaded machine: the
    kube-controller-manager gives up when the kube-apiserver's /healthz is slow); one more start is tried."""


class ClusterInputError(ClusterError):
    """Bad input or a refused start: an occupied port, a missing binary, an unknown version (exit 2)."""


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
            data = json.loads(self.state_file.read_text())
        except (FileNotFoundError, ValueError, UnicodeDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def state_error(self) -> str | None:
        """Why the state file cannot be read (None when it is fine or absent)."""
        try:
            data = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError) as e:
            return f"{self.state_file} is not valid JSON ({e})"
        return None if isinstance(data, dict) else f"{self.state_file} does not hold a JSON object"

    def own_processes(self) -> list[int]:
        """Processes started for this cluster, found by their command line (every one names the cluster's
        kubeconfig or folder): the way to stop them when the state file cannot be read."""
        marks = (str(self.kubeconfig).encode(), str(self.folder).encode() + b"/")
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if any(m in cmd for m in marks):
                out.append(int(d.name))
        return out

    @contextmanager
    def _state_lock(self):
        """One read-modify-write of state.json at a time: the legs of a run (separate processes, and threads of
        one) register their processes on one cluster at once.  The lock file sits beside the cluster folder,
        which `down` removes."""
        path = self.folder.parent / f".{self.name}.state.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _save(self, st: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(f"state.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(st, indent=2))
        os.replace(tmp, self.state_file)

    @property
    def controller_version(self) -> str | None:
        return self.state().get("controller_version")

    @property
    def api_server(self) -> str | None:
        return self.state().get("api_server")

    def register_process(self, name: str, pid: int, ports: list[int], log: Path | str) -> None:
        with self._state_lock():
            st = self.state()
            st.setdefault("processes", [])
            st["processes"] = [p for p in st["processes"] if p["name"] != name]
            st["processes"].append({"name": name, "pid": pid, "ports": list(ports), "log": str(log)})
            self._save(st)

    def unregister_process(self, name: str) -> None:
        with self._state_lock():
            st = self.state()
            st["processes"] = [p for p in st.get("processes", []) if p["name"] != name]
            self._save(st)

    def api_client(self):
        from ..kube import new_client
        return new_client(self.kubeconfig)

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
            err = self.state_error()
            return {"ready": False, "cluster": self.name, "error": err} if err else {"ready": False}
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
        if controller_binary == self.tc.rollouts_dir(version) / "rollouts-controller":
            check_built(controller_binary)      # the release as built, never a truncated or overwritten copy
        t0 = time.monotonic()
        if crd_warning:
            self.log(f"cluster: warning: {crd_warning}")
        for attempt in (1, 2):
            try:
                self._create(version, api_port, Path(controller_binary), Path(crds_dir), reported_version,
                             label, crd_warning)
                break
            except ControlPlaneExited as e:
                self.down(quiet=True)
                if attempt == 2:
                    raise
                self.log(f"cluster: {e}; cleaned up, starting once more")
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
        clock = PhaseClock()
        if self.folder.exists():
            shutil.rmtree(self.folder)
        (self.folder / "logs").mkdir(parents=True)
        self.kwok_workdir.mkdir(parents=True, exist_ok=True)
        user_built = controller_binary != self.tc.rollouts_dir(version) / "rollouts-controller"
        self._save({"name": self.name, "controller_version": label or version, "ready": False,
                    "controller_binary": None, "processes": [],
                    "nearest_release": version if user_built else None, "crd_source": str(crds_dir),
                    "crd_warning": crd_warning,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        ports = reserve_ports(config.clusters_dir(), self.name, 6, lambda picked: self._update(
            control_plane_ports=picked[:5] + [api_port or picked[5]]))
        kc = kwokctl_configuration(self.tc, self.folder, ports[:5], api_port or ports[5])
        conf_path = self.folder / "kwokctl.yaml"
        conf_path.write_text(yaml.safe_dump_all(kc.documents, sort_keys=False))
        crd_files = sorted(crds_dir.glob("*.yaml")) + [self.tc.bin("istio-crds", config.ISTIO_API_VERSION, "crds.yaml")]
        inputs = snapshot_inputs(self.tc, crd_files, kc.stages, kc.audit_policy, kc.options, SENTINEL_NS, NODES)
        kdir = self.kwok_workdir / "clusters" / self.name
        create = ("create", "cluster", "--name", self.name, "-c", str(conf_path), "--kubeconfig", str(self.kubeconfig))
        if kdir.exists():     # a leftover of a cluster of this name that was not taken down
            self._kwokctl("delete", "cluster", "--name", self.name, check=False)
            shutil.rmtree(kdir, ignore_errors=True)
        self._update(audit_log=str(kdir / "logs" / "audit.log"), kwok_cluster_dir=str(kdir))
        background = None
        with clock.phase("snapshot lookup"):
            lease = SnapshotStore().acquire(snapshot_key(inputs))
        try:
            if lease.ready:
                with clock.phase("restore etcd data"):
                    meta = lease.restore(kdir / "etcd")
                lease.release()
                self._update(snapshot={"key": lease.key, "start": "warm"})
                self.log(f"cluster: starting control plane from snapshot {lease.key} (kwokctl, binary runtime)")
                background = self._kwokctl_background(*create)
                self._start_releaser()      # its own start-up (a Python import) overlaps the apiserver's
                with clock.phase("kwokctl: control plane forked"):
                    self._wait(lambda: self._kwokctl_failed(background) or set(CONTROL_PLANE) <= set(self._kwok_pids()),
                               60, "kwokctl to start the control plane")
                # all that is left of `kwokctl create` is its wait for /version: a kubectl run every 200 ms that
                # takes CPU from the starting apiserver; the CRDs being served is the wait that counts here
                background.terminate()
                with clock.phase("CRDs Established and served"):
                    poll = self._wait(lambda: polling_client(self.kubeconfig), 10, "the kubeconfig")
                    self._wait(crds_served(poll, meta["crds"]), 60, "the apiserver to serve the CRDs")
            else:
                self._update(snapshot={"key": lease.key, "start": "cold"})
                self.log(f"cluster: no snapshot for these inputs: building {lease.key} (kwokctl, binary runtime)")
                with clock.phase("kwokctl create"):
                    self._kwokctl(*create, timeout=180)
                with clock.phase("kube-apiserver /readyz after create"):
                    self._wait(lambda: self._api_ready(timeout=1), 60, "the kube-apiserver to answer /readyz")
                with clock.phase("nodes"):
                    self._kwokctl("scale", "node", "--name", self.name, "--replicas", str(NODES))
                api = self.api_client()
                with clock.phase("CRDs created and Established"):
                    crds = install_crds(api, crd_files, self._wait)
                self._ensure_system_namespace(api)
                with clock.phase("nodes Ready"):
                    self._wait(lambda: nodes_ready(api, NODES), 60, "the fake nodes to be Ready")
                with clock.phase("snapshot save and restart"):
                    self._save_snapshot(api, lease, inputs, crds, str(crds_dir))
                self._wait(crds_served(polling_client(self.kubeconfig), crds), 60, "the apiserver to serve the CRDs")
                self._start_releaser()
            with clock.phase("controller started"):
                self._start_controller(controller_binary)
            api = self.api_client()
            self._update(api_server=yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"])
            with clock.phase("sentinel reconciled"):
                create_sentinel(api)
                self._wait_sentinel(api)
            with clock.phase("kube-apiserver /readyz"):
                self._wait(lambda: self._api_ready(timeout=1), 60, "the kube-apiserver to answer /readyz")
            with clock.phase("control plane whole"):
                revive_exited(self, kdir, ControlPlaneExited)
        finally:
            lease.release()
            if background is not None:
                background.terminate()
                background.wait(10)
        clock.mark("ready")
        release = controller_binary == self.tc.rollouts_dir(version) / "rollouts-controller"
        sha = (release and stamped_sha256(controller_binary)) or sha256_file(controller_binary)
        self._update(ready=True, controller_binary=None if release else str(controller_binary), controller_sha256=sha,
                     controller_reported_version=reported_version,
                     startup={"at": clock.at, "phases": clock.phases})

    def _update(self, **fields) -> None:
        with self._state_lock():
            st = self.state()
            st.update(fields)
            self._save(st)

    def _kwokctl_background(self, *args) -> subprocess.Popen:
        with open(self.folder / "logs" / "kwokctl.log", "ab") as log:
            return subprocess.Popen([str(self.tc.bin("kwok", config.KWOK_VERSION, "kwokctl")), *args],
                                    env=dict(os.environ, KWOK_WORKDIR=str(self.kwok_workdir)),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _kwokctl_failed(self, proc: subprocess.Popen) -> bool:
        """False while kwokctl runs or after it succeeded; raises with its output when it failed."""
        if proc.poll() not in (None, 0):
            out = (self.folder / "logs" / "kwokctl.log").read_text(errors="replace").strip()
            raise ClusterError(f"kwokctl create cluster failed: {out[-800:]}")
        return False

    def _save_snapshot(self, api, lease, inputs: dict, crds: list[dict], crds_from: str) -> None:
        """Stop the control plane (etcd last, cleanly), store etcd's data folder, start the plane again.

        The node Leases go first: a kwok controller takes a node (and its pods) only through its Lease, and
        a Lease held by the stopped one would keep the next one waiting until it expires (minutes)."""
        from kubernetes import client
        kdir = self.kwok_workdir / "clusters" / self.name
        pids = self._kwok_pids()
        for name in reversed(CONTROL_PLANE):
            if name in pids:
                self._terminate(pids[name], grace=20, expect=name.split("-")[0])
            if name == "kwok-controller":
                client.CoordinationV1Api(api).delete_collection_namespaced_lease("kube-node-lease")
        if any(pid_alive(p) for p in pids.values()):
            raise ClusterError("the control plane did not stop for the snapshot")
        for name in pids:     # kwokctl would take a stopped process not yet reaped (a zombie) for running
            (kdir / "pids" / f"{name}.pid").unlink(missing_ok=True)
        lease.save(kdir / "etcd", inputs, {"crds": crds, "crds_from": crds_from})
        self.log(f"cluster: snapshot {lease.key} saved")
        self._kwokctl("start", "cluster", "--name", self.name, timeout=180)

    @staticmethod
    def _wait(pred, timeout: float, what: str, interval: float = 0.05):
        """Poll ``pred`` until it returns something truthy, and return that."""
        try:
            return until(what, pred, timeout=timeout, interval=interval)
        except WaitTimeout as e:
            raise ClusterError(str(e)) from None

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
        """The releaser runs this same copy of drills (its cwd is the cluster folder); it waits for the API."""
        path = os.pathsep.join(filter(None, [str(config.project_root()), os.environ.get("PYTHONPATH")]))
        self._spawn("releaser", [sys.executable, "-m", "drills.cluster.availability",
                                 "--kubeconfig", str(self.kubeconfig)], [], env=dict(os.environ, PYTHONPATH=path))

    def _start_controller(self, binary: Path):
        metrics, healthz = free_port(), free_port()
        pid = self._spawn("rollouts-controller", [
            str(binary), "--kubeconfig", str(self.kubeconfig), "--leader-elect=false",
            "--metricsport", str(metrics), "--healthzPort", str(healthz), "--loglevel", "info",
        ], [metrics, healthz])
        if not pid_alive(pid):       # an exit later is caught by the wait for the sentinel's status
            log = (self.folder / "logs" / "rollouts-controller.log").read_text()[-600:]
            raise ClusterInputError(f"{binary} does not start as a rollouts controller: {log.strip()}")

    def _wait_sentinel(self, api, timeout: float = 60):
        ctrl_pid = next(p["pid"] for p in self.state()["processes"] if p["name"] == "rollouts-controller")

        def reconciled():
            if not pid_alive(ctrl_pid):
                log = (self.folder / "logs" / "rollouts-controller.log").read_text()[-600:]
                raise ClusterInputError(f"the rollouts controller exited: {log.strip()}")
            return sentinel_reconciled(api)
        self._wait(reconciled, timeout, "the rollouts controller to reconcile the sentinel Rollout", interval=0.05)

    # --- down -------------------------------------------------------------------------------------
    def down(self, quiet: bool = False) -> dict:
        st = self.state()
        procs = [p for p in st.get("processes", []) if isinstance(p, dict) and isinstance(p.get("pid"), int)]
        for p in procs:
            self._terminate(p["pid"], expect=self._expected_cmd(str(p.get("name"))))
        for pid in self.own_processes():      # whatever the state file no longer (or never) named
            self._terminate(pid, grace=2.0)
        r = None
        kwok_pids = self._kwok_pids()
        if self.tc.bin("kwok", config.KWOK_VERSION, "kwokctl").exists():
            r = self._kwokctl("delete", "cluster", "--name", self.name, "--kubeconfig", str(self.kubeconfig),
                              check=False)
        for name, pid in kwok_pids.items():      # kwokctl stops them; make sure of it
            self._terminate(pid, grace=2.0, expect=name.split("-")[0])
        try:                                      # a killed process holds its listeners until its last thread exits
            self._wait(lambda: not any(pid_alive(p) for p in [*kwok_pids.values(), *(p["pid"] for p in procs)]), 10,
                       "the cluster's processes to exit")
        except ClusterError as e:
            self.log(f"cluster: {e}")
        if self.folder.exists():
            shutil.rmtree(self.folder, ignore_errors=True)
        if not quiet:
            self.log(f"cluster: {self.name} down" + (f" ({r.stderr.strip()[-200:]})" if r is not None and
                                                      r.returncode != 0 else ""))
        return {"stopped": [p.get("name") for p in procs]}

    def _expected_cmd(self, name: str) -> str:
        return {"rollouts-controller": "--leader-elect=false", "releaser": "drills.cluster.availability"}.get(
            name, str(self.kubeconfig) if name.startswith("mesh") else name.split("-")[0])

    @staticmethod
    def _terminate(pid: int, grace: float = 5.0, expect: str | None = None):
        terminate(pid, grace, expect)


def audit_log_for(kubeconfig: str | Path) -> str | None:
    """The audit log of the embedded cluster whose kubeconfig this is (None for any other cluster)."""
    folder = Path(kubeconfig).resolve().parent
    if folder.parent != config.clusters_dir().resolve():
        return None
    return EmbeddedCluster(folder.name).state().get("audit_log")


__all__ = ["EmbeddedCluster", "ClusterError", "ClusterInputError", "free_port", "port_in_use", "pid_alive",
           "listening_ports_of"]
