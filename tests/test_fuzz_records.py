"""Fuzzing (Hypothesis) of the run records drills reads back from folders a user hands it: a run folder's run.json
and ledger.json (`drills report RUN_DIR`), shard folders (`drills report --merge`: their records, their files and
links) and the run folders of `drills upgrade-check --runs`.  Random, truncated, huge and deeply nested JSON and
wrong types end in exit 2 with one line naming the folder, or in the verdict the contract gives (0, 1 or 3: a
record drills can read, a gap inconclusive); never a traceback (DRILLS_DEBUG=1: an unanticipated error fails the
test with its own traceback); and nothing is ever written outside the reports folder (an input folder is never
touched).

A few dozen inputs per entry point in `make test` (it runs on 2 cores); DRILLS_FUZZ=long runs 10,000 each, and
benchmarks/bench_fuzz_inputs.py runs them with a count and a time.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from drills import cli
from drills.core import inputs
from drills.run import runner
from drills.core.errors import BadInput

LONG = os.environ.get("DRILLS_FUZZ") == "long"
EXAMPLES = int(os.environ.get("DRILLS_FUZZ_EXAMPLES") or (10_000 if LONG else 40))
fuzz = settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])

LEGS = ["v1.8.2/a/stage", "v1.10.2/a/stage", "v1.8.2/b/stage", "v1.10.2/b/stage"]
VERDICTS = ["pass", "fail", "inconclusive", "unverified", "not_applicable"]

# --- JSON documents: valid records, the same with any field of any type, and text that is no record -------------
leaf = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=12),
                 st.sampled_from(["", "..", "../../etc", "/etc/hostname", "v1.8.2", "a\nb", "\x00", "ledger.json"]))
anything = st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                        max_leaves=12)


def sometimes(valid, weight: int = 4):
    """``valid`` most of the time, else anything (a wrong type, a missing field)."""
    return st.one_of(*[valid] * weight, anything)


leg_record = st.fixed_dictionaries({"id": sometimes(st.sampled_from(LEGS))}, optional={
    "rc": sometimes(st.sampled_from([0, 1, 2, 3, -9, None])), "error": sometimes(st.none()),
    "controller": anything, "lane": anything, "variant": anything, "started": anything})
run_meta = st.fixed_dictionaries({}, optional={
    "run_id": sometimes(st.sampled_from(["r1", "s1", "s2"])), "plan_digest": sometimes(st.just("p1")),
    "legs": sometimes(st.lists(sometimes(leg_record, 8), max_size=4)),
    "all_legs": sometimes(st.lists(sometimes(st.sampled_from(LEGS), 8), max_size=4)),
    "interrupted": anything, "classified_from": st.one_of(anything, st.lists(st.text(max_size=10), max_size=2)),
    "upgrade": anything})
def rows(required=sometimes):
    """Ledger rows: the fields every row has (``required``: always well-formed, or sometimes anything) and the
    optional ones, sometimes anything."""
    return st.fixed_dictionaries({
        "lane": required(st.sampled_from(["a", "b"])), "step": required(st.sampled_from(["before", "after"])),
        "assertion": required(st.just("peak")), "verdict": required(st.sampled_from(VERDICTS)),
        "controller_version": required(st.sampled_from(["v1.8.2", "v1.10.2"]))}, optional={
        "leg": sometimes(st.sampled_from(LEGS)), "evidence": sometimes(st.sampled_from(
            ["ev.json", "v1.8.2/step.timeline.jsonl", "/etc/hostname", "../outside.json", ".", "ledger.json"])),
        "id": sometimes(st.sampled_from(["a/before/peak", "b/after/peak"])), "run_id": anything,
        "polarity": sometimes(st.sampled_from(["holds", "hazard", "neutral"])), "shows": anything,
        "details": anything, "key": anything, "expected": anything, "observed": anything, "shard_run_id": anything})


row = rows()
well_formed_row = rows(required=lambda s: s)
ledger_doc = st.lists(sometimes(row, 8), max_size=5)


def _cut(doc, at: int) -> str:
    text = json.dumps(doc)
    return text[: at % (len(text) + 1)]


def documents(valid, percent: int = 40) -> st.SearchStrategy[str]:
    """A record's text: whole (about ``percent`` in 100), else cut short, nested past the budget, a number too long
    to read, or anything."""
    broken = st.one_of(
        st.builds(_cut, valid, st.integers(0, 10 ** 6)),
        anything.map(json.dumps), st.text(max_size=80),
        st.integers(1, 3 * inputs.MAX_DEPTH).map(lambda n: '{"legs": ' + "[" * n + "]" * n + "}"),
        st.integers(1, 3 * inputs.MAX_DEPTH).map(lambda n: "[" * n + "]" * n),
        st.sampled_from(["1" * 5000, "[" + "1" * 5000 + "]", '{"legs": [{"id": 1e999}]}', "NaN", "\ufeff[]",
                         '[{"lane": "a"}]' + "\x00", "[]" * 3, "{" * 50_000]))
    whole = valid.map(lambda d: json.dumps(d, allow_nan=True))
    return st.sampled_from(range(100)).flatmap(lambda n: whole if n < percent else broken)


# --- what a command does with them: its exit, its lines, and where it wrote ----------------------------------
RUN_REPORT = {"report.html", "report.md"}      # `drills report RUN_DIR` renders the run's own report in its folder


def snapshot(root: Path, skip: Path, own_report: bool) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if Path(dirpath) / d != skip]
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if own_report and (name in RUN_REPORT or name.endswith(".png")):
                continue
            st_ = p.lstat()
            out[str(p)] = (st_.st_mode, os.readlink(p) if p.is_symlink() else None) if not p.is_file() or \
                p.is_symlink() else (st_.st_mode, st_.st_size, st_.st_mtime_ns)    # a folder: by what it holds
    return out


def drills(root: Path, *args) -> tuple[int, str, str]:
    """The command line in this process (DRILLS_DEBUG=1: an unanticipated error raises, with its traceback),
    writing to ``root``/reports; fails when anything outside it changed (but the run's own report that
    `drills report RUN_DIR` renders in its folder)."""
    reports = root / "reports"
    own_report = args[0] == "report" and "--merge" not in args
    before = snapshot(root, reports, own_report)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([*map(str, args), "--reports-dir", str(reports)])
    assert snapshot(root, reports, own_report) == before, "a write outside the reports folder"
    return code, out.getvalue(), err.getvalue()


def bad_input_in_one_line(code: int, err: str, *names: str) -> bool:
    """Exit 2 and one line naming one of ``names``: True; another exit: False (the caller checks it)."""
    if code != 2:
        return False
    lines = [x for x in err.splitlines() if x.startswith("drills:")]
    assert len(lines) == 1 and err.strip() == lines[0], err
    assert any(n in lines[0] for n in names), (names, lines[0])
    return True


@pytest.fixture(autouse=True)
def debug(monkeypatch):
    monkeypatch.setenv("DRILLS_DEBUG", "1")
    # --reports-dir sets DRILLS_REPORTS for the process: given back as it was after each test, set or not
    # (monkeypatch.delenv of a variable that is not set records nothing to undo: the value a test's --reports-dir
    # set then outlived the test, and a later file on the same worker ran its commands with that reports folder;
    # setenv first records the state to give back, whatever it was)
    was = os.environ.get("DRILLS_REPORTS")
    monkeypatch.setenv("DRILLS_REPORTS", was or "")
    if was is None:
        monkeypatch.delenv("DRILLS_REPORTS")


@pytest.fixture
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("records")


def fresh(root: Path) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "outside.json").write_text("{}\n")
    return root


def run_folder(path: Path, meta: str | None, ledger: str | None) -> Path:
    path.mkdir(parents=True)
    if meta is not None:
        (path / "run.json").write_text(meta)
    if ledger is not None:
        (path / "ledger.json").write_text(ledger)
    (path / "ev.json").write_text("{}\n")
    return path


# --- a run folder: run.json and ledger.json, read by `drills report` and for a run's verdict -----------------------
@fuzz
@given(meta=documents(run_meta), ledger=documents(ledger_doc))
@example(meta='{"run_id": "r1", "legs": [{"id": "v1.8.2/a/stage"}]}', ledger="[" * 20_000)
def test_a_run_folders_records_read_or_are_refused_in_one_line(root, meta, ledger):
    run = run_folder(fresh(root) / "r1", meta, ledger)
    try:                                          # the verdict `drills run` ends with: its rows and its legs' gaps
        code, missing, rows = runner.verdict(run)
    except BadInput as e:
        assert str(run) in str(e) and "\n" not in str(e), str(e)
    else:
        assert code in (0, 1, 2, 3) and all(isinstance(x, str) and "\n" not in x for x in missing), (code, missing)
    code, out, err = drills(root, "report", run)       # the report reads the ledger (run.json is not its input)
    event(f"report exit {code}")
    if bad_input_in_one_line(code, err, str(run)):
        return
    assert code in (0, 1, 3), (code, err)


# --- shard folders: `drills report --merge` -----------------------------------------------------------------------
FILES = ["ev.json", "v1.8.2/step.timeline.jsonl", "clusters/drills/etcd.log", "legs/x.log", "notes.txt", "plots/p.png"]
entry = st.one_of(
    st.tuples(st.just("file"), st.sampled_from(FILES), st.sampled_from(["{}\n", "x", "", '{"a": 1}\n'])),
    st.tuples(st.just("link"), st.sampled_from(FILES + ["lnk", "v1.8.2/lnk"]),
              st.sampled_from(["ev.json", "../outside.json", "/etc/hostname", "..", ".", "missing", "v1.8.2"])),
    st.tuples(st.just("fifo"), st.sampled_from(["pipe.json", "v1.8.2/pipe"]), st.just("")))


def lay_out(folder: Path, entries) -> None:
    for kind, rel, what in entries:
        p = folder / rel
        if p.exists() or p.is_symlink() or not p.parent.is_dir() and p.parent.exists():
            continue
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            continue
        if kind == "file":
            p.write_text(what)
        elif kind == "link":
            p.symlink_to(what)
        else:
            os.mkfifo(p)


shard_meta = st.builds(lambda legs, extra, pick: {"run_id": "s", "plan_digest": "p1", "all_legs": LEGS, "legs": legs,
                                                  **(extra if pick == 0 else {})},
                       st.lists(st.fixed_dictionaries({"id": st.sampled_from(LEGS), "rc": st.sampled_from([0, 1])}),
                                max_size=2, unique_by=lambda x: x["id"]), run_meta, st.integers(0, 3))
shard_ledger = st.lists(st.builds(lambda r, leg: dict(r, leg=leg, controller_version=leg.split("/")[0],
                                                      lane=leg.split("/")[1]), well_formed_row, st.sampled_from(LEGS)),
                        max_size=4)


@fuzz
@given(metas=st.lists(documents(shard_meta, 85), min_size=2, max_size=2),
       ledgers=st.lists(documents(shard_ledger, 85), min_size=2, max_size=2),
       files=st.lists(st.lists(entry, max_size=5), min_size=2, max_size=2))
def test_shard_folders_merge_or_are_refused_in_one_line_writing_nothing(root, metas, ledgers, files):
    root = fresh(root)
    shards = [run_folder(root / f"s{i}", metas[i], ledgers[i]) for i in (0, 1)]
    for s, entries in zip(shards, files):
        lay_out(s, entries)
    code, out, err = drills(root, "report", "--merge", *shards)
    event(f"merge exit {code}")
    reports = root / "reports"
    if bad_input_in_one_line(code, err, *map(str, shards), "run folders", "leg ", "--merge"):
        assert not reports.exists() or not any(reports.iterdir()) or \
            {p.name for p in reports.iterdir()} <= {"matrix.html", "matrix.md"}, list(reports.iterdir())
        return
    assert code in (0, 1, 3), (code, err)
    merged = Path(out.splitlines()[[x.startswith("INCOMPLETE") for x in out.splitlines()].index(False)])
    assert merged.parent == reports and (merged / "run.json").is_file()
    for link in [p for p in merged.rglob("*") if p.is_symlink()]:      # a link kept is a link inside the merge
        assert os.path.realpath(link).startswith(str(merged.resolve()) + os.sep) or \
            os.path.realpath(link) == str(merged.resolve()), (link, os.readlink(link))


# --- `drills upgrade-check --runs` ------------------------------------------------------------------------------
@fuzz
@given(metas=st.lists(st.one_of(documents(run_meta, 75), st.none()), min_size=1, max_size=2),
       ledgers=st.lists(documents(st.lists(well_formed_row, max_size=4), 75), min_size=1, max_size=2))
def test_upgrade_check_runs_classify_or_are_refused_in_one_line(root, metas, ledgers):
    root = fresh(root)
    runs = [run_folder(root / f"r{i}", m, ledger) for i, (m, ledger) in enumerate(zip(metas, ledgers))]
    code, out, err = drills(root, "upgrade-check", "--from", "v1.8.2", "--to", "v1.10.2", "--runs", *runs, "--json")
    event(f"upgrade-check exit {code}")
    if bad_input_in_one_line(code, err, *map(str, runs), "--runs", "no rows of"):
        return
    assert code in (0, 1, 3), (code, err)
    doc = json.loads(out)
    assert doc["exit"] == code or code == 3, (code, doc.get("exit"))


# --- past the size budget: refused unread ------------------------------------------------------------------------
@pytest.mark.parametrize("name,commands", [
    ("ledger.json", ["report", "merge", "runs"]),
    ("run.json", ["merge", "runs"])])        # `drills report RUN_DIR` reads no run.json
def test_a_record_past_the_size_budget_is_refused_unread(root, name, commands):
    run = run_folder(fresh(root) / "r1", json.dumps({"run_id": "r1", "plan_digest": "p1", "all_legs": LEGS,
                                                     "legs": []}), "[]")
    with open(run / name, "wb") as fh:                  # sparse: nothing is ever read of it
        fh.truncate(inputs.RECORD_BYTES + 1)
    args = {"report": ["report", run], "merge": ["report", "--merge", run],
            "runs": ["upgrade-check", "--from", "v1.8.2", "--to", "v1.10.2", "--runs", run]}
    for command in commands:
        code, out, err = drills(root, *args[command])
        assert bad_input_in_one_line(code, err, name), (command, code, err)
        assert "larger than" in err, err
