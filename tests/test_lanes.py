"""Every lane passes on the controllers under test, on every router it runs on: the drills themselves, run the way
users run them (`drills run --lanes all --router all`: legs in parallel, one embedded cluster per version).

The legs' own pytest output is in the run folder (legs/<leg>.log); a failure here quotes every row that did not
pass and the tail of the log of every leg that failed.  The same run's rows then go through `drills
upgrade-check --runs`: the change from the first version under test to the last, classified."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from drills.core import config
from drills.core.procs import die_with_parent, stop_process
from drills import lanes
from drills.record.ledger import PASS, describe_row, read_rows


STOP_GRACE_S = 180.0     # an interrupted run's own clean-up: its legs stopped, its clusters taken down


def _drills(*args, env=None, log: Path | None = None) -> tuple[int, str]:
    env = dict(os.environ, **(env or {}))
    if log is None:
        r = subprocess.run([sys.executable, "-m", "drills", *args], env=env, capture_output=True, text=True,
                           cwd=str(config.project_root()), timeout=600)
        return r.returncode, r.stdout + r.stderr
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "drills", *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                cwd=str(config.project_root()), stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=die_with_parent)
        try:
            rc = proc.wait()
        except BaseException:
            # the session interrupted (Ctrl-C): the run, in a session of its own (a terminal's Ctrl-C does not reach
            # it), gets one SIGTERM, as a user stops it: its legs end and its clusters come down (subprocess.call's
            # SIGKILL left them for the next run to reap; a second signal would abandon its restore)
            stop_process(proc, timeout=STOP_GRACE_S)
            raise
    return rc, log.read_text()


@pytest.fixture(scope="module")
def versions(request) -> list[str]:
    return (request.config.getoption("--controller") or ",".join(config.TEST_CONTROLLERS)).split(",")


@pytest.fixture(scope="module")
def lanes_run(versions, tmp_path_factory) -> tuple[int, str, Path | None]:
    reports = Path(os.environ.get("DRILLS_REPORTS") or config.reports_dir())
    env = {"DRILLS_REPORTS": str(reports), "DRILLS_CLUSTER": f"lanes-{os.getpid()}"}
    # DRILLS_TEST_LANE_JOBS legs at a time (make test: TEST_LANE_JOBS, five with a warm cache; four without it, as
    # from empty caches, where the builds fill the cores): legs mostly wait (on the controller, holds and pauses), and
    # lanes abort, order and escape run their probes side by side within a leg, so five at a time keep the cores busy
    # without starving the other test workers (eight at a time put the load at 33 on two cores)
    jobs = os.environ.get("DRILLS_TEST_LANE_JOBS") or "4"
    rc, text = _drills("run", "--controller", ",".join(versions), "--lanes", "all", "--router", "all", "-j", jobs,
                       env=env,
                       log=tmp_path_factory.mktemp("lanes") / "run.log")
    run_dir = next((Path(line.split("run folder: ", 1)[1].split()[0]) for line in text.splitlines()
                    if line.startswith("run folder: ")), None)
    return rc, text, run_dir


def test_every_lane_passes_on_the_controllers_under_test(lanes_run, versions):
    rc, text, run_dir = lanes_run
    assert run_dir is not None, text[-4000:]
    rows = read_rows(run_dir / "ledger.json")
    bad = [describe_row(r) for r in rows if r["verdict"] not in (PASS, "unverified", "not_applicable")]
    failed_logs = [f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-40:])
                   for p in sorted((run_dir / "legs").glob("*.log")) if " passed" not in p.read_text()[-300:]
                   or " failed" in p.read_text()[-300:]]
    assert rc == 0, "\n".join([f"drills run exited {rc} (run folder {run_dir})", *bad, *failed_logs, text[-3000:]])
    lanes_seen = {(r["lane"], r["controller_version"]) for r in rows}
    pairs = config.swap_pairs(versions)          # lane swap runs on version pairs, its rows under the pair's first
    assert {lane for lane, _ in lanes_seen} == set(lanes.REGISTRY) - (set() if pairs else {"swap"}), sorted(lanes_seen)
    assert {v for _, v in lanes_seen} == set(versions), sorted(lanes_seen)
    # each lane on each router it names, and nothing on a router it does not
    routed = {(r["lane"], r["router"], r["controller_version"]) for r in rows}
    assert routed == {(k, router, v) for k, lane in lanes.REGISTRY.items() if k != "swap" for router in lane.routers
                      for v in versions} | {("swap", "istio", a) for a, _ in pairs}
    assert {r["details"]["pair"] for r in rows if r["lane"] == "swap"} == {f"{a}->{b}" for a, b in pairs}
    # lane A through nginx: the incident (BEFORE the final setWeight on the partial ReplicaSet), then the prescription
    peaks = {(r["controller_version"], r["step"]): r["observed"] for r in rows
             if r["router"] == "nginx" and r.get("id", "").endswith("/peak-weight")}
    assert peaks == {**{(v, "before"): 100 for v in versions}, **{(v, "after"): 5 for v in versions}}, peaks


def test_upgrade_check_classifies_the_run_from_the_first_version_to_the_last(lanes_run, versions):
    rc, text, run_dir = lanes_run
    if len(versions) < 2:
        pytest.skip(f"one controller version under test ({versions[0]}): no upgrade to classify")
    assert run_dir is not None, text[-4000:]
    code, out = _drills("upgrade-check", "--from", versions[0], "--to", versions[-1], "--runs", str(run_dir),
                        "--json")
    assert code in (0, 1, 3), out[-3000:]
    doc = json.loads(out[: out.rindex("}") + 1])
    assert (doc["baseline"], doc["candidate"], doc["exit"]) == (versions[0], versions[-1], code)
    rows = read_rows(run_dir / "ledger.json")
    paired = {(r["lane"], r["step"]) for r in rows if r["controller_version"] in (versions[0], versions[-1])
              and r["lane"] != "swap"}
    assert {(c["lane"], c["step"]) for c in doc["changes"]} == paired
    # lane swap's rows are verdicts on the pair, not changes: the upgrade's states, first in upgrade.json's swap; the
    # downgrade was not run by `drills run` (upgrade-check runs it), which the classification says is missing
    up = f"{versions[0]}->{versions[-1]}"
    assert {e["state"] for e in doc["swap"] if e["pair"] == up} >= {"healthy", "paused", "timed-pause", "aborted",
                                                                    "rollback"}, doc["swap"]
    assert any(f"no row for the pair {versions[-1]}->{versions[0]}" in m for m in doc["missing"]), doc["missing"]
    assert sum(doc["counts"].values()) == len(doc["changes"])
    by_step = {(c["lane"], c["step"]): c for c in doc["changes"] if not c["assertion"].startswith("load.")}
    hazard = by_step.get(("order", "hazard-replica-progress-threshold"))
    if versions[0] == "v1.8.2" and versions[-1] == "v1.10.2":
        # the field does not exist before v1.9: the hazard appears with the upgrade, said in words
        assert hazard is not None and hazard["class"] == "new" and hazard["danger"], hazard
        assert "the prescription no longer holds" in hazard["words"], hazard
        # a hazard the baseline lacks gates the upgrade, whatever its class, and is named first
        assert code == 1 and hazard["new_hazard"] and doc["new_hazards"], (code, doc["new_hazards"])
        assert list(doc)[:2] == ["headlines", "new_hazards"]
        assert by_step[("a", "before")]["class"] == by_step[("a", "after")]["class"] == "same", by_step
    classified = Path(re.search(r"run folder: (\S+)", out).group(1))     # a new run folder, never the input's
    assert classified != run_dir and not (run_dir / "upgrade.json").exists()
    md = (classified / "report.md").read_text()
    assert f"## Upgrade check: {versions[0]} → {versions[-1]}" in md
