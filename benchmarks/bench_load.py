"""Benchmark: requests/second Locust sustains against the mesh emulator, and the emulator's added latency.

    python benchmarks/bench_load.py [--kubeconfig K] [--seconds 15] [--users 20] [--rate 10]

Needs a running embedded cluster (``drills cluster up``; default kubeconfig is the embedded cluster's).  It
creates a namespace with a VirtualService, a DestinationRule and two Ready pods, starts the emulator
(capacity high enough not to shed) and a direct loopback server built on the same HTTP stack, then:
1. Locust (bounded users/rate/time) against each: achieved requests/second, failure ratio, p50/p99;
2. a sequential keep-alive client against each: p50/p99; the difference is the emulator's added latency.
Everything runs on 127.0.0.1 and stops by itself; the namespace is deleted at the end.
"""
from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class _Direct(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_direct(port_file: str) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Direct)
    srv.daemon_threads = True
    Path(port_file).write_text(str(srv.server_address[1]))
    srv.serve_forever()


def sequential(port: int, n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", "/")
        r = conn.getresponse()
        r.read()
        out.append((time.perf_counter() - t0) * 1000.0)
        if r.status != 200:
            raise RuntimeError(f"status {r.status} from port {port}")
    conn.close()
    return out


def main() -> int:
    from kubernetes import client, config as kconfig

    from drills.core import config
    from drills.traffic import load, mesh, mesh_server

    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", default=str(config.clusters_dir() / config.EMBEDDED_CLUSTER_NAME / "kubeconfig"))
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--rate", type=float, default=10, help="requests/second per user")
    ap.add_argument("--sequential", type=int, default=2000)
    a = ap.parse_args()
    if not Path(a.kubeconfig).is_file():
        print(f"no kubeconfig at {a.kubeconfig}: start the embedded cluster first (drills cluster up)")
        return 2

    api = kconfig.new_client_from_config(config_file=a.kubeconfig)
    core, co = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns = f"bench-load-{int(time.time())}"
    core.create_namespace({"metadata": {"name": ns, "labels": {config.NAMESPACE_OPT_IN_LABEL: "true"}}})
    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    direct = None
    try:
        co.create_namespaced_custom_object("networking.istio.io", "v1alpha3", ns, "virtualservices", {
            "apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService", "metadata": {"name": "web"},
            "spec": {"hosts": ["web"], "http": [{"route": [
                {"destination": {"host": "web", "subset": "stable"}, "weight": 100},
                {"destination": {"host": "web", "subset": "canary"}, "weight": 0}]}]}})
        co.create_namespaced_custom_object("networking.istio.io", "v1alpha3", ns, "destinationrules", {
            "apiVersion": "networking.istio.io/v1alpha3", "kind": "DestinationRule", "metadata": {"name": "web"},
            "spec": {"host": "web", "subsets": [{"name": "stable", "labels": {mesh.HASH_LABEL: "aaa"}},
                                                {"name": "canary", "labels": {mesh.HASH_LABEL: "bbb"}}]}})
        for i in range(2):
            core.create_namespaced_pod(ns, {"metadata": {"name": f"web-{i}", "labels": {mesh.HASH_LABEL: "aaa"}},
                                            "spec": {"containers": [{"name": "web", "image": "web:1"}],
                                                     "tolerations": [{"operator": "Exists"}]}})
        port_file = tmp / "direct.port"
        direct = subprocess.Popen([sys.executable, __file__, "--serve-direct", str(port_file)])
        while not port_file.exists():
            time.sleep(0.05)
        dport = int(port_file.read_text())
        with mesh_server.MeshProcess(a.kubeconfig, ns, "web", capacity_rps=100000, folder=tmp) as m:
            deadline = time.monotonic() + 60
            while m.state()["ready_per_subset"].get("stable", 0) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pods not Ready: {m.state()['pods']}")
                time.sleep(0.2)
            rows = []
            for label, url in (("direct", f"http://127.0.0.1:{dport}"), ("emulator", m.url)):
                run = load.run_load(url, tmp / label, users=a.users, spawn_rate=a.users, run_time_s=a.seconds,
                                    rate_per_user=a.rate, name=label)
                recs = run.records()
                span = (max(r["t"] for r in recs) - min(r["t"] for r in recs)) if len(recs) > 1 else 0
                lat = [r["ms"] for r in recs]
                fails = sum(not r["ok"] for r in recs)
                seq = sequential(dport if label == "direct" else m.port, a.sequential)
                rows.append((label, len(recs) / span if span else 0.0, fails / max(1, len(recs)),
                             load.percentile(lat, 50), load.percentile(lat, 99),
                             load.percentile(seq, 50), load.percentile(seq, 99)))
        print(f"offered: {a.users} users x {a.rate}/s = {a.users * a.rate:.0f} req/s for {a.seconds:.0f} s "
              f"(cap {load.MAX_TOTAL_RPS:.0f}); {mesh.EMULATION_NOTE}")
        print(f"{'target':<9} {'locust rps':>10} {'fail':>6} {'locust p50':>10} {'p99':>8} "
              f"{'seq p50 ms':>10} {'seq p99':>8}")
        for r in rows:
            print(f"{r[0]:<9} {r[1]:>10.1f} {r[2]:>6.3f} {r[3]:>10.2f} {r[4]:>8.2f} {r[5]:>10.3f} {r[6]:>8.3f}")
        d, e = rows
        print(f"emulator added latency (sequential keep-alive): p50 +{e[5] - d[5]:.3f} ms, p99 +{e[6] - d[6]:.3f} ms")
        print(f"emulator added latency (under Locust load):     p50 +{e[3] - d[3]:.2f} ms, p99 +{e[4] - d[4]:.2f} ms")
        return 0
    finally:
        if direct is not None:
            direct.terminate()
            direct.wait(10)
        core.delete_namespace(ns)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-direct":
        serve_direct(sys.argv[2])
    else:
        sys.exit(main())
