"""The load generator dying mid-drill: a live drill with --service-url (a plain HTTP service on 127.0.0.1 that the
case runs) loses its Locust while BEFORE's rollback is under way.  The drill goes on and restores; the load rows of
BEFORE's phases that Locust no longer covered are `inconclusive` naming Locust, never a pass or a figure."""
from __future__ import annotations

import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from drills.core.wait import until

pytestmark = pytest.mark.single_version


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *a):
        pass


@pytest.fixture
def service():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _locust(drill) -> list[int]:
    """The drill's running Locust processes (their command lines read now, after their exec)."""
    return drill.descendants("-m locust")


@pytest.mark.parametrize("phase", [pytest.param("before", id="locust-killed-during-before")])
def test_locust_killed_during_before(stage, service, phase):
    s = stage()
    s.hold(s.d.hash_v1)
    drill = s.live("--service-url", service)
    s.reach("before", drill)
    pids = until("the drill's Locust running", lambda: _locust(drill), timeout=60)
    for pid in pids:            # as the OOM killer would
        os.kill(pid, signal.SIGKILL)
    s.release()
    rc = drill.wait()
    assert "Traceback" not in drill.console, drill.tail()
    assert rc == 3, drill.tail()
    s.assert_restored()
    rows = [r for r in s.rows() if r["step"] == "before" and r["assertion"].startswith("load.")]
    cut = [r for r in rows if r["verdict"] == "inconclusive" and "Locust exited" in (r["reason"] or "")]
    assert cut, rows
    assert not [r for r in rows if r["verdict"] == "pass"], rows
    # the phase Locust no longer covered has no figure but the reason (steady, before the kill, may have one)
    assert all(r["assertion"].split(".")[1] != "settled" or r in cut for r in rows), rows
    s.assert_nothing_left()
