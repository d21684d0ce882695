"""Shards for real: shards 1/2 and 2/2 of a small run, merged, give the unsharded run's rows (lane B on two
controller versions: two legs, each on an embedded cluster of its own; the three runs go at once)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from drills.record.ledger import read_rows

pytestmark = pytest.mark.single_version
VERSIONS = "v1.8.2,v1.10.2"


def _start(tmp_path: Path, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
    reports = tmp_path / name
    env = dict(os.environ, DRILLS_REPORTS=str(reports), DRILLS_CLUSTER=f"shard-{name}-{os.getpid()}")
    log = open(tmp_path / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "drills", "run", "--controller", VERSIONS, "--lanes", "b", *args],
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    return proc, reports


def _rows(run_dir: Path) -> set[tuple]:
    return {(r["lane"], r["step"], r["assertion"], r["controller_version"], r["verdict"])
            for r in read_rows(run_dir / "ledger.json")}


def test_shards_merged_equal_the_unsharded_run(tmp_path):
    runs = {name: _start(tmp_path, name, *args) for name, args in (
        ("whole", ("-j", "2")), ("s1", ("--shard", "1/2")), ("s2", ("--shard", "2/2")))}
    for name, (proc, _) in runs.items():
        assert proc.wait(timeout=1500) == 0, (tmp_path / f"{name}.log").read_text()[-4000:]
    whole = (runs["whole"][1] / "latest").resolve()
    shards = [(runs[n][1] / "latest").resolve() for n in ("s1", "s2")]
    assert all(read_rows(s / "ledger.json") for s in shards), "each shard ran a leg"
    merged_reports = tmp_path / "merged"
    r = subprocess.run([sys.executable, "-m", "drills", "report", "--merge", *map(str, shards)], capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, DRILLS_REPORTS=str(merged_reports)))
    assert r.returncode == 0, r.stderr
    merged = Path(r.stdout.splitlines()[0])
    assert merged.parent == merged_reports and (merged / "report.html").is_file()
    assert _rows(merged) == _rows(whole) and len(_rows(whole)) >= 2 * 9, sorted(_rows(whole) ^ _rows(merged))
    assert (merged_reports / "matrix.md").is_file()


def test_a_failed_legs_cluster_keeps_the_tail_of_its_logs(tmp_path, monkeypatch):
    from drills.cluster import EmbeddedCluster
    from drills.run.runner import KEEP_LOG_BYTES, keep_cluster_logs

    monkeypatch.setenv("DRILLS_CACHE", str(tmp_path / "cache"))
    c = EmbeddedCluster("kept-logs")
    (c.folder / "logs").mkdir(parents=True)
    plane = c.kwok_workdir / "clusters" / c.name / "logs"
    plane.mkdir(parents=True)
    big = b"x" * KEEP_LOG_BYTES + b"the controller's last words\n"
    (c.folder / "logs" / "rollouts-controller.log").write_bytes(big)
    (plane / "kube-controller-manager.log").write_text("healthz check failed\n")
    (plane / "audit.log").write_text("{}\n" * 10)
    kept = keep_cluster_logs(c, tmp_path / "run" / "clusters" / c.name)
    assert sorted(p.name for p in kept.iterdir()) == ["kube-controller-manager.log", "rollouts-controller.log"]
    tail = (kept / "rollouts-controller.log").read_bytes()
    assert len(tail) == KEEP_LOG_BYTES and tail.endswith(b"the controller's last words\n")
    assert (kept / "kube-controller-manager.log").read_text() == "healthz check failed\n"
