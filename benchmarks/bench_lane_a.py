"""Lane A wall time on the embedded cluster against its floor, and the five-version matrix wall time.

    python benchmarks/bench_lane_a.py [--controller v1.8.2] [--matrix]

The floor is what the lane must wait for by construction: the canary pauses of the two v2 deploys, the
two scale-down delays of the old ReplicaSet, the readiness holds of the revived pods (one hold per pod,
per rollback), and the load phases (steady before each rollback, settled after).  Target ratio <= 1.15.
With --matrix: `drills run --controller all --lanes a` (legs in parallel, default -j) with binaries cached;
target <= 4 min; printed against the sum of the legs' own durations (the run's run.json).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import yaml

from drills.core import config


def _seconds(d: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", d)
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def floor_seconds(variant: str = "stage") -> dict:
    fx = yaml.safe_load((config.fixtures_dir() / "lanes" / "a" / f"{variant}.yaml").read_text())
    pauses = sum(_seconds(s["pause"]["duration"]) for steps in (fx["steps_before"], fx["steps_after"])
                 for s in steps if "pause" in s and (s["pause"] or {}).get("duration"))
    scale_down = 2 * fx["scaleDownDelaySeconds"]
    pods_per_rollback = fx["replicas"] if not fx.get("batch_release") else 2
    holds = 2 * pods_per_rollback * fx["hold_seconds"]
    load = 2 * 5.0 + 2 * 3.0 if variant == "stage" else 0.0
    return {"pauses": pauses, "scale_down_delays": scale_down, "readiness_holds": holds, "load_phases": load,
            "total": pauses + scale_down + holds + load}


def run(args: list[str]) -> tuple[float, dict]:
    """Wall time of `drills run ARGS` and the run's own record (legs and their durations)."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "drills", "run", *args], check=False)
    wall = time.monotonic() - t0
    latest = config.reports_dir() / "latest"
    meta = json.loads((latest / "run.json").read_text()) if (latest / "run.json").is_file() else {}
    return wall, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--controller", default=config.DEFAULT_CONTROLLER)
    ap.add_argument("--matrix", action="store_true")
    a = ap.parse_args()
    # bring the cluster up first so the lane's time excludes it
    subprocess.run([sys.executable, "-m", "drills", "cluster", "up", "--controller", a.controller], check=True,
                   stdout=subprocess.DEVNULL, env=dict(os.environ))
    t, _ = run(["--controller", a.controller, "--lanes", "a", "--keep-cluster"])
    f = floor_seconds()
    print(f"lane A ({a.controller}, stage): wall {t:.1f}s, floor {f['total']:.1f}s "
          f"({', '.join(f'{k} {v:.0f}s' for k, v in f.items() if k != 'total')}), ratio {t / f['total']:.2f} "
          f"(target <= 1.15)")
    if a.matrix:
        t, meta = run(["--controller", "all", "--lanes", "a"])
        legs_sum = sum(x.get("seconds") or 0 for x in meta.get("legs") or [])
        print(f"five-version matrix (lane A, binaries cached, a fresh cluster per version, -j {meta.get('jobs')}): "
              f"wall {t / 60:.1f} min against the legs' own durations summed {legs_sum / 60:.1f} min "
              f"(target <= 4 min)")


if __name__ == "__main__":
    main()
