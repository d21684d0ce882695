"""drills.traffic.load: real Locust (subprocess) against a loopback server started here, bounded to a few seconds."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from drills.traffic import load
from drills.record.ledger import Ledger, read_rows
from drills.core.wait import hold_for, until

SLOW_MS = 80


class _Switching(ThreadingHTTPServer):
    """Answers 200 at once until ``switch_at`` (wall time), then 503 after SLOW_MS."""
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.switch_at: float | None = None
        self.hits = 0
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def do_GET(self):
        srv = self.server
        now = time.time()
        with srv.lock:
            srv.hits += 1
            if srv.switch_at is None:
                srv.switch_at = now + 2.0
            failing = now >= srv.switch_at
        if failing:
            time.sleep(SLOW_MS / 1000)
        body = b"down\n" if failing else b"ok\n"
        self.send_response(503 if failing else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server():
    srv = _Switching()
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_locust_run_per_phase_stats_and_ledger_rows(server, tmp_path):
    users, rate, run_time = 4, 10.0, 5
    url = f"http://127.0.0.1:{server.server_address[1]}"
    run = load.run_load(url, tmp_path / "load", users=users, spawn_rate=users, run_time_s=run_time,
                        rate_per_user=rate)
    # Stopped by itself at its run time (no signal needed), and kept Locust's own outputs.
    assert run.stop_outcome == load.EXITED and not run.killed, run.log.read_text()[-2000:]
    for f in (run.html, tmp_path / "load" / "load_stats.csv", tmp_path / "load" / "load_stats_history.csv",
              run.json):
        assert f.is_file() and f.stat().st_size > 0, f

    recs = run.records()
    assert recs, run.log.read_text()[-2000:]
    assert {"t", "ms", "code", "ok"} <= set(recs[0])
    # The rate bound holds: constant throughput per user (plus one request per user at start).
    assert len(recs) <= users * rate * run_time * 1.1 + users, len(recs)
    assert len(recs) == server.hits

    sw = server.switch_at
    phases = {"steady": (min(r["t"] for r in recs), sw - 0.05),
              "exposure": (sw + 0.05, max(r["t"] for r in recs) + 1),
              "empty": (sw - 100, sw - 99)}
    st = load.phase_stats(recs, phases)
    steady, exposure = st["steady"], st["exposure"]
    assert steady["requests"] >= 20 and exposure["requests"] >= 20, st
    assert steady["failures"] == 0 and steady["failure_ratio"] == 0.0, st
    assert exposure["failure_ratio"] == 1.0 and exposure["codes"] == {"503": exposure["requests"]}, st
    assert steady["p50_ms"] < SLOW_MS <= exposure["p50_ms"] <= exposure["p95_ms"], st
    assert st["empty"] == {**st["empty"], "requests": 0, "failure_ratio": None, "p95_ms": None}

    ledger = Ledger(tmp_path / "run", "r1", "embedded", "v1.8.2")
    th = {"defaults": {"*": {"failure_ratio": {"max": 0.01}, "p95_ms": {"max": 300}}},
          "lanes": {"a": {"before": {"exposure": {"failure_ratio": {"min": 0.5}}}}}}
    rows = load.record_phase_rows(ledger, "a", "before", st, th, evidence=run.records_path)
    by = {r["assertion"]: r for r in rows}
    assert by["load.steady.failure_ratio"]["verdict"] == "pass"
    assert by["load.exposure.failure_ratio"]["verdict"] == "pass"          # min 0.5: failures expected
    assert by["load.exposure.p95_ms"]["verdict"] == "pass"
    assert by["load.empty.failure_ratio"]["verdict"] == "inconclusive"
    assert by["load.empty.failure_ratio"]["reason"]
    rows_after = load.record_phase_rows(ledger, "a", "after", {"exposure": exposure}, th, evidence=run.records_path)
    assert rows_after[0]["verdict"] == "fail" and rows_after[0]["observed"] == 1.0
    assert rows_after[0]["expected"] == "<= 0.01"
    assert len(read_rows(ledger.path)) == len(rows) + len(rows_after)


def test_stop_ends_a_long_run_early_and_keeps_outputs(server, tmp_path, monkeypatch):
    # what is tested is that the stop request alone ends the run with its outputs written: a machine whose cores
    # are shared may take Locust longer than the product's grace to write them, so this run gets a longer one
    monkeypatch.setattr(load, "KILL_GRACE_S", 180.0)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    run = load.start_load(url, tmp_path, users=2, spawn_rate=2, run_time_s=120, rate_per_user=5, name="early")
    until("Locust's first records", run.records, bool, 30, interval=0.2)
    asked = time.time()
    run.stop()
    # the stop request was enough: Locust stopped its users, said so, and wrote its own summaries
    assert run.stop_outcome == load.STOPPED, run.log.read_text()[-2000:]
    assert not run.running()
    stopped = run.users_stopped_at()
    assert stopped is not None and asked <= stopped <= run.ended_at, (asked, stopped, run.ended_at)
    assert max(r["end"] for r in run.records()) <= stopped
    assert run.records() and (tmp_path / "early_stats.csv").is_file()
    assert set(run.summary_files()) == {tmp_path / "early_stats.csv", run.html, run.json}
    n = len(run.records())
    hold_for(0.5, "no request after the stop")
    assert len(run.records()) == n


def test_a_locust_that_does_not_stop_on_sigint_is_killed_and_its_open_phase_is_inconclusive(server, tmp_path):
    """A Locust that cannot act on SIGINT (here: stopped with SIGSTOP, so neither SIGINT nor SIGTERM is acted on)
    is killed; its per-request records stay, its own summaries are missing, and the phase still open at the stop
    (its requests in flight are lost) is inconclusive naming why, while a phase that ended long before is judged."""
    import os
    import signal
    url = f"http://127.0.0.1:{server.server_address[1]}"
    run = load.start_load(url, tmp_path, users=2, spawn_rate=2, run_time_s=120, rate_per_user=5, name="stuck")
    until("Locust's first records", run.records, bool, 30, interval=0.2)
    hold_for(1.0, "a second of load for the first phase")
    os.killpg(run.pid, signal.SIGSTOP)
    run.stop()
    assert run.stop_outcome == load.KILLED and run.killed
    assert not run.running() and run.summary_files() == []
    assert not run.html.exists() and not run.json.exists()       # written by Locust only when it ends cleanly
    recs = run.records()
    assert recs
    first = min(r["t"] for r in recs)
    phases = {"early": (first - 60.0, first - 30.0), "open": (first, run.ended_at)}
    stats = load.phase_stats(recs, phases)
    load.mark_cut_short(stats, phases, run)
    assert "cut_short" not in stats["early"]
    assert "was killed" in stats["open"]["cut_short"] and str(run.log) in stats["open"]["cut_short"]
    ledger = Ledger(tmp_path / "run", "r1", target="embedded", controller_version="v1.8.2")
    th = {"defaults": {"*": {"failure_ratio": {"max": 1.0}, "p95_ms": {"max": 100000}}}}
    rows = load.record_phase_rows(ledger, "a", "before", {"open": stats["open"]}, th, run.records_path, min_requests=1)
    assert {r["verdict"] for r in rows} == {"inconclusive"}
    assert all("was killed" in r["reason"] for r in rows), rows


HANGS_AT_QUIT = """
import time

from locust import events

exec(open({drill!r}).read())
HANG_S = 3600                       # longer than any grace: the drill must signal it


@events.quitting.add_listener
def _hang(environment, **kw):       # a Locust stuck after its users stopped (writing its summaries, say)
    time.sleep(HANG_S)              # gevent's sleep (Locust patches time): its signal handlers still run
"""


def test_a_locust_stuck_after_its_users_stopped_is_killed_and_loses_no_request(server, tmp_path, monkeypatch):
    """Locust stops its users on the stop request and says so, then hangs before it exits: it is signalled after
    the grace, its own summaries are missing, and yet no phase is cut short, since no request was in flight at the
    signal: its records are all there is and all there was."""
    monkeypatch.setattr(load, "KILL_GRACE_S", 3.0)
    locustfile = tmp_path / "hangs_at_quit.py"
    locustfile.write_text(HANGS_AT_QUIT.format(drill=str(load.locustfile_path())))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    run = load.start_load(url, tmp_path / "out", users=2, spawn_rate=2, run_time_s=120, rate_per_user=5,
                          name="hangs", locustfile=str(locustfile))
    until("Locust's first records", run.records, bool, 30, interval=0.2)
    run.stop()
    assert run.stop_outcome in (load.TERMINATED, load.KILLED), (run.stop_outcome, run.log.read_text()[-2000:])
    assert run.summary_files() == []
    stopped = run.users_stopped_at()
    assert stopped is not None and run.stop_requested_at <= stopped < run.signalled_at, \
        (run.stop_requested_at, stopped, run.signalled_at, run.log.read_text()[-2000:])
    recs = run.records()
    assert recs and max(r["end"] for r in recs) <= stopped
    phases = {"open": (min(r["t"] for r in recs), run.ended_at)}
    stats = load.phase_stats(recs, phases)
    load.mark_cut_short(stats, phases, run)
    assert "cut_short" not in stats["open"], stats["open"]
    assert stats["open"]["requests"] == len(recs)


SLOW_ANSWER_S = 3.0       # the slow server's answer time: longer than the stop's grace in the test that uses it


class _Slow(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        with self.server.lock:
            self.server.hits += 1
        time.sleep(SLOW_ANSWER_S)           # the server's own slowness, not a wait of the test
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture
def slow_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    srv.daemon_threads, srv.hits, srv.lock = True, 0, threading.Lock()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_users_that_stop_only_after_the_signal_leave_the_open_phase_cut_short(slow_server, tmp_path, monkeypatch):
    """A request in flight when the grace runs out (the server answers in 3 s, the grace is 0.5 s): Locust is
    signalled while its user is still in the request, so the users stop after the signal, not before it, and the
    phase open at the signal is cut short whatever Locust writes on its way out."""
    monkeypatch.setattr(load, "KILL_GRACE_S", 0.5)
    url = f"http://127.0.0.1:{slow_server.server_address[1]}"
    run = load.start_load(url, tmp_path, users=1, spawn_rate=1, run_time_s=120, rate_per_user=5, name="slow")
    until("a first answer, then a request in flight", lambda: bool(run.records()) and slow_server.hits >= 2,
          timeout=60, interval=0.1)
    run.stop()
    assert run.stop_outcome in (load.TERMINATED, load.KILLED), run.log.read_text()[-2000:]
    stopped = run.users_stopped_at()
    assert stopped is None or stopped >= run.signalled_at, (stopped, run.signalled_at)
    recs = run.records()
    phases = {"open": (min(r["t"] for r in recs), run.ended_at)}
    stats = load.phase_stats(recs, phases)
    load.mark_cut_short(stats, phases, run)
    assert "in flight at the signal" in stats["open"].get("cut_short", ""), stats["open"]


def test_users_stopped_by_their_run_time_leave_a_later_phase_cut_short(server, tmp_path):
    """Locust's own run time (2 s) ends the users long before the drill's phase ends, and Locust then hangs on its
    way out (so it is still running when the drill stops it): the phase is cut short, it has no load for its end."""
    locustfile = tmp_path / "hangs_at_quit.py"
    locustfile.write_text(HANGS_AT_QUIT.format(drill=str(load.locustfile_path())))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    run = load.start_load(url, tmp_path / "out", users=2, spawn_rate=2, run_time_s=2, rate_per_user=5,
                          name="short", locustfile=str(locustfile))
    until("the users to stop at the run time", run.users_stopped_at, timeout=60, interval=0.2)
    first = min(r["t"] for r in run.records())
    phases = {"early": (first, first + 1.0), "long": (first, run.users_stopped_at() + 5.0)}
    assert run.running()
    run.stop()
    stats = load.phase_stats(run.records(), phases)
    load.mark_cut_short(stats, phases, run)
    assert "cut_short" not in stats["early"], stats["early"]
    assert "its run time ran out" in stats["long"]["cut_short"], stats["long"]


def test_a_garbled_users_stopped_file_reads_as_unknown(server, tmp_path):
    url = f"http://127.0.0.1:{server.server_address[1]}"
    run = load.start_load(url, tmp_path, users=1, spawn_rate=1, run_time_s=120, rate_per_user=1, name="g")
    try:
        for text in ("[" * 4096, '{"users_stopped_at": ' + "9" * 4000 + "}", '{"users_stopped_at": 0}',
                     '{"users_stopped_at": true}', '{"users_stopped_at": NaN}', "[1]", '"x"',
                     '{"users_stopped_at": %f}' % (time.time() + 3600)):
            run.stopped_file.write_text(text)
            assert run.users_stopped_at() is None, text[:40]
        run.stopped_file.write_text('{"users_stopped_at": %f}' % time.time())
        assert run.users_stopped_at() is not None
    finally:
        run.stop()


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "", "x" * 300])
def test_a_run_name_that_is_not_a_plain_name_is_refused_before_anything_is_written(name, tmp_path):
    with pytest.raises(load.LoadRefused, match="not a plain name"):
        load.start_load("http://127.0.0.1:9", tmp_path / "out", name=name)
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_locustfile_path_with_a_comma_is_refused(tmp_path):
    f = tmp_path / "a,b.py"
    f.write_text("")
    with pytest.raises(load.LoadRefused, match="may not contain ','"):
        load.start_load("http://127.0.0.1:9", tmp_path / "out", locustfile=str(f))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("url", ["http://10.0.0.1:8080", "http://192.168.1.10/", "http://[::1]:80",
                                 "http://0.0.0.0:80", "ftp://127.0.0.1/"])
def test_non_loopback_target_is_refused_before_anything_starts(url, tmp_path):
    with pytest.raises(load.LoadRefused, match="refusing|not an http"):
        load.start_load(url, tmp_path / "x", run_time_s=1)
    assert not (tmp_path / "x").exists()


def test_live_target_is_accepted_and_bounds_still_hold(tmp_path):
    assert load.check_target("https://stage.example.internal/", target="kubeconfig")
    with pytest.raises(load.LoadRefused, match="users"):
        load.LoadSpec("http://127.0.0.1:1", tmp_path, users=load.MAX_USERS + 1).validate()
    with pytest.raises(load.LoadRefused, match="total rate"):
        load.LoadSpec("http://127.0.0.1:1", tmp_path, users=20, rate_per_user=50).validate()


def test_percentile_and_phase_assignment_on_known_records():
    recs = [{"t": 10.0 + i * 0.1, "ms": float(i + 1), "code": 200 if i % 4 else 503, "ok": bool(i % 4)}
            for i in range(100)]
    st = load.phase_stats(recs, {"a": (10.0, 15.0), "b": (15.0, 20.0)})
    assert st["a"]["requests"] + st["b"]["requests"] == 100
    assert st["a"]["requests"] == 50 and st["a"]["failures"] == 13
    assert st["a"]["p50_ms"] == 25.0 and st["a"]["p95_ms"] == 48.0
    assert load.percentile([5.0], 95) == 5.0 and load.percentile([], 50) is None
    with pytest.raises(ValueError):
        load.phase_stats(recs, {"bad": (2.0, 1.0)})


def test_thresholds_fixture_is_consistent_with_lane_a():
    th = load.load_thresholds()
    assert load.threshold_for(th, "a", "before", "exposure", "failure_ratio") == {"min": 0.02}
    assert load.threshold_for(th, "a", "after", "exposure", "failure_ratio")["max"] <= 0.01
    assert load.threshold_for(th, "a", "before", "steady", "p95_ms") == {"max": 300}
    assert json.dumps(th)  # plain data


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connections are refused)."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_phase_without_a_successful_request_is_inconclusive_naming_the_url(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/"
    run = load.run_load(url, tmp_path / "load", users=2, spawn_rate=2, run_time_s=3, rate_per_user=10,
                        target="live")
    recs = run.records()
    assert recs and not any(r["ok"] for r in recs), run.log.read_text()[-2000:]
    t0, t1 = min(r["t"] for r in recs), max(r["t"] for r in recs) + 0.001
    mid = (t0 + t1) / 2
    st = load.phase_stats(recs, {"steady": (t0, mid), "exposure": (mid, t1)})
    assert all(s["failure_ratio"] == 1.0 for s in st.values()), st
    ledger = Ledger(tmp_path / "run", "r1", "stage", "v1.8.2")
    # live: every phase with no successful request is no evidence, whatever the thresholds say
    rows = load.record_phase_rows(ledger, "a", "before", st, {}, evidence=run.records_path, emulated=False, url=url)
    assert len(rows) == 4 and {r["verdict"] for r in rows} == {"inconclusive"}, rows
    assert all(url in r["reason"] and "no request" in r["reason"] for r in rows), rows
    # the emulated mesh never reached in any phase of the step: no evidence either
    th = {"defaults": {"*": {"failure_ratio": {"max": 0.01}, "p95_ms": {"max": 300}}},
          "lanes": {"a": {"before": {"exposure": {"failure_ratio": {"min": 0.5}}}}}}
    rows = load.record_phase_rows(ledger, "a", "before", st, th, evidence=run.records_path, url=url)
    assert {r["verdict"] for r in rows} == {"inconclusive"} and all(url in r["reason"] for r in rows), rows


def test_live_figures_of_a_reached_service_stay_observations_with_a_reason(tmp_path):
    st = {"steady": {"requests": 40, "failures": 0, "failure_ratio": 0.0, "p50_ms": 3.0, "p95_ms": 5.0,
                     "codes": {"200": 40}, "window": [0, 5]},
          "exposure": {"requests": 30, "failures": 30, "failure_ratio": 1.0, "p50_ms": 3.0, "p95_ms": 5.0,
                       "codes": {"503": 30}, "window": [5, 8]}}
    ledger = Ledger(tmp_path / "run", "r1", "stage", "v1.8.2")
    rows = load.record_phase_rows(ledger, "a", "before", st, {}, evidence="l.jsonl", emulated=False,
                                  url="http://stage.example/")
    by = {r["assertion"]: r for r in rows}
    assert by["load.steady.failure_ratio"]["verdict"] == "unverified" and by["load.steady.failure_ratio"]["reason"]
    # a live phase where every request failed (503s included) is no evidence of the drill's effect
    assert by["load.exposure.failure_ratio"]["verdict"] == "inconclusive"
    assert "http://stage.example/" in by["load.exposure.failure_ratio"]["reason"]
    # on the emulated mesh a phase of failures beside a reached steady phase is the figure the thresholds ask for
    th = {"lanes": {"a": {"before": {"exposure": {"failure_ratio": {"min": 0.5}}}}}}
    rows = load.record_phase_rows(ledger, "a", "before", st, th, evidence="l.jsonl", url="http://127.0.0.1:9/")
    by = {r["assertion"]: r for r in rows}
    assert by["load.exposure.failure_ratio"]["verdict"] == "pass"
