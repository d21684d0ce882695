"""`drills report --merge` of many rows: shard run folders as `drills run --shard I/N` leaves them, merged and reported.

    python benchmarks/bench_report_merge.py [--rows 30000] [--shards 3] [--keep DIR]

Writes N shard run folders (no cluster): the legs of every supported controller version and every registered lane,
each leg's rows in the shape the lanes record them (one row is recorded with drills' own Ledger per leg, the rest
are that row with its step, key and evidence changed: ten assertions per step, one flight-recorder timeline per
step, closed by the recorder's END record naming its leg and run), and run.json with each leg's record.  Then runs
`drills report --merge` on them as a user does (a subprocess) and prints its wall time, the merged folder's rows and
its exit; a merge of this size took 275 s when the matrix looked up each line's first cell by scanning every cell.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from drills.core import config
from drills import lanes
from drills.record.ledger import HOLDS, PASS, Ledger

ASSERTIONS_PER_STEP = 10


def timeline(path: Path, leg: str, run_id: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"seq": 1, "type": "ADDED", "kind": "Rollout", "rv": "101", "obj": {}}) + "\n"
                    + json.dumps({"seq": 2, "type": "END", "kind": "Recorder", "rv": None,
                                  "obj": {"complete": True, "leg": leg, "run_id": run_id}}) + "\n")


def shard(path: Path, legs: list[str], all_legs: list[str], rows_per_leg: int) -> int:
    path.mkdir(parents=True)
    rows, records = [], []
    for leg in legs:
        controller, lane, variant = leg.split("/")
        scratch = path / ".scratch"
        first = Ledger(scratch, path.name, "embedded", controller, leg=leg).record(
            lane, "step0", "step 0 assertion 0 holds", 1, 1, PASS, evidence="x.timeline.jsonl", key="k0",
            polarity=HOLDS, shows=True, variant=variant)
        for i in range(rows_per_leg):
            step, k = divmod(i, ASSERTIONS_PER_STEP)
            ev = Path(controller) / f"lane-{lane}" / f"step{step}.timeline.jsonl"
            if k == 0:
                timeline(path / ev, leg, path.name)
            row = copy.deepcopy(first)
            row.update(step=f"step{step}", assertion=f"step {step} assertion {k} holds",
                       id=f"{lane}/step{step}/k{k}", evidence=str(ev))
            rows.append(row)
        records.append({"controller": controller, "lane": lane, "variant": variant, "id": leg, "state": "done",
                        "rc": 0, "seconds": 1.0, "error": None})
        shutil.rmtree(scratch)
    (path / "ledger.json").write_text(json.dumps(rows, indent=2))
    (path / "run.json").write_text(json.dumps({"run_id": path.name, "plan_digest": "bench", "all_legs": all_legs,
                                               "legs": records}, indent=1))
    return len(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=30000)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--keep", default=None, help="write the folders here and keep them (default: a temporary folder)")
    args = ap.parse_args()
    all_legs = [f"{v}/{lane}/stage" for v in config.SUPPORTED_CONTROLLERS for lane in lanes.REGISTRY]
    per_leg = max(1, args.rows // len(all_legs))
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        dirs, total = [], 0
        for s in range(args.shards):
            d = root / "shards" / f"shard-{s + 1}"
            total += shard(d, all_legs[s::args.shards], all_legs, per_leg)
            dirs.append(d)
        reports = root / "reports"
        print(f"{total} rows in {len(all_legs)} legs ({per_leg} per leg), {args.shards} shards", flush=True)
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "drills", "report", "--merge", *map(str, dirs)], text=True,
                           capture_output=True, env=dict(os.environ, DRILLS_REPORTS=str(reports)))
        wall = time.monotonic() - t0
        merged = next((Path(x) for x in r.stdout.splitlines() if x.startswith(str(reports))), None)
        rows = len(json.loads((merged / "ledger.json").read_text())) if merged else 0
        print(f"drills report --merge: {wall:.1f} s for {rows} merged rows, exit {r.returncode}")
        if r.returncode not in (0,):
            print(r.stderr[-2000:], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
