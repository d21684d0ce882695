"""Embedded cluster figures: cold build time per component (from the build stamps), warm `up` to the first
reconcile of the controller, `down`, and the peak RSS of the whole control plane.

    python benchmarks/bench_cluster.py [--controller v1.8.2] [--rounds 3]

Target (issue): warm `up` to a reconciling controller <= 5 s on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

from drills import config
from drills.cluster import EmbeddedCluster
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--controller", default=config.DEFAULT_CONTROLLER)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ["DRILLS_CLUSTER"] = "bench"
    tc = Toolchain()
    print("cold build (wall seconds, from each component's build stamp):")
    total = 0.0
    for name, secs in cold_builds(tc):
        total += secs
        print(f"  {name:<28} {secs:7.1f}")
    print(f"  {'total':<28} {total:7.1f}")

    ups, downs, peaks = [], [], []
    for i in range(args.rounds):
        c = EmbeddedCluster("bench", log=lambda m: None)
        c.down(quiet=True)
        t0 = time.monotonic()
        c.up(args.controller, build=False)
        ups.append(time.monotonic() - t0)
        # peak RSS over a short busy period: a Rollout created and reconciled
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
        t0 = time.monotonic()
        c.down(quiet=True)
        downs.append(time.monotonic() - t0)
        print(f"round {i + 1}: up {ups[-1]:.2f}s  down {downs[-1]:.2f}s  control-plane RSS peak "
              f"{peak[0] / 1024:.0f} MiB (sum of per-process high-water marks {hwm / 1024:.0f} MiB)")
    print(f"warm up to first reconcile: median {statistics.median(ups):.2f}s  min {min(ups):.2f}s  "
          f"max {max(ups):.2f}s  (target <= 5 s)")
    print(f"down: median {statistics.median(downs):.2f}s")
    print(f"peak RSS of the whole control plane: {max(p for p, _ in peaks) / 1024:.0f} MiB sampled, "
          f"{max(h for _, h in peaks) / 1024:.0f} MiB by high-water marks")


if __name__ == "__main__":
    main()
