"""The go commands drills runs outside a build (`go mod download`, `go env`) and kwokctl run under a timeout, in a
process group of their own that the timeout kills whole, and die with drills however it ends (SIGKILL included).
A stand-in `go` on PATH that never answers plays a module proxy that hangs (the real go cannot be made to hang on
demand); kwokctl is the real one."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from drills.core import config
from drills.core.procs import die_with_parent, pid_alive
from drills.core.wait import until

HANGING_GO = textwrap.dedent("""\
    #!/bin/sh
    # a go command whose module proxy never answers: it starts a helper of its own and waits for ever
    sleep 600 &
    echo $! > "$STUB_DIR/helper.pid"
    echo $$ > "$STUB_DIR/go.pid"
    wait
""")


@pytest.fixture
def hanging_go(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(HANGING_GO)
    go.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STUB_DIR", str(tmp_path))
    return tmp_path


def _pids(folder: Path) -> list[int]:
    until("the stand-in go to write its pids", lambda: (folder / "go.pid").is_file() and
          (folder / "helper.pid").is_file() and (folder / "go.pid").read_text().strip(), timeout=60, interval=0.05)
    return [int((folder / n).read_text()) for n in ("go.pid", "helper.pid")]


def _gone(pids: list[int], why: str) -> None:
    until(why, lambda: not any(pid_alive(p) for p in pids), timeout=30, interval=0.05)


def test_go_mod_download_that_never_answers_ends_at_its_timeout_with_its_helpers(hanging_go):
    from drills.toolchain.modsource import ModuleUnavailable, _download
    with pytest.raises(ModuleUnavailable, match="did not finish within 2s"):
        _download("example.com/never", "v1.0.0", "local", timeout=2)
    _gone(_pids(hanging_go), "the hanging go and the helper it started to be killed with its group")


def test_a_version_check_that_never_answers_is_bad_input_naming_the_timeout(hanging_go, monkeypatch):
    from drills.toolchain import components
    monkeypatch.setattr(components, "SERVED_TIMEOUT_S", 2)
    with pytest.raises(components.UnknownVersion, match="did not finish within 2s"):
        components.resolve_controller_versions("v1.99.0")
    _gone(_pids(hanging_go), "the hanging go and its helper to be killed with its group")


@pytest.mark.parametrize("call", [
    "from drills.toolchain.modsource import _download; _download('example.com/never', 'v1.0.0', 'local', 600)",
    "from drills.toolchain.components import _module_served; _module_served('example.com/never', 'v1.0.0')",
    "from drills.toolchain.modsource import local_go_version; local_go_version()",
    "from drills.scan.sources import _cached_module_dir; _cached_module_dir('v1.99.0')",
])
def test_a_go_command_dies_with_a_drills_that_is_killed(hanging_go, call):
    proc = subprocess.Popen([sys.executable, "-c", call], env=dict(os.environ, PYTHONPATH=str(config.project_root())),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=die_with_parent)
    try:
        go, helper = _pids(hanging_go)
        proc.send_signal(signal.SIGKILL)          # no handler, no finally: only the kernel can take go down
        proc.wait(30)
        _gone([go], "the go command of a SIGKILLed drills to die with it")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        helper_pid = (hanging_go / "helper.pid")
        if helper_pid.is_file():              # go's own helper is go's to end: the stand-in's, ended here
            try:
                os.kill(int(helper_pid.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def test_kwokctl_runs_bounded_and_answers():
    from drills.cluster import EmbeddedCluster
    r = EmbeddedCluster("h22-bounded", log=lambda m: None)._kwokctl("--version", timeout=60)
    assert r.returncode == 0 and config.KWOK_VERSION in r.stdout + r.stderr, (r.stdout, r.stderr)


def test_an_error_in_a_fleet_scan_kills_the_helm_children_its_workers_wait_for():
    """The main thread leaving the worker pool (an error, or a signal) takes the children the worker threads
    wait for with it before the work tree goes: nothing writes into a folder being removed."""
    import types

    from drills.core import procs
    from drills.scan.fleet import FleetScan
    started: list[int] = []

    def fn(item):
        if item == "fails":
            until("the other worker's child to start", lambda: procs._running, timeout=30)
            started.extend(p.pid for p in procs._running)
            raise ValueError("a render failed")
        procs.run_bounded(["sleep", "120"], timeout=300)
    with pytest.raises(ValueError, match="a render failed"):
        FleetScan._each(types.SimpleNamespace(workers=2), fn, ["fails", "sleeps"])
    assert len(started) == 1 and not pid_alive(started[0])
    assert not procs._running


def test_a_signal_that_comes_while_the_child_starts_still_kills_its_group(tmp_path):
    """The signal lands while the parent is still inside Popen (a loaded machine: the child has already run and
    forked): run_bounded raises it once the child is recorded, and the child's whole group is gone."""
    import json
    import sys
    import textwrap
    pids = tmp_path / "pids"
    binary = tmp_path / "hang"
    binary.write_text(f"#!/bin/sh\necho $$ >> {pids}\nsleep 600 &\necho $! >> {pids}\nwait\n")
    binary.chmod(0o755)
    code = textwrap.dedent(f"""
        import json, os, signal, subprocess
        from pathlib import Path
        from drills.core import procs
        from drills.core.signals import Interrupted, SignalGuard
        from drills.core.wait import until
        real = subprocess.Popen
        pids = Path({str(pids)!r})

        class SlowParent(real):          # the signal comes before Popen has returned to run_bounded
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                until("the child and the process it forked to be started",
                      lambda: pids.exists() and len(pids.read_text().split()) == 2, timeout=60)
                os.kill(os.getpid(), signal.SIGINT)      # its handler runs here, before __init__ returns

        subprocess.Popen = SlowParent
        raised = None
        with SignalGuard():
            try:
                procs.run_bounded([{str(binary)!r}], timeout=60)
            except Interrupted as e:
                raised = type(e).__name__
        started = [int(x) for x in Path({str(pids)!r}).read_text().split()]
        print(json.dumps({{"raised": raised, "started": started}}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["raised"] == "Interrupted" and len(out["started"]) == 2, out
    until("every process the child started to be gone", lambda: not any(pid_alive(p) for p in out["started"]),
          timeout=30)
