"""The embedded default cluster: a real control plane on 127.0.0.1, no containers.

kwokctl (binary runtime, pointed at the toolchain's binaries) runs etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok.  After the CRDs exist, the project starts its own
processes: the real ``rollouts-controller`` at the version under test and the pod releaser of
availability control (later also the mesh emulator, Prometheus, a chart registry).  Each one is recorded
(pid, start time, ports, log) in the cluster folder's state.json, and ``down`` stops those it can prove are
still its own (drills.cluster.state).  Who uses the cluster, and one `up`/`down` at a time: drills.cluster.usage.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from ..core import config, fastyaml
from ..core.names import is_plain_name, plain_name
from ..core.signals import held
from ..core.procs import (boot_id, die_with_parent, free_port, listening_ports_of, now_ticks, pid_alive, port_in_use,
                          proven, run_bounded, terminate_proven)
from ..toolchain import Toolchain, check_built, components_for
from ..core.wait import WaitTimeout, until
from .errors import ClusterError, ClusterInputError, ClusterInUse, ClusterStateError, ControlPlaneExited
from .snapshot import SnapshotStore, snapshot_inputs, snapshot_key, stamped_sha256
from .startup import (
    SENTINEL_NS, PhaseClock, create_sentinel, crds_served, install_crds, kwokctl_configuration, nodes_ready,
    polling_client, reserve_ports, revive_exited, sentinel_reconciled
)
from .state import ClusterState
from .usage import Usage, describe

NODES = 2
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")


class EmbeddedCluster(ClusterState):
    """One embedded cluster (folder ``$DRILLS_CACHE/clusters/<name>``; the name is a plain name, drills.core.names)."""

    def __init__(self, name: str | None = None, toolchain: Toolchain | None = None, log=None):
        self.name = config.cluster_name(name)
        self.tc = toolchain or Toolchain()
        self.folder = config.clusters_dir().absolute() / self.name
        self.kubeconfig = self.folder / "kubeconfig"
        self.state_file = self.folder / "state.json"
        self.kwok_workdir = config.cache_dir().absolute() / "kwok-workdir"
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.usage = Usage(self.folder.parent, self.name)
        self._holder = None

    # --- who uses it ----------------------------------------------------------------------------------
    def hold(self, purpose: str) -> None:
        """Mark this cluster in use by this process until ``release`` (or the process ends): `up` elsewhere then
        refuses to replace it.  Take it before `up`, so nothing can replace the cluster in between."""
        if self._holder is None or not self._holder.held:
            self._holder = self.usage.hold(purpose)

    def release(self) -> None:
        if self._holder is not None:
            self._holder.release()

    def holders(self) -> list[dict]:
        """Who else uses the cluster now (this object's own marker left out)."""
        return self.usage.holders(exclude=(self._holder.path,) if self._holder and self._holder.held else ())

    def in_use(self) -> str | None:
        """Why the cluster may not be replaced or taken down by a caller that did not start it: another holder,
        or a drill's lease on a Rollout in it; None when nobody uses it."""
        others = self.holders()
        if others:
            more = f" and {len(others) - 1} more" if len(others) > 1 else ""
            return f"in use by {describe(others[0])}{more}"
        lease = self._a_lease()
        return f"in use by a drill's lease on rollout {lease}" if lease else None

    def _a_lease(self) -> str | None:
        """A Rollout of this cluster carrying a drill's lease (a live drill runs on it, or left a restore owed)."""
        if not self.kubeconfig.exists():
            return None
        try:
            from ..kube.k8s import client
            items = client.CustomObjectsApi(self.api_client()).list_cluster_custom_object(
                config.ARGO_GROUP, config.ARGO_VERSION, "rollouts", _request_timeout=5)["items"]
        except Exception:          # no answer, no CRD: nothing there can be proven to hold it
            return None
        for ro in items:
            meta = ro.get("metadata") or {}
            lease = (meta.get("annotations") or {}).get("drills.dev/lease")
            if lease:
                return f"{meta.get('namespace')}/{meta.get('name')} ({lease[:160]})"
        return None

    @property
    def controller_version(self) -> str | None:
        return self.state().get("controller_version")

    @property
    def api_server(self) -> str | None:
        return self.state().get("api_server")

    def api_client(self):
        from ..kube.api import new_client
        return new_client(self.kubeconfig)

    def ensure_pod_room(self, pods: int) -> int:
        """Fake nodes enough for ``pods`` pods (a node holds what its allocatable says: 110 from kwokctl's node
        template), added, never removed; the node count."""
        from ..kube.k8s import client
        from ..kube.k8s import utils as kutils
        api = self.api_client()
        nodes = client.CoreV1Api(api).list_node().items
        per = min((int(kutils.parse_quantity((n.status.allocatable or {}).get("pods", "110"))) for n in nodes), default=110)
        want = max(NODES, -(-pods // max(1, per)))
        if want > len(nodes):
            self.log(f"cluster: {want} fake nodes for {pods} pods ({per} each)")
            self._kwokctl("scale", "node", "--name", self.name, "--replicas", str(want), timeout=300)
            self._wait(lambda: nodes_ready(api, want), 120, f"{want} fake nodes to be Ready")
        return max(want, len(nodes))

    def _kwokctl(self, *args, check=True, timeout=120) -> subprocess.CompletedProcess:
        env = dict(os.environ, KWOK_WORKDIR=str(self.kwok_workdir))
        kwokctl = self.tc.bin("kwok", config.KWOK_VERSION, "kwokctl")
        r = run_bounded([str(kwokctl), *args], timeout=timeout, env=env)     # its group killed on a timeout
        if check and r.returncode != 0:
            raise ClusterError(f"kwokctl {' '.join(args)} failed: {(r.stderr or r.stdout).strip()[-800:]}")
        return r

    # --- status ---------------------------------------------------------------------------------
    def status(self) -> dict:
        st = self.state()
        if not st:
            err = self.state_error()
            return {"ready": False, "cluster": self.name, "error": err} if err else {"ready": False}
        procs = [{k: p.get(k) for k in ("name", "pid", "ports", "log")} | {"alive": self.still_running(p) and
                 proven(p, self.marks())} for p in self.process_records(st)]
        for name, (pid, rec) in sorted(self.control_plane().items()):
            alive = rec is not None and self.still_running(rec)
            procs.append({"name": name, "pid": pid, "managed_by": "kwokctl", "alive": alive,
                          "ports": listening_ports_of([pid]) if alive else [],
                          "log": str(self.kwok_dir / "logs" / f"{name}.log")})
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
            "audit_log": str(self.kwok_dir / "logs" / "audit.log") if st.get("audit_log") else None,
            "created_at": st.get("created_at"),
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
        drills.drill.controller_binary) that argument is only the nearest release, and the cluster is labelled by the
        binary's reported version, its sha256 and its CRD folder ``crds_dir``.

        A cluster of this name that runs something else is replaced only when nobody uses it (``in_use``);
        otherwise ClusterInUse (exit 2) names who does.  One `up` or `down` of a name at a time."""
        version = plain_name(controller_version or config.DEFAULT_CONTROLLER, "controller version")
        if controller_binary is not None and crds_dir is None:
            raise ClusterInputError("a user-built controller needs its CRD folder (drills.drill.controller_binary)")
        label = plain_name((config.normalise_version(reported_version or "") or reported_version or "unknown")
                           if controller_binary is not None else version, "the controller's reported version")
        if api_port and port_in_use(api_port):
            raise ClusterInputError(f"port {api_port} on 127.0.0.1 is already in use")
        comps = [c for c in components_for([] if controller_binary else [version]) if c.name != "helm"]
        for _ in range(2):
            missing = [c for c in comps if not self.tc.is_built(c)]
            if missing and not build:
                raise ClusterInputError(
                    "missing binary (not built, or its build stamp is of other flags or of an older drills): "
                    + ", ".join(c.key for c in missing) + " (run: drills toolchain build)")
            with self.usage.exclusive(f"cluster up --controller {label}", self.log):
                st = self.state()
                same = ((st.get("nearest_release") or st.get("controller_version")) == version and
                        st.get("controller_version") == label and
                        st.get("controller_binary") == (str(controller_binary) if controller_binary else None) and
                        (crds_dir is None or st.get("crd_source") == str(crds_dir)))
                if st and same and self.status()["ready"]:
                    self.log(f"cluster: {self.name} already up with controller {label}")
                    return self.status()
                if st or self.folder.exists():
                    why = self.in_use()
                    if why:
                        raise ClusterInUse(
                            f"cluster {self.name} is {why}: it is not replaced with controller {label} (it runs "
                            f"{st.get('controller_version') or 'something else'}); nothing was changed. Use another "
                            f"cluster (DRILLS_CLUSTER=<name>) or wait until it is done")
                if not missing:
                    return self._replace(st, version, label, api_port, controller_binary, crds_dir,
                                         reported_version, crd_warning)
            self.tc.ensure(missing)        # outside the lock: a build takes minutes
        raise ClusterError(f"still missing after the build: {', '.join(c.key for c in missing)}")

    def _replace(self, st, version, label, api_port, controller_binary, crds_dir, reported_version,
                 crd_warning) -> dict:
        if st:
            self.log(f"cluster: replacing {self.name} (controller {st.get('controller_version')} -> {label})")
            self._down()
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
                self._down(quiet=True)
                if attempt == 2:
                    raise
                self.log(f"cluster: {e}; cleaned up, starting once more")
            except BaseException:
                self.log("cluster: start failed, cleaning up")
                self._down(quiet=True)
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
        began = now_ticks()
        if self.folder.exists():
            shutil.rmtree(self.folder)
        (self.folder / "logs").mkdir(parents=True)
        self.kwok_workdir.mkdir(parents=True, exist_ok=True)
        user_built = controller_binary != self.tc.rollouts_dir(version) / "rollouts-controller"
        self._save({"name": self.name, "controller_version": label or version, "ready": False,
                    "controller_binary": None, "processes": [],
                    "nearest_release": version if user_built else None, "crd_source": str(crds_dir),
                    "crd_warning": crd_warning,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    # a control-plane process started since, from this cluster's private folder, is ours
                    "began_ticks": began, "boot_id": boot_id()})
        ports = reserve_ports(config.clusters_dir(), self.name, 6, lambda picked: self._update(
            control_plane_ports=picked[:5] + [api_port or picked[5]]))
        kc = kwokctl_configuration(self.tc, self.folder, ports[:5], api_port or ports[5])
        conf_path = self.folder / "kwokctl.yaml"
        conf_path.write_text(yaml.safe_dump_all(kc.documents, sort_keys=False))
        crd_files = sorted(crds_dir.glob("*.yaml")) + [self.tc.bin("istio-crds", config.ISTIO_API_VERSION, "crds.yaml")]
        inputs = snapshot_inputs(self.tc, crd_files, kc.stages, kc.audit_policy, kc.options, SENTINEL_NS, NODES)
        kdir = self.kwok_dir
        create = ("create", "cluster", "--name", self.name, "-c", str(conf_path), "--kubeconfig", str(self.kubeconfig))
        if kdir.exists():     # a leftover of a cluster of this name that was not taken down
            self.drop_unproven_pid_files()        # (its record is gone: kwokctl signals nothing it names)
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
                    self.record_control_plane()
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
                    self.record_control_plane()
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
            self._update(api_server=fastyaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"])
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

    def _kwokctl_background(self, *args) -> subprocess.Popen:
        with open(self.folder / "logs" / "kwokctl.log", "ab") as log:
            return subprocess.Popen([str(self.tc.bin("kwok", config.KWOK_VERSION, "kwokctl")), *args],
                                    env=dict(os.environ, KWOK_WORKDIR=str(self.kwok_workdir)),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=die_with_parent)     # `up` terminates it; a killed drills too

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
        from ..kube.k8s import client
        kdir = self.kwok_dir
        pids = self.control_plane()
        for name in reversed(CONTROL_PLANE):
            if name in pids and pids[name][1] is not None:
                terminate_proven(pids[name][1], self.kwok_marks(), grace=20)
            if name == "kwok-controller":
                client.CoordinationV1Api(api).delete_collection_namespaced_lease("kube-node-lease")
        if any(pid_alive(pid) for pid, _ in pids.values()):
            raise ClusterError("the control plane did not stop for the snapshot")
        for name in pids:     # kwokctl would take a stopped process not yet reaped (a zombie) for running
            (kdir / "pids" / f"{name}.pid").unlink(missing_ok=True)
        lease.save(kdir / "etcd", inputs, {"crds": crds, "crds_from": crds_from})
        self.log(f"cluster: snapshot {lease.key} saved")
        self._kwokctl("start", "cluster", "--name", self.name, timeout=180)
        self.record_control_plane()

    @staticmethod
    def _wait(pred, timeout: float, what: str, interval: float = 0.05):
        """Poll ``pred`` until it returns something truthy, and return that."""
        try:
            return until(what, pred, timeout=timeout, interval=interval)
        except WaitTimeout as e:
            raise ClusterError(str(e)) from None

    def _ensure_system_namespace(self, api):
        from ..kube.k8s import client
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": SENTINEL_NS}})

    def _spawn(self, name: str, args: list[str], ports: list[int], env: dict | None = None) -> int:
        log = self.folder / "logs" / f"{name}.log"
        with held(), open(log, "ab") as lf:      # a signal after the start: taken once the process is recorded
            proc = subprocess.Popen(args, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env or os.environ.copy(), cwd=str(self.folder))
            self.register_process(name, proc.pid, ports, log)
        return proc.pid

    def _start_releaser(self):
        """The releaser runs this same copy of drills (its cwd is the cluster folder); it waits for the API."""
        path = os.pathsep.join(filter(None, [str(config.project_root()), os.environ.get("PYTHONPATH")]))
        self._spawn("releaser", [sys.executable, "-m", "drills.cluster.availability",
                                 "--kubeconfig", str(self.kubeconfig)], [], env=dict(os.environ, PYTHONPATH=path))

    def start_controller(self, binary: Path, extra_args: list[str] = ()) -> None:
        """Start ``binary`` as the controller (none may run): the flags of every start, then ``extra_args``."""
        self._start_controller(binary, extra_args)

    def _start_controller(self, binary: Path, extra_args: list[str] = ()):
        metrics, healthz = free_port(), free_port()
        pid = self._spawn("rollouts-controller", [
            str(binary), "--kubeconfig", str(self.kubeconfig), "--leader-elect=false",
            "--metricsport", str(metrics), "--healthzPort", str(healthz), "--loglevel", "info", *extra_args,
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
    def down(self, quiet: bool = False, if_unused: bool = False) -> dict:
        """Stop the cluster's processes (those it can prove are its own) and remove its folder.  With
        ``if_unused`` (a run or a test session ending) the cluster stays up while someone else holds it."""
        if not (self.folder.exists() or self.kwok_dir.exists()):
            if not quiet:
                self.log(f"cluster: {self.name} down (there was none)")
            return {"stopped": [], "left_running": []}
        with self.usage.exclusive("cluster down", self.log):
            others = self.holders()
            if others and if_unused:
                self.log(f"cluster: {self.name} left up: in use by {describe(others[0])}")
                return {"stopped": [], "left_up": describe(others[0])}
            if others:
                self.log(f"cluster: warning: taking {self.name} down while in use by {describe(others[0])}")
            return self._down(quiet)

    def _down(self, quiet: bool = False) -> dict:
        st = self.state()
        procs = self.process_records(st)
        stopped = [p["name"] for p in procs if terminate_proven(p, self.marks())]
        control = self.control_plane()
        self.drop_unproven_pid_files()          # kwokctl stops what its pid files name: only what is proven ours
        r = None
        if self.tc.bin("kwok", config.KWOK_VERSION, "kwokctl").exists():
            r = self._kwokctl("delete", "cluster", "--name", self.name, "--kubeconfig", str(self.kubeconfig),
                              check=False)
        ours = [rec for _, rec in control.values() if rec is not None]
        for rec in ours:                          # kwokctl stops them; make sure of it
            terminate_proven(rec, self.kwok_marks(), grace=2.0)
        waited = [p for p in procs if p["name"] in stopped] + ours
        try:                                      # a killed process holds its listeners until its last thread exits
            self._wait(lambda: not any(self.still_running(p) for p in waited), 10, "the cluster's processes to exit")
        except ClusterError as e:
            self.log(f"cluster: {e}")
        left = self.own_processes()
        if left:
            why = {pid: name for name, (pid, _) in control.items()}
            self.log(f"cluster: left running, not proven to be started by drills for {self.name} (never "
                     f"signalled): " + ", ".join(f"pid {pid}" + (f" ({why[pid]}: no record of it at its start)"
                                                                  if pid in why else "") for pid in left[:10]))
        if self.folder.exists():
            shutil.rmtree(self.folder, ignore_errors=True)
        self.usage.tidy()                         # the folder of markers, when none is left
        if not quiet:
            self.log(f"cluster: {self.name} down" + (f" ({r.stderr.strip()[-200:]})" if r is not None and
                                                      r.returncode != 0 else ""))
        return {"stopped": stopped + [n for n, (_, rec) in control.items() if rec is not None], "left_running": left}


def audit_log_for(kubeconfig: str | Path) -> str | None:
    """The audit log of the embedded cluster whose kubeconfig this is (None for any other cluster)."""
    folder = Path(kubeconfig).resolve().parent
    if folder.parent != config.clusters_dir().resolve() or not is_plain_name(folder.name):
        return None
    c = EmbeddedCluster(folder.name)
    return str(c.kwok_dir / "logs" / "audit.log") if c.state().get("audit_log") else None


__all__ = ["EmbeddedCluster", "ClusterError", "ClusterInputError", "ClusterInUse", "ClusterStateError", "free_port", "port_in_use", "pid_alive",
           "listening_ports_of"]
