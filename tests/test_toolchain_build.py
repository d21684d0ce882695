"""How the toolchain's go commands are cut (a component's binaries named as go names them build in one command), and
how builds share a cache: build slots held only while go compiles, the download before the slot, two at a time."""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys

import pytest

from drills.core.errors import BadInput
from drills.core.procs import BACKGROUND_NICE
from drills.toolchain.build import Toolchain, _build_groups, build_jobs
from drills.toolchain.components import Component, base_components, optional_components, rollouts_component
from drills.core.wait import WaitTimeout, hold_for, until


def _by_name(name):
    return {c.name: c for c in [*base_components(), *optional_components().values()]}[name]


def test_binaries_named_as_go_names_them_build_in_one_command():
    kube = _by_name("kubernetes")
    assert _build_groups(kube.binaries) == [("/", list(kube.binaries.values()))]
    ro = rollouts_component("v1.8.2")
    assert _build_groups(ro.binaries) == [("/", list(ro.binaries.values()))]


def test_a_binary_go_would_name_otherwise_builds_alone():
    # go would name the binary of .../server/v3 "v3": it keeps its own -o
    assert _build_groups(_by_name("etcd").binaries) == [("etcd", ["go.etcd.io/etcd/server/v3"])]
    mixed = {"a": "example.com/x/cmd/a", "b": "example.com/x/cmd/b", "tool": "example.com/x/v2"}
    assert _build_groups(mixed) == [("/", ["example.com/x/cmd/a", "example.com/x/cmd/b"]),
                                    ("tool", ["example.com/x/v2"])]


def test_prometheus_builds_without_service_discovery_plugins():
    assert _by_name("prometheus").tags == ("remove_all_sd",)


# --- build slots: real go builds of a small module on a cache of the test's own ----------------------------------
HELLO = ("golang.org/x/example/hello", "v0.0.0-20250915201037-7f05d217867b")


def _hello(name: str) -> Component:
    return Component(name, HELLO[0], HELLO[1], {"hello": HELLO[0]}, ldflags=(f"-X main.name={name}",))


class _Holder:
    """Another process holding one of a cache's lock files (as another builder's go build does)."""

    def __init__(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-c", (
            "import fcntl, sys; fh = open(sys.argv[1], 'a+'); fcntl.flock(fh, fcntl.LOCK_EX); "
            "fh.write('pid holder, another build'); fh.flush(); print('held', flush=True); sys.stdin.read()"),
            str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"

    def release(self):
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.mark.parametrize("raw", ["0", "9", "two", "-1"])
def test_build_jobs_out_of_range_is_bad_input(monkeypatch, raw):
    monkeypatch.setenv("DRILLS_BUILD_JOBS", raw)
    with pytest.raises(BadInput, match="DRILLS_BUILD_JOBS"):
        build_jobs()


def test_toolchain_build_refuses_a_bad_jobs_count(tmp_path):
    r = subprocess.run([sys.executable, "-m", "drills", "toolchain", "build", "-j", "0"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "DRILLS_CACHE": str(tmp_path)})
    assert r.returncode == 2 and "-j 0" in r.stderr, r.stderr
    assert not any(tmp_path.iterdir()), "nothing is built or written on bad input"


def test_a_second_slot_builds_while_another_process_holds_the_first(tmp_path, monkeypatch):
    monkeypatch.setenv("DRILLS_BUILD_JOBS", "2")
    tc = Toolchain(tmp_path / "cache", log=lambda m: None)
    holder = _Holder(tc._lock_path("build-slot"))
    try:
        tc.ensure([_hello("hello-a")])
        assert tc.is_built(_hello("hello-a"))
    finally:
        holder.release()


def test_with_every_slot_taken_the_source_downloads_and_the_compile_waits_saying_so(tmp_path, monkeypatch):
    monkeypatch.setenv("DRILLS_BUILD_JOBS", "1")
    lines: list[str] = []
    tc = Toolchain(tmp_path / "cache", log=lines.append)
    comp = _hello("hello-b")
    holder = _Holder(tc._lock_path("build-slot"))
    proc = None
    try:
        proc = subprocess.Popen([sys.executable, "-c", (
            "import sys; from drills.toolchain.build import Toolchain; from drills.toolchain.components import "
            "Component; c = Component('hello-b', sys.argv[2], sys.argv[3], {'hello': sys.argv[2]}, "
            "ldflags=('-X main.name=hello-b',)); Toolchain(sys.argv[1]).ensure([c])"),
            str(tc.root), *HELLO], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log = tc.root / "logs" / f"hello-b-{HELLO[1]}.log"
        # the download ran (go mod tidy finished) while the compile waits for the slot another process holds
        until("the builder to wait for a build slot after its download", lambda: proc.stdout.readline(),
              lambda line: "every build slot of this cache is in use" in line or not line, timeout=300)
        assert proc.poll() is None, "the build did not wait for the slot"
        text = log.read_text()
        assert "go mod tidy" in text and "go build" not in text, text
        assert not tc.is_built(comp)
    finally:
        holder.release()
    assert proc.wait(300) == 0, proc.stdout.read()
    assert tc.is_built(comp) and "go build" in log.read_text()


RECORDING_GO = """#!/bin/sh
# the real go, started by the toolchain: first the priority it runs at (its nice value and, where the kernel has
# them, its session's scheduling group), on one line
echo "go $1 $2: nice $(nice) group $(cat /proc/self/autogroup 2>/dev/null || echo none)" >> "$GO_PRIORITY_LOG"
exec "$REAL_GO" "$@"
"""


@pytest.fixture
def recording_go(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "go").write_text(RECORDING_GO)
    (bin_dir / "go").chmod(0o755)
    record = tmp_path / "priority.log"
    monkeypatch.setenv("REAL_GO", shutil.which("go"))
    monkeypatch.setenv("GO_PRIORITY_LOG", str(record))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def _build_lines(record) -> list[str]:
    """The recorded lines of the build's own go commands (go mod tidy, go build): the source download and `go env`
    before them do next to no computing."""
    lines = record.read_text().splitlines()
    builds = [line for line in lines if line.startswith(("go mod tidy:", "go build "))]
    assert builds[:1] and builds[0].startswith("go mod tidy:") and len(builds) >= 2, lines
    return builds


def _own_group() -> str:
    try:
        return open("/proc/self/autogroup").read().strip()
    except OSError:
        return "none"


@pytest.mark.parametrize("how", ["env", "argument"])
def test_a_build_beside_drills_runs_below_them_and_its_builder_keeps_its_own_priority(recording_go, tmp_path,
                                                                                      monkeypatch, how):
    if how == "env":        # the test session's builder (tests/conftest.py)
        monkeypatch.setenv("DRILLS_BUILD_PRIORITY", "background")
    before, group_before = os.nice(0), _own_group()
    tc = Toolchain(tmp_path / "cache", log=lambda m: None, background=True if how == "argument" else None)
    tc.ensure([_hello("hello-nice")])
    assert tc.is_built(_hello("hello-nice"))
    for line in _build_lines(recording_go):
        # its own nice value (the lowest there is, if this process runs lower yet) and, where sessions are
        # scheduled as groups, its session's group lowered too
        assert f": nice {min(19, before + BACKGROUND_NICE)} group " in line, line
        assert line.endswith(" group none") if group_before == "none" else line.endswith(f" nice {BACKGROUND_NICE}")
    # the builder's own priority and group (the test session's, the drills beside it) untouched
    assert (os.nice(0), _own_group()) == (before, group_before)


@pytest.mark.parametrize("env", [None, "normal", "background"])
def test_a_build_alone_runs_at_the_callers_priority(recording_go, tmp_path, monkeypatch, env):
    if env is None:
        monkeypatch.delenv("DRILLS_BUILD_PRIORITY", raising=False)
    else:
        monkeypatch.setenv("DRILLS_BUILD_PRIORITY", env)
    before, group_before = os.nice(0), _own_group()
    # `drills toolchain build` (None: the setting, normal unless said); a caller that says so overrides the setting
    tc = Toolchain(tmp_path / "cache", log=lambda m: None, background=False if env == "background" else None)
    tc.ensure([_hello("hello-plain")])
    for line in _build_lines(recording_go):
        assert f": nice {before} group " in line, line
        # a session of its own: a new scheduling group, at the default priority
        assert line.endswith(" group none") if group_before == "none" else line.endswith(" nice 0"), line


@pytest.mark.parametrize("raw", ["low", "Background", "10", "background; rm -rf /"])
def test_a_bad_build_priority_is_bad_input_before_anything_is_built(tmp_path, monkeypatch, raw):
    monkeypatch.setenv("DRILLS_BUILD_PRIORITY", raw)
    tc = Toolchain(tmp_path / "cache", log=lambda m: None)
    with pytest.raises(BadInput, match="DRILLS_BUILD_PRIORITY"):
        tc.ensure([_hello("hello-bad")])
    assert not (tmp_path / "cache").exists()
    # a command that may build says so in one line, exit 2, before it touches anything (its cluster included)
    r = subprocess.run([sys.executable, "-m", "drills", "cluster", "status"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, DRILLS_CACHE=str(tmp_path / "cache")))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "DRILLS_BUILD_PRIORITY" in r.stderr, r.stderr
    assert not (tmp_path / "cache").exists()


def test_the_build_priority_is_the_setting_else_the_callers_default(monkeypatch):
    from drills.toolchain.locks import build_priority
    monkeypatch.delenv("DRILLS_BUILD_PRIORITY", raising=False)
    assert (build_priority(), build_priority("background")) == ("normal", "background")    # a run's builds
    for said in ("normal", " background "):
        monkeypatch.setenv("DRILLS_BUILD_PRIORITY", said)
        assert build_priority() == build_priority("background") == said.strip()


def test_two_jobs_build_two_components_and_report_each_as_it_is_ready(tmp_path, monkeypatch):
    monkeypatch.setenv("DRILLS_BUILD_JOBS", "2")
    tc = Toolchain(tmp_path / "cache", log=lambda m: None)
    comps = [_hello("hello-c"), _hello("hello-d")]
    ready: list[str] = []
    tc.ensure(comps, jobs=2, on_built=lambda c: ready.append(c.key))
    assert sorted(ready) == sorted(c.key for c in comps) and all(tc.is_built(c) for c in comps)
    # already built: each is reported ready at once, nothing is built again
    again: list[str] = []
    tc.ensure(comps, jobs=2, on_built=lambda c: again.append(c.key))
    assert again == [c.key for c in comps]


def test_the_longest_build_of_the_first_cluster_starts_first_beside_the_rest():
    from drills.toolchain import components_for
    order = [c.name for c in components_for(["v1.8.2", "v1.10.2"], ["prometheus", "registry"])]
    # two at a time: Kubernetes in one slot from the start, etcd, kwok and the first controller in the other
    assert order[:2] == ["etcd", "kubernetes"]
    first_cluster = {"etcd", "kubernetes", "kwok", "istio-crds"}
    assert set(order[:5]) == first_cluster | {"rollouts"} and order.index("helm") == 5
    assert order[-2:] == ["prometheus", "registry"]


def _builder(cache, names, jobs):
    """A process building hello components ``names`` on ``cache``, ``jobs`` at a time (its console piped)."""
    # SIGINT as in a terminal: a process started in the background of a shell without job control inherits it
    # ignored, and Python then never turns it into KeyboardInterrupt
    code = ("import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
            "signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from drills.toolchain.build import Toolchain; from drills.toolchain.components import "
            "Component; cs = [Component(n, sys.argv[2], sys.argv[3], {'hello': sys.argv[2]}, "
            "ldflags=('-X main.name=' + n,)) for n in sys.argv[5:]]; "
            "Toolchain(sys.argv[1]).ensure(cs, jobs=int(sys.argv[4]))")
    return subprocess.Popen([sys.executable, "-c", code, str(cache), *HELLO, str(jobs), *names],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_signal_ends_the_builds_waiting_for_a_slot_and_starts_nothing(tmp_path):
    from drills.core.procs import pid_alive
    tc = Toolchain(tmp_path / "cache", log=lambda m: None)
    holders = [_Holder(tc._lock_path("build-slot")), _Holder(tc._lock_path("build-slot-1"))]
    proc = _builder(tc.root, ["hello-s", "hello-t"], 2)
    lines: list[str] = []
    try:
        until("both builds to wait for a slot after their downloads", lambda: lines.append(proc.stdout.readline())
              or lines[-1], lambda line: "every build slot of this cache is in use" in line or not line,
              timeout=300)
        proc.send_signal(signal.SIGINT)
        try:
            until("the builder to end after SIGINT", lambda: proc.poll() is not None, timeout=60)
        except WaitTimeout:          # where every thread of the builder is: its stacks, in the failure
            proc.send_signal(signal.SIGUSR1)
            hold_for(2, "faulthandler to write the builder's stacks")
            proc.kill()
            raise AssertionError("the builder did not end within 60 s of SIGINT; its output and stacks:\n"
                                 + "".join(lines) + proc.stdout.read()) from None
    finally:
        for h in holders:
            h.release()
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines) + proc.stdout.read()
    assert proc.returncode != 0, out
    # nothing started after the signal: no component built, no go command left, every lock free again
    assert not any(tc.is_built(_hello(n)) for n in ("hello-s", "hello-t")), out
    assert "go build" not in "".join(p.read_text() for p in (tc.root / "logs").glob("hello-*.log"))
    leftover = subprocess.run(["pgrep", "-f", str(tc.root)], capture_output=True, text=True, timeout=30).stdout.split()
    assert [p for p in leftover if pid_alive(int(p))] == [], leftover
    with open(tc._lock_path("build-slot"), "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)       # raises if the builder still held it


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_left_alone(tmp_path):
    cache = tmp_path / "cache"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    comp = _hello("hello-l")
    lock = Toolchain(cache)._lock_path(comp.key)
    lock.parent.mkdir(parents=True)
    lock.symlink_to(victim)
    with pytest.raises(BadInput, match="a link"):
        Toolchain(cache, log=lambda m: None).ensure([comp])
    assert victim.read_text() == "keep me\n" and not Toolchain(cache).is_built(comp)


@pytest.mark.parametrize("raw", ["x", "0", "²", "9" * 5000])
def test_a_bad_build_jobs_setting_is_refused_before_anything_is_written(tmp_path, raw):
    r = subprocess.run([sys.executable, "-m", "drills", "toolchain", "build"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "DRILLS_CACHE": str(tmp_path / "c"), "DRILLS_BUILD_JOBS": raw})
    assert r.returncode == 2 and "DRILLS_BUILD_JOBS" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("*")), "nothing is written on bad input"


# --- a build copied from another drills cache (an image builder's cache mount: Containerfile, --reuse) ----------------
FAKE = Component("fake", "example.com/fake", "v0.0.1",
                 {"fake": "example.com/fake/cmd/fake", "tool": "example.com/fake/cmd/tool"})


def _built_elsewhere(cache, comp=FAKE, **stamp_over):
    """``comp`` as a build leaves it in the drills cache ``cache``: its binaries, a data folder, its build stamp."""
    import hashlib
    import json
    from drills.toolchain.stamps import go_platform
    folder = cache / comp.name / comp.version
    (folder / "crds").mkdir(parents=True)
    (folder / "crds" / "x-crd.yaml").write_text("kind: CustomResourceDefinition\n")
    shas = {}
    for name in comp.binaries:
        (folder / name).write_bytes(b"\x7fELF" + name.encode() * 1000)
        (folder / name).chmod(0o755)
        shas[name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    stamp = {"module": comp.module, "version": comp.version, "binaries": shas, "go": go_platform(),
             "fingerprint": Toolchain.fingerprint(comp), "gotoolchain": "local", "tags": list(comp.tags), **stamp_over}
    (folder / "BUILD.json").write_text(json.dumps(stamp))
    return folder


def test_a_component_built_the_same_way_in_another_cache_is_copied_not_built(tmp_path):
    import json
    src = _built_elsewhere(tmp_path / "builder")
    said = []
    tc = Toolchain(tmp_path / "image", log=said.append, reuse=tmp_path / "builder")
    remains = tc.dir(FAKE).parent / f".{FAKE.version}.copy-999999999"       # what a killed copy left
    remains.mkdir(parents=True)
    tc.ensure([FAKE], jobs=1)       # nothing to build: a build of example.com/fake would fail (no such module)
    assert tc.is_built(FAKE) and any("copied from" in line for line in said), said
    assert not remains.exists() and sorted(p.name for p in tc.dir(FAKE).parent.iterdir()) == [FAKE.version]
    dest = tc.dir(FAKE)
    for name in FAKE.binaries:
        assert (dest / name).read_bytes() == (src / name).read_bytes() and os.access(dest / name, os.X_OK)
    assert (dest / "crds" / "x-crd.yaml").read_text() == (src / "crds" / "x-crd.yaml").read_text()
    stamp = json.loads(tc.stamp(FAKE).read_text())
    assert stamp["copied_from"] == str(src)
    assert stamp["binaries"] == json.loads((src / "BUILD.json").read_text())["binaries"]
    from drills.toolchain import check_built
    assert check_built(dest / "fake")           # the copy runs: its sha256 is its stamp's


@pytest.mark.parametrize("spoil", ["binary overwritten", "other flags", "stamp without fingerprint", "a binary missing",
                                   "a symbolic link", "no stamp", "another Go", "another platform"])
def test_a_build_elsewhere_that_is_not_the_same_is_not_copied(tmp_path, spoil):
    import json
    src = _built_elsewhere(tmp_path / "builder")
    stamp = json.loads((src / "BUILD.json").read_text())
    if spoil == "binary overwritten":
        (src / "tool").write_bytes(b"\x7fELF something else")
    elif spoil == "other flags":
        stamp["fingerprint"] = "0" * 32
    elif spoil == "stamp without fingerprint":
        del stamp["fingerprint"]
    elif spoil == "a binary missing":
        del stamp["binaries"]["tool"]
    elif spoil == "a symbolic link":
        (src / "crds" / "x-crd.yaml").unlink()
        (src / "crds" / "x-crd.yaml").symlink_to(tmp_path / "outside.yaml")
        (tmp_path / "outside.yaml").write_text("not the builder's\n")
    elif spoil == "no stamp":
        (src / "BUILD.json").unlink()
    elif spoil == "another Go":
        stamp["go"] = {**stamp["go"], "GOVERSION": "go1.0.1"}
    elif spoil == "another platform":
        stamp["go"] = {**stamp["go"], "GOARCH": "arm64" if stamp["go"]["GOARCH"] != "arm64" else "amd64"}
    if (src / "BUILD.json").exists():
        (src / "BUILD.json").write_text(json.dumps(stamp))
    said = []
    from drills.toolchain.stamps import copy_build
    tc = Toolchain(tmp_path / "image")
    assert copy_build(FAKE, Toolchain.fingerprint(FAKE), tmp_path / "builder", tc.dir(FAKE), said.append) is False
    assert not tc.is_built(FAKE) and not tc.dir(FAKE).exists(), said
    assert not [p for p in (tmp_path / "image").rglob("*") if p.name.startswith(".")], "no copy left half-done"


def test_toolchain_build_refuses_a_reuse_folder_that_is_not_one(tmp_path):
    cache = tmp_path / "cache"
    r = subprocess.run([sys.executable, "-m", "drills", "toolchain", "build", "--reuse", str(tmp_path / "none")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "DRILLS_CACHE": str(cache)})
    assert r.returncode == 2 and "--reuse" in r.stderr and "not a folder" in r.stderr, r.stderr
    assert not cache.exists(), "nothing is built or written on bad input"


def test_a_stamp_of_other_flags_or_of_none_is_not_built(tmp_path):
    """A component whose stamp lacks this drills' fingerprint of it (a cache from before fingerprints, or of other
    flags) is built again; with the fingerprint it is built."""
    import json
    _built_elsewhere(tmp_path / "cache")
    tc = Toolchain(tmp_path / "cache")
    assert tc.is_built(FAKE)
    stamp = json.loads(tc.stamp(FAKE).read_text())
    for spoiled in ({k: v for k, v in stamp.items() if k != "fingerprint"}, {**stamp, "fingerprint": "0" * 32}):
        tc.stamp(FAKE).write_text(json.dumps(spoiled))
        assert not tc.is_built(FAKE), spoiled


def test_a_components_fingerprint_is_the_same_in_every_process():
    """The fingerprint decides whether a cache is built: it never depends on a process's hash seed (a set's order)."""
    code = ("from drills.toolchain import Toolchain, components_for\n"
            "print(*(Toolchain.fingerprint(c) for c in components_for(['v1.8.2', 'v1.10.2'], "
            "['registry', 'prometheus', 'kube-state-metrics'])))")
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout for seed in map(str, range(8))}
    assert len(seen) == 1 and len(seen.pop().split()) == 10, seen
