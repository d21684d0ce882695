"""What a merge of shards does with the files of their folders (no cluster: shard folders written as `drills run
--shard` leaves them): one name in two shards with the same content is kept once; the logs a shard kept of its own
machine (a failed leg's cluster logs) with different content are kept apart under a name per shard, and said; a
row's evidence (or any other record) of one name with different content is refused, exit 2 naming both shards,
nothing written; a link that points outside its shard is refused, exit 2 naming it; a link inside is kept as a
link, and said."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drills.core import config
from drills.run import runner
from drills.core.errors import BadInput
from drills.record.ledger import HOLDS, PASS, Ledger, read_rows

PLAN = ["v1.8.2/a/stage", "v1.8.2/b/stage"]


def shard(root: Path, name: str, leg: str) -> Path:
    """A shard run folder: one leg's row, its evidence (a complete timeline) under the leg's own folder."""
    d = root / name
    controller, lane, _ = leg.split("/")
    ev = d / controller / f"lane-{lane}" / "step.timeline.jsonl"
    ev.parent.mkdir(parents=True)
    ev.write_text(json.dumps({"seq": 1, "type": "ADDED", "kind": "Rollout", "rv": "1", "obj": {}}) + "\n"
                  + json.dumps({"seq": 2, "type": "END", "kind": "Recorder", "rv": None,
                                "obj": {"complete": True, "leg": leg, "run_id": name}}) + "\n")
    Ledger(d, name, "embedded", controller, leg=leg).record(lane, "step", "step holds", 1, 1, PASS, evidence=ev,
                                                            key="k", polarity=HOLDS, shows=True)
    (d / "run.json").write_text(json.dumps({"run_id": name, "plan_digest": "p1", "all_legs": PLAN,
                                            "legs": [{"id": leg, "rc": 0, "error": None}]}))
    return d


@pytest.fixture
def shards(tmp_path):
    return shard(tmp_path, "s1", PLAN[0]), shard(tmp_path, "s2", PLAN[1])


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def merge(shards_, dest: Path) -> tuple[Path, list[str]]:
    said: list[str] = []
    return runner.merge(list(shards_), dest=dest, log=said.append), said


def drills_merge(tmp_path: Path, *folders: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "drills", "report", "--merge", *map(str, folders)],
                          capture_output=True, text=True, timeout=300, cwd=str(config.project_root()),
                          env=dict(os.environ, DRILLS_REPORTS=str(tmp_path / "reports")))


def refused_naming(r: subprocess.CompletedProcess, tmp_path: Path, *names: str) -> str:
    """Exit 2 with one line naming each of ``names``, and nothing written where the merged folder would go."""
    line = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "\n" not in line and line.startswith("drills:"), r.stderr
    assert all(n in line for n in names), (names, line)
    reports = tmp_path / "reports"
    assert not reports.exists() or not [p for p in reports.rglob("*")], list(reports.rglob("*"))
    return line


def test_a_file_the_same_in_two_shards_is_kept_once(tmp_path, shards):
    for s in shards:
        write(s / "fixtures" / "expectations.yaml", "versions: {}\n")
    merged, said = merge(shards, tmp_path / "m")
    assert (merged / "fixtures" / "expectations.yaml").read_text() == "versions: {}\n"
    assert sorted(p.name for p in (merged / "fixtures").iterdir()) == ["expectations.yaml"]
    assert any("1 file(s) the same in several shards: kept once" in x for x in said), said


def test_a_failed_legs_cluster_logs_in_two_shards_are_kept_apart_and_said(tmp_path, shards):
    for s in shards:
        write(s / "clusters" / "drills" / "rollouts-controller.log", f"controller of {s.name}\n")
        write(s / "legs" / "v1.8.2-a-stage.log", f"pytest of {s.name}\n")
    merged, said = merge(shards, tmp_path / "m")
    kept = merged / "clusters" / "drills"
    assert sorted(p.name for p in kept.iterdir()) == ["rollouts-controller.s1.log", "rollouts-controller.s2.log"]
    assert (kept / "rollouts-controller.s1.log").read_text() == "controller of s1\n"
    assert (kept / "rollouts-controller.s2.log").read_text() == "controller of s2\n"
    assert sorted(p.name for p in (merged / "legs").iterdir()) == ["v1.8.2-a-stage.s1.log", "v1.8.2-a-stage.s2.log"]
    line = next(x for x in said if "clusters/drills/rollouts-controller.log" in x)
    assert "kept apart" in line and "rollouts-controller.s1.log" in line and "rollouts-controller.s2.log" in line
    assert runner.verdict(merged, whole=True)[0] == 0        # the rows' evidence is untouched


def test_the_per_shard_names_say_so_on_the_command_line_too(tmp_path, shards):
    for s in shards:
        write(s / "clusters" / "drills" / "etcd.log", f"etcd of {s.name}\n")
    r = drills_merge(tmp_path, *shards)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "clusters/drills/etcd.log differs between shards" in r.stderr and "etcd.s1.log" in r.stderr
    merged = Path(r.stdout.splitlines()[0])
    assert (merged / "clusters" / "drills" / "etcd.s2.log").read_text() == "etcd of s2\n"


@pytest.mark.parametrize("rel", ["v1.8.2/lane-a/step.timeline.jsonl", "v1.8.2/observed.json", "notes.txt"])
def test_a_different_record_of_one_name_is_refused_naming_both_shards(tmp_path, shards, rel):
    s1, s2 = shards
    if not (s1 / rel).exists():
        write(s1 / rel, "{}\n")
    write(s2 / rel, '{"other": 1}\n')
    with pytest.raises(BadInput, match="differs between"):
        merge(shards, tmp_path / "m")
    assert not (tmp_path / "m").exists()
    line = refused_naming(drills_merge(tmp_path, s1, s2), tmp_path, rel, str(s1), str(s2))
    assert ("a row names it as evidence" in line) == rel.endswith("timeline.jsonl")


def test_a_log_a_row_names_as_evidence_is_evidence_never_kept_apart(tmp_path, shards):
    s1, s2 = shards
    write(s1 / "load" / "locust.log", "run 1\n")
    write(s2 / "load" / "locust.log", "run 2\n")
    rows = read_rows(s1 / "ledger.json")
    (s1 / "ledger.json").write_text(json.dumps([dict(rows[0], evidence="load/locust.log")]))
    refused_naming(drills_merge(tmp_path, s1, s2), tmp_path, "load/locust.log", "a row names it as evidence")


def test_a_folder_in_one_shard_and_a_file_in_the_other_is_refused(tmp_path, shards):
    s1, s2 = shards
    write(s1 / "extra" / "x.json", "{}\n")
    write(s2 / "extra", "{}\n")
    refused_naming(drills_merge(tmp_path, s1, s2), tmp_path, "extra is a folder in", str(s1), str(s2))


@pytest.mark.parametrize("target", ["/etc/hostname", "../outside.json", "/"])
def test_a_link_that_points_outside_its_shard_is_refused_naming_it(tmp_path, shards, target):
    s1, s2 = shards
    write(tmp_path / "outside.json", '{"secret": 1}\n')
    (s2 / "v1.8.2" / "copied.json").symlink_to(target if target.startswith("/") else "../" + target)
    line = refused_naming(drills_merge(tmp_path, s1, s2), tmp_path, "v1.8.2/copied.json", "outside the shard",
                          str(s2))
    assert "secret" not in line


def test_a_link_through_another_link_out_of_the_shard_is_refused(tmp_path, shards):
    s1, s2 = shards
    (s2 / "hop").symlink_to("..")                     # inside the folder's parent: outside the shard
    (s2 / "v1.8.2" / "via.json").symlink_to("../hop/outside.json")
    write(tmp_path / "outside.json", "{}\n")
    with pytest.raises(BadInput, match="outside the shard"):
        merge(shards, tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_a_link_inside_its_shard_is_kept_as_a_link_and_said(tmp_path, shards):
    s1, s2 = shards
    ev = s2 / "v1.8.2" / "lane-b" / "step.timeline.jsonl"
    (s2 / "latest-evidence.jsonl").symlink_to("v1.8.2/lane-b/step.timeline.jsonl")      # relative
    (s2 / "v1.8.2" / "same.jsonl").symlink_to(ev)                                        # absolute, inside
    (s2 / "lane-b").symlink_to(ev.parent)                                                # a folder link, inside
    merged, said = merge(shards, tmp_path / "m")
    for name in ("latest-evidence.jsonl", "v1.8.2/same.jsonl", "lane-b"):
        link = merged / name
        assert link.is_symlink() and not os.path.isabs(os.readlink(link)), name
        assert link.resolve().is_relative_to(merged.resolve()), (name, link.resolve())   # never back into the shard
        assert any(f"{name} is a link inside the shard" in x and "kept as a link" in x for x in said), (name, said)
    assert (merged / "v1.8.2" / "same.jsonl").read_text() == ev.read_text()


def test_a_fifo_in_a_shard_is_refused_never_read(tmp_path, shards):
    s1, s2 = shards
    os.mkfifo(s2 / "v1.8.2" / "pipe.json")       # a copy would block on it for ever
    refused_naming(drills_merge(tmp_path, s1, s2), tmp_path, "pipe.json", "not a file, a folder or a link")


def test_a_shard_folder_past_the_depth_budget_is_refused(tmp_path, shards):
    s1, s2 = shards
    deep = s2.joinpath(*["d"] * 40)
    deep.mkdir(parents=True)
    with pytest.raises(BadInput, match="nested deeper than"):
        merge(shards, tmp_path / "m")
    assert not (tmp_path / "m").exists()
