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
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from drills.core import config
from drills.run import legs
from drills.core.errors import BadInput
from drills.charts.fleet import Fleet, load_values_file
from drills.kube.api import resolve_kubeconfig
from drills.record.ledger import read_rows
from drills.drill.safety import Journal, allowed_contexts
from drills.core.steps import parse_steps
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
@example(doc="=")          # composes, but has no constructor (tag:yaml.org,2002:value): once a traceback
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


DURATION_CHARS = string.digits + ".msh " + "０１²½-+eE\t\n\x00"


@given(st.one_of(st.text(alphabet=DURATION_CHARS, max_size=24), st.text(max_size=24)))
def test_duration_parses_or_names_the_bad_text(text):
    from drills.commands.main import _duration
    try:
        seconds = _duration(text)
    except BadInput as e:
        assert "--duration" in str(e) and repr(text) in str(e), (text, str(e))
        return
    assert 0 < seconds <= 7 * 24 * 3600


durations_docs = st.one_of(json_docs, st.dictionaries(st.text(max_size=12), st.one_of(
    st.integers(min_value=-10**400, max_value=10**400), st.floats(), st.booleans(), st.none(), st.text(max_size=4)),
    max_size=6).map(lambda d: json.dumps(d)))


@given(durations_docs)
def test_durations_file_reads_or_is_refused_naming_the_file(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("durations") / "durations.json"
    path.write_text(doc)
    try:
        durations = legs.read_durations(path)
    except BadInput as e:
        assert str(path) in str(e)
        return
    assert all(isinstance(k, str) and isinstance(v, float) and 0 < v < float("inf") for k, v in durations.items())


@pytest.mark.parametrize("args", [
    ["probe", "--steps", "5,,,pause:xs"], ["probe", "--steps", "5", "--hold", "-0"],
    ["run", "--shard", "2/1", "--plan"], ["run", "--lanes", "a,zz", "--plan"], ["watch", "-n", "x", "r", "--duration",
                                                                             "5parsecs", "--out", "/tmp/x"],
    ["restore", "--journal", "/dev/null"], ["report", "--merge", "/"], ["scan"], ["scan", "/no/such/manifests"],
    ["scan", "fixtures/fleet/apps", "--fail-on", "everything"], ["scan", "fixtures/fleet/apps", "--verify", "-1"],
    ["scan", "fixtures/fleet/apps", "--controller", "latest"], ["probe", "--steps", "none", "--rollback-timeout", "0"]])
def test_the_command_line_answers_bad_input_with_exit_2_and_one_line(args, tmp_path):
    env = dict(os.environ, DRILLS_REPORTS=str(tmp_path), DRILLS_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.strip().startswith("drills:"), r.stderr
    assert not (Path(tmp_path) / "cache" / "clusters").exists()


# --- drills scan: manifests as a user (or a CI pipeline) feeds them ------------------------------------------
junk = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 300), st.floats(allow_nan=False),
                              st.text(max_size=6)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner,
                                                                                        max_size=3)), max_leaves=6)


def mostly(valid, weight: int = 12):
    """``valid`` most of the time, else anything (the scan reads both kinds)."""
    return st.one_of(*[valid] * weight, junk)


def rollouts(valid: bool):
    """Rollout documents: every field the rules read well-formed (``valid``), or each one sometimes anything."""
    any_of = (lambda v, *_: v) if valid else mostly
    step = any_of(st.one_of(
        st.fixed_dictionaries({"setWeight": st.integers(0, 100)}),
        st.fixed_dictionaries({"pause": st.one_of(st.just({}), st.fixed_dictionaries(
            {"duration": st.sampled_from(["10s", "1m", "1h30m", 5])}))}),
        st.fixed_dictionaries({"setCanaryScale": st.one_of(st.fixed_dictionaries({"replicas": st.integers(0, 30)}),
                                                           st.fixed_dictionaries({"weight": st.integers(0, 100)}),
                                                           st.just({"matchTrafficWeight": True}))})))
    routing = st.sampled_from([
        {"trafficRouting": {"istio": {"virtualService": {"name": "r"}, "destinationRule": {"name": "r"}}}},
        {"trafficRouting": {"istio": {"virtualService": {"name": "r"}}}, "canaryService": "c", "stableService": "s"},
        {"trafficRouting": {"istio": {"virtualService": {"name": "r"}}, "maxTrafficWeight": 200}, "canaryService": "c"},
        {"trafficRouting": {"nginx": {"stableIngress": "s"}}}, {}])
    canary = st.builds(lambda base, more: {**base, **more}, routing, st.fixed_dictionaries(
        {"steps": any_of(st.lists(step, max_size=6))}, optional={
            "minPodsPerReplicaSet": any_of(st.integers(0, 30)),
            "replicaProgressThreshold": any_of(st.fixed_dictionaries({"type": st.sampled_from(["Pods", "Percent"]),
                                                                      "value": st.integers(0, 100)}), 2),
            "dynamicStableScale": any_of(st.booleans()), "scaleDownDelaySeconds": any_of(st.integers(0, 60)),
            **({} if valid else {"trafficRouting": junk})}))
    strategy = st.builds(lambda c, pick: {"blueGreen": {"activeService": "a"}} if pick == 7 else {"canary": c},
                         canary, st.integers(0, 9))
    return st.fixed_dictionaries({
        "apiVersion": st.just("argoproj.io/v1alpha1"), "kind": st.just("Rollout"),
        "metadata": any_of(st.fixed_dictionaries({"name": st.text(string.ascii_lowercase, min_size=1, max_size=8)},
                                                 optional={"namespace": any_of(st.just("ns"))})),
        "spec": any_of(st.fixed_dictionaries({
            "strategy": any_of(strategy),
            "rollbackWindow": any_of(st.fixed_dictionaries({"revisions": st.integers(1, 5)})),
            "replicas": st.builds(lambda n, pick: n if pick != 7 else n % 2, st.integers(2, 40), st.integers(0, 9))
            if valid else mostly(st.integers(0, 40))}))})


rollout_doc = rollouts(valid=False)

def _spliced(doc: dict, at: int, cut: str) -> str:
    """A manifest with a fragment spliced in (a YAML error somewhere, or a different structure)."""
    text = yaml.safe_dump(doc)
    at %= len(text) + 1
    return text[:at] + cut + text[at:]


manifest_text = st.one_of(
    st.lists(st.one_of(rollout_doc, junk), min_size=1, max_size=3).map(lambda docs: yaml.safe_dump_all(docs)),
    st.builds(_spliced, rollout_doc, st.integers(0, 10_000),
              st.sampled_from(["\t", ": [", "- ", "&a *b", "{", "\"", "\n  x:", "!!python/object x", "<<: *a"])),
    st.text(max_size=200))


@given(manifest_text)
def test_scan_manifests_read_and_predict_or_name_the_file_and_line(doc):
    from drills.scan.model import ScanInputError
    from drills.scan.readers import rollouts_in
    from drills.scan.records import evaluate
    from drills.scan.sources import facts_from_releases
    try:
        found = rollouts_in(doc, "fuzz/rollouts.yaml").rollouts
    except ScanInputError as e:
        msg = str(e)
        assert msg.startswith("fuzz/rollouts.yaml") and "\n" not in msg.strip(), msg
        assert e.problem and (e.line is None or e.line >= 1), msg
        return
    for v in ("v1.7.2", "v1.8.2", "v1.10.2"):
        for ro in found:
            r = evaluate(ro, facts_from_releases(v))
            r.as_dict()
            assert r.pred.peak is None or 0 <= r.pred.peak <= ro.max_weight, (ro, r.pred)


@given(st.lists(rollouts(valid=True), min_size=1, max_size=4), st.sampled_from(config.SUPPORTED_CONTROLLERS))
def test_scan_predicts_every_well_formed_rollout_within_its_rules(docs, version):
    """Well-formed Rollouts always read, and every prediction keeps its own invariants on every version."""
    from drills.scan.advice import WAVES
    from drills.scan.readers import rollouts_in
    from drills.scan.records import evaluate
    from drills.scan.sources import facts_from_releases
    text = yaml.safe_dump_all(docs)
    found = rollouts_in(text, "fuzz/valid.yaml").rollouts
    assert len(found) == len(docs)
    for ro in found:
        r = evaluate(ro, facts_from_releases(version))
        p, d = r.pred, r.as_dict()
        assert d["wave"] in WAVES and d["controller_version"] is None and d["rule"]["id"] == p.rule
        if p.peak is None:
            assert not r.exposed and r.wave == "-"
            continue
        assert 0 <= p.peak <= ro.max_weight and (p.carrying is None or 1 <= p.carrying <= ro.replicas), (ro, p)
        assert r.exposed == (p.peak * ro.replicas > ro.max_weight * (p.carrying or 0) and p.peak > 0), (ro, p)
        for f in r.findings:
            assert f.line is None or 1 <= f.line <= len(text.splitlines()), f


@pytest.mark.parametrize("content,needle", [("kind: Rollout\nmetadata: {name: a}\nspec: {replicas: [\n", ":4:"),
                                            ("kind: Rollout\nmetadata: {name: a}\nspec:\n  replicas: -1\n", ":4:"),
                                            ("kind: Rollout\nmetadata: {name: a}\nspec:\n  strategy:\n    canary:\n"
                                             "      steps:\n      - setWeight: x\n", ":7:")])
def test_scan_bad_manifest_exits_2_naming_file_and_line(tmp_path, content, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    r = subprocess.run([sys.executable, "-m", "drills", "scan", str(path)], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, DRILLS_REPORTS=str(tmp_path)))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    line = r.stderr.strip()
    assert "Traceback" not in r.stderr and line.startswith("drills:") and "\n" not in line, r.stderr
    assert f"bad.yaml{needle}" in line and r.stdout == "", line
