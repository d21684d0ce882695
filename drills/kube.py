"""Kubernetes clients for every part of drills: kubeconfig resolution as kubectl does it, a timeout on every
request, bounded retries where a retry is safe, and API failures said in one line.

- Every request carries a connect and a read timeout (``DRILLS_REQUEST_TIMEOUT`` = read seconds, default 15;
  connect 5 s).  A watch gets its own read timeout: its server-side ``timeoutSeconds`` plus a grace, so a
  silent API server ends a watch instead of hanging it.
- Connection errors are retried twice by the HTTP pool (nothing was sent); a read that timed out is never
  retried there, because a mutating request may have been applied.  Reads that are safe to repeat use
  ``read_retry`` (tenacity).
- ``describe`` turns any failure of a request (unreachable server, TLS, 401/403/500, timeouts) into one line.
"""
from __future__ import annotations

import os
import socket
import ssl
from pathlib import Path

import urllib3
from kubernetes import client
from kubernetes import config as kconfig
from kubernetes.client.rest import ApiException
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from .errors import BadInput, Unreachable

CONNECT_TIMEOUT = 5.0
WATCH_GRACE = 15.0
WATCH_DEFAULT_READ = 330.0


def read_timeout() -> float:
    try:
        v = float(os.environ.get("DRILLS_REQUEST_TIMEOUT", "15"))
    except ValueError:
        v = 15.0
    return v if 0 < v < 3600 else 15.0


class KubeClient(client.ApiClient):
    """An ApiClient whose requests always carry a (connect, read) timeout."""

    def request(self, method, url, query_params=None, headers=None, post_params=None, body=None,
                _preload_content=True, _request_timeout=None):
        if _request_timeout is None:
            _request_timeout = default_timeout(query_params)
        return super().request(method, url, query_params=query_params, headers=headers, post_params=post_params,
                               body=body, _preload_content=_preload_content, _request_timeout=_request_timeout)


def default_timeout(query_params) -> tuple[float, float]:
    qp = dict(query_params or [])
    if str(qp.get("watch")).lower() == "true":
        ts = qp.get("timeoutSeconds")
        try:
            read = float(ts) + WATCH_GRACE if ts else WATCH_DEFAULT_READ
        except (TypeError, ValueError):
            read = WATCH_DEFAULT_READ
        return CONNECT_TIMEOUT, read
    return CONNECT_TIMEOUT, read_timeout()


# --- kubeconfig ---------------------------------------------------------------------------------------
def resolve_kubeconfig(path: str | None, context: str | None) -> tuple[str, str]:
    """As kubectl: --kubeconfig, else the first file of $KUBECONFIG, else ~/.kube/config; --context, else the
    current context.  Raises BadInput naming what is missing."""
    env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    kc = path or next((p for p in env if Path(p).exists()), None) or (env[0] if env else None) \
        or str(Path.home() / ".kube" / "config")
    if not Path(kc).is_file():
        raise BadInput(f"kubeconfig {kc} does not exist")
    try:
        contexts, current = kconfig.list_kube_config_contexts(config_file=kc)
    except Exception as e:   # the loader raises many kinds for a malformed file
        raise BadInput(f"kubeconfig {kc}: {_one_line(e)}") from None
    names = [c["name"] for c in contexts or []]
    ctx = context or (current or {}).get("name")
    if ctx not in names:
        raise BadInput(f"context {ctx!r} is not in {kc} (contexts: {', '.join(names) or 'none'})")
    entry = next(c for c in contexts if c["name"] == ctx)
    if not (entry.get("context") or {}).get("user"):
        raise BadInput(f"context {ctx!r} in {kc} names no user: kubectl could not authenticate with it either")
    return kc, ctx


USER_AGENT = "drills/0.1"


def new_client(kubeconfig: str | Path, context: str | None = None, agent: str = USER_AGENT) -> KubeClient:
    """A client for one kubeconfig context, saying who it is (``agent``: the apiserver's audit log tells the
    drill's own requests from the releaser's and the controllers'); BadInput (exit 2) when the kubeconfig cannot
    be loaded."""
    cfg = client.Configuration()
    try:
        kconfig.load_kube_config(config_file=str(kubeconfig), context=context, client_configuration=cfg,
                                 persist_config=False)
    except Exception as e:   # bad CA data, missing user, failing exec plugin, malformed file ...
        where = f"kubeconfig {kubeconfig}" + (f" context {context!r}" if context else "")
        raise Unreachable(f"{where}: cannot load it: {_one_line(e)}") from None
    cfg.retries = urllib3.Retry(total=2, connect=2, read=0, status=0, other=0, backoff_factor=0.2,
                                raise_on_status=False)
    api = KubeClient(configuration=cfg)
    api.user_agent = agent
    return api


# --- failures in one line -----------------------------------------------------------------------------
def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:300] + "…") if len(text) > 300 else (text or type(e).__name__)


def is_connection_error(e: BaseException) -> bool:
    return isinstance(e, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, socket.timeout, ssl.SSLError,
                          OSError)) and not isinstance(e, ApiException)


def describe(e: BaseException, server: str | None = None, what: str = "the request") -> str:
    """One line for a failed request."""
    at = f" at {server}" if server else ""
    if isinstance(e, ApiException):
        reason = (e.reason or "").strip()
        if e.status == 0:
            return f"{what}: no answer from the API server{at} ({reason or 'connection failed'})"
        if e.status == 401:
            return (f"{what}: the API server{at} refused the credentials (401 Unauthorized): the kubeconfig's "
                    f"user could not authenticate (expired token, failing exec plugin?)")
        if e.status == 403:
            return f"{what}: forbidden (403){at}: the kubeconfig's user lacks the permission ({_body_message(e)})"
        return f"{what}: the API server{at} answered {e.status} {reason} ({_body_message(e)})"
    if isinstance(e, urllib3.exceptions.MaxRetryError):
        e = e.reason or e
    if isinstance(e, (urllib3.exceptions.ReadTimeoutError, socket.timeout, TimeoutError)):
        return f"{what}: the API server{at} did not answer within {read_timeout():.0f}s"
    if isinstance(e, (urllib3.exceptions.SSLError, ssl.SSLError)):
        return f"{what}: TLS with the API server{at} failed: {_one_line(e)}"
    if isinstance(e, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError,
                      ConnectionError)):
        return f"{what}: cannot reach the API server{at}: {_one_line(e)}"
    return f"{what}: {type(e).__name__}: {_one_line(e)}"


def _body_message(e: ApiException) -> str:
    import json
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason or "").strip()[:200]
    except (ValueError, AttributeError):
        return str(e.body or e.reason or "")[:200].strip()


def server_of(api: client.ApiClient) -> str | None:
    return getattr(api.configuration, "host", None)


def unreachable(e: BaseException, api: client.ApiClient | None = None, what: str = "the request") -> Unreachable:
    return Unreachable(describe(e, server_of(api) if api is not None else None, what))


def transient(e: BaseException) -> bool:
    """A failure worth repeating a read for: no answer, overload, a dropped connection."""
    if isinstance(e, ApiException):
        return e.status in (0, 429, 500, 502, 503, 504)
    return is_connection_error(e)


def conflict_retry(attempts: int = 5):
    """Retry a write that lost a resourceVersion race (409 Conflict), recomputed each time."""
    return retry(retry=retry_if_exception(lambda e: isinstance(e, ApiException) and e.status == 409),
                 stop=stop_after_attempt(attempts), wait=wait_exponential(multiplier=0.05, max=0.5), reraise=True)


read_retry = retry(retry=retry_if_exception(transient), stop=stop_after_attempt(4),
                   wait=wait_exponential(multiplier=0.2, max=2), reraise=True)


def check_reachable(api: client.ApiClient, what: str = "reading the API server's version") -> None:
    """One cheap read; Unreachable with one line when it fails (before anything is mutated)."""
    try:
        client.VersionApi(api).get_code()
    except Exception as e:
        if isinstance(e, BadInput):
            raise
        raise unreachable(e, api, what) from None
