"""The mesh emulator's server: watches of the routed objects, the HTTP front on 127.0.0.1, and the child
process drills starts (``python -m drills.traffic.mesh_server``).  The routing itself is drills.traffic.mesh (pure).

It WATCHES (drills.kube.watching: list, watch, resume, relist on 410 Gone; never a poll) the objects the router
(drills.routers) names for the route (Istio: its route and subset objects and the Services; nginx: the Ingresses
and Services), the Pods of the namespace, and optionally a ConfigMap holding injected faults; the
router turns them into the route table.  Admin endpoints
(loopback only, same port): ``GET /-/ready`` (200 once every watch has listed), ``GET /-/state`` (routing table
as JSON), ``GET|POST /-/faults``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..kube.k8s import client

from .. import routers
from ..kube.api import new_client
from .mesh import EMULATION_NOTE, Decision, NotLoopback, PodInfo, Router, _parse_fault_map, pod_info, require_loopback
from ..core.names import plain_name
from ..core.procs import die_with_parent, stop_process, wait_http
from ..core.wait import until
from ..kube.watching import ListWatch


class Mesh:
    def __init__(self, kubeconfig: str, namespace: str, route: str, capacity_rps: float, router: str | None = None,
                 pod_selector: str | None = None, faults_configmap: str | None = None, seed: int | None = None):
        self.kubeconfig, self.namespace, self.route = kubeconfig, namespace, route
        self.traffic = routers.get(router)
        self.pod_selector, self.cm_name = pod_selector, faults_configmap
        self.router = Router(capacity_rps, rng=random.Random(seed))
        self.metrics = self.traffic.metrics(namespace, route)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self._pods: dict[str, PodInfo] = {}
        self._objects: dict[str, dict[str, dict]] = {}      # the router's watched kinds: key -> name -> object
        self._admin_faults: dict = {"error_rate": {}, "latency_ms": {}}
        self._cm_faults: dict = {"error_rate": {}, "latency_ms": {}}
        self._watches = {w.key: w for w in self.traffic.watches(namespace, route)}
        self.synced = {k: threading.Event() for k in self._watches}
        self.synced["pods"] = threading.Event()
        if faults_configmap:
            self.synced["configmap"] = threading.Event()
        self.relists = {k: 0 for k in self.synced}
        self.loops: dict[str, ListWatch] = {}

    # -- state updates
    def _apply(self, kind: str, etype: str, obj: dict | None, items: list[dict] | None = None) -> None:
        with self.lock:
            if kind in self._watches:
                have = self._objects.setdefault(kind, {})
                if items is not None:
                    have.clear()
                    have.update({o["metadata"]["name"]: o for o in items})
                elif etype == "DELETED":
                    have.pop(obj["metadata"]["name"], None)
                else:
                    have[obj["metadata"]["name"]] = obj
                self.router.routes = self.traffic.route_table(self._objects, self.route)
            elif kind == "pods":
                if items is not None:
                    self._pods = {p.name: p for p in map(pod_info, items)}
                elif etype == "DELETED":
                    self._pods.pop(obj["metadata"]["name"], None)
                else:
                    p = pod_info(obj)
                    self._pods[p.name] = p
                self.router.set_pods(self._pods)
            elif kind == "configmap":
                data = {} if etype == "DELETED" or obj is None else (obj.get("data") or {})
                try:
                    self._cm_faults = {"error_rate": _parse_fault_map(data.get("error-rate")),
                                       "latency_ms": _parse_fault_map(data.get("latency-ms"))}
                except (ValueError, TypeError, AttributeError) as e:
                    print(f"mesh: ignoring malformed faults ConfigMap: {e}", file=sys.stderr, flush=True)
                self._merge_faults()

    def _merge_faults(self) -> None:
        self.router.error_rate = {**self._cm_faults["error_rate"], **self._admin_faults["error_rate"]}
        self.router.latency_ms = {**self._cm_faults["latency_ms"], **self._admin_faults["latency_ms"]}

    def set_admin_faults(self, faults: dict) -> None:
        with self.lock:
            self._admin_faults = {"error_rate": {str(k): float(v) for k, v in (faults.get("error_rate") or {}).items()},
                                  "latency_ms": {str(k): float(v) for k, v in (faults.get("latency_ms") or {}).items()}}
            self._merge_faults()

    # -- watch loops
    def _list_call(self, kind: str, api_client) -> tuple:
        ns = self.namespace
        if kind in self._watches:
            return self._watches[kind].list_call(api_client)
        core = client.CoreV1Api(api_client)
        if kind == "pods":
            return core.list_namespaced_pod, (ns,), ({"label_selector": self.pod_selector} if self.pod_selector else {})
        return core.list_namespaced_config_map, (ns,), {"field_selector": f"metadata.name={self.cm_name}"}

    def _watch_loop(self, kind: str) -> None:
        fn, args, kwargs = self._list_call(kind, new_client(self.kubeconfig, agent="drills-mesh/0.1"))
        lw = ListWatch(fn, *args, timeout_seconds=30, **kwargs)
        self.loops[kind] = lw

        def on_list(items, rv, relisted):
            if relisted:
                self.relists[kind] += 1
            if kind == "pods" or kind in self._watches:
                self._apply(kind, "LIST", None, items=items)
            else:
                self._apply(kind, "ADDED" if items else "DELETED", items[0] if items else None)
            self.synced[kind].set()

        while not self.stop.is_set():
            try:
                lw.run(on_list, lambda etype, obj: self._apply(kind, etype, obj))
            except Exception as e:  # a refused or failing watch: say it, list again shortly
                print(f"mesh: watch {kind}: {type(e).__name__}: {e}; relisting in 1s", file=sys.stderr, flush=True)
                self.relists[kind] += 1
                lw.resource_version = None
                self.stop.wait(1.0)

    def stop_watches(self) -> None:
        self.stop.set()
        for lw in list(self.loops.values()):
            lw.stop()

    def start_watches(self) -> None:
        for kind in self.synced:
            threading.Thread(target=self._watch_loop, args=(kind,), name=f"watch-{kind}", daemon=True).start()

    def ready(self) -> bool:
        return all(e.is_set() for e in self.synced.values())

    def handle(self) -> Decision:
        with self.lock:
            return self.router.decide(time.monotonic())

    def state(self) -> dict:
        with self.lock:
            snap = self.router.snapshot()
        snap.update({"emulation": EMULATION_NOTE, "namespace": self.namespace, "router": self.traffic.name,
                     "route": self.route, "metrics": self.traffic.metrics_note, "synced": {k: e.is_set() for k, e in self.synced.items()},
                     "relists": dict(self.relists),
                     "admin_faults": self._admin_faults, "configmap_faults": self._cm_faults})
        return snap


# ---------------------------------------------------------------------------------------------------------
# HTTP front
# ---------------------------------------------------------------------------------------------------------
def make_handler(mesh: Mesh):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "drills-mesh-emulator"
        disable_nagle_algorithm = True      # headers and body are two writes: no 40 ms delayed-ACK stall

        def log_message(self, fmt, *args):  # request logs would cost more than the routing itself
            pass

        def _send(self, code: int, body: str, ctype: str = "text/plain; charset=utf-8", headers: dict | None = None):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _route(self):
            t0 = time.perf_counter()
            d = mesh.handle()
            if d.latency_ms > 0:
                time.sleep(d.latency_ms / 1000.0)
            headers = {"x-mesh-emulated": "true", "x-mesh-subset": d.subset or "-", "x-mesh-pod": d.pod or "-",
                       "x-mesh-revision": d.revision, "x-envoy-response-flags": d.flags}
            self._send(d.code, d.body if d.body.endswith("\n") else d.body + "\n", headers=headers)
            mesh.metrics.observe(d, (time.perf_counter() - t0) * 1000.0)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                return self._send(200, mesh.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
            if path == "/-/ready":
                return self._send(200 if mesh.ready() else 503, "ready\n" if mesh.ready() else "syncing\n")
            if path == "/-/state":
                return self._send(200, json.dumps(mesh.state(), indent=1), "application/json")
            if path == "/-/faults":
                return self._send(200, json.dumps(mesh._admin_faults), "application/json")
            return self._route()

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            if path == "/-/faults":
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    mesh.set_admin_faults(json.loads(self.rfile.read(n) or b"{}"))
                except (ValueError, TypeError, AttributeError) as e:
                    return self._send(400, f"bad faults: {e}\n")
                return self._send(200, json.dumps(mesh._admin_faults), "application/json")
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            return self._route()

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def serve(mesh: Mesh, bind: str, port: int) -> _Server:
    require_loopback(bind)
    srv = _Server((bind, port), make_handler(mesh))
    return srv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m drills.traffic.mesh_server", description=EMULATION_NOTE)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--router", default=routers.DEFAULT, choices=routers.NAMES)
    p.add_argument("--route", required=True, help="the router's route object (Istio: the route and subset "
                                                   "objects of that name; nginx: the stable Ingress)")
    p.add_argument("--port", type=int, required=True, help="0 picks a free port (see --port-file)")
    p.add_argument("--bind", default="127.0.0.1", help="loopback address only")
    p.add_argument("--capacity-rps", type=float, required=True, help="requests/second each Ready pod serves")
    p.add_argument("--pod-selector", default=None, help="label selector of the Service's pods")
    p.add_argument("--faults-configmap", default=None, help="ConfigMap with keys error-rate / latency-ms")
    p.add_argument("--error-rate", action="append", default=[], metavar="REV=RATIO",
                   help="initial injected error ratio per revision (pod-template-hash or image tag)")
    p.add_argument("--port-file", default=None, help="write the bound port here once listening")
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args(argv)
    try:
        require_loopback(a.bind)
    except NotLoopback as e:
        print(f"mesh: {e}", file=sys.stderr)
        return 2
    mesh = Mesh(a.kubeconfig, a.namespace, a.route, a.capacity_rps, a.router, a.pod_selector, a.faults_configmap,
                a.seed)
    if a.error_rate:
        mesh.set_admin_faults({"error_rate": dict(x.split("=", 1) for x in a.error_rate)})
    srv = serve(mesh, a.bind, a.port)
    port = srv.server_address[1]
    if a.port_file:
        tmp = Path(a.port_file + ".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, a.port_file)
    mesh.start_watches()

    def _term(*_):
        mesh.stop_watches()
        threading.Thread(target=srv.shutdown, daemon=True).start()
    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    print(f"mesh: {EMULATION_NOTE}", file=sys.stderr, flush=True)
    print(f"mesh: listening on http://{a.bind}:{port} for {a.router} {a.namespace}/{a.route}", file=sys.stderr,
          flush=True)
    srv.serve_forever(poll_interval=0.2)
    srv.server_close()
    return 0


class MeshProcess:
    """``python -m drills.traffic.mesh_server`` as a child process; a context manager that always stops it."""

    def __init__(self, kubeconfig, namespace: str, route: str, capacity_rps: float, folder: Path, register=None,
                 unregister=None, pod_selector: str | None = None, faults_configmap: str | None = None,
                 router: str | None = None, seed: int | None = None, ready_timeout: float = 30):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = str(kubeconfig)
        plain_name(namespace, "namespace", 63), plain_name(route, "route")   # they name its files
        self.router = routers.get(router).name
        self.name = f"mesh-{namespace}-{route}"
        self._unregister = unregister
        self.log = self.folder / f"mesh-{namespace}-{route}.log"
        port_file = self.folder / f"mesh-{namespace}-{route}.port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "drills.traffic.mesh_server", "--kubeconfig", str(kubeconfig), "--namespace", namespace,
               "--router", self.router, "--route", route, "--port", "0",
               "--port-file", str(port_file), "--capacity-rps", str(capacity_rps)]
        if pod_selector:
            cmd += ["--pod-selector", pod_selector]
        if faults_configmap:
            cmd += ["--faults-configmap", faults_configmap]
        if seed is not None:
            cmd += ["--seed", str(seed)]
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=die_with_parent)
        try:
            deadline = time.monotonic() + ready_timeout

            def listening() -> bool:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mesh emulator did not start (rc={self.proc.poll()}):\n"
                                       + self.log.read_text()[-2000:])
                return port_file.exists()
            until("the mesh emulator to listen", listening, timeout=ready_timeout)
            self.port = int(port_file.read_text())
            self.url = f"http://127.0.0.1:{self.port}"
            if register is not None:
                register(self.name, self.proc.pid, [self.port], self.log)
            wait_http(self.url + "/-/ready", max(1.0, deadline - time.monotonic()), self.proc, self.log)
        except BaseException:
            self.stop()
            raise

    def state(self) -> dict:
        with urllib.request.urlopen(self.url + "/-/state", timeout=5) as r:
            return json.loads(r.read())

    def set_faults(self, error_rate: dict | None = None, latency_ms: dict | None = None) -> dict:
        body = json.dumps({"error_rate": error_rate or {}, "latency_ms": latency_ms or {}}).encode()
        req = urllib.request.Request(self.url + "/-/faults", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            return r.read().decode()

    def stop(self) -> None:
        stop_process(self.proc)
        if not self._logf.closed:
            self._logf.close()
        if self._unregister is not None:
            try:
                self._unregister(self.name)
            except Exception:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
