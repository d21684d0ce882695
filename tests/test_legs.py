"""Legs, plans and shards (no cluster): every leg in exactly one shard, shards balanced, merges checked."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from drills.core import config
from drills import lanes
from drills.run import legs, runner
from drills.core.errors import BadInput
from drills.record.ledger import Ledger, read_rows


def drills(*args, env=None):
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


def test_plan_lists_one_leg_per_version_lane_variant_in_a_stable_order(tmp_path):
    env = {"DRILLS_CACHE": str(tmp_path / "cache")}
    r = drills("run", "--plan", "--json", "--controller", "all", "--lanes", "all", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ids = [x["id"] for x in doc["legs"]]
    assert len(ids) == len(config.SUPPORTED_CONTROLLERS) * len(lanes.REGISTRY) == len(set(ids)) == doc["total_legs"]
    four = json.loads(drills("run", "--plan", "--json", "--controller", "all", "--lanes", "a,b,abort,order",
                             env=env).stdout)
    assert len(four["legs"]) == 4 * len(config.SUPPORTED_CONTROLLERS)
    assert all({"controller", "lane", "variant"} <= set(x) for x in doc["legs"])
    assert ids[:4] == ["v1.7.1/a/stage", "v1.7.1/b/stage", "v1.7.1/abort/stage", "v1.7.1/order/stage"]
    assert ids == [x["id"] for x in json.loads(drills("run", "--plan", "--json", "--controller", "all", "--lanes",
                                                      "all", env=env).stdout)["legs"]]
    both = json.loads(drills("run", "--plan", "--json", "--lanes", "a,b", "--variant", "both", env=env).stdout)
    assert [x["id"] for x in both["legs"]] == ["v1.8.2/a/stage", "v1.8.2/a/prod", "v1.8.2/b/stage"]
    assert not (tmp_path / "cache" / "rollouts").exists(), "a plan builds nothing"


def test_shards_partition_the_plan(tmp_path):
    env = {"DRILLS_CACHE": str(tmp_path / "cache")}
    whole = [x["id"] for x in json.loads(drills("run", "--plan", "--json", "--controller", "all", "--lanes", "all",
                                                env=env).stdout)["legs"]]
    parts = [[x["id"] for x in json.loads(drills("run", "--plan", "--json", "--controller", "all", "--lanes", "all",
                                                 "--shard", f"{i}/3", env=env).stdout)["legs"]] for i in (1, 2, 3)]
    assert sorted(sum(parts, [])) == sorted(whole) and len(sum(parts, [])) == len(whole)
    assert all(parts)


def test_shards_are_balanced_by_measured_durations():
    plan = legs.plan(["v1.8.2", "v1.10.2"], ["a", "b", "abort", "order"])
    durations = {"v1.8.2/abort/stage": 600.0, "v1.10.2/abort/stage": 590.0}
    shards = legs.assign_shards(plan, 2, durations)
    load = {1: 0.0, 2: 0.0}
    for leg in plan:
        load[shards[leg.id]] += legs.estimate(leg, durations)
    assert shards["v1.8.2/abort/stage"] != shards["v1.10.2/abort/stage"]
    assert abs(load[1] - load[2]) <= max(legs.estimate(x, durations) for x in plan)
    assert legs.digest(plan, durations) != legs.digest(plan, {})


@pytest.mark.parametrize("text", ["0/2", "3/2", "a/b", "1-2", "", "1/0"])
def test_bad_shard_is_bad_input(text):
    with pytest.raises(BadInput, match="--shard"):
        legs.parse_shard(text)


def test_default_jobs_is_bounded_by_the_legs():
    assert runner.default_jobs(1) == 1
    assert 1 <= runner.default_jobs() <= 3 * (os.cpu_count() or 1)


def _start_order(tmp_path, plan, jobs, durations) -> list[str]:
    """The order a run starts its legs in: the run's own loop, each leg done as soon as it starts (no cluster)."""
    said = []
    run = runner.Run(plan, tmp_path / "run", jobs, log=said.append, durations=durations)
    run._ready = lambda leg: True

    def run_leg(leg, res):
        run._leg_done(leg)
        run.changed.set()
    run._run_leg = run_leg
    run._legs()
    return [line.split()[1].rstrip(":") for line in said if line.endswith(": start")]


def test_a_run_starts_its_legs_longest_first_with_at_most_jobs_clusters_up(tmp_path, monkeypatch):
    """A long leg started last runs alone at the end: legs start by the plan's durations (a leg never measured:
    its lane's estimate), ties in plan order; and no more clusters are up at once than legs run at once."""
    monkeypatch.setenv("DRILLS_CACHE", str(tmp_path / "cache"))          # no machine's durations
    plan = legs.plan(["v1.8.2", "v1.10.2"], ["a", "b", "order"])
    est = {x.id: legs.estimate(x, {}) for x in plan}
    assert est["v1.8.2/order/stage"] > est["v1.8.2/a/stage"] > est["v1.8.2/b/stage"]
    # two at a time: both clusters may be up, so the longest legs first, whatever their version
    measured = {"v1.10.2/b/stage": 9000.0, "v1.8.2/order/stage": 1.0}
    assert _start_order(tmp_path, plan, 2, measured) == [
        "v1.10.2/b/stage", "v1.10.2/order/stage", "v1.8.2/a/stage", "v1.10.2/a/stage", "v1.8.2/b/stage",
        "v1.8.2/order/stage"]
    # one at a time: one cluster up, its legs the longest first, then the next cluster's
    assert _start_order(tmp_path, plan, 1, {}) == [
        "v1.8.2/order/stage", "v1.8.2/a/stage", "v1.8.2/b/stage", "v1.10.2/order/stage", "v1.10.2/a/stage",
        "v1.10.2/b/stage"]
    # without durations given, the run reads the cache's (what every run records)
    legs.record_duration(legs.Leg("v1.10.2", "b"), 9000.0)
    assert runner.Run(plan, tmp_path / "run", 2).start_order[0] == legs.Leg("v1.10.2", "b")


def _shard_folder(root, name, digest, leg_ids, rows):
    d = root / name
    led = Ledger(d, name, "embedded", "v1.8.2")
    (d / "v1.8.2").mkdir(parents=True, exist_ok=True)
    (d / "v1.8.2" / f"{name}.timeline.jsonl").write_text("{}\n")
    for lane, step, verdict in rows:        # each row names what it was judged on, as the lanes' rows do
        seen = d / "v1.8.2" / f"{name}-{lane}-{step}.json"
        seen.write_text("{}\n")
        led.record(lane, step, f"{step} holds", 1, 1, verdict, evidence=seen)
    (d / "run.json").write_text(json.dumps({"plan_digest": digest, "legs": [{"id": i} for i in leg_ids],
                                            "all_legs": ["v1.8.2/a/stage", "v1.8.2/b/stage"]}))
    return d


def test_merge_makes_one_run_folder_as_if_one_machine_ran_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DRILLS_REPORTS", str(tmp_path / "reports"))
    s1 = _shard_folder(tmp_path, "s1", "abc", ["v1.8.2/a/stage"], [("a", "before", "pass"), ("a", "after", "pass")])
    s2 = _shard_folder(tmp_path, "s2", "abc", ["v1.8.2/b/stage"], [("b", "merge-alone", "pass")])
    merged = runner.merge([s1, s2], dest=tmp_path / "reports" / "merged")
    rows = read_rows(merged / "ledger.json")
    assert {(r["lane"], r["step"], r["verdict"]) for r in rows} == {
        ("a", "before", "pass"), ("a", "after", "pass"), ("b", "merge-alone", "pass")}
    assert {r["run_id"] for r in rows} == {"merged"}
    assert (merged / "v1.8.2" / "s1.timeline.jsonl").is_file() and (merged / "v1.8.2" / "s2.timeline.jsonl").is_file()
    assert (merged / "report.html").is_file()


def test_merge_refuses_shards_of_different_plans_or_a_leg_twice(tmp_path):
    s1 = _shard_folder(tmp_path, "s1", "abc", ["v1.8.2/a/stage"], [("a", "before", "pass")])
    s2 = _shard_folder(tmp_path, "s2", "xyz", ["v1.8.2/b/stage"], [("b", "merge-alone", "pass")])
    with pytest.raises(BadInput, match="different plans"):
        runner.merge([s1, s2], dest=tmp_path / "m1")
    s3 = _shard_folder(tmp_path, "s3", "abc", ["v1.8.2/a/stage"], [("a", "before", "pass")])
    with pytest.raises(BadInput, match="in two run folders"):
        runner.merge([s1, s3], dest=tmp_path / "m2")
    with pytest.raises(BadInput, match="not a run folder"):
        runner.merge([tmp_path], dest=tmp_path / "m3")


def test_durations_are_kept_per_leg_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("DRILLS_CACHE", str(tmp_path))
    leg = legs.Leg("v1.8.2", "a")
    legs.record_duration(leg, 123.45)
    assert legs.read_durations() == {"v1.8.2/a/stage": 123.5}
    assert legs.durations_file() == tmp_path / "legs" / "durations.json"
    assert config.cache_dir() == tmp_path


def test_every_built_in_lane_has_a_measured_estimate_for_shards():
    # a lane without one falls back to a guess, and the shards it is balanced into come out uneven
    default = lanes.base.Runbook.estimate_s
    assert [lane.key for lane in lanes.BUILTIN if "estimate_s" not in vars(lane)] == []
    assert all(lane.estimate_s > 0 for lane in lanes.BUILTIN)
    # the plan reads each lane's own estimate; a leg with a measured duration uses that instead
    assert legs.estimate(legs.Leg("v1.8.2", "escape"), {}) == lanes.get("escape").estimate_s != default
    assert legs.estimate(legs.Leg("v1.8.2", "escape"), {"v1.8.2/escape/stage": 42.0}) == 42.0


@pytest.mark.parametrize("bad", ["300", -1000, 0, 10 ** 400, float("nan"), True, None])
def test_a_lane_estimate_that_is_not_a_sane_number_counts_as_the_default(bad, monkeypatch):
    # a lane another package registers sets its own estimate: a plan and its shards must not break on it
    monkeypatch.setattr(lanes.get("escape"), "estimate_s", bad)
    assert legs.estimate(legs.Leg("v1.8.2", "escape"), {}) == lanes.base.Runbook.estimate_s
    shards = legs.assign_shards(legs.plan(["v1.8.2"], ["a", "escape"]), 2, {})
    assert sorted(shards.values()) == [1, 2]
