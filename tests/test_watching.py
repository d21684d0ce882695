"""The watch loop (drills.kube.watching) against a real HTTP server on 127.0.0.1 that answers as an apiserver's
watch does, except where a test makes its stream break."""
from __future__ import annotations

import http.server
import json
import threading
import time

import pytest
import urllib3

from drills.kube.watching import CORRUPT_IN_A_ROW, ListWatch, WatchGarbled


def _event(rv: int) -> bytes:
    return json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": "r", "resourceVersion": str(rv)}}}).encode()


class _Server:
    """Serves the list at rv 1 and each watch from the ``streams`` given (one per request, in order)."""

    def __init__(self, streams: list[bytes]):
        self.streams, self.asked = list(streams), []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.asked.append(self.path)
                body = (outer.streams.pop(0) if outer.streams else b"") if "watch=True" in self.path else \
                    json.dumps({"metadata": {"resourceVersion": "1"}, "items": []}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.pool = urllib3.PoolManager()

    def list_fn(self, watch=False, resource_version=None, _preload_content=False, **_):
        url = f"http://127.0.0.1:{self.httpd.server_port}/r?watch={watch}&rv={resource_version}"
        return self.pool.request("GET", url, preload_content=False, timeout=5)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("garbage", [
    pytest.param(_event(3)[:40] + b"\r\n1f4\r\n" + _event(3)[40:], id="framing-inside-a-line"),
    pytest.param(b"200", id="a-chunk-size-of-digits-alone"),       # JSON (a number), but no event
])
def test_a_stream_cut_mid_line_resumes_from_the_last_version_delivered(garbage):
    # the chunked encoding's framing in the stream: what a connection cut mid-chunk leaves
    srv = _Server([_event(2) + b"\n" + garbage + b"\n", _event(3) + b"\n" + _event(4) + b"\n"])
    seen = []
    try:
        lw = ListWatch(srv.list_fn)
        ended = lw.run(lambda items, rv, relisted: None,
                       lambda kind, obj: seen.append(obj["metadata"]["resourceVersion"]) or len(seen) == 3,
                       deadline=time.monotonic() + 60)
    finally:
        srv.close()
    assert ended and seen == ["2", "3", "4"], seen
    assert lw.reconnects == 1 and lw.corrupt == 0
    assert "rv=2" in srv.asked[-1], srv.asked        # resumed from the last version delivered, not relisted


def test_a_server_that_only_sends_lines_that_are_no_json_is_an_error_not_a_loop():
    srv = _Server([b"{not json\n"] * (CORRUPT_IN_A_ROW + 2))
    try:
        with pytest.raises(WatchGarbled, match=f"{CORRUPT_IN_A_ROW} watch streams in a row"):
            ListWatch(srv.list_fn).run(lambda *a: None, lambda *a: None, deadline=time.monotonic() + 60)
    finally:
        srv.close()


def test_a_thread_told_to_stop_leaves_a_watch_that_sends_nothing():
    # a probe run side by side (scan --verify) reads a watch stream that may stay silent for minutes: told to stop,
    # its stream is cut and the loop raises Interrupted at once, not at the stream's end
    from drills.core.signals import Interrupted, cancel_threads, forget_threads
    from drills.core.wait import until
    from drills.kube.watching import cut_watches_of
    release = threading.Event()

    class Silent(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            watching = "watch=True" in self.path
            body = b"" if watching else json.dumps({"metadata": {"resourceVersion": "1"}, "items": []}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 20 if watching else len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            if watching:
                release.wait(120)        # the stream stays open and silent

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    pool = urllib3.PoolManager()

    def list_fn(watch=False, resource_version=None, _preload_content=False, **_):
        return pool.request("GET", f"http://127.0.0.1:{httpd.server_port}/r?watch={watch}", preload_content=False,
                            timeout=urllib3.Timeout(connect=5, read=300))
    out: dict = {}

    def run() -> None:
        lw = ListWatch(list_fn)
        out["lw"] = lw
        try:
            lw.run(lambda *a: None, lambda *a: None)
            out["ended"] = "returned"
        except Interrupted as e:
            out["ended"] = str(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        until("the watch to be reading its silent stream", lambda: out.get("lw") is not None and
              out["lw"]._resp is not None, timeout=30)
        cancel_threads([t.ident], Interrupted(15))
        cut_watches_of([t.ident])
        until("the watching thread to end", lambda: not t.is_alive(), timeout=30)
    finally:
        forget_threads([t.ident])
        release.set()
        pool.clear()
        httpd.shutdown()
        httpd.server_close()
    assert out["ended"] == "interrupted by SIGTERM", out
