"""External metrics on the embedded cluster: the values a drill sets, served on 127.0.0.1 as the Kubernetes external
metrics API (``external.metrics.k8s.io/v1beta1``), so that the real HorizontalPodAutoscaler controller (the cluster's
kube-controller-manager) scales a Rollout on them, as it does for KEDA's ScaledObjects (KEDA writes such an HPA and
serves its scalers' values through the same API).

The kube-apiserver's aggregator reaches the server through an ``APIService`` whose Service is of type ExternalName
``127.0.0.1`` (the aggregator resolves such a Service to its name and the APIService's port; an Endpoint may not
hold a loopback address, so a ClusterIP Service could not lead there without a kube-proxy).  TLS with the embedded
cluster's own admin certificate (the APIService skips verification: the server is on loopback, started by the
drill); each connection's handshake runs in its own thread under a timeout, so a silent client stalls nobody.
One registration per cluster: ``start`` refuses while the registered port answers on loopback (another drill's
server), and takes over a registration whose server is gone; writes carry the resourceVersion they read, so two
drills cannot both win, and ``stop`` deletes only the registration it wrote.  ``stop`` removes the APIService and
the Service and closes the server on every way out (context manager, and any exception or signal in ``start``).
A registration left by a killed drill is taken over by the next one, and goes with ``drills cluster down``."""
from __future__ import annotations

import json
import math
import re
import ssl
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..kube import k8s
from ..kube.k8s import client

from ..core.procs import port_in_use
from ..core.wait import WaitTimeout, until
from .errors import ClusterError

GROUP, VERSION = "external.metrics.k8s.io", "v1beta1"
API_SERVICE = f"{VERSION}.{GROUP}"
NAMESPACE = "drills-system"
SERVICE = "drills-external-metrics"
READY_TIMEOUT_S = 60.0
CONNECTION_TIMEOUT_S = 10.0      # a client's TLS handshake and request, per connection
_PATH = re.compile(rf"^/apis/{re.escape(GROUP)}/{VERSION}/namespaces/([a-z0-9-]{{1,63}})/([A-Za-z0-9_.:-]{{1,253}})$")


class _TLSServer(ThreadingHTTPServer):
    """TLS per connection, in the connection's own thread (never in the accept loop), under a timeout."""
    daemon_threads = True

    def __init__(self, address, handler, ctx: ssl.SSLContext):
        super().__init__(address, handler)
        self.ctx = ctx

    def finish_request(self, request, client_address):
        request.settimeout(CONNECTION_TIMEOUT_S)
        try:
            tls = self.ctx.wrap_socket(request, server_side=True)
        except (OSError, ValueError):
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            tls.close()


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
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        self.server = _TLSServer(("127.0.0.1", 0), Handler, ctx)
        self.port = self.server.server_address[1]
        self._rv: str | None = None              # the APIService's resourceVersion as this drill wrote it
        self._thread: threading.Thread | None = None

    # --- the values -----------------------------------------------------------------------------------------
    def set(self, namespace: str, metric: str, value: float) -> None:
        if not math.isfinite(float(value)) or value < 0:
            raise ValueError(f"an external metric is a finite number >= 0, not {value!r}")
        with self.lock:
            self.values[(namespace, metric)] = float(value)

    def _list(self, namespace: str, metric: str) -> dict:
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
        try:
            self._register()
        except BaseException as e:          # a signal included: nothing of it is left registered or listening
            self.stop()
            if isinstance(e, (WaitTimeout, k8s.ApiException)):
                raise ExternalMetricsError(str(e).splitlines()[0]) from None
            raise
        self.log(f"external metrics: {API_SERVICE} served on 127.0.0.1:{self.port} through the aggregator")
        return self

    def _register(self) -> None:
        reg = client.ApiregistrationV1Api(self.api)
        core = client.CoreV1Api(self.api)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="external-metrics")
        self._thread.start()
        svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
               "spec": {"type": "ExternalName", "externalName": "127.0.0.1"}}
        apisvc = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": API_SERVICE},
                  "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 100, "versionPriority": 100,
                           "insecureSkipTLSVerify": True,
                           "service": {"name": SERVICE, "namespace": NAMESPACE, "port": self.port}}}
        try:
            core.create_namespaced_service(NAMESPACE, svc)
        except k8s.ApiException as e:
            if e.status != 409:
                raise
            old = core.read_namespaced_service(SERVICE, NAMESPACE)
            if old.spec.external_name != "127.0.0.1":             # another version's: the same name, set right
                core.patch_namespaced_service(SERVICE, NAMESPACE, {"spec": svc["spec"]})
        try:
            self._rv = reg.create_api_service(apisvc).metadata.resource_version
        except k8s.ApiException as e:
            if e.status != 409:
                raise
            held = reg.read_api_service(API_SERVICE)
            port = held.spec.service.port if held.spec and held.spec.service else None
            if port is not None and port != self.port and port_in_use(port):
                raise ExternalMetricsError(f"the cluster's external metrics API ({API_SERVICE}) is served by another "
                                           f"drill now (127.0.0.1:{port}): one at a time per cluster") from None
            body = dict(apisvc, metadata=dict(apisvc["metadata"], resourceVersion=held.metadata.resource_version))
            self._rv = reg.replace_api_service(API_SERVICE, body).metadata.resource_version  # 409 if another won
        until(f"the aggregator to serve {API_SERVICE} from 127.0.0.1:{self.port}",
              lambda: reg.read_api_service(API_SERVICE), lambda s: s.spec.service.port == self.port and
              _available(s), timeout=READY_TIMEOUT_S, interval=0.5,
              describe=lambda s: str([(c.type, c.status, c.message) for c in ((s.status and s.status.conditions)
                                                                              or [])]))

    def stop(self) -> None:
        if self._rv is not None:
            reg = client.ApiregistrationV1Api(self.api)
            try:                  # only the registration this drill wrote: another's resourceVersion differs (409)
                held = reg.read_api_service(API_SERVICE)
                if held.spec.service.port == self.port:
                    reg.delete_api_service(API_SERVICE, body=client.V1DeleteOptions(
                        preconditions=client.V1Preconditions(resource_version=held.metadata.resource_version)))
                    client.CoreV1Api(self.api).delete_namespaced_service(SERVICE, NAMESPACE)
            except k8s.ApiException as e:
                if e.status not in (404, 409):
                    self.log(f"external metrics: not unregistered: {e.reason}")
            self._rv = None
        if self._thread is not None:
            self.server.shutdown()
            self._thread = None
        self.server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _available(s) -> bool:
    return any(c.type == "Available" and c.status == "True" for c in ((s.status and s.status.conditions) or []))


def cluster_cert(cluster) -> tuple[Path, Path]:
    """The embedded cluster's admin certificate and key (its kwok PKI): the server's TLS identity."""
    pki = Path(cluster.kwok_dir) / "pki"
    cert, key = pki / "admin.crt", pki / "admin.key"
    if not (cert.is_file() and key.is_file()):
        raise ExternalMetricsError(f"no admin certificate in {pki}: is the embedded cluster {cluster.name} up?")
    return cert, key
