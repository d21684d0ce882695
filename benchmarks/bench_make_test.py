"""`make test` wall time, cold (empty caches, as on a fresh machine) and warm, with the breakdown: when each
toolchain component was built and how long it took, the slowest test files and tests, and the tests that waited
for a build.

    python benchmarks/bench_make_test.py --cold     # empty DRILLS_CACHE, GOMODCACHE, GOCACHE (temporary, removed)
    python benchmarks/bench_make_test.py --warm     # this machine's caches as they are
    python benchmarks/bench_make_test.py --cold --warm
    python benchmarks/bench_make_test.py --cold --cache DIR   # the cold run's caches in DIR (new), kept afterwards

Targets (issue): cold <= 45 min, warm <= 15 min on the 2-core machine.  A figure, never a test.
"""
from __future__ import annotations

import argparse
import calendar
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from drills.core import config
from drills.core.procs import die_with_parent
from drills.core.wait import WaitTimeout, until

ROOT = config.project_root()


def _stamps(cache: Path) -> list[dict]:
    out = []
    for stamp in sorted(cache.glob("*/*/BUILD.json")):
        data = json.loads(stamp.read_text())
        end = calendar.timegm(time.strptime(data["built_at"], "%Y-%m-%dT%H:%M:%SZ"))
        out.append({"component": f"{stamp.parent.parent.name}@{stamp.parent.name}",
                    "seconds": data.get("build_seconds", 0.0), "end": end})
    return out


def _junit(path: Path) -> tuple[dict, list, dict]:
    counts = defaultdict(int)
    cases = []
    if not path.is_file():
        return counts, cases, {}
    for case in ET.parse(path).getroot().iter("testcase"):
        verdict = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                verdict = "failed"
            elif child.tag == "skipped":
                verdict = "skipped"
        counts[verdict] += 1
        cls = case.get("classname", "")
        cases.append((float(case.get("time") or 0), cls, case.get("name", ""), verdict))
    files = defaultdict(float)
    for t, cls, _, _ in cases:         # classname: tests.faults.test_fault_cancel[.TestClass] -> the file's module
        parts = cls.split(".")
        cut = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
        files[".".join(parts[:cut + 1])] += t
    return counts, cases, files


def _timeline(path: Path, t0: float, toolchain_done: float | None) -> None:
    """Per worker: its first start, its last end, its idle time, and the files it ran (minutes since start)."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return
    if not rows:
        return
    print("  workers (minutes since start; a file's first test start -> its last test end; seconds of tests):")
    by_worker = defaultdict(list)
    for r in rows:
        by_worker[r["worker"]].append(r)
    for worker in sorted(by_worker):
        rs = sorted(by_worker[worker], key=lambda r: r["start"])
        busy = sum(r["end"] - r["start"] for r in rs)
        first, last = rs[0]["start"] - t0, rs[-1]["end"] - t0
        after = sum(r["end"] - max(r["start"], toolchain_done) for r in rs if toolchain_done and r["end"] > toolchain_done)
        print(f"    {worker}: {first / 60:5.1f} -> {last / 60:5.1f}, tests {busy:6.0f} s"
              + (f" ({after:.0f} s of them after the toolchain was built)" if toolchain_done else ""))
        files: dict[str, list] = {}
        for r in rs:
            f = files.setdefault(r["test"].split("::", 1)[0], [r["start"], r["end"], 0.0, None])
            f[1] = max(f[1], r["end"])
            f[2] += r["end"] - r["start"]
            if r.get("cpu") is not None:
                f[3] = (f[3] or 0.0) + r["cpu"]
        for name, (a, b, s, cpu) in sorted(files.items(), key=lambda x: x[1][0]):
            if s >= 60:
                print(f"      {(a - t0) / 60:5.1f} -> {(b - t0) / 60:5.1f}  {s:6.0f} s"
                      + (f" {cpu:6.0f} CPU-s" if cpu is not None else "") + f"  {name}")
    cpu_rows = [r for r in rows if r.get("cpu") is not None]
    if cpu_rows:
        by_file: dict[str, float] = defaultdict(float)
        for r in cpu_rows:
            by_file[r["test"].split("::", 1)[0]] += r["cpu"]
        total = sum(by_file.values())
        print(f"  CPU of the tests (each worker's cgroup over its tests: {total:.0f} CPU-s), files first:")
        for name, cpu in sorted(by_file.items(), key=lambda x: -x[1])[:15]:
            print(f"    {cpu:7.0f} CPU-s  {name}")
        for r in sorted(cpu_rows, key=lambda r: -r["cpu"])[:15]:
            print(f"    {r['cpu']:7.0f} CPU-s  {r['end'] - r['start']:6.0f} s  {r['test']}")


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _cpu_group(name: str) -> Path | None:
    """A cgroup-v1 cpuacct group of the run's own (every process the run starts, daemons included, is counted in
    it); None where the machine has none or it cannot be made."""
    group = CPUACCT / name
    try:
        group.mkdir(exist_ok=True)
        return group if (group / "cpuacct.usage").is_file() else None
    except OSError:
        return None


# signal, then how long the group has to end: SIGINT's wait outlasts tests/test_lanes.py's STOP_GRACE_S (the lanes
# run's own clean-up, its clusters taken down), so the SIGTERM after it never cuts that short
STOP_STEPS = ((signal.SIGINT, 240.0), (signal.SIGTERM, 30.0), (signal.SIGKILL, 30.0))


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_group(proc: subprocess.Popen) -> None:
    """The run's process group stopped: SIGINT (as Ctrl-C: the drills restore what they changed and take down their
    clusters), then SIGTERM, then SIGKILL, each once the previous one's wait ran out with a process of the group still
    there (make's exit alone is not the end: what it started may outlive it)."""
    for sig, wait in STOP_STEPS:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            until(f"make test's process group to end after {sig.name}",
                  lambda: proc.poll() is not None and not _group_alive(proc.pid), timeout=wait, interval=0.5)
            break
        except WaitTimeout:
            continue
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run(label: str, env: dict, cache: Path, workdir: Path) -> None:
    junit = workdir / "junit.xml"
    log = workdir / "make-test.log"
    timeline = workdir / "timeline.jsonl"
    timeline.unlink(missing_ok=True)
    env = dict(env, DRILLS_TEST_TIMELINE=str(timeline))
    group = _cpu_group(f"bench-make-test-{os.getpid()}")
    if group:
        env["DRILLS_TEST_CPU_GROUP"] = str(group)       # each worker's group in it: every test's CPU in the timeline
    t0 = time.time()

    def child() -> None:
        die_with_parent()
        # SIGINT as a terminal's: a benchmark started in the background (`cmd &`) inherits it ignored, and so would
        # make, pytest and every drill (Python leaves an ignored SIGINT ignored), and the stop's SIGINT would do nothing
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if group:
            (group / "tasks").write_text(str(os.getpid()))

    with open(log, "w") as out:
        # a process group of its own, so that the benchmark stopped stops the run as Ctrl-C stops `make test`
        proc = subprocess.Popen(["make", "test", f"PYTEST_ARGS=--junitxml={junit}"], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=child)
        try:
            rc = proc.wait()
        except BaseException:
            print(f"  stopping make test (process group {proc.pid}): SIGINT, then SIGTERM, then SIGKILL", flush=True)
            stop_group(proc)
            raise
    wall = time.time() - t0
    cpu = int((group / "cpuacct.usage").read_text()) / 1e9 if group else None
    if group:
        try:
            for worker in group.iterdir():
                if worker.is_dir():
                    worker.rmdir()
            group.rmdir()                  # empty once every process of the run has exited
        except OSError:
            print(f"  (cgroup {group} still holds processes of the run: left)")
    counts, cases, files = _junit(junit)
    print(f"== {label}: make test exit {rc}, wall {wall / 60:.1f} min ({wall:.0f} s); "
          + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f"  [log {log}]")
    if cpu is not None:
        cores = os.cpu_count() or 1
        print(f"  CPU: {cpu:.0f} s of the run's processes (daemons included) = {cpu / wall:.2f} cores on average "
              f"of {cores} ({cpu / wall / cores:.0%})")
    stamps = [s for s in _stamps(cache) if s["end"] >= t0 - 1]
    if stamps:
        print("  toolchain built during the run (minutes since start: from -> to, build seconds):")
        for s in sorted(stamps, key=lambda s: s["end"]):
            start = s["end"] - s["seconds"] - t0
            print(f"    {s['component']:<24} {start / 60:5.1f} -> {(s['end'] - t0) / 60:5.1f}  ({s['seconds']:6.1f} s)")
    _timeline(timeline, t0, max((s["end"] for s in stamps if not s["component"].startswith("rollouts-reporting")),
                                default=None))
    print("  slowest test files (sum of their tests' seconds; files run side by side on the workers):")
    for f, t in sorted(files.items(), key=lambda x: -x[1])[:12]:
        print(f"    {t:7.1f} s  {f}")
    print("  slowest tests:")
    for t, cls, name, verdict in sorted(cases, reverse=True)[:10]:
        print(f"    {t:7.1f} s  {cls}::{name} ({verdict})")
    lines = log.read_text(errors="replace").splitlines()
    at = next((i for i, ln in enumerate(lines) if "tests that waited for a toolchain build" in ln), None)
    if at is not None:
        print("  tests that waited for a build:")
        for ln in lines[at + 1:]:
            if ln.startswith("=") or not ln.strip():
                break
            print(f"    {ln}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cold", action="store_true", help="empty caches (temporary folders, removed afterwards)")
    ap.add_argument("--warm", action="store_true", help="this machine's caches")
    ap.add_argument("--cache", default=None, metavar="DIR",
                    help="with --cold: the empty caches in DIR (it must not exist yet), kept afterwards")
    ap.add_argument("--out", default=None, help="keep the logs and JUnit files here (default: a temporary folder)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, _raise_interrupt)     # a stopped benchmark stops its run (stop_group) and cleans up
    if not (a.cold or a.warm):
        ap.error("give --cold and/or --warm")
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="bench-make-test-"))
    out.mkdir(parents=True, exist_ok=True)
    if a.cache and (not a.cold or os.path.lexists(a.cache)):
        ap.error("--cache DIR goes with --cold and names a folder that does not exist yet")
    if a.cold:
        scratch = Path(a.cache).absolute() if a.cache else Path(tempfile.mkdtemp(prefix="drills-cold-"))
        scratch.mkdir(parents=True, exist_ok=True)
        try:
            env = dict(os.environ, DRILLS_CACHE=str(scratch / "drills"), GOMODCACHE=str(scratch / "gomod"),
                       GOCACHE=str(scratch / "gocache"))
            (out / "cold").mkdir(exist_ok=True)
            run("cold (empty DRILLS_CACHE, GOMODCACHE, GOCACHE)", env, scratch / "drills", out / "cold")
        finally:
            if not a.cache:
                subprocess.call(["chmod", "-R", "u+w", str(scratch)])
                shutil.rmtree(scratch, ignore_errors=True)
    if a.warm:
        (out / "warm").mkdir(exist_ok=True)
        run("warm (this machine's caches)", dict(os.environ), config.cache_dir(), out / "warm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
