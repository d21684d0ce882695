"""External metrics on the embedded cluster: the values a drill sets, served on 127.0.0.1 as the Kubernetes external
metrics API (``external.metrics.k8s.io/v1beta1``), so that the real HorizontalPodAutoscaler controller (the cluster's
kube-controller-manager) scales a Rollout on them, as it does for KEDA's ScaledObjects (KEDA writes such an HPA and
serves its scalers' values through the same API).

The kube-apiserver's aggregator reaches the server through an ``APIService`` whose Service is of type ExternalName
``localhost`` (the aggregator resolves such a Service to its name and the APIService's port; an Endpoint may not
hold a loopback address, so a ClusterIP Service could not lead there without a kube-proxy).  TLS with the embedded
cluster's own admin certificate (the APIService skips verification: the server is on loopback, started by the
drill).  One registration per cluster: ``start`` refuses when another live server holds it.  ``stop`` removes the
APIService and the Service and closes the server, on every way out (context manager)."""
from __future__ import annotations

import json
import re
import ssl
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..procs import port_in_use
from ..wait import WaitTimeout, until
from .errors import ClusterError

GROUP, VERSION = "external.metrics.k8s.io", "v1beta1"
API_SERVICE = f"{VERSION}.{GROUP}"
NAMESPACE = "drills-system"
SERVICE = "drills-external-metrics"
READY_TIMEOUT_S = 60.0
_PATH = re.compile(rf"^/apis/{re.escape(GROUP)}/{VERSION}/namespaces/([a-z0-9-]{{1,63}})/([A-Za-z0-9_.:-]{{1,253}})$")


class ExternalMetricsError(ClusterError):
    """The external metrics API could not be served on this cluster (held by another drill, not available)."""


class ExternalMetrics:
    def __init__(self, api: client.ApiClient, cert: Path, key: Path, log=None):
        self.api = api
        self.log = log or (lambda m: None)
        self.values: dict[tuple[str, str], float] = {}
        self.reads: list[tuple[float, str, str, float | None]] = []      # (wall, namespace, metric, value served)
        self.lock = threading.Lock()
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == f"/apis/{GROUP}/{VERSION}":
                    body = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{VERSION}",
                            "resources": [{"name": "*", "singularName": "", "namespaced": True,
                                           "kind": "ExternalMetricValueList", "verbs": ["get"]}]}
                elif m := _PATH.match(path):
                    body = me._list(m.group(1), m.group(2))
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread: threading.Thread | None = None
        self._registered = False

    # --- the values -----------------------------------------------------------------------------------------
    def set(self, namespace: str, metric: str, value: float) -> None:
        with self.lock:
            self.values[(namespace, metric)] = float(value)

    def _list(self, namespace: str, metric: str) -> dict:
        import time
        with self.lock:
            value = self.values.get((namespace, metric))
            self.reads.append((time.time(), namespace, metric, value))
            del self.reads[:-1000]
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        items = [] if value is None else [{"metricName": metric, "metricLabels": {}, "timestamp": now,
                                           "value": f"{int(round(value * 1000))}m"}]
        return {"kind": "ExternalMetricValueList", "apiVersion": f"{GROUP}/{VERSION}", "metadata": {},
                "items": items}

    def reads_of(self, namespace: str, metric: str) -> list[tuple[float, float | None]]:
        with self.lock:
            return [(t, v) for t, ns, m, v in self.reads if (ns, m) == (namespace, metric)]

    # --- life -----------------------------------------------------------------------------------------------
    def start(self) -> "ExternalMetrics":
        reg = client.ApiregistrationV1Api(self.api)
        try:
            held = reg.read_api_service(API_SERVICE)
        except ApiException as e:
            if e.status != 404:
                raise
            held = None
        if held is not None and _available(held) and held.spec.service is not None and \
                port_in_use(held.spec.service.port):          # a registration whose server is gone is taken over
            raise ExternalMetricsError(f"the cluster's external metrics API ({API_SERVICE}) is served by another "
                                       f"drill now (port {held.spec.service.port}): one at a time per cluster")
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="external-metrics")
        self._thread.start()
        core = client.CoreV1Api(self.api)
        svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
               "spec": {"type": "ExternalName", "externalName": "localhost"}}
        apisvc = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": API_SERVICE},
                  "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 100, "versionPriority": 100,
                           "insecureSkipTLSVerify": True,
                           "service": {"name": SERVICE, "namespace": NAMESPACE, "port": self.port}}}
        try:
            self._registered = True
            _create_or_replace(lambda: core.create_namespaced_service(NAMESPACE, svc),
                               lambda: core.replace_namespaced_service(SERVICE, NAMESPACE, dict(
                                   svc, metadata=dict(svc["metadata"], resourceVersion=core.read_namespaced_service(
                                       SERVICE, NAMESPACE).metadata.resource_version))))
            _create_or_replace(lambda: reg.create_api_service(apisvc),
                               lambda: reg.replace_api_service(API_SERVICE, dict(apisvc, metadata=dict(
                                   apisvc["metadata"], resourceVersion=reg.read_api_service(
                                       API_SERVICE).metadata.resource_version))))
            until(f"the aggregator to serve {API_SERVICE} from 127.0.0.1:{self.port}",
                  lambda: reg.read_api_service(API_SERVICE), lambda s: s.spec.service.port == self.port and
                  _available(s), timeout=READY_TIMEOUT_S, interval=0.5,
                  describe=lambda s: str([(c.type, c.status, c.message) for c in (s.status.conditions or [])]))
        except (WaitTimeout, ApiException) as e:
            self.stop()
            raise ExternalMetricsError(str(e).splitlines()[0]) from None
        self.log(f"external metrics: {API_SERVICE} served on 127.0.0.1:{self.port} through the aggregator")
        return self

    def stop(self) -> None:
        if self._registered:
            self._registered = False
            reg = client.ApiregistrationV1Api(self.api)
            try:
                if reg.read_api_service(API_SERVICE).spec.service.port == self.port:     # ours, not another's
                    reg.delete_api_service(API_SERVICE)
                    client.CoreV1Api(self.api).delete_namespaced_service(SERVICE, NAMESPACE)
            except ApiException as e:
                if e.status != 404:
                    self.log(f"external metrics: not unregistered: {e.reason}")
        if self._thread is not None:
            self.server.shutdown()
            self._thread = None
        self.server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _available(s) -> bool:
    return any(c.type == "Available" and c.status == "True" for c in (s.status.conditions or []) if s.status)


def _create_or_replace(create, replace) -> None:
    try:
        create()
    except ApiException as e:
        if e.status != 409:
            raise
        replace()


def cluster_cert(cluster) -> tuple[Path, Path]:
    """The embedded cluster's admin certificate and key (its kwok PKI): the server's TLS identity."""
    pki = Path(cluster.kwok_workdir) / "clusters" / cluster.name / "pki"
    cert, key = pki / "admin.crt", pki / "admin.key"
    if not (cert.is_file() and key.is_file()):
        raise ExternalMetricsError(f"no admin certificate in {pki}: is the embedded cluster {cluster.name} up?")
    return cert, key
