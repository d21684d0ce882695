"""Embedded cluster figures: cold build time per component (from the build stamps), a cold `up` (which
builds and saves the snapshot), warm `up` to the first reconcile of the controller (median of N) with the
phases of one instrumented warm start, `down`, the CLI's `cluster up`/`down`, the peak RSS of the whole
control plane and the CPU seconds its start costs (a test run starts over a hundred clusters).

    python benchmarks/bench_cluster.py [--controller v1.8.2] [--rounds 5] [--cold] [--cli-rounds 3] [--idle 180]

Target (issue): warm `up` to a reconciling controller (the sentinel Rollout's status written by this run's
controller) <= 3 s on 2 cores; measured before the snapshot cache: 8.3 s.
"""
from __future__ import annotations

import argparse
import calendar
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from drills.core import config
from drills.cluster import EmbeddedCluster
from drills.cluster.snapshot import SnapshotStore
from drills.cluster.startup import SENTINEL
from drills.toolchain import Toolchain


def cold_builds(tc: Toolchain) -> list[tuple[str, float]]:
    out = []
    for stamp in sorted(tc.root.glob("*/*/BUILD.json")):
        data = json.loads(stamp.read_text())
        out.append((f"{stamp.parent.parent.name}@{stamp.parent.name}", data.get("build_seconds", 0.0)))
    return out


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except OSError:
        pass
    return rss, hwm


def cpu_s(pid: int) -> tuple[str, float]:
    """(name, user + system CPU seconds so far) of a process; ("", 0.0) once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", 0.0
    name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
    return name, (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def print_phases(title: str, startup: dict, events: dict | None = None) -> None:
    print(f"{title} (seconds since up began; phases overlap where they run side by side):")
    for p in startup["phases"]:
        span = p["end"] - p["start"]
        print(f"  {p['phase']:<34} {p['start']:6.2f} -> {p['end']:6.2f}  ({span:5.2f})")
    if events:
        print("  as the components logged it:")
        for name, at in sorted(events.items(), key=lambda kv: kv[1]):
            print(f"    {name:<48} {at - startup['at']:6.2f}")


def _epoch(iso: str) -> float:
    """'2026-12-01T13:15:45.757891Z' (any fraction) -> seconds since the epoch."""
    base, _, frac = iso.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + float("0." + (frac or "0"))


def component_events(c: EmbeddedCluster) -> dict:
    """When each part of a running cluster got going, from its own files: kwokctl's pid files, etcd's and
    the apiserver's logs, and the apiserver's audit log (the controller's first request, the sentinel's
    first status write)."""
    kdir = Path(c.state()["kwok_cluster_dir"])
    out = {}
    pids = list((kdir / "pids").glob("*.pid"))
    if pids:
        out["kwokctl forked the control plane"] = min(f.stat().st_mtime for f in pids)
    day = time.strftime("%Y-%m-%d", time.gmtime(c.state()["startup"]["at"]))
    for line in (kdir / "logs" / "etcd.log").read_text().splitlines():
        if "ready to serve client requests" in line:
            out["etcd serves clients"] = _epoch(json.loads(line)["ts"])
            break
    for line in (kdir / "logs" / "kube-apiserver.log").read_text().splitlines():
        if "Serving securely on" in line:
            out["kube-apiserver serves (TLS listener)"] = _epoch(f"{day}T{line.split()[1]}")
            break
    for line in Path(c.state()["audit_log"]).read_text().splitlines():
        e = json.loads(line)
        ua, ref = e.get("userAgent", ""), e.get("objectRef") or {}
        if "rollouts-controller" in ua and "rollouts-controller: first request" not in out:
            out["rollouts-controller: first request"] = _epoch(e["requestReceivedTimestamp"])
        if ref.get("name") == SENTINEL and ref.get("subresource") == "status" and "rollouts-controller" in ua:
            out["sentinel status written by the controller"] = _epoch(e["stageTimestamp"])
            break
    return out


def spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f}s  min {min(xs):.2f}s  max {max(xs):.2f}s  (n={len(xs)})"


def idle_cpu(c: EmbeddedCluster, controller: str, seconds: float) -> None:
    """A cluster left alone: each of its processes' CPU seconds a minute, over ``seconds`` after a 30 s settle."""
    c.down(quiet=True)
    c.up(controller, build=False)
    try:
        time.sleep(30)
        pids = c.all_pids()
        before = {pid: cpu_s(pid) for pid in pids}
        time.sleep(seconds)
        after = {pid: cpu_s(pid) for pid in pids}
    finally:
        c.down(quiet=True)
    per: dict[str, float] = {}
    for pid, (name, secs) in before.items():
        if name and after[pid][0] == name:      # still the same process
            per[name] = per.get(name, 0.0) + (after[pid][1] - secs) * 60 / seconds
        elif name:
            print(f"  (process {pid} {name} ended during the measurement: its CPU is left out)")
    print(f"\nidle cluster, {seconds:.0f} s after a 30 s settle: {sum(per.values()):.2f} CPU-s a minute (" + ", ".join(
        f"{k} {v:.2f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])) + ")")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--controller", default=config.DEFAULT_CONTROLLER)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cli-rounds", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="also time a cold up (the snapshot removed first)")
    ap.add_argument("--idle", type=float, default=0.0, metavar="SECONDS",
                    help="also: the CPU a minute of an idle cluster, each process's, measured over SECONDS after "
                         "a 30 s settle (a test run keeps eight clusters up at once)")
    args = ap.parse_args()
    print("load average at the start (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    name = (os.environ.get("DRILLS_CLUSTER") or config.EMBEDDED_CLUSTER_NAME) + "-bench"
    os.environ["DRILLS_CLUSTER"] = name
    tc = Toolchain()
    print("cold build (wall seconds, from each component's build stamp):")
    total = 0.0
    for comp, secs in cold_builds(tc):
        total += secs
        print(f"  {comp:<28} {secs:7.1f}")
    print(f"  {'total':<28} {total:7.1f}")

    c = EmbeddedCluster(name, log=lambda m: None)
    c.down(quiet=True)
    t0 = time.monotonic()
    c.up(args.controller, build=False)
    first = time.monotonic() - t0
    snap = c.state()["snapshot"]
    print(f"\nfirst up: {first:.2f}s ({snap['start']}, snapshot {snap['key']})")
    if args.cold:
        c.down(quiet=True)
        SnapshotStore().remove(snap["key"])
        t0 = time.monotonic()
        c.up(args.controller, build=False)
        print(f"cold up (snapshot built and saved): {time.monotonic() - t0:.2f}s")
        print_phases("phases of the cold up", c.state()["startup"], component_events(c))

    ups, downs, peaks, phases, events, cpus = [], [], [], [], [], []
    for i in range(args.rounds):
        c.down(quiet=True)
        t0 = time.monotonic()
        c.up(args.controller, build=False)
        ups.append(time.monotonic() - t0)
        assert c.state()["snapshot"]["start"] == "warm"
        phases.append(c.state()["startup"])
        events.append(component_events(c))
        # peak RSS over a short period after the start
        stop = threading.Event()
        peak = [0]

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], sum(rss_kib(p)[0] for p in c.all_pids()))
                stop.wait(0.2)
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        time.sleep(3)
        stop.set()
        th.join()
        hwm = sum(rss_kib(p)[1] for p in c.all_pids())
        peaks.append((peak[0], hwm))
        cpu: dict[str, float] = {}
        for pid in c.all_pids():
            comm, secs = cpu_s(pid)
            cpu[comm] = cpu.get(comm, 0.0) + secs
        cpus.append(cpu)
        t0 = time.monotonic()
        c.down(quiet=True)
        downs.append(time.monotonic() - t0)
        print(f"round {i + 1}: warm up {ups[-1]:.2f}s  down {downs[-1]:.2f}s  control-plane RSS peak "
              f"{peak[0] / 1024:.0f} MiB (sum of per-process high-water marks {hwm / 1024:.0f} MiB); CPU of its "
              f"processes 3 s after up {sum(cpu.values()):.2f}s (" + ", ".join(
                  f"{k} {v:.2f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])[:3]) + ")")
    median_round = sorted(range(len(ups)), key=lambda i: ups[i])[len(ups) // 2]
    print_phases(f"\nphases of one warm start (round {median_round + 1}, the median)", phases[median_round],
                 events[median_round])

    if args.idle > 0:
        idle_cpu(c, args.controller, args.idle)

    cli_ups, cli_downs = [], []
    env = dict(os.environ, DRILLS_CLUSTER=name)
    for _ in range(args.cli_rounds):
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "drills", "cluster", "up", "--controller", args.controller,
                            "--no-build"], env=env, capture_output=True, text=True)
        cli_ups.append(time.monotonic() - t0)
        assert r.returncode == 0, r.stderr
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "drills", "cluster", "down"], env=env, capture_output=True)
        cli_downs.append(time.monotonic() - t0)

    print(f"\nwarm up to the sentinel reconciled (in process): {spread(ups)}  (target <= 3 s, was 8.3 s)")
    print(f"down (in process): {spread(downs)}")
    if cli_ups:
        print(f"`drills cluster up` (warm, new Python process): {spread(cli_ups)}")
        print(f"`drills cluster down` (new Python process): {spread(cli_downs)}")
    print("load average at the end (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"peak RSS of the whole control plane: {max(p for p, _ in peaks) / 1024:.0f} MiB sampled, "
          f"{max(h for _, h in peaks) / 1024:.0f} MiB by high-water marks")
    totals = sorted(sum(c.values()) for c in cpus)
    print(f"CPU of the control plane and the controller, 3 s after a warm up: median {totals[len(totals) // 2]:.2f}s "
          f"(all rounds: {', '.join(f'{t:.2f}' for t in totals)}); each cluster start of a test run pays it")


if __name__ == "__main__":
    main()
