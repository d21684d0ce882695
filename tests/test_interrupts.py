"""Signals and timeouts outside the drill: a signal ends every command with exit 3 and one line saying what it did
(whatever disposition the command inherited), a child it waits for goes with it, and a preflight has one deadline
with its retries inside it (no cluster needed)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from apistub import StubAPI, kubeconfig_for, namespace, rollout_path
from drills.core.procs import pid_alive
from drills.drill.safety import Journal
from drills.core.wait import until

ROOT = Path(__file__).resolve().parent.parent
ROLLOUT = """apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata: {{name: r{i}, namespace: shop}}
spec:
  replicas: 4
  rollbackWindow: {{revisions: 3}}
  template: {{metadata: {{labels: {{app: r{i}}}}}, spec: {{containers: [{{name: app, image: "img:{i}"}}]}}}}
  strategy:
    canary:
      trafficRouting: {{istio: {{virtualService: {{name: vs}}, destinationRule: {{name: dr}}}}}}
      steps: [{{setWeight: 5}}, {{pause: {{duration: 10s}}}}, {{setWeight: 100}}]
"""


def env_for(tmp: Path, **extra) -> dict:
    e = dict(os.environ, DRILLS_REPORTS=str(tmp / "reports"), DRILLS_CONFIG=str(tmp / "config.yaml"),
             PYTHONPATH=str(ROOT))
    e.pop("KUBECONFIG", None)
    e.update(extra)
    return e


def start(args, tmp: Path, stdin=None, ignore_sigint: bool = False, **env) -> subprocess.Popen:
    def preexec():
        if ignore_sigint:        # what a background job of a non-interactive shell inherits
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    return subprocess.Popen([sys.executable, "-m", "drills", *map(str, args)], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env_for(tmp, **env), cwd=tmp, preexec_fn=preexec)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def interrupted(proc, out, err, signame: str) -> str:
    assert proc.returncode == 3, (proc.returncode, out[-500:], err[-2000:])
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("drills: ") and signame in lines[-1] and "Traceback" not in err, err
    return lines[-1]


@pytest.fixture
def big_stream(tmp_path) -> Path:
    """A manifest stream of ~50 MB (a large kubectl get -o yaml): long enough to be interrupted while read."""
    one = "---\n".join(ROLLOUT.format(i=i) for i in range(200))
    path = tmp_path / "stream.yaml"
    with open(path, "w") as f:
        while f.tell() < 50_000_000:
            f.write(one + "---\n")
    return path


@pytest.mark.parametrize("ignored", [False, True], ids=["sigint", "sigint-inherited-ignored"])
def test_sigint_during_a_large_stdin_scan_ends_it_without_presenting_output(tmp_path, big_stream, ignored):
    with open(big_stream) as stdin:
        proc = start(["scan", "-", "--json"], tmp_path, stdin=stdin, ignore_sigint=ignored)
        until("the scan to read its stream", lambda: Path(f"/proc/{proc.pid}/fdinfo/0").exists() and
              int(Path(f"/proc/{proc.pid}/fdinfo/0").read_text().split()[1]) > 0, timeout=120)
        proc.send_signal(signal.SIGINT)
        out, err = finish(proc)
    interrupted(proc, out, err, "SIGINT")
    assert out == ""              # no partial result presented as the scan's answer


def test_sigterm_during_a_fleet_scan_says_it_was_interrupted(tmp_path):
    proc = start(["scan", "--fleet", ROOT / "fixtures" / "fleet"], tmp_path)
    lines: list[str] = []

    def rendering() -> bool:
        lines.append(proc.stderr.readline())
        return "fleet" in lines[-1] or proc.poll() is not None
    until("the fleet renders to start", rendering, timeout=300)
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    line = interrupted(proc, out, "".join(lines) + err, "SIGTERM")
    assert "interrupted" in line and out == ""


def _hanging_binary(tmp: Path) -> tuple[Path, Path]:
    pids = tmp / "pids"
    binary = tmp / "rollouts-controller"
    binary.write_text(f"#!/bin/sh\necho $$ >> {pids}\nsleep 600 &\necho $! >> {pids}\nwait\n")
    binary.chmod(0o755)
    return binary, pids


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_a_hanging_to_binary_version_is_killed_on_sigint_with_its_children(tmp_path):
    binary, pids = _hanging_binary(tmp_path)
    proc = start(["upgrade-check", "--from", "v1.8.2", "--to-binary", binary, "--crds", tmp_path], tmp_path)
    until("the binary and its child to start", lambda: len(_pids(pids)) == 2 or proc.poll() is not None, timeout=120)
    proc.send_signal(signal.SIGINT)
    out, err = finish(proc)
    interrupted(proc, out, err, "SIGINT")
    until("every process the binary started to be gone", lambda: not any(pid_alive(p) for p in _pids(pids)),
          timeout=10)


def test_a_hanging_to_binary_version_is_stopped_at_its_timeout_with_its_children(tmp_path):
    binary, pids = _hanging_binary(tmp_path)
    proc = start(["upgrade-check", "--from", "v1.8.2", "--to-binary", binary, "--crds", tmp_path], tmp_path)
    out, err = finish(proc, timeout=180)
    assert proc.returncode == 2 and "'--version' did not return within 20s" in err, err
    assert len(_pids(pids)) == 2 and not any(pid_alive(p) for p in _pids(pids))


def _journal(tmp: Path, server: str) -> Path:
    kc = kubeconfig_for(tmp / "kc", server)
    (tmp / "config.yaml").write_text("allowed_contexts: [stage]\n")
    j = Journal(tmp / "run" / "journal.json", kubeconfig=str(kc), context="stage", run_id="run-1")
    j.before_spec_change({"metadata": {"namespace": "shop", "name": "checkout"},
                          "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "img:1"}]}},
                                   "strategy": {"canary": {"steps": [{"setWeight": 5}]}}}})
    j.data["pid"] = 2 ** 22 + 1                  # the drill that wrote it is gone
    j._save()
    return j.path


def test_sigterm_during_the_restore_preflight_leaves_the_journal_and_names_it(tmp_path, silent_server):
    journal = _journal(tmp_path, silent_server.url.replace("https", "http"))
    before = journal.read_bytes()
    proc = start(["restore", "--journal", journal], tmp_path, DRILLS_REQUEST_TIMEOUT="120")
    until("the restore's preflight to reach the API server", lambda: silent_server.accepted > 0 or
          proc.poll() is not None, timeout=120)
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    line = interrupted(proc, out, err, "SIGTERM")
    assert "preflight" in line and str(journal) in line and "untouched" in line, line
    assert journal.read_bytes() == before


def test_a_late_answer_ends_the_live_preflight_at_its_one_deadline(tmp_path):
    api = StubAPI({"/api/v1/namespaces/shop": namespace("shop"),
                   rollout_path("shop", "checkout"): (8, {"kind": "Rollout"})})
    try:
        kc = kubeconfig_for(tmp_path / "kc", api.url)
        (tmp_path / "config.yaml").write_text("allowed_contexts: [stage]\n")
        r = subprocess.run([sys.executable, "-m", "drills", "run", "--kubeconfig", kc, "--namespace", "shop",
                            "--rollout", "checkout", "--dry-run"], capture_output=True, text=True, timeout=120,
                           env=env_for(tmp_path, DRILLS_REQUEST_TIMEOUT="2"), cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        line = r.stderr.strip()
        assert "\n" not in line and "did not answer within 2s" in line, line
        # the retries happen inside the one deadline: the late read was asked once, not once per retry
        assert api.gets(rollout_path("shop", "checkout")) == 1, api.requests
        assert api.mutations == []
    finally:
        api.close()



@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["group-sigterm", "group-sigint"])
def test_a_run_interrupted_before_its_legs_start_writes_run_json_and_says_so(tmp_path, sig):
    """A run waiting for its binaries (another process holds their build locks) cancelled as `timeout` and CI
    runners cancel (the signal to its whole process group): exit 3 with a last line saying so, and the run folder
    has run.json saying interrupted, the signal, and that no leg started."""
    import fcntl
    from drills.toolchain import Toolchain, components_for
    cache = tmp_path / "cache"
    locks = []
    for comp in components_for(["v1.8.2"], []):
        path = Toolchain(cache)._lock_path(comp.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+")
        fcntl.flock(fh, fcntl.LOCK_EX)
        locks.append(fh)
    env = env_for(tmp_path, DRILLS_CACHE=str(cache), DRILLS_CLUSTER="cancel-waiting")
    proc = subprocess.Popen([sys.executable, "-m", "drills", "run", "--controller", "v1.8.2", "--lanes", "order"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        lines: list[str] = []

        def waiting() -> bool:
            lines.append(proc.stderr.readline())
            return "is being built by another process" in lines[-1] or proc.poll() is not None
        until("the run to wait for its binaries", waiting, timeout=120)
        os.killpg(proc.pid, sig)
        out, err = finish(proc)
    finally:
        for fh in locks:
            fh.close()
    err = "".join(lines) + err
    line = interrupted(proc, out, err, sig.name)
    assert "interrupted" in line, line
    run_dir = next(d for d in (tmp_path / "reports").iterdir() if d.is_dir() and not d.is_symlink())
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["interrupted"] is True and meta["signal"] == sig.name and meta["left"] == [], meta
    assert [x["state"] for x in meta["legs"]] == ["not started"], meta
    assert (run_dir / "report.html").is_file()


def test_a_signal_inside_a_held_stretch_is_raised_at_its_end_and_outside_at_once():
    """A process started and recorded as ours is one stretch (drills.cluster.embedded._spawn): a SIGINT in it comes
    as Interrupted once the record is written, never between the start and the record."""
    from drills.core.signals import Interrupted, SignalGuard, held
    steps: list[str] = []
    with SignalGuard():
        with pytest.raises(Interrupted):
            with held():
                os.kill(os.getpid(), signal.SIGINT)
                steps.append("started")
                steps.append("recorded")
        assert steps == ["started", "recorded"]
        with pytest.raises(Interrupted):            # outside a stretch: at once, the next step never runs
            os.kill(os.getpid(), signal.SIGINT)
            steps.append("after")
    assert steps == ["started", "recorded"]


class _Finalized:
    """A cycle's member whose finalizer runs Python code: a signal's handler may run inside it (Python then swallows
    what the handler raises: "Exception ignored in ...")."""

    def __del__(self):
        total = 0
        for i in range(50):
            total += i


def test_a_signal_whose_interrupted_a_finalizer_swallowed_is_raised_again():
    """A Ctrl-C is never lost: a main thread that churns objects with finalizers (the Kubernetes client's responses,
    sockets) still gets its Interrupted when the handler first ran inside a finalizer (without the re-delivery,
    most of these signals are lost)."""
    import threading
    from drills.core.signals import Interrupted, SignalGuard
    swallowed: list[str] = []
    previous, sys.unraisablehook = sys.unraisablehook, lambda u: swallowed.append(type(u.exc_value).__name__)
    caught = 0
    try:
        for _ in range(20):
            started, sent = threading.Event(), threading.Event()
            sender = threading.Thread(target=lambda: (started.wait(10), os.kill(os.getpid(), signal.SIGINT),
                                                      sent.set()))
            try:                     # the guard's end raises one its re-delivery had not yet brought
                with SignalGuard():
                    sender.start()
                    # churn until the signal was sent and a while after (on a loaded machine the sender may run
                    # only after a fixed number of rounds would have ended: the signal would come after the guard)
                    after, i = 0, 0
                    while after < 100_000 and i < 50_000_000:
                        a, b = _Finalized(), _Finalized()
                        a.other, b.other = b, a          # a cycle: the GC runs the finalizers, in the middle of it
                        del a, b
                        i += 1
                        if i == 100:
                            started.set()
                        if sent.is_set():
                            after += 1
            except Interrupted:
                caught += 1
            sender.join()
    finally:
        sys.unraisablehook = previous
    assert caught == 20 and "Interrupted" not in swallowed, (caught, swallowed)


def test_a_thread_told_to_stop_raises_interrupted_once_at_its_next_wait():
    # threads a command runs side by side (scan --verify's probes): a signal reaches the main thread only, which
    # tells them to stop; each stops at its next wait, and the clean-up it unwinds through may wait in turn
    import threading
    from drills.core import signals
    from drills.core.signals import Interrupted, cancel_threads, forget_threads
    from drills.core.wait import hold_for
    seen: dict = {}

    def waiter(kind: str) -> None:
        try:
            if kind == "until":
                until("a condition that never holds", lambda: None, timeout=600)
            else:
                hold_for(600, "an evidence window")
        except Interrupted as e:
            seen[kind] = str(e)
            seen[f"{kind} clean-up"] = until("a condition that holds", lambda: "waited", timeout=5)
    threads = [threading.Thread(target=waiter, args=(k,), daemon=True) for k in ("until", "hold")]
    for t in threads:
        t.start()
    # the evidence window already running when the thread is told (its 600 s wait is woken, not skipped)
    until("the hold thread to be inside its window", lambda: threads[1].ident in signals._wakeups, timeout=30)
    cancel_threads([t.ident for t in threads], Interrupted(signal.SIGTERM))
    until("both waiting threads to end", lambda: not any(t.is_alive() for t in threads), timeout=60)
    forget_threads([t.ident for t in threads])
    assert seen == {"until": "interrupted by SIGTERM", "until clean-up": "waited",
                    "hold": "interrupted by SIGTERM", "hold clean-up": "waited"}, seen
    until("the main thread's own wait, never told to stop", lambda: True, timeout=1)
