"""The one watch loop of the project: list, watch from the list's resourceVersion, resume after a dropped
connection from the last resourceVersion delivered, relist when the apiserver answers 410 Gone (its history
was compacted).  The recorder, the Rollout waits, the mesh emulator and the pod releaser all use it.

Objects are plain dicts as the apiserver sent them (JSON, never deserialised into client models).
``ListWatch.run`` calls ``on_list(items, resource_version, relisted)`` after every list and
``on_event(type, obj)`` for every ADDED/MODIFIED/DELETED event; either may return True to end the loop.
``on_gap(reason)`` is told when a relist was needed.  The loop ends when a callback says so, ``stop()`` is
called (from another thread too), or ``deadline`` (a time.monotonic() value) passes.
"""
from __future__ import annotations

import json
import re
import threading
import time
import weakref
from typing import Callable

from . import k8s
from .api import transient
from ..core.signals import check_cancelled

GONE = 410
WATCH_SECONDS = 240
CORRUPT_IN_A_ROW = 5     # streams in a row whose first line is no JSON: the server's answer, not a cut


class CorruptStream(ConnectionError):
    """A watch line that is no JSON: a connection cut mid-line (a fault, or ``cut()``) can leave part of a line or
    the chunked encoding's framing in it.  The event's resourceVersion was never delivered, so resuming from the
    last one delivered replays it: a dropped connection, as long as it is not every stream's first line."""


class WatchGarbled(RuntimeError):
    """CORRUPT_IN_A_ROW streams in a row sent a line that is no JSON: the server's answer, never resumed."""


_LIVE: "weakref.WeakSet[ListWatch]" = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def cut_watches_of(idents) -> None:
    """The streams of the watches the threads ``idents`` made are cut, so a thread told to stop
    (drills.core.signals.cancel_threads) is not left reading one: its loop comes round and stops.  A watch it made
    that another thread runs (a recorder's) only resumes; a request not yet answered has no stream to cut, and the
    loop checks once it is."""
    wanted = set(idents)
    with _LIVE_LOCK:
        mine = [lw for lw in _LIVE if lw.owner in wanted]
    for lw in mine:
        lw.cut()


class ListWatch:
    def __init__(self, list_fn: Callable, *args, timeout_seconds: int = WATCH_SECONDS, **kwargs):
        self.list_fn, self.args, self.kwargs = list_fn, args, kwargs
        self.timeout_seconds = timeout_seconds
        self.stopped = threading.Event()
        self.resource_version: str | None = None
        self.reconnects = 0
        self.relists = 0
        self.corrupt = 0          # streams cut mid-line, in a row (reset by a line that decodes)
        self._resp = None
        self.owner = threading.get_ident()      # the thread that made it (cut_watches_of)
        with _LIVE_LOCK:
            _LIVE.add(self)

    # --- control ----------------------------------------------------------------------------------------
    def stop(self) -> None:
        self.stopped.set()
        self.cut()

    def cut(self) -> bool:
        """Drop the current watch connection (as a network fault would); the loop resumes by itself."""
        resp = self._resp
        if resp is None:
            return False
        try:
            resp.shutdown()
        except Exception:
            try:
                resp.close()
            except Exception:
                pass
        return True

    # --- the loop ----------------------------------------------------------------------------------------
    def list(self) -> dict:
        resp = self.list_fn(*self.args, _preload_content=False, **self.kwargs)
        return json.loads(resp.data)

    def run(self, on_list: Callable[[list, str, bool], bool | None],
            on_event: Callable[[str, dict], bool | None],
            on_gap: Callable[[str], None] | None = None, deadline: float | None = None) -> bool:
        """Returns True when a callback ended the loop, False on stop() or when the deadline passed."""
        relisted = False
        while not self.stopped.is_set():
            check_cancelled()         # a thread told to stop: the watch ends with it
            if deadline is not None and time.monotonic() >= deadline:
                return False
            try:
                if self.resource_version is None:
                    lst = self.list()
                    self.resource_version = lst["metadata"]["resourceVersion"]
                    if on_list(lst.get("items") or [], self.resource_version, relisted):
                        return True
                if self._watch_once(on_event, deadline):
                    return True
            except k8s.ApiException as e:
                if self.stopped.is_set():
                    break
                if e.status == GONE:
                    self.relists += 1
                    relisted = True
                    self.resource_version = None
                    if on_gap:
                        on_gap("410 Gone: the apiserver compacted the history; relisted")
                    continue
                if not transient(e):
                    raise
                self.reconnects += 1
                self.stopped.wait(0.2)
            except Exception as e:
                if self.stopped.is_set():
                    break
                if not transient(e) and not _dropped(e):
                    raise
                self.reconnects += 1          # resume from the last resourceVersion delivered
                self.stopped.wait(0.05)
        return False

    def _watch_once(self, on_event, deadline: float | None) -> bool:
        """One watch request, its stream read here (the client's own stream handling fails on an ERROR event when
        it does not deserialise: a 410 must reach the loop as a 410)."""
        seconds = self.timeout_seconds
        if deadline is not None:
            seconds = max(1, int(min(seconds, deadline - time.monotonic() + 1)))
        resp = self.list_fn(*self.args, watch=True, resource_version=self.resource_version,
                            allow_watch_bookmarks=True, timeout_seconds=seconds, _preload_content=False,
                            **self.kwargs)
        self._resp = resp
        try:
            check_cancelled()         # told to stop while the request was made: its stream was not there to cut
            for line in k8s.iter_resp_lines(resp):
                check_cancelled()
                if self.stopped.is_set():
                    return False
                if not line.strip():
                    continue
                try:
                    ev = json.loads(line)
                except ValueError as e:
                    raise self._garbled(f"a watch line that is no JSON ({e}): cut mid-line") from None
                if not (isinstance(ev, dict) and isinstance(ev.get("object"), dict) and "type" in ev):
                    raise self._garbled(f"a watch line that is no event: {line[:80]!r}")    # e.g. a chunk size
                self.corrupt = 0
                obj, kind = ev["object"], ev["type"]
                if kind == "ERROR":
                    raise k8s.ApiException(status=obj.get("code"), reason=obj.get("message"))
                self.resource_version = obj["metadata"]["resourceVersion"]
                if kind == "BOOKMARK":
                    continue
                if on_event(kind, obj):
                    return True
                if deadline is not None and time.monotonic() >= deadline:
                    return False
        finally:
            self._resp = None
            try:
                resp.close()
                resp.release_conn()
            except Exception:
                pass
        return False


    def _garbled(self, what: str) -> Exception:
        """A line that is no event: CorruptStream (resumed), or WatchGarbled after CORRUPT_IN_A_ROW in a row."""
        self.corrupt += 1
        if self.corrupt >= CORRUPT_IN_A_ROW:
            return WatchGarbled(f"{self.corrupt} watch streams in a row sent a line that is no event: {what}")
        return CorruptStream(what)


def _dropped(e: BaseException) -> bool:
    """A connection the server or a fault closed mid-stream (urllib3 and http.client say it in many ways)."""
    name = type(e).__name__
    if isinstance(e, CorruptStream):
        return True
    return any(k in name for k in ("Connection", "Protocol", "IncompleteRead", "ReadTimeout", "Timeout")) \
        or isinstance(e, (ValueError, AttributeError)) and re.search(r"\bclosed\b", str(e).lower()) is not None
