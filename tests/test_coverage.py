"""Coverage and evidence are part of every verdict (no cluster: run folders written by hand, as `drills run` leaves
them): a row whose evidence is missing, truncated or another leg's is inconclusive, never pass; a leg that could
not start, was killed or recorded nothing makes its run, a merge of it and an upgrade-check of it inconclusive,
named first; a merge refuses rows of a leg its shard did not run; a duplicated newer pass never hides a fail."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from drills.core import config
from drills.record import evidence
from drills.run import legs, runner
from drills.reporting import upgrade
from drills.core.errors import BadInput
from drills.record.ledger import FAIL, HOLDS, INCONCLUSIVE, PASS, Ledger, read_rows

PLAN = ["v1.8.2/a/stage", "v1.8.2/b/stage"]


def drills(*args, reports: Path, cwd: Path | None = None):
    return subprocess.run([sys.executable, "-m", "drills", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=str(cwd or config.project_root()),
                          env=dict(os.environ, DRILLS_REPORTS=str(reports)))


def timeline(path: Path, leg: str | None = None, run_id: str | None = None, end: bool = True) -> Path:
    """A flight-recorder timeline as the recorder leaves it: records, then END naming its leg and run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = {k: v for k, v in (("leg", leg), ("run_id", run_id)) if v}
    lines = [{"seq": 1, "type": "ADDED", "kind": "Rollout", "rv": "101", "obj": {}}]
    if end:
        lines.append({"seq": 2, "type": "END", "kind": "Recorder", "rv": None, "obj": {"complete": True, **stamp}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def run_folder(path: Path, legs_: list[dict], version: str = "v1.8.2", rows_per_leg: int = 2,
               verdicts: dict | None = None, with_evidence: bool = True, all_legs=PLAN) -> Path:
    """A run folder as `drills run` writes it: each leg's rows (naming their leg and their timeline), its evidence,
    and run.json with each leg's exit."""
    path.mkdir(parents=True, exist_ok=True)
    for rec in legs_:
        controller, lane, variant = rec["id"].split("/")
        led = Ledger(path, path.name, "embedded", version if controller == version else controller, leg=rec["id"])
        for i in range(rows_per_leg):
            ev = path / controller / f"lane-{lane}" / f"step{i}.timeline.jsonl"
            if with_evidence:
                timeline(ev, rec["id"], path.name)
            verdict = (verdicts or {}).get((rec["id"], i), PASS)
            led.record(lane, f"step{i}", f"step {i} holds", 1, 1 if verdict == PASS else 0, verdict, evidence=ev,
                       key=f"k{i}", polarity=HOLDS, shows=verdict == PASS)
        rec.setdefault("rc", 0)
        rec.setdefault("error", None)
        rec.update(controller=controller, lane=lane, variant=variant)
    (path / "run.json").write_text(json.dumps({"run_id": path.name, "plan_digest": "p1", "legs": legs_,
                                               "all_legs": list(all_legs)}))
    return path


# --- a row and its evidence -----------------------------------------------------------------------------------
def _row(run: Path, ev, verdict=PASS, leg="v1.8.2/a/stage") -> dict:
    led = Ledger(run, run.name, "embedded", "v1.8.2", leg=leg)
    return led.record("a", "before", "peak", 5, 5, verdict, evidence=ev, key="peak")


def test_a_row_names_the_leg_that_wrote_it(tmp_path):
    row = _row(tmp_path / "r1", None)
    assert row["leg"] == "v1.8.2/a/stage" and read_rows(tmp_path / "r1" / "ledger.json")[0]["leg"] == row["leg"]
    assert "leg" not in Ledger(tmp_path / "r2", "r2", "embedded", "v1.8.2").record("a", "s", "x", 1, 1, PASS)


def test_a_pass_without_its_evidence_is_inconclusive_never_pass(tmp_path):
    run = tmp_path / "run1"
    good = timeline(run / "v1.8.2" / "good.timeline.jsonl", "v1.8.2/a/stage", "run1")
    cases = {
        "missing": (run / "v1.8.2" / "gone.timeline.jsonl", "evidence missing: "),
        "empty": (run / "empty.json", "evidence empty: "),
        "no END": (timeline(run / "cut.timeline.jsonl", end=False), "evidence truncated: "),
        "cut line": (run / "half.jsonl", "evidence truncated: "),
        "cut JSON": (run / "lane-b" / "steps-only.json", "evidence truncated: "),
        "other leg": (timeline(run / "b.timeline.jsonl", "v1.10.2/a/stage", "run1"), "evidence from another leg: "),
        "other run": (timeline(run / "o.timeline.jsonl", "v1.8.2/a/stage", "run0"), "evidence from another run: "),
        "outside": (timeline(tmp_path / "elsewhere.timeline.jsonl", "v1.8.2/a/stage", "run1"),
                    "evidence outside the run folder: "),
    }
    (run / "empty.json").write_text("")
    (run / "half.jsonl").write_text('{"seq": 1}\n{"seq": 2, "ty')
    (run / "lane-b").mkdir()
    (run / "lane-b" / "steps-only.json").write_text('{"envs": [{"name": "stage", "ok": tr')
    for name, (ev, reason) in cases.items():
        judged = evidence.judge(_row(run, ev), run)
        assert judged["verdict"] == INCONCLUSIVE and judged["reason"].startswith(reason), (name, judged)
        assert str(ev) in judged["reason"] and judged["recorded_verdict"] == PASS, name
    assert evidence.judge(_row(run, good), run)["verdict"] == PASS
    unnamed = evidence.judge(_row(run, None), run)          # a pass that names nothing it was judged on
    assert unnamed["verdict"] == INCONCLUSIVE and unnamed["reason"].startswith("no evidence named"), unnamed
    # a fail is never hidden behind its missing evidence
    assert evidence.judge(_row(run, run / "nowhere.json", FAIL), run)["verdict"] == FAIL


def test_the_run_report_shows_a_pass_whose_evidence_is_missing_as_inconclusive(tmp_path):
    from drills.reporting.report import write_run_report
    run = run_folder(tmp_path / "run1", [{"id": "v1.8.2/a/stage"}], with_evidence=False)
    md = write_run_report(run)[1].read_text()
    assert "evidence missing: " in md and "inconclusive 2" in md, md


# --- a run's legs ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("leg, cause", [
    ({"rc": -9}, "pytest was killed by signal 9 after 2 row(s)"),
    ({"rc": 2}, "pytest exit 2 (interrupted)"),
    ({"rc": 1, "error": "binaries did not build: go: no space left on device"}, "did not run to its end: binaries"),
    ({"rc": 1, "error": "cluster for v1.8.2: the apiserver did not become ready"}, "did not run to its end: cluster"),
])
def test_a_leg_killed_or_that_could_not_start_makes_the_run_inconclusive_naming_it_first(tmp_path, leg, cause):
    """`drills run` said "a fail ... 8 assertions: 8 pass" (exit 1, the cause only in run.json)."""
    run = run_folder(tmp_path / "run1", [{"id": "v1.8.2/a/stage", **leg}, {"id": "v1.8.2/b/stage"}])
    code, missing, rows = runner.verdict(run)
    assert code == 3, (code, missing)
    assert missing[0].startswith("leg v1.8.2/a/stage: ") and cause in missing[0], missing
    assert len(missing) == 1 and all(r["verdict"] == PASS for r in rows)


def test_a_leg_that_completed_with_a_failing_test_stays_a_fail(tmp_path):
    run = run_folder(tmp_path / "run1", [{"id": "v1.8.2/a/stage", "rc": 1}, {"id": "v1.8.2/b/stage"}],
                     verdicts={("v1.8.2/a/stage", 1): FAIL})
    assert runner.verdict(run)[:2] == (1, [])
    refused = run_folder(tmp_path / "run2", [{"id": "v1.8.2/a/stage", "rc": 2, "error": "cluster: bad name"}])
    assert runner.verdict(refused)[0] == 2
    quiet = run_folder(tmp_path / "run3", [{"id": "v1.8.2/a/stage"}], rows_per_leg=0)
    code, missing, _ = runner.verdict(quiet)
    assert code == 3 and "no row recorded" in missing[0]
    whole = run_folder(tmp_path / "run4", [{"id": "v1.8.2/a/stage"}, {"id": "v1.8.2/b/stage"}])
    assert runner.verdict(whole)[:2] == (0, [])


def test_rows_belong_to_their_leg_not_to_every_leg_of_their_lane(tmp_path):
    run = run_folder(tmp_path / "run1", [{"id": "v1.8.2/a/stage"}, {"id": "v1.8.2/a/prod", "rc": -15}],
                     all_legs=["v1.8.2/a/stage", "v1.8.2/a/prod"])
    rows = read_rows(run / "ledger.json")
    meta = legs.read_run_meta(run)
    assert [len(legs.rows_of(rows, x)) for x in meta["legs"]] == [2, 2]
    assert len(runner.leg_rows(rows, legs.Leg("v1.8.2", "a", "stage"))) == 2


# --- merge ----------------------------------------------------------------------------------------------------
def test_a_merge_of_one_of_two_shards_is_inconclusive_naming_the_missing_leg_first(tmp_path):
    s1 = run_folder(tmp_path / "s1", [{"id": "v1.8.2/a/stage"}])
    r = drills("report", "--merge", s1, reports=tmp_path / "reports")
    assert r.returncode == 3, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("INCOMPLETE: leg v1.8.2/b/stage: no shard ran it"), r.stdout
    s2 = run_folder(tmp_path / "s2", [{"id": "v1.8.2/b/stage"}])
    whole = drills("report", "--merge", s1, s2, reports=tmp_path / "reports")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    merged = Path(whole.stdout.splitlines()[0])
    assert merged.parent == tmp_path / "reports" and {r["leg"] for r in read_rows(merged / "ledger.json")} == set(PLAN)
    # the merged folder's rows keep the evidence of the run they were recorded in
    assert {r["shard_run_id"] for r in read_rows(merged / "ledger.json")} == {"s1", "s2"}


@pytest.mark.parametrize("rc", [-9, 2])
def test_a_merge_of_a_shard_whose_leg_was_killed_is_inconclusive_though_its_rows_pass(tmp_path, rc):
    s1 = run_folder(tmp_path / "s1", [{"id": "v1.8.2/a/stage", "rc": rc}])
    s2 = run_folder(tmp_path / "s2", [{"id": "v1.8.2/b/stage"}])
    r = drills("report", "--merge", s1, s2, reports=tmp_path / "reports")
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.startswith("INCOMPLETE: leg v1.8.2/a/stage: pytest "), r.stdout


def test_a_merge_refuses_a_shard_carrying_rows_of_a_leg_it_did_not_run(tmp_path):
    s1 = run_folder(tmp_path / "s1", [{"id": "v1.8.2/a/stage"}])
    s2 = run_folder(tmp_path / "s2", [{"id": "v1.8.2/b/stage"}])
    # s1 also carries a pass row of leg b, which s2 ran (and where it could override s2's row in the matrix)
    Ledger(s1, "s1", "embedded", "v1.8.2", leg="v1.8.2/b/stage").record("b", "step0", "step 0 holds", 1, 1, PASS)
    r = drills("report", "--merge", s1, s2, reports=tmp_path / "reports")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "leg v1.8.2/b/stage" in r.stderr and str(s1) in r.stderr and "did not run" in r.stderr, r.stderr
    # a row recorded without its leg is placed by its lane and controller: here neither leg of s1
    s3 = run_folder(tmp_path / "s3", [{"id": "v1.8.2/a/stage"}])
    Ledger(s3, "s3", "embedded", "v1.8.2").record("b", "step0", "step 0 holds", 1, 1, PASS)
    with pytest.raises(BadInput, match="did not run"):
        runner.merge([s3, s2], dest=tmp_path / "m")


def test_merged_pass_rows_whose_evidence_is_missing_are_inconclusive(tmp_path):
    s1 = run_folder(tmp_path / "s1", [{"id": "v1.8.2/a/stage"}], with_evidence=False)
    s2 = run_folder(tmp_path / "s2", [{"id": "v1.8.2/b/stage"}])
    r = drills("report", "--merge", s1, s2, reports=tmp_path / "reports")
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.startswith("INCOMPLETE: v1.8.2 a/step0/k0: pass -> inconclusive, evidence missing: "), r.stdout
    merged = Path(next(x for x in r.stdout.splitlines() if not x.startswith("INCOMPLETE")))
    assert "evidence missing: " in (merged / "report.md").read_text()


def test_the_ci_merge_job_fails_when_the_merge_is_inconclusive():
    doc = yaml.safe_load((config.project_root() / "examples" / "ci-matrix.yml").read_text())
    job = doc["jobs"]["merge"]
    assert job.get("if") == "always()"                     # the merge runs whatever the shards did
    steps = job["steps"]
    i = next(i for i, s in enumerate(steps) if "drills report --merge" in str(s.get("run")))
    merge = steps[i]
    assert not merge.get("continue-on-error") and "||" not in merge["run"] and "; true" not in merge["run"]
    assert merge.get("if") in (None, "always()") and "set +e" not in merge["run"]
    upload = next(s for s in steps[i + 1:] if "upload-artifact" in str(s.get("uses")))
    assert upload.get("if") == "always()"                  # the report is kept though the job is red


# --- upgrade-check --------------------------------------------------------------------------------------------
def _sides_run(tmp_path: Path, cand_rows: int, cand_rc: int = 0, with_run_json: bool = True) -> Path:
    run = tmp_path / "reports" / "20261201T000000Z-1"
    legs_ = [{"id": "v1.8.2/a/stage"}, {"id": "v1.10.2/a/stage", "rc": cand_rc}]
    run_folder(run, legs_[:1], rows_per_leg=6, all_legs=[x["id"] for x in legs_])
    base_meta = json.loads((run / "run.json").read_text())
    run_folder(run, legs_[1:], version="v1.10.2", rows_per_leg=cand_rows)
    if with_run_json:
        (run / "run.json").write_text(json.dumps(dict(base_meta, legs=base_meta["legs"] + legs_[1:])))
    else:
        (run / "run.json").unlink()
    return run


def _upgrade(tmp_path, run):
    return drills("upgrade-check", "--from", "v1.8.2", "--to", "v1.10.2", "--runs", run, "--lanes", "a",
                  reports=tmp_path / "reports")


def test_upgrade_check_with_the_candidate_leg_killed_after_its_first_rows_is_no_go(tmp_path):
    """It said go (exit 0, "0 regressed ... 4 gone, 2 same"): gone did not count, a leg counted only without rows."""
    r = _upgrade(tmp_path, _sides_run(tmp_path, cand_rows=2, cand_rc=-9))
    assert r.returncode == 3, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("!! INCOMPLETE: ") and "leg v1.10.2/a/stage: pytest was killed by signal 9" in lines[0]
    assert any("4 row(s) of the baseline v1.8.2 missing on the candidate v1.10.2: a/step2/k2" in x
               for x in lines[:3]), lines[:3]
    doc = json.loads((Path(r.stdout.split("run folder: ", 1)[1].split()[0]) / "upgrade.json").read_text())
    assert doc["exit"] == 3 and doc["counts"]["gone"] == 4 and doc["missing"], doc["missing"]


def test_upgrade_check_runs_with_missing_candidate_rows_is_inconclusive(tmp_path):
    r = _upgrade(tmp_path, _sides_run(tmp_path, cand_rows=3, with_run_json=False))
    assert r.returncode == 3, r.stdout + r.stderr
    head = [x for x in r.stdout.splitlines() if x.startswith("!! INCOMPLETE: ")]
    assert r.stdout.startswith("!! INCOMPLETE: ") and "no run.json" in head[0], r.stdout     # what is missing, first
    assert any("3 row(s) of the baseline v1.8.2 missing on the candidate" in x for x in head), r.stdout
    assert _upgrade(tmp_path, _sides_run(tmp_path / "whole", cand_rows=6)).returncode == 0


def test_gone_without_a_candidate_row_is_inconclusive_unless_something_gates_harder(tmp_path):
    base = read_rows(run_folder(tmp_path / "b", [{"id": "v1.8.2/a/stage"}], rows_per_leg=3) / "ledger.json")
    cand = [dict(r, controller_version="v1.10.2") for r in base[:2]]
    assert upgrade.exit_code(upgrade.classify(base, cand)) == 3
    assert upgrade.exit_code(upgrade.classify(base, [dict(cand[0], verdict=FAIL), cand[1]])) == 1
    assert upgrade.exit_code(upgrade.classify(base, [dict(r, controller_version="v1.10.2") for r in base])) == 0


def test_a_duplicated_newer_pass_row_never_hides_a_fail(tmp_path):
    base = read_rows(run_folder(tmp_path / "b", [{"id": "v1.8.2/a/stage"}], rows_per_leg=1) / "ledger.json")
    failed = dict(base[0], controller_version="v1.10.2", verdict=FAIL, observed=0, shows=False)
    copy = dict(failed, verdict=PASS, observed=1, shows=True, recorded_at="2999-01-01T00:00:00Z")
    for cand in ([failed, copy], [copy, failed]):
        ch = upgrade.classify(base, cand)
        assert [c.cls for c in ch] == [upgrade.REGRESSED] and upgrade.exit_code(ch) == 1, [c.words for c in ch]
    # a newer run of the same id replaces the older run's row (a run again)
    rerun = dict(copy, run_id="later")
    assert [c.cls for c in upgrade.classify(base, [failed, rerun])] == [upgrade.SAME]


def test_two_legs_of_lane_b_in_one_run_keep_their_own_evidence(tmp_path):
    """Lane b wrote every leg's result to <run>/lane_b/<step>.json: the second leg's overwrote the first's."""
    from drills.lanes import LaneContext
    from drills.lanes.b import LaneB
    run = tmp_path / "run1"
    rows = []
    for version in ("v1.8.2", "v1.10.2"):
        led = Ledger(run, "run1", "embedded", version, leg=f"{version}/b/stage")
        lane = LaneB(LaneContext(api=None, namespace="", evidence_dir=run / version, ledger=led, version=version))
        try:
            rows.append(lane._record("steps-only", "steps only", True, True, True, {"version": version},
                                     key="steps-only"))
        finally:
            lane.close()
    assert rows[0]["evidence"] != rows[1]["evidence"]
    for row, version in zip(rows, ("v1.8.2", "v1.10.2")):
        assert json.loads((run / row["evidence"]).read_text()) == {"version": version}


def test_a_duplicated_newer_pass_row_never_hides_a_fail_in_the_matrix_or_the_report(tmp_path):
    from drills.reporting.report import write_matrix
    reports = tmp_path / "reports"
    run = run_folder(reports / "run1", [{"id": "v1.8.2/a/stage"}], rows_per_leg=1,
                     verdicts={("v1.8.2/a/stage", 0): FAIL})
    rows = read_rows(run / "ledger.json")
    (run / "ledger.json").write_text(json.dumps(rows + [dict(rows[0], verdict=PASS, observed=1, shows=True,
                                                              recorded_at="2999-01-01T00:00:00Z")]))
    md = write_matrix([run], reports)[1].read_text()
    line = next(x for x in md.splitlines() if x.startswith("| a/step0/"))
    assert "**fail**" in line and "**pass**" not in line, line
    r = drills("report", run, reports=reports)
    assert r.stdout.startswith("prescription holds on v1.8.2: no"), r.stdout


# --- what a careful engineer tried next ----------------------------------------------------------------------
def test_evidence_that_is_no_observation_or_cannot_be_read_is_inconclusive(tmp_path):
    run = tmp_path / "run1"
    run_folder(run, [{"id": "v1.8.2/a/stage"}], rows_per_leg=1)
    big = run / "big.json"
    with open(big, "wb") as fh:               # a sparse file past the input budget: never taken as read
        fh.truncate((64 << 20) + 1)
    deep = run / "deep.timeline.jsonl"
    deep.write_text("[" * 100000 + "\n")
    cases = {".": "own record", "ledger.json": "own record", "run.json": "own record", str(big): "too large",
             "a\0b.json": "evidence unreadable", "x" * 5000: "evidence unreadable", str(deep): "evidence unreadable"}
    for ev, why in cases.items():
        row = evidence.judge(_row(run, ev), run)
        assert row["verdict"] == INCONCLUSIVE and why in row["reason"], (ev[:40], row.get("reason"))
    for ev in (["x"], {"a": 1}):
        row = evidence.judge(dict(_row(run, None), evidence=ev), run)
        assert row["verdict"] == INCONCLUSIVE and "not a path" in row["reason"], row


def test_a_merge_refuses_a_link_to_evidence_outside_its_shard(tmp_path):
    s1 = run_folder(tmp_path / "s1", [{"id": "v1.8.2/a/stage"}], all_legs=PLAN)
    s2 = tmp_path / "s2"
    outside = run_folder(tmp_path / "outside", [{"id": "v1.8.2/b/stage"}], all_legs=PLAN)
    s2.mkdir()
    (s2 / "v1.8.2").symlink_to(outside / "v1.8.2")        # its evidence lives outside the shard
    (s2 / "ledger.json").write_text((outside / "ledger.json").read_text().replace(str(outside), str(s2)))
    (s2 / "run.json").write_text((outside / "run.json").read_text())
    with pytest.raises(BadInput, match="outside the shard folder"):      # never taken in, never judged on
        runner.merge([s1, s2], dest=tmp_path / "reports" / "m")
    assert not (tmp_path / "reports").exists()


def test_a_merge_refuses_folders_that_are_not_shards_of_one_plan_or_would_contain_it(tmp_path):
    a1, a2 = tmp_path / "a1", tmp_path / "a2"
    for d in (a1, a2):
        d.mkdir()
        (d / "run.json").write_text("{}")
    with pytest.raises(BadInput, match="not a shard run folder"):
        runner.merge([a1, a2], dest=tmp_path / "m0")
    f1 = run_folder(tmp_path / "f1", [{"id": "v1.8.2/a/stage"}], all_legs=[])
    f2 = run_folder(tmp_path / "f2", [{"id": "v1.8.2/b/stage"}], all_legs=PLAN)
    for order in ([f1, f2], [f2, f1]):           # the answer never depends on the order the folders are given in
        with pytest.raises(BadInput, match="not shards of one plan"):
            runner.merge(order, dest=tmp_path / "m1")
    with pytest.raises(BadInput, match="would be inside it"):
        runner.merge([f2], dest=f2 / "reports" / "m2")
    assert not (f2 / "reports").exists() and not (tmp_path / "m0").exists() and not (tmp_path / "m1").exists()


def test_upgrade_check_runs_expects_the_plan_and_refuses_a_classification(tmp_path):
    plan = ["v1.8.2/a/stage", "v1.10.2/a/stage", "v1.8.2/b/stage", "v1.10.2/b/stage"]
    shard = run_folder(tmp_path / "shard", [{"id": "v1.8.2/a/stage"}, {"id": "v1.10.2/a/stage"}], all_legs=plan)
    reports = tmp_path / "reports"
    r = drills("upgrade-check", "--from", "v1.8.2", "--to", "v1.10.2", "--lanes", "a,b", "--runs", shard, "--json",
               reports=reports)
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(r.stdout[: r.stdout.rindex("}") + 1])
    assert any("v1.8.2/b/stage" in m and "run by none" in m for m in doc["missing"]), doc["missing"]
    classified = next(p for p in reports.iterdir() if p.is_dir())
    again = drills("upgrade-check", "--from", "v1.8.2", "--to", "v1.10.2", "--lanes", "a", "--runs", classified,
                   reports=tmp_path / "reports2")
    assert again.returncode == 2 and "a classification of upgrade-check" in again.stderr, again.stderr
    bare = tmp_path / "bare"
    run_folder(bare, [{"id": "v1.8.2/a/stage"}, {"id": "v1.10.2/a/stage"}], all_legs=plan)
    (bare / "run.json").unlink()
    r = drills("upgrade-check", "--from", "v1.8.2", "--to", "v1.10.2", "--lanes", "a", "--runs", bare, "--json",
               reports=tmp_path / "reports3")
    assert r.returncode == 3 and "no run.json" in r.stdout, r.stdout[-2000:]
