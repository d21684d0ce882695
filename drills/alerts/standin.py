"""The drill's stand-in for kube-state-metrics (labelled as one wherever it shows).

kube-state-metrics cannot be built here (the Go module proxy this machine reaches does not serve
``k8s.io/kube-state-metrics/v2``), so the drill runs this exporter in its place: it watches every Rollout of the
cluster (drills.watching.ListWatch) and serves, on 127.0.0.1, exactly the samples kube-state-metrics' custom-
resource-state metrics give with the config the rules need (drills.alerts.metrics.KSM_CONFIG), read from each
Rollout's status as it changes.  Its metrics say ``stand-in`` in their HELP text, and ``drills_standin_info`` names
what it stands in for.  It is a thread of the drill's own process: it ends with it.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kubernetes import client

from ..wait import WaitTimeout, until
from ..watching import ListWatch
from .metrics import GROUP, KSM_CONFIG, VERSION, exposition, ksm_samples

NOTE = "(drills stand-in for kube-state-metrics custom-resource-state metrics)"
INFO = ('# HELP drills_standin_info What this exporter stands in for.\n# TYPE drills_standin_info gauge\n'
        'drills_standin_info{stands_in_for="kube-state-metrics custom-resource-state"} 1\n')


class StandIn:
    def __init__(self, api: client.ApiClient, config: dict = KSM_CONFIG, log=None):
        self.config = config
        self.log = log or (lambda m: None)
        self.rollouts: dict[tuple[str, str], dict] = {}
        self.lock = threading.Lock()
        self.listed = threading.Event()
        self.errors: list[str] = []
        co = client.CustomObjectsApi(api)
        self.lw = ListWatch(co.list_cluster_custom_object, GROUP, VERSION, "rollouts", timeout_seconds=120)
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = standin.metrics().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.hostport = f"127.0.0.1:{self.port}"
        self._threads: list[threading.Thread] = []

    # --- the watch -----------------------------------------------------------------------------------------
    def _key(self, o: dict) -> tuple[str, str]:
        md = o.get("metadata") or {}
        return md.get("namespace", ""), md.get("name", "")

    def _watch(self) -> None:
        def on_list(items, rv, relisted):
            with self.lock:
                self.rollouts = {self._key(o): o for o in items}
            self.listed.set()

        def on_event(etype, o):
            with self.lock:
                if etype == "DELETED":
                    self.rollouts.pop(self._key(o), None)
                else:
                    self.rollouts[self._key(o)] = o
        while not self.lw.stopped.is_set():
            try:
                self.lw.run(on_list, on_event)
            except Exception as e:          # said, then listed again: a sample is never older than the watch
                self.errors.append(str(e)[:200])
                self.log(f"stand-in: Rollout watch restarted: {e}")
                self.lw.resource_version = None
                self.lw.stopped.wait(0.2)

    def metrics(self) -> str:
        with self.lock:
            objs = list(self.rollouts.values())
        samples = []
        for o in objs:
            o = dict(o, apiVersion=o.get("apiVersion", f"{GROUP}/{VERSION}"), kind=o.get("kind", "Rollout"))
            samples += ksm_samples(o, self.config)
        return INFO + exposition(samples, NOTE)

    # --- life ---------------------------------------------------------------------------------------------
    def start(self, timeout: float = 15.0) -> "StandIn":
        for target in (self._watch, self.server.serve_forever):
            t = threading.Thread(target=target, daemon=True, name=f"standin-{target.__name__}")
            t.start()
            self._threads.append(t)
        try:
            until("the stand-in's first list of the Rollouts", self.listed.is_set, timeout=timeout, interval=0.05)
        except WaitTimeout as e:
            self.stop()
            raise RuntimeError(f"stand-in: {e} {self.errors[-1:]}") from None
        return self

    def stop(self) -> None:
        self.lw.stop()
        if self._threads:                    # serve_forever runs: shutdown() waits for it to return
            self.server.shutdown()
            self._threads = []
        self.server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
