"""Every lane passes on the controllers under test: the drills themselves, run the way users run them
(`drills run --lanes all` with its default -j: legs in parallel, one embedded cluster per version).

The legs' own pytest output is in the run folder (legs/<leg>.log); a failure here quotes every row that did not
pass and the tail of the log of every leg that failed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from drills import config
from drills.ledger import PASS, describe_row, read_rows


def test_every_lane_passes_on_the_controllers_under_test(request, tmp_path):
    versions = request.config.getoption("--controller") or ",".join(config.TEST_CONTROLLERS)
    reports = Path(os.environ.get("DRILLS_REPORTS") or config.reports_dir())
    env = dict(os.environ, DRILLS_REPORTS=str(reports), DRILLS_CLUSTER=f"lanes-{os.getpid()}")
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        rc = subprocess.call([sys.executable, "-m", "drills", "run", "--controller", versions, "--lanes", "all"],
                             env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(config.project_root()))
    text = log.read_text()
    run_dir = next((Path(line.split("run folder: ", 1)[1].split()[0]) for line in text.splitlines()
                    if line.startswith("run folder: ")), None)
    assert run_dir is not None, text[-4000:]
    rows = read_rows(run_dir / "ledger.json")
    bad = [describe_row(r) for r in rows if r["verdict"] not in (PASS, "unverified", "not_applicable")]
    failed_logs = [f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-40:])
                   for p in sorted((run_dir / "legs").glob("*.log")) if " passed" not in p.read_text()[-300:]
                   or " failed" in p.read_text()[-300:]]
    assert rc == 0, "\n".join([f"drills run exited {rc} (run folder {run_dir})", *bad, *failed_logs, text[-3000:]])
    lanes_seen = {(r["lane"], r["controller_version"]) for r in rows}
    assert {lane for lane, _ in lanes_seen} == {"a", "b", "abort", "order"}, sorted(lanes_seen)
    assert {v for _, v in lanes_seen} == set(versions.split(",")), sorted(lanes_seen)
