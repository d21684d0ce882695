"""Kubeconfigs handled as kubectl handles them (drills.kube.kubeconfig): exec credential plugins under the request
timeout and dying with the command, a failing plugin an error before any request, proxy-url honoured, an unset
current-context and a context whose user is missing refused, KUBECONFIG lists merged with the first file winning.
Small servers on 127.0.0.1 stand in for API servers and a proxy; the proxy test also runs through the real
apiserver of the embedded cluster."""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from drills.kube import kubeconfig
from drills.core.errors import BadInput
from drills.core.procs import pid_alive
from drills.core.wait import until

ROOT = Path(__file__).resolve().parent.parent
EXEC_API = "client.authentication.k8s.io/v1beta1"


class ListServer:
    """An API server that answers every GET with an empty list and records who asked for what."""

    def __init__(self):
        self.requests: list[tuple[str, str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.requests.append((self.command, self.path, dict(self.headers)))
                body = json.dumps({"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Proxy:
    """An HTTP proxy on 127.0.0.1: forwards plain requests (absolute URLs) and tunnels CONNECT; counts both."""

    def __init__(self):
        self.seen: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_CONNECT(self):
                outer.seen.append(f"CONNECT {self.path}")
                host, port = self.path.rsplit(":", 1)
                upstream = socket.create_connection((host, int(port)), timeout=10)
                self.send_response(200, "Connection established")
                self.end_headers()
                socks = [self.connection, upstream]
                while True:
                    ready, _, _ = select.select(socks, [], [], 10)
                    if not ready:
                        break
                    for s in ready:
                        data = s.recv(65536)
                        if not data:
                            upstream.close()
                            return
                        (upstream if s is self.connection else self.connection).sendall(data)

            def do_GET(self):
                outer.seen.append(f"GET {self.path}")
                import urllib.request
                req = urllib.request.Request(self.path, headers={k: v for k, v in self.headers.items()
                                                                 if k.lower() not in ("host", "proxy-connection")})
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10) as r:
                    body = r.read()
                    self.send_response(r.status)
                    self.send_header("Content-Type", r.headers.get("Content-Type", "application/json"))
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def list_server():
    made = []

    def make() -> ListServer:
        made.append(ListServer())
        return made[-1]
    yield make
    for s in made:
        s.close()


def config_doc(server: str, context: str = "stage", user: dict | None = None, current: str | None = "stage",
               cluster_name: str = "c", user_name: str = "u", cluster_extra: dict | None = None) -> dict:
    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": cluster_name, "cluster": {"server": server, **(cluster_extra or {})}}],
           "contexts": [{"name": context, "context": {"cluster": cluster_name, "user": user_name}}],
           "users": [{"name": user_name, "user": user if user is not None else {"token": "t"}}]}
    if current is not None:
        doc["current-context"] = current
    return doc


def write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def drills(*args, tmp: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    e = dict(os.environ, DRILLS_REPORTS=str(tmp / "reports"), DRILLS_CONFIG=str(tmp / "none.yaml"),
             PYTHONPATH=str(ROOT))
    e.pop("KUBECONFIG", None)
    e.update(env or {})
    if args and args[0] == "scan" and "--fail-on" not in args:
        args = (*args, "--fail-on", "none", "--allow-empty")   # what is tested here is not the scan's gate
    return subprocess.run([sys.executable, "-m", "drills", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=tmp)


def one_line(r, code: int = 2) -> str:
    assert r.returncode == code, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("drills: "), r.stderr
    return lines[0]


def hanging_plugin(tmp: Path) -> tuple[Path, Path]:
    """A plugin that starts a child of its own and never answers; it writes both pids."""
    pids = tmp / "plugin.pids"
    script = tmp / "hang-plugin.sh"
    script.write_text(f"#!/bin/sh\necho $$ >> {pids}\nsleep 600 &\necho $! >> {pids}\nwait\n")
    script.chmod(0o755)
    return script, pids


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


# --- exec credential plugins ------------------------------------------------------------------------------------------
def test_a_hanging_exec_plugin_ends_the_command_at_the_request_timeout_and_leaves_no_process(tmp_path, list_server):
    srv = list_server()
    script, pids = hanging_plugin(tmp_path)
    kc = write(tmp_path / "kc", config_doc(srv.url, user={"exec": {"apiVersion": EXEC_API, "command": str(script)}}))
    (tmp_path / "none.yaml").write_text("allowed_contexts: [stage]\n")
    r = drills("run", "--kubeconfig", kc, "--namespace", "n", "--rollout", "r", "--dry-run", tmp=tmp_path,
               env={"DRILLS_REQUEST_TIMEOUT": "2"})
    line = one_line(r)
    assert "exec plugin" in line and "did not answer within 2s" in line, line
    assert len(_pids(pids)) == 2 and not any(pid_alive(p) for p in _pids(pids))
    assert srv.requests == []
    r = drills("scan", "--kubeconfig", kc, tmp=tmp_path, env={"DRILLS_REQUEST_TIMEOUT": "2"})
    assert r.returncode == 2 and "did not answer within 2s" in r.stderr, r.stderr
    assert not any(pid_alive(p) for p in _pids(pids)) and srv.requests == []


def test_sigterm_while_an_exec_plugin_hangs_leaves_no_plugin_process(tmp_path, list_server):
    srv = list_server()
    script, pids = hanging_plugin(tmp_path)
    kc = write(tmp_path / "kc", config_doc(srv.url, user={"exec": {"apiVersion": EXEC_API, "command": str(script)}}))
    env = dict(os.environ, DRILLS_REPORTS=str(tmp_path / "reports"), DRILLS_CONFIG=str(tmp_path / "none.yaml"),
               PYTHONPATH=str(ROOT), DRILLS_REQUEST_TIMEOUT="300")
    proc = subprocess.Popen([sys.executable, "-m", "drills", "scan", "--kubeconfig", str(kc)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        until("the plugin and its child to start", lambda: len(_pids(pids)) == 2, timeout=60)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3 and "SIGTERM" in err and "Traceback" not in err, (proc.returncode, err)
    until("every process of the plugin to be gone", lambda: not any(pid_alive(p) for p in _pids(pids)), timeout=10)
    assert srv.requests == []


@pytest.mark.parametrize("plugin,needle", [
    ("#!/bin/sh\necho 'token expired' >&2\nexit 1\n", "failed (exit 1): token expired"),
    ("#!/bin/sh\necho not json\n", "not valid JSON"),
    ('#!/bin/sh\necho \'{"apiVersion": "' + EXEC_API + '", "kind": "ExecCredential", "status": {}}\'\n',
     "neither a token nor a client certificate"),
], ids=["fails", "garbage", "no-credential"])
def test_a_failing_exec_plugin_is_exit_2_and_no_request_goes_out_without_credentials(tmp_path, list_server, plugin,
                                                                                     needle):
    srv = list_server()
    script = tmp_path / "plugin.sh"
    script.write_text(plugin)
    script.chmod(0o755)
    kc = write(tmp_path / "kc", config_doc(srv.url, user={"exec": {"apiVersion": EXEC_API, "command": str(script)}}))
    (tmp_path / "none.yaml").write_text("allowed_contexts: [stage]\n")
    for args in (["scan", "--kubeconfig", kc],
                 ["run", "--kubeconfig", kc, "--namespace", "n", "--rollout", "r", "--dry-run"],
                 ["watch", "-n", "n", "r", "--kubeconfig", kc, "--duration", "5s", "--out", tmp_path / "w.jsonl"]):
        r = drills(*args, tmp=tmp_path)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert srv.requests == []
    assert not (tmp_path / "w.jsonl").exists()


def test_an_exec_plugin_that_answers_is_used_for_every_request(tmp_path, list_server):
    srv = list_server()
    script = tmp_path / "plugin.sh"
    script.write_text('#!/bin/sh\necho \'{"apiVersion": "' + EXEC_API + '", "kind": "ExecCredential", '
                      '"status": {"token": "from-the-plugin"}}\'\n')
    script.chmod(0o755)
    kc = write(tmp_path / "kc", config_doc(srv.url, user={"exec": {"apiVersion": EXEC_API, "command": str(script)}}))
    r = drills("scan", "--kubeconfig", kc, tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    auth = [{k.lower(): v for k, v in h.items()}.get("authorization") for _, _, h in srv.requests]
    assert auth and all(a == "Bearer from-the-plugin" for a in auth), auth


# --- proxy-url ---------------------------------------------------------------------------------------------------------
def test_proxy_url_carries_every_request(tmp_path, list_server):
    srv = list_server()
    proxy = Proxy()
    try:
        kc = write(tmp_path / "kc", config_doc(srv.url, cluster_extra={"proxy-url": proxy.url}))
        r = drills("scan", "--kubeconfig", kc, tmp=tmp_path, env={"NO_PROXY": "127.0.0.1,localhost",
                                                                  "no_proxy": "127.0.0.1,localhost"})
        assert r.returncode == 0, r.stderr
        assert srv.requests and len(proxy.seen) == len(srv.requests), (proxy.seen, srv.requests)
        assert all(s.startswith(f"GET {srv.url}/") for s in proxy.seen), proxy.seen
        doc = config_doc(srv.url, cluster_extra={"proxy-url": "socks5://127.0.0.1:1080"})
        r = drills("scan", "--kubeconfig", write(tmp_path / "socks", doc), tmp=tmp_path)
        assert r.returncode == 2 and "proxy-url socks5://127.0.0.1:1080" in r.stderr, r.stderr
    finally:
        proxy.close()


def test_proxy_url_tunnels_to_the_real_apiserver(tmp_path, cluster):
    proxy = Proxy()
    try:
        doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
        for c in doc["clusters"]:
            c["cluster"]["proxy-url"] = proxy.url
        kc = write(tmp_path / "kc", doc)
        r = drills("scan", "--kubeconfig", kc, "--json", tmp=tmp_path, env={"NO_PROXY": "127.0.0.1",
                                                                            "no_proxy": "127.0.0.1"})
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["clusters"][0]["error"] is None
        api = doc["clusters"][0]["cluster"]["server"].split("://", 1)[1]
        assert proxy.seen and all(s == f"CONNECT {api}" for s in proxy.seen), proxy.seen
    finally:
        proxy.close()


# --- contexts -------------------------------------------------------------------------------------------------------
def test_an_unset_current_context_is_refused_unless_context_is_given(tmp_path, list_server):
    srv = list_server()
    kc = write(tmp_path / "kc", config_doc(srv.url, current=""))
    line = one_line(drills("scan", "--kubeconfig", kc, tmp=tmp_path))
    assert "current-context is not set" in line and "stage" in line
    one_line(drills("scan", "--kubeconfig", write(tmp_path / "kc2", config_doc(srv.url, current=None)),
                    tmp=tmp_path))
    assert srv.requests == []
    r = drills("scan", "--kubeconfig", kc, "--context", "stage", tmp=tmp_path)
    assert r.returncode == 0 and srv.requests, r.stderr


def test_a_context_whose_user_or_cluster_is_missing_is_refused(tmp_path, list_server):
    srv = list_server()
    doc = config_doc(srv.url)
    doc["users"] = [{"name": "someone-else", "user": {"token": "t"}}]
    line = one_line(drills("scan", "--kubeconfig", write(tmp_path / "kc", doc), tmp=tmp_path))
    assert "user 'u' is not in" in line
    doc = config_doc(srv.url)
    doc["clusters"][0]["name"] = "other"
    assert "cluster 'c' is not in" in one_line(drills("scan", "--kubeconfig", write(tmp_path / "kc2", doc),
                                                          tmp=tmp_path))
    with pytest.raises(BadInput, match="user 'u' is not in"):
        d = config_doc(srv.url)
        d["users"] = []
        kubeconfig.resolve(str(write(tmp_path / "kc3", d)), "stage")
    assert srv.requests == []


def test_kubeconfig_lists_merge_as_kubectl_merges_them(tmp_path, list_server, monkeypatch):
    a_srv, b_srv = list_server(), list_server()
    a = write(tmp_path / "a.yaml", config_doc(a_srv.url, context="ctx-a", current="ctx-a", cluster_name="ca",
                                              user_name="ua"))
    b_doc = config_doc(b_srv.url, context="ctx-b", current="ctx-b", cluster_name="cb", user_name="ub")
    b_doc["contexts"].append({"name": "ctx-a", "context": {"cluster": "cb", "user": "ub"}})   # a clash: a wins
    b_doc["contexts"].append({"name": "ctx-clash", "context": {"cluster": "ca", "user": "ub"}})
    b_doc["clusters"].append({"name": "ca", "cluster": {"server": "http://127.0.0.1:9"}})     # a clash: a wins
    b = write(tmp_path / "b.yaml", b_doc)
    env = {"KUBECONFIG": f"{a}{os.pathsep}{tmp_path / 'missing.yaml'}{os.pathsep}{b}"}
    r = drills("scan", "--context", "ctx-b", "--json", tmp=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert b_srv.requests and not a_srv.requests
    assert [c["context"] for c in json.loads(r.stdout)["clusters"]] == ["ctx-b"]
    b_srv.requests.clear()
    (tmp_path / "none.yaml").write_text("allowed_contexts: [ctx-a, ctx-b]\n")
    r = drills("run", "--namespace", "n", "--rollout", "r", "--dry-run", tmp=tmp_path, env=env)
    assert a_srv.requests and not b_srv.requests, r.stderr          # the first file's current-context: ctx-a
    a_srv.requests.clear()
    r = drills("scan", "--context", "ctx-clash", tmp=tmp_path, env=env)   # cluster ca: the first file's server
    assert r.returncode == 0 and a_srv.requests and not b_srv.requests, r.stderr
    a_srv.requests.clear()
    r = drills("scan", "--all-contexts", "--json", tmp=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert [c["context"] for c in json.loads(r.stdout)["clusters"]] == ["ctx-a", "ctx-b", "ctx-clash"]
    monkeypatch.setenv("KUBECONFIG", env["KUBECONFIG"])
    assert kubeconfig.resolve(None, None) == (f"{a}{os.pathsep}{b}", "ctx-a")
    assert kubeconfig.server_of(None, "ctx-clash") == a_srv.url
