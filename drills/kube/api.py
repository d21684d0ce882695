"""Kubernetes clients for every part of drills: kubeconfig resolution as kubectl does it, a timeout on every
request, bounded retries where a retry is safe, and API failures said in one line.

- Every request carries a connect and a read timeout (``DRILLS_REQUEST_TIMEOUT`` = read seconds, default 15;
  connect 5 s).  A watch gets its own read timeout: its server-side ``timeoutSeconds`` plus a grace, so a
  silent API server ends a watch instead of hanging it.
- Connection errors are retried twice by the HTTP pool (nothing was sent); a read that timed out is never
  retried there, because a mutating request may have been applied.  Reads that are safe to repeat use
  ``read_retry`` (tenacity).
- A phase such as a preflight runs under one ``deadline``: every request's timeouts are cut to what is left of it,
  so its retries happen inside it, and a request due after it raises ``DeadlinePassed`` (exit 2).
- The kubeconfig is read, merged and checked by drills.kube.kubeconfig (exec plugins under the request timeout).
- ``describe`` turns any failure of a request (unreachable server, TLS, 401/403/500, timeouts) into one line.
"""
from __future__ import annotations

import functools
import os
import socket
import ssl
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import urllib3
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential, wait_random

from . import k8s
from .k8s import client
from ..core.errors import BadInput, Unreachable

CONNECT_TIMEOUT = 5.0
WATCH_GRACE = 15.0
WATCH_DEFAULT_READ = 330.0


def read_timeout() -> float:
    try:
        v = float(os.environ.get("DRILLS_REQUEST_TIMEOUT", "15"))
    except ValueError:
        v = 15.0
    return v if 0 < v < 3600 else 15.0


class DeadlinePassed(Unreachable):
    """The deadline of a phase (a preflight) passed: no further request is sent in it."""


_phase = threading.local()


@contextmanager
def deadline(seconds: float, what: str):
    """One overall deadline for the requests of a phase in this thread (a preflight): each request's timeouts
    are cut to what is left, retries happen inside it, and a request due after it raises DeadlinePassed."""
    prev = getattr(_phase, "deadline", None)
    end = time.monotonic() + seconds
    _phase.deadline = (min(end, prev[0]) if prev else end, seconds if not prev else prev[1], what)
    try:
        yield
    finally:
        _phase.deadline = prev


def _budget(timeout: float) -> float:
    """``timeout`` cut to what is left of the phase's deadline."""
    d = getattr(_phase, "deadline", None)
    return timeout if d is None else max(0.05, min(timeout, d[0] - time.monotonic()))


def _cut(timeout, host: str | None):
    d = getattr(_phase, "deadline", None)
    if d is None:
        return timeout
    left = d[0] - time.monotonic()
    if left <= 0:
        raise DeadlinePassed(f"{d[2]}: the API server{' at ' + host if host else ''} did not answer within "
                             f"{d[1]:.0f}s (the deadline of the whole {d[2]}, DRILLS_REQUEST_TIMEOUT)")
    if isinstance(timeout, tuple):
        return tuple(min(t, left) for t in timeout)
    return min(timeout, left) if timeout else left


@functools.lru_cache(maxsize=None)
def kube_client_class() -> type:
    """KubeClient: an ApiClient whose requests always carry a (connect, read) timeout, cut to the phase's deadline
    (made on first use: its base class is the Kubernetes client's, imported only by a command that talks to a
    cluster)."""

    class KubeClient(client.ApiClient):
        def request(self, method, url, query_params=None, headers=None, post_params=None, body=None,
                    _preload_content=True, _request_timeout=None):
            if _request_timeout is None:
                _request_timeout = default_timeout(query_params)
            _request_timeout = _cut(_request_timeout, getattr(self.configuration, "host", None))
            return super().request(method, url, query_params=query_params, headers=headers,
                                   post_params=post_params, body=body, _preload_content=_preload_content,
                                   _request_timeout=_request_timeout)

    return KubeClient


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
    """As kubectl: --kubeconfig, else the files of $KUBECONFIG merged (the first file wins), else
    ~/.kube/config; --context, else the current context (refused when unset).  Raises BadInput naming what is
    missing (drills.kube.kubeconfig); nothing is run and nothing is sent."""
    from . import kubeconfig         # the client's kubeconfig loader: imported when a kubeconfig is read
    return kubeconfig.resolve(path, context)


USER_AGENT = "drills/0.1"


def new_client(kubeconfig_spec: str | Path, context: str | None = None, agent: str = USER_AGENT) -> client.ApiClient:
    """A client for one kubeconfig context, saying who it is (``agent``: the apiserver's audit log tells the
    drill's own requests from the releaser's and the controllers'); BadInput (exit 2) when the kubeconfig cannot
    be loaded or its credentials cannot be had (an exec plugin that fails or hangs past the request timeout)."""
    from . import kubeconfig
    cfg = client.Configuration()
    kubeconfig.configure(cfg, str(kubeconfig_spec), context, exec_timeout=_budget(read_timeout()))
    cfg.retries = urllib3.Retry(total=2, connect=2, read=0, status=0, other=0, backoff_factor=0.2,
                                raise_on_status=False)
    api = kube_client_class()(configuration=cfg)
    api.user_agent = agent
    return api


# --- failures in one line -----------------------------------------------------------------------------
def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:300] + "…") if len(text) > 300 else (text or type(e).__name__)


def is_connection_error(e: BaseException) -> bool:
    return isinstance(e, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, socket.timeout, ssl.SSLError,
                          OSError)) and not isinstance(e, k8s.ApiException)


def describe(e: BaseException, server: str | None = None, what: str = "the request") -> str:
    """One line for a failed request."""
    at = f" at {server}" if server else ""
    if isinstance(e, k8s.ApiException):
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


def _body_message(e: k8s.ApiException) -> str:
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
    if isinstance(e, k8s.ApiException):
        return e.status in (0, 429, 500, 502, 503, 504)
    return is_connection_error(e)


def conflict_retry(attempts: int = 5):
    """Retry a write that lost a resourceVersion race (409 Conflict), recomputed each time."""
    return retry(retry=retry_if_exception(lambda e: isinstance(e, k8s.ApiException) and e.status == 409),
                 stop=stop_after_attempt(attempts),
                 # jittered: probes side by side write the one holds ConfigMap at once, and lose to each other in step
                 wait=wait_exponential(multiplier=0.05, max=0.5) + wait_random(0, 0.05), reraise=True)


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
