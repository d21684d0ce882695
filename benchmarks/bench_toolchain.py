"""The toolchain's build from empty caches, one component at a time against two at a time: the wall of the whole
set, each component's build seconds, and the CPU the builds used.

    python benchmarks/bench_toolchain.py                               # the make-test set, -j 1 then -j 2
    python benchmarks/bench_toolchain.py --components etcd,kwok,helm   # a subset (a quicker comparison)
    python benchmarks/bench_toolchain.py --jobs 2                      # one variant only

Every variant starts from its own empty DRILLS_CACHE, GOMODCACHE and GOCACHE (temporary folders, removed
afterwards), so each downloads and compiles everything; run it on an otherwise idle machine.  A figure, never a
test.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from drills.core import config
from drills.toolchain import components_for

ROOT = config.project_root()
SESSION = {"controllers": list(config.TEST_CONTROLLERS), "extras": ["prometheus", "registry"]}


def _variant(jobs: int, names: list[str] | None) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix=f"drills-bench-toolchain-j{jobs}-"))
    env = dict(os.environ, DRILLS_CACHE=str(scratch / "drills"), GOMODCACHE=str(scratch / "gomod"),
               GOCACHE=str(scratch / "gocache"), DRILLS_BUILD_JOBS=str(jobs))
    comps = components_for(SESSION["controllers"], SESSION["extras"])
    if names:
        comps = [c for c in comps if c.name in names or c.key in names]
    code = ("import sys; from drills.toolchain import Toolchain, components_for; "
            f"cs = components_for({SESSION['controllers']!r}, {SESSION['extras']!r}); "
            f"want = {[c.key for c in comps]!r}; Toolchain().ensure([c for c in cs if c.key in want])")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=4 * 3600)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        builds = {}
        for c in comps:
            stamp = scratch / "drills" / c.name / c.version / "BUILD.json"
            if stamp.is_file():
                builds[c.key] = json.loads(stamp.read_text()).get("build_seconds")
        return {"jobs": jobs, "rc": r.returncode, "wall_s": round(wall), "builds": builds,
                "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)),
                "error": r.stderr.strip().splitlines()[-1] if r.returncode else None}
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(scratch)], check=False, timeout=600)
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="1,2", help="variants: components built at a time (default 1,2)")
    ap.add_argument("--components", default="", help="component names or keys (default: make test's set)")
    a = ap.parse_args()
    names = [x.strip() for x in a.components.split(",") if x.strip()] or None
    cores = os.cpu_count() or 1
    for jobs in [int(j) for j in a.jobs.split(",") if j.strip()]:
        v = _variant(jobs, names)
        print(f"-j {jobs}: wall {v['wall_s'] / 60:.1f} min ({v['wall_s']} s), CPU {v['cpu_s']} s = "
              f"{v['cpu_s'] / max(1, v['wall_s']):.2f} cores of {cores}, exit {v['rc']}"
              + (f" ({v['error']})" if v["error"] else ""))
        for key, secs in v["builds"].items():
            print(f"    {key:<28} {secs:7.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
