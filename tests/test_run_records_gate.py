"""What a run folder's records say gates as the contract does (no cluster): an interrupted run or shard is
inconclusive in `report --merge` and `upgrade-check --runs`; a folder given to `report` that is no run folder is bad
input, a run without rows inconclusive; rows spliced in from another run, a timeline that says it is incomplete or
whose records skip are inconclusive; one folder given twice or inside another is bad input; and upgrade-check's
gate follows the candidate's headline.  Run folders as tests/test_upgrade_noise.py and tests/test_merge_files.py
write them."""
from __future__ import annotations

import json
from pathlib import Path

from drills.record import evidence
from drills.run import runner
from drills.record.ledger import INCONCLUSIVE, PASS, read_rows

from test_merge_files import drills_merge, refused_naming, shard
from test_upgrade_noise import as_release, drills, run_folder


def _interrupt(run: Path, signal: str = "SIGTERM") -> Path:
    meta = json.loads((run / "run.json").read_text())
    meta.update(interrupted=True, signal=signal)
    (run / "run.json").write_text(json.dumps(meta))
    return run


def _folder(stdout: str) -> Path:
    return Path(stdout.split("run folder: ", 1)[1].split()[0])


# --- 1: upgrade-check --runs with an interrupted run ---------------------------------------------------------------
def test_upgrade_check_runs_with_an_interrupted_run_is_inconclusive_naming_it(tmp_path):
    reports = tmp_path / "reports"
    base = run_folder(reports, "base")
    cand = _interrupt(as_release(base, "v1.8.5", tmp_path / "cand"))
    r = drills("upgrade-check", "--from", "v1.8.2", "--to", "v1.8.5", "--runs", base, cand, "--lanes", "a,order,abort",
               "--json", reports=tmp_path / "classified")
    assert r.returncode == 3, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["exit"] == 3 and any(str(cand) in m and "interrupted (SIGTERM)" in m for m in doc["missing"]), doc
    # the same folders, neither interrupted: a go
    meta = json.loads((cand / "run.json").read_text())
    meta.pop("interrupted"), meta.pop("signal")
    (cand / "run.json").write_text(json.dumps(meta))
    r = drills("upgrade-check", "--from", "v1.8.2", "--to", "v1.8.5", "--runs", base, cand, "--lanes", "a,order,abort",
               reports=tmp_path / "classified")
    assert r.returncode == 0, r.stdout + r.stderr


# --- 2: a merge of an interrupted shard carries the interruption ---------------------------------------------------
def test_a_merge_of_an_interrupted_shard_is_interrupted_and_inconclusive(tmp_path):
    s1, s2 = shard(tmp_path, "s1", "v1.8.2/a/stage"), _interrupt(shard(tmp_path, "s2", "v1.8.2/b/stage"), "SIGINT")
    r = drills_merge(tmp_path, s1, s2)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "INCOMPLETE: the run was interrupted (SIGINT; shard " in r.stdout and str(s2) in r.stdout, r.stdout
    merged = (tmp_path / "reports" / "latest").resolve()
    meta = json.loads((merged / "run.json").read_text())
    assert meta["interrupted"] is True and meta["signal"] == "SIGINT", meta
    assert meta["interrupted_shards"] == [{"folder": str(s2), "run_id": "s2", "signal": "SIGINT"}], meta
    assert drills("report", merged, reports=tmp_path / "reports").returncode == 3
    # shards that ran to their end merge to a pass, their rows judged by their shard's run id
    ok = tmp_path / "ok"
    r = drills_merge(ok, shard(ok, "s1", "v1.8.2/a/stage"), shard(ok, "s2", "v1.8.2/b/stage"))
    assert r.returncode == 0, r.stdout + r.stderr
    merged = (ok / "reports" / "latest").resolve()
    assert json.loads((merged / "run.json").read_text())["shard_run_ids"] == ["s1", "s2"]
    assert {r["verdict"] for r in evidence.read_judged(merged)} == {PASS}


# --- 3: report of folders that are no run folder, or a run without rows ------------------------------------------
def test_report_counts_each_folder_given(tmp_path):
    reports = tmp_path / "reports"
    good = run_folder(reports, "good")
    empty = tmp_path / "empty"
    empty.mkdir()
    r = drills("report", good, empty, reports=reports)
    assert r.returncode == 2 and str(empty) in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    rowless = tmp_path / "rowless"
    rowless.mkdir()
    (rowless / "run.json").write_text((good / "run.json").read_text())
    r = drills("report", good, rowless, reports=reports)
    assert r.returncode == 3 and f"INCOMPLETE: {rowless}: the run wrote run.json but no ledger.json" in r.stdout, \
        r.stdout + r.stderr
    assert json.loads(drills("report", rowless, "--json", reports=reports).stdout)["exit"] == 3
    odd = run_folder(tmp_path / "other", "odd")
    (odd / "run.json").unlink()
    (odd / "run.json").mkdir()
    r = drills("report", good, odd, reports=reports)
    assert r.returncode == 2 and "run.json: not a file" in r.stderr, r.stderr
    assert drills("report", good, reports=reports).returncode == 0


# --- 4: rows of another run --------------------------------------------------------------------------------------
def test_rows_spliced_from_another_run_are_inconclusive(tmp_path):
    reports = tmp_path / "reports"
    run = run_folder(reports, "run-1")
    rows = read_rows(run / "ledger.json")
    json_row = next(i for i, x in enumerate(rows) if str(x.get("evidence")).endswith(".json"))
    rows[json_row] = dict(rows[json_row], run_id="run-0")                   # another run's row with JSON evidence
    (run / "ledger.json").write_text(json.dumps(rows))
    judged = evidence.read_judged(run)
    assert judged[json_row]["verdict"] == INCONCLUSIVE and "another run" in judged[json_row]["reason"]
    assert [r["verdict"] for i, r in enumerate(judged) if i != json_row] == \
        [r["verdict"] for i, r in enumerate(rows) if i != json_row]
    r = drills("report", run, reports=reports)
    assert r.returncode == 3 and "a row from another run: recorded by run run-0" in r.stdout, r.stdout


# --- 5: a timeline incomplete by its own word, or cut in the middle ----------------------------------------------
def _timeline(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(x) + "\n" for x in records))


def test_a_timeline_that_says_it_is_incomplete_or_skips_records_is_inconclusive(tmp_path):
    run = run_folder(tmp_path / "reports", "run-t")
    tl = run / "after.timeline.jsonl"
    end = {"type": "END", "kind": "Recorder", "obj": {"complete": False, "reasons": ["watch gap on VirtualService"]}}
    row = next(r for r in read_rows(run / "ledger.json") if r["evidence"] == "after.timeline.jsonl")
    _timeline(tl, [{"seq": 1, "type": "ADDED", "kind": "Rollout"}, dict(end, seq=2)])
    why = evidence.problem(row, run)
    assert why and "incomplete" in why and "watch gap on VirtualService" in why, why
    _timeline(tl, [{"seq": 1, "type": "ADDED"}, {"seq": 2, "type": "MODIFIED"}, {"seq": 9, "type": "MODIFIED"},
                   dict(end, seq=10, obj={"complete": True})])
    why = evidence.problem(row, run)
    assert why and "truncated" in why and "skip from 2 to 9" in why, why
    # a timeline without seq numbers (written by another tool) stands on its END record alone
    _timeline(tl, [{"type": "ADDED"}, {"type": "MODIFIED"}, dict(end, obj={"complete": True})])
    assert evidence.problem(row, run) is None
    _timeline(tl, [{"seq": 1, "type": "ADDED"}, {"seq": 2, "type": "MODIFIED"}, dict(end, seq=3, obj={"complete": True})])
    assert evidence.problem(row, run) is None


# --- 6: folders given twice, inside another, or none --------------------------------------------------------------
def test_merge_and_runs_refuse_a_folder_twice_inside_another_or_none(tmp_path):
    s1 = shard(tmp_path, "s1", "v1.8.2/a/stage")
    nested = shard(s1, "nested", "v1.8.2/b/stage")
    refused_naming(drills_merge(tmp_path, s1, nested), tmp_path, str(nested), "inside")
    line = refused_naming(drills_merge(tmp_path), tmp_path, "no run folder given")
    assert "all_legs" not in line
    refused_naming(drills_merge(tmp_path, s1, s1), tmp_path, "given twice")
    base = run_folder(tmp_path / "runs", "base")
    cand = as_release(base, "v1.8.5", tmp_path / "cand")
    classified = tmp_path / "classified"
    r = drills("upgrade-check", "--from", "v1.8.2", "--to", "v1.8.5", "--runs", base, base, cand, reports=classified)
    assert r.returncode == 2 and "given twice" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not classified.exists() or not list(classified.iterdir())


# --- 7: the gate follows the answer --------------------------------------------------------------------------------
def test_a_candidate_on_which_the_prescription_does_not_hold_is_no_go_even_by_a_load_row(tmp_path):
    base = run_folder(tmp_path / "runs", "base")
    # AFTER's users see failures: the load row of AFTER (a holds row) fails by the real threshold
    failing = run_folder(tmp_path / "runs", "failing", after_load=(0.4, 45.0))
    cand = as_release(failing, "v1.8.5", tmp_path / "cand")
    assert any(r["id"] == "a/after/load.exposure.failure_ratio" and r["verdict"] == "fail"
               for r in read_rows(cand / "ledger.json"))
    args = ("upgrade-check", "--from", "v1.8.2", "--to", "v1.8.5", "--runs", base, cand, "--lanes", "a,order,abort")
    r = drills(*args, "--json", reports=tmp_path / "classified")
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["headlines"][1]["holds"] == "no" and doc["exit"] == 1
    assert doc["prescription_gate"]["exit"] == 1
    assert doc["prescription_gate"]["rows"] == ["a/after/load.exposure.failure_ratio"], doc["prescription_gate"]
    assert "gate" in doc and "informational" in doc and "answer gates" in doc["gate"]
    # the load rows stay informational as change classes: changed, never regressed
    load = [c for c in doc["changes"] if c["id"] == "a/after/load.exposure.failure_ratio"]
    assert load and load[0]["gates"] is False and load[0]["class"] != "regressed", load
    r = drills(*args, reports=tmp_path / "classified")
    assert r.returncode == 1 and "!! NO GO: the prescription does not hold on the candidate v1.8.5" in r.stdout, r.stdout
    assert runner.verdict(_folder(r.stdout))[0] in (0, 1, 3)
