"""A long fuzz run of the run records drills reads back (tests/test_fuzz_records.py: a run folder's run.json and
ledger.json, shard folders given to `report --merge`, the run folders of `upgrade-check --runs`): how many generated
inputs ran, how long they took, and whether any ended in a traceback, a hang or a write outside the reports folder
(the test fails then, and this script exits 1).

    python benchmarks/bench_fuzz_inputs.py [--examples 10000] [--file tests/test_fuzz_records.py] [-k EXPR]

`make test` runs the same tests with a few dozen inputs per entry point; this runs ``--examples`` per entry point,
each seeded anew (DRILLS_FUZZ=long: not derandomized).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10_000, help="inputs per entry point (default 10,000)")
    ap.add_argument("--file", default="tests/test_fuzz_records.py")
    ap.add_argument("-k", default=None, help="only the tests pytest -k selects")
    args = ap.parse_args()
    env = dict(os.environ, DRILLS_FUZZ="long", DRILLS_FUZZ_EXAMPLES=str(args.examples), DRILLS_BACKGROUND_BUILD="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:locust", "-q", "-p", "no:cacheprovider",
           "--hypothesis-show-statistics", "-W", "ignore::DeprecationWarning", args.file, *(["-k", args.k] if args.k
                                                                                          else [])]
    started = time.monotonic()
    r = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=24 * 3600)
    took = time.monotonic() - started
    blocks = re.split(r"^(tests/\S+::\S+):$", r.stdout, flags=re.M)      # a header, then each phase's counts
    cases = entry_points = 0
    for name, block in zip(blocks[1::2], blocks[2::2]):
        counts = [tuple(map(int, m)) for m in re.findall(r"- (\d+) passing, (\d+) failing, and (\d+) invalid", block)]
        ran = sum(p + f for p, f, _ in counts)
        cases += ran
        entry_points += 1
        print(f"  {name.split('::')[-1]}: {ran} cases ({sum(f for _, f, _ in counts)} failing, "
              f"{sum(i for _, _, i in counts)} invalid draws skipped)")
    print(f"fuzz inputs: {cases:,} cases over {entry_points} entry points in {took:.0f} s "
          f"({cases / took if took else 0:.1f} cases/s, {os.cpu_count()} cores); pytest exit {r.returncode}")
    if r.returncode != 0:
        print(r.stdout[-4000:], r.stderr[-2000:], sep="\n")
    return 0 if r.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
