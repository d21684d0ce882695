"""A small stand-in API server on 127.0.0.1 that answers from a table of paths (the objects a real apiserver would
never serve: a Rollout whose steps are not objects, a list with items that are not objects, a read that answers late),
recording every request; and the kubeconfig pointing at it."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from drills.core import config

NAMESPACE_OPT_IN = {config.NAMESPACE_OPT_IN_LABEL: "true"}


def namespace(name: str, labels: dict | None = None) -> dict:
    return {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": name, "labels": labels or NAMESPACE_OPT_IN}}


def rollout_path(ns: str, name: str) -> str:
    return f"/apis/argoproj.io/v1alpha1/namespaces/{ns}/rollouts/{name}"


class StubAPI:
    """GET answers: ``routes`` path (without the query) -> JSON body, or (seconds, body) to answer that late; any other
    GET is an empty list.  Everything else is 405.  ``requests`` records (method, path) of every request."""

    def __init__(self, routes: dict | None = None):
        self.routes = dict(routes or {})
        self.requests: list[tuple[str, str]] = []
        self._stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.requests.append((self.command, self.path))
                answer = outer.routes.get(self.path.split("?", 1)[0],
                                          {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []})
                if isinstance(answer, tuple):
                    delay, answer = answer          # the fault itself: an answer that comes late
                    if outer._stop.wait(delay):         # (cut short when the server closes)
                        return
                body = json.dumps(answer).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:          # the client gave up on a late answer
                    pass

            def _refuse(self):
                outer.requests.append((self.command, self.path))
                self.send_response(405)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_PATCH = do_PUT = do_DELETE = _refuse

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def gets(self, path: str) -> int:
        return sum(1 for m, p in self.requests if m == "GET" and p.split("?", 1)[0] == path)

    @property
    def mutations(self) -> list:
        return [r for r in self.requests if r[0] != "GET"]

    def close(self):
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def kubeconfig_for(path: Path, server: str, context: str = "stage", user: dict | None = None) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "contexts": [{"name": context, "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": user if user is not None else {"token": "t"}}]}))
    return path
