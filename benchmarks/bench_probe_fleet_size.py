"""A probe at the fleet's real sizes: `drills probe` at N replicas (default 360, the incident's autoscaler maximum,
with a floor of 2 and the prescription's rung 5), its wall time, and the peak memory of the embedded cluster's
processes (control plane, kwok, the controller, the releaser: summed RSS, sampled every second) while it runs.

    python benchmarks/bench_probe_fleet_size.py [--replicas 360] [--min-pods 2] [--controller v1.8.2]
                                                [--scale-out N]

A figure, never a test.  The cluster is the probe's own (DRILLS_CLUSTER=bench-fleet-size), taken down afterwards.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from drills.core import config
from drills.cluster import EmbeddedCluster

CLUSTER = "bench-fleet-size"


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=360)
    ap.add_argument("--min-pods", type=int, default=2)
    ap.add_argument("--steps", default="5,pause:10s")
    ap.add_argument("--controller", default=config.DEFAULT_CONTROLLER)
    ap.add_argument("--scale-out", type=int, default=None)
    a = ap.parse_args()
    env = dict(os.environ, DRILLS_CLUSTER=CLUSTER)
    cluster = EmbeddedCluster(CLUSTER, log=lambda m: None)
    peak = {"kib": 0, "at": 0.0, "procs": 0}
    stop = threading.Event()
    t0 = time.monotonic()

    def sample():
        while not stop.wait(1.0):
            pids = cluster.own_processes()
            total = sum(rss_kib(p) for p in pids)
            if total > peak["kib"]:
                peak.update(kib=total, at=time.monotonic() - t0, procs=len(pids))
    threading.Thread(target=sample, daemon=True).start()
    cmd = [sys.executable, "-m", "drills", "probe", "--steps", a.steps, "--replicas", str(a.replicas),
           "--min-pods", str(a.min_pods), "--controller", a.controller, "--json",
           *(["--scale-out", str(a.scale_out)] if a.scale_out else [])]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=7200)
    finally:
        stop.set()
        wall = time.monotonic() - t0
        subprocess.run([sys.executable, "-m", "drills", "cluster", "down"], env=env, capture_output=True,
                       timeout=300)
    print(f"$ {' '.join(cmd[1:])}")
    print(f"  exit {r.returncode}, wall {wall:.0f} s (cluster start included)")
    print(f"  peak memory of the cluster's processes: {peak['kib'] / 1024:.0f} MiB ({peak['procs']} processes, "
          f"at {peak['at']:.0f} s)")
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        print(r.stderr[-2000:])
        return 1
    print(f"  peak canary weight while partial: {doc['peak_canary_weight_while_partial']}; weights while partial "
          f"[t, weight, available, target]: {doc['weights_while_partial'][:6]}")
    if doc.get("scale_out"):
        print(f"  scale-out: {doc['scale_out']['said']}")
    if doc.get("inconclusive_reason"):
        print(f"  INCONCLUSIVE: {doc['inconclusive_reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
