"""Kubeconfigs as kubectl reads them: which files, merged how, which context, checked before any request.

- Files: ``--kubeconfig FILE``, else every file of ``$KUBECONFIG`` (a list; files that do not exist are skipped),
  else ``~/.kube/config``.  Each file is read under the input budget (drills.core.inputs) and must be a mapping.
- Merge: the kubernetes client's own merger (``KubeConfigMerger``): on a name clash the first file wins; the
  current context is the first file's that sets one (as kubectl: a later file never overrides it).
- Context: ``--context``, else the current context; a current context that is empty or unset is refused (kubectl
  refuses too), and so is a context whose user or cluster is missing, or a cluster without a server.
- Exec credential plugins run under the request timeout (``DRILLS_REQUEST_TIMEOUT``), in a process group of
  their own that is killed with it on a timeout or a signal, and die with their parent; a plugin that fails,
  hangs or answers nonsense is an error (exit 2): no request ever goes out without its credentials.
- ``proxy-url`` of the cluster is honoured: every request goes through it (http and https proxies).
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..core import inputs
from ..core.errors import BadInput, Unreachable
from .lazy_client import install as serve_lazily

ENV_SEPARATOR = os.pathsep


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:300] + "…") if len(text) > 300 else (text or type(e).__name__)


def files_of(path: str | None) -> list[str]:
    """The kubeconfig files kubectl reads, in precedence order."""
    if path:
        return [path]
    env = [p for p in os.environ.get("KUBECONFIG", "").split(ENV_SEPARATOR) if p]
    if env:
        found = [p for p in env if Path(p).expanduser().exists()]
        return found or env[:1]
    return [str(Path.home() / ".kube" / "config")]


@dataclass
class Kubeconfig:
    spec: str                                   # the files, joined as KUBECONFIG joins them
    files: list[str]
    merged: object = None                       # the merger's ConfigNode
    current: str | None = None
    names: list[str] = field(default_factory=list)

    def entry(self, kind: str, name: str) -> dict | None:
        for item in self.merged.value.get(kind) or []:
            value = getattr(item, "value", item)
            if isinstance(value, dict) and value.get("name") == name:
                return value
        return None


def read(spec: str | None) -> Kubeconfig:
    """The merged kubeconfig of ``spec`` (one file or a KUBECONFIG-style list; None: as kubectl finds it)."""
    files = spec.split(ENV_SEPARATOR) if spec and ENV_SEPARATOR in spec else files_of(spec)
    files = [str(Path(f).expanduser()) for f in files if f]
    shown = ENV_SEPARATOR.join(files)
    current = None
    for f in files:
        if not Path(f).is_file():
            raise BadInput(f"kubeconfig {f} does not exist")
        try:
            doc = inputs.load_yaml_file(f, what="kubeconfig")
        except OSError as e:
            raise BadInput(f"kubeconfig {f}: cannot read it ({e.strerror or e})") from None
        if doc is None:
            raise BadInput(f"kubeconfig {f}: empty, not a kubeconfig")
        if not isinstance(doc, dict):
            raise BadInput(f"kubeconfig {f}: not a kubeconfig (a mapping with clusters, contexts and users)")
        for kind in ("clusters", "contexts", "users"):
            items = doc.get(kind)
            if items is not None and (not isinstance(items, list) or
                                      not all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items)):
                raise BadInput(f"kubeconfig {f}: {kind} must be a list of entries with a name")
        cc = doc.get("current-context")
        if current is None and isinstance(cc, str) and cc:
            current = cc
    serve_lazily()
    from kubernetes.config.kube_config import KubeConfigMerger     # the client: imported when a kubeconfig is read
    try:
        merger = KubeConfigMerger(shown)
    except Exception as e:                       # the library raises many kinds for a malformed file
        raise BadInput(f"kubeconfig {shown}: {_one_line(e)}") from None
    if merger.config is None:
        raise BadInput(f"kubeconfig {shown}: no configuration found")
    merger.config.value["current-context"] = current or ""
    kc = Kubeconfig(shown, files, merger.config, current)
    kc.names = [c["name"] for c in (getattr(i, "value", i) for i in merger.config.value.get("contexts") or [])]
    return kc


def resolve(path: str | None, context: str | None) -> tuple[str, str]:
    """(kubeconfig spec, context) as kubectl resolves them; BadInput (exit 2) naming what is missing."""
    kc = read(path)
    return kc.spec, check_context(kc, context)


def check_context(kc: Kubeconfig, context: str | None) -> str:
    ctx = context or kc.current
    if not ctx:
        raise BadInput(f"kubeconfig {kc.spec}: current-context is not set and no --context was given (kubectl "
                       f"refuses this too; contexts: {', '.join(kc.names) or 'none'})")
    if ctx not in kc.names:
        raise BadInput(f"context {ctx!r} is not in {kc.spec} (contexts: {', '.join(kc.names) or 'none'})")
    entry = kc.entry("contexts", ctx) or {}
    body = entry.get("context") if isinstance(entry.get("context"), dict) else {}
    user, cluster = body.get("user"), body.get("cluster")
    if not user:
        raise BadInput(f"context {ctx!r} in {kc.spec} names no user: kubectl could not authenticate with it either")
    if kc.entry("users", user) is None:
        raise BadInput(f"context {ctx!r} in {kc.spec}: its user {user!r} is not in the kubeconfig's users "
                       f"(kubectl refuses it too)")
    if not cluster:
        raise BadInput(f"context {ctx!r} in {kc.spec} names no cluster")
    c = kc.entry("clusters", cluster)
    if c is None:
        raise BadInput(f"context {ctx!r} in {kc.spec}: its cluster {cluster!r} is not in the kubeconfig's clusters")
    if not isinstance(c.get("cluster"), dict) or not c["cluster"].get("server"):
        raise BadInput(f"context {ctx!r} in {kc.spec}: cluster {cluster!r} has no server")
    return ctx


def contexts(path: str | None) -> tuple[str, list[str]]:
    """(kubeconfig spec, every context name) for --all-contexts."""
    kc = read(path)
    return kc.spec, list(kc.names)


def server_of(path: str | None, context: str | None) -> str | None:
    """The API server URL of a context (read from the files only: no request)."""
    kc = read(path)
    entry = kc.entry("contexts", check_context(kc, context)) or {}
    c = kc.entry("clusters", (entry.get("context") or {}).get("cluster")) or {}
    return (c.get("cluster") or {}).get("server")


# --- exec credential plugins -----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _client_classes() -> tuple[type, type]:
    """(_Exec, _Loader), made on first use: their bases are the Kubernetes client's, imported only by a command
    that reads a kubeconfig."""
    serve_lazily()
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.exec_provider import ExecProvider
    from kubernetes.config.kube_config import KubeConfigLoader

    class _Exec(ExecProvider):
        """The client's exec provider with its process run as every child of the product runs: under a timeout, in
        a process group of its own (killed with it), dying with its parent; a failure raises."""

        def __init__(self, exec_config, cwd, cluster=None, timeout: float = 15.0):
            super().__init__(exec_config, cwd, cluster)
            self.timeout = timeout

        def run(self, previous_response=None):
            from ..core.procs import run_bounded
            info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
            if previous_response:
                info["spec"]["response"] = previous_response
            if self.cluster:
                info["spec"]["cluster"] = self.cluster.value
            env = dict(self.env, KUBERNETES_EXEC_INFO=json.dumps(info))
            name = self.args[0]
            try:
                r = run_bounded(self.args, timeout=self.timeout, env=env, cwd=self.cwd)
            except subprocess.TimeoutExpired:
                raise ConfigException(f"exec plugin {name} did not answer within {self.timeout:.0f}s "
                                      f"(DRILLS_REQUEST_TIMEOUT): stopped it") from None
            except OSError as e:
                raise ConfigException(f"exec plugin {name} cannot run: {e.strerror or e}") from None
            if r.returncode != 0:
                raise ConfigException(f"exec plugin {name} failed (exit {r.returncode})"
                                      + (f": {r.stderr.strip()[-300:]}" if r.stderr.strip() else ""))
            try:
                data = inputs.load_json(r.stdout, what=f"exec plugin {name}'s answer")
            except BadInput as e:
                raise ConfigException(str(e)) from None
            if not isinstance(data, dict) or not isinstance(data.get("status"), dict):
                raise ConfigException(f"exec plugin {name} answered no ExecCredential status")
            if data.get("apiVersion") != self.api_version:
                raise ConfigException(f"exec plugin {name} answered apiVersion {data.get('apiVersion')!r}, not "
                                      f"{self.api_version}")
            return data["status"]

    class _Loader(KubeConfigLoader):
        """The client's loader, but an exec plugin that fails is an error (the library logs it and goes on without
        credentials)."""

        exec_timeout = 15.0

        def _load_from_exec_plugin(self):
            if "exec" not in self._user:
                return None
            base_path = self._get_base_path(self._cluster.path)
            status = _Exec(self._user["exec"], base_path, self._cluster, self.exec_timeout).run()
            if "token" in status:
                self.token = f"Bearer {status['token']}"
            elif "clientCertificateData" in status and "clientKeyData" in status:
                from kubernetes.config.kube_config import FileOrData
                self.cert_file = FileOrData(status, None, data_key_name="clientCertificateData", file_base_path=base_path,
                                            base64_file_content=False, temp_file_path=self._temp_file_path).as_file()
                self.key_file = FileOrData(status, None, data_key_name="clientKeyData", file_base_path=base_path,
                                           base64_file_content=False, temp_file_path=self._temp_file_path).as_file()
            else:
                raise ConfigException(f"exec plugin {self._user['exec'].safe_get('command')} answered neither a token nor "
                                      f"a client certificate and key")
            if "expirationTimestamp" in status:
                from kubernetes.config.dateutil import parse_rfc3339
                self.expiry = parse_rfc3339(status["expirationTimestamp"])
            return True

    return _Exec, _Loader


def configure(cfg, spec: str | Path, context: str | None, exec_timeout: float) -> str:
    """Fill a client Configuration from the kubeconfig (credentials, TLS, proxy); returns the context used.
    BadInput when the kubeconfig is unusable, Unreachable when its credentials cannot be had."""
    serve_lazily()
    from kubernetes.config.config_exception import ConfigException
    kc = read(str(spec))
    ctx = check_context(kc, context)
    where = f"kubeconfig {kc.spec} context {ctx!r}"
    try:
        loader = _client_classes()[1](config_dict=kc.merged, active_context=ctx, config_base_path=None)
        loader.exec_timeout = exec_timeout
        loader.load_and_set(cfg)
        proxy = loader._cluster.safe_get("proxy-url")
    except (BadInput, KeyboardInterrupt):
        raise
    except ConfigException as e:
        raise Unreachable(f"{where}: {_one_line(e)}") from None
    except Exception as e:   # bad CA data, a malformed entry ...
        raise Unreachable(f"{where}: cannot load it: {_one_line(e)}") from None
    if proxy:
        from urllib.parse import urlsplit
        scheme = urlsplit(str(proxy)).scheme
        if scheme not in ("http", "https"):
            raise BadInput(f"{where}: proxy-url {proxy}: only http and https proxies are supported here "
                           f"({scheme or 'no scheme'} given)")
        cfg.proxy = str(proxy)
        cfg.no_proxy = ""             # a proxy-url holds for every request of the context, as in kubectl
    return ctx


__all__ = ["files_of", "read", "resolve", "check_context", "contexts", "server_of", "configure"]
