"""Input fuzzing of every parser and reader (Hypothesis): never a traceback; bad input is always the project's
own error (exit 2 on the command line) with a message that names the bad part.

A few hundred inputs per entry point by default; DRILLS_FUZZ=long runs 10,000 per entry point.
"""
from __future__ import annotations

import json
import os
import string
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drills import config, legs
from drills.errors import BadInput
from drills.fleet import Fleet, load_values_file
from drills.kube import resolve_kubeconfig
from drills.ledger import read_rows
from drills.safety import Journal, allowed_contexts
from drills.steps import parse_steps
from drills.toolchain import resolve_controller_versions

LONG = os.environ.get("DRILLS_FUZZ") == "long"
settings.register_profile("drills", max_examples=10_000 if LONG else 300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile("drills")

# text as a user types it, with the characters that matter to each parser weighted in
STEP_CHARS = string.digits + "pause:.,smh " + "０１２３４５６７８９²½-+eE" + "\t\n\x00"
steps_text = st.one_of(st.text(alphabet=STEP_CHARS, max_size=40), st.text(max_size=40),
                       st.lists(st.one_of(st.integers(-1000, 1000).map(str), st.sampled_from(
                           ["pause", "pause:10s", "pause:1.5m", "pause:", "pause:-1s", "pause:1e3s", "100", "101"])),
                           max_size=80).map(",".join))


@given(steps_text)
def test_steps_text_parses_or_names_the_bad_step(text):
    try:
        steps = parse_steps(text)
    except ValueError as e:
        msg = str(e)
        assert msg and ("step" in msg or "setWeight" in msg), msg
        bad = [s.strip() for s in text.split(",") if s.strip()]
        assert ("empty step" in msg or "steps: at most" in msg or any(repr(b) in msg or b.lstrip("0") in msg
                                                                      for b in bad)), (text, msg)
        return
    assert all(set(s) in ({"setWeight"}, {"pause"}) for s in steps)
    assert all(0 <= s["setWeight"] <= 100 for s in steps if "setWeight" in s)


@given(st.text(max_size=30))
def test_controller_versions_resolve_or_name_the_bad_one(text):
    try:
        versions = resolve_controller_versions(text, check_served=False)
    except BadInput as e:
        assert "unknown controller version" in str(e) and "Tested versions" in str(e)
        return
    assert all(config.normalise_version(v) == v for v in versions)


@given(st.text(max_size=20))
def test_shard_parses_or_says_how(text):
    try:
        shard = legs.parse_shard(text)
    except BadInput as e:
        assert "--shard" in str(e) and repr(text) in str(e)
        return
    assert shard is not None and 1 <= shard[0] <= shard[1]


yaml_docs = st.one_of(
    st.text(max_size=200),
    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
                 lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner,
                                                                                    max_size=4)),
                 max_leaves=12).map(lambda v: yaml.safe_dump(v)),
    st.dictionaries(st.sampled_from(["allowed_contexts", "other"]),
                    st.one_of(st.text(max_size=10), st.lists(st.one_of(st.text(max_size=6), st.integers())),
                              st.none(), st.integers()), max_size=2).map(yaml.safe_dump),
)


@given(yaml_docs)
def test_config_file_is_an_allowlist_or_refused_naming_the_file(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(doc)
    try:
        ok = allowed_contexts(path)
    except BadInput as e:
        assert str(path) in str(e)
        return
    assert isinstance(ok, set) and all(isinstance(c, str) and c for c in ok)


json_docs = st.one_of(st.text(max_size=200), st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=15).map(json.dumps), st.fixed_dictionaries({"rollouts": st.dictionaries(
        st.sampled_from(["ns/a", "x", "ns/b"]), st.one_of(st.none(), st.dictionaries(
            st.sampled_from(["template", "original", "steps"]), st.one_of(st.none(), st.dictionaries(
                st.text(max_size=4), st.integers(), max_size=2)))), max_size=2)}).map(json.dumps))


@given(json_docs)
def test_journal_loads_or_is_refused_naming_the_file(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("journal") / "journal.json"
    path.write_text(doc)
    try:
        j = Journal.load(path)
    except BadInput as e:
        assert str(path) in str(e)
        return
    assert isinstance(j.data["rollouts"], dict)
    j.describe()


@given(json_docs)
def test_ledger_reads_or_is_refused_naming_the_file(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("ledger") / "ledger.json"
    path.write_text(doc)
    try:
        rows = read_rows(path)
    except BadInput as e:
        assert str(path) in str(e)
        return
    assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows)


@given(yaml_docs)
def test_values_layer_loads_or_names_file_and_line(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("values") / "values.yaml"
    path.write_text(doc)
    try:
        values = load_values_file(path)
    except BadInput as e:
        assert str(path) in str(e)
        return
    assert isinstance(values, dict)


@given(yaml_docs)
def test_app_list_loads_or_names_file_and_line(tmp_path_factory, doc):
    root = tmp_path_factory.mktemp("fleet")
    (root / "apps").mkdir()
    (root / "apps" / "stage.yaml").write_text(doc)
    try:
        apps = Fleet(root).apps("stage")
    except BadInput as e:
        assert "apps/stage.yaml" in str(e)
        return
    assert all(a.env == "stage" for a in apps)


@given(yaml_docs)
def test_kubeconfig_resolves_or_is_refused_naming_the_file(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("kc") / "kubeconfig"
    path.write_text(doc)
    try:
        kc, ctx = resolve_kubeconfig(str(path), None)
    except BadInput as e:
        assert str(path) in str(e) or "context" in str(e)
        return
    assert kc == str(path) and ctx


@pytest.mark.parametrize("args", [
    ["probe", "--steps", "5,,,pause:xs"], ["probe", "--steps", "5", "--hold", "-0"],
    ["run", "--shard", "2/1", "--plan"], ["run", "--lanes", "a,zz", "--plan"], ["watch", "-n", "x", "r", "--duration",
                                                                             "5parsecs", "--out", "/tmp/x"],
    ["restore", "--journal", "/dev/null"], ["report", "--merge", "/"]])
def test_the_command_line_answers_bad_input_with_exit_2_and_one_line(args, tmp_path):
    env = dict(os.environ, DRILLS_REPORTS=str(tmp_path), DRILLS_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.strip().startswith("drills:"), r.stderr
    assert not (Path(tmp_path) / "cache" / "clusters").exists()
