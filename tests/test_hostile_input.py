"""Hostile input: every YAML and JSON reader of user input holds to one size, depth and alias budget
(drills.core.inputs), so a billion-laughs document, a 20,000-deep mapping or an oversized file ends with exit 2 and one
line naming the file (and the line), in bounded memory, with nothing written (no cluster needed)."""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from drills.core import inputs
from drills.core.errors import BadInput
from drills.scan.yamlstream import objects

ROOT = Path(__file__).resolve().parent.parent
MEMORY_LIMIT = 1 << 30          # the command runs under 1 GiB of address space: a bomb that expands cannot pass

ROLLOUT_HEAD = "apiVersion: argoproj.io/v1alpha1\nkind: Rollout\nmetadata: {name: bomb, namespace: n}\nspec:\n"


def _laughs(indent: str = "  ") -> str:
    """Nine levels of nine aliases: 10^9 nodes once expanded, a few hundred bytes as written."""
    out = f'{indent}a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for i in range(8):
        me, prev = chr(98 + i), chr(97 + i)
        out += f"{indent}{me}: &{me} [" + ", ".join([f"*{prev}"] * 9) + "]\n"
    return out


def laughs_document() -> str:
    return "lol:\n" + _laughs()


def one_string_many_times(indent: str = "") -> str:
    """One 1 MB string named 100 times: few nodes, 100 MB once expanded (the quadratic form of the bomb)."""
    return f'{indent}a: &a "{"x" * 1_000_000}"\n{indent}b: [' + ", ".join(["*a"] * 100) + "]\n"


def deep_mapping(depth: int = 20_000, flow: bool = False) -> str:
    """``depth`` nested mappings: flow style, or block style (indentation grows with the square of the depth, so a
    block document is 2,000 deep: 2 MB)."""
    if flow:
        return "a: " + "{a: " * depth + "1" + "}" * depth + "\n"
    depth = min(depth, 2_000)
    return "a:\n" + "".join(" " * (i + 1) + "a:\n" for i in range(depth))


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def drills(*args, tmp: Path, stdin: str | None = None, env: dict | None = None, timeout: float = 180):
    e = dict(os.environ, DRILLS_REPORTS=str(tmp / "reports"), DRILLS_CONFIG=str(tmp / "none.yaml"),
             PYTHONPATH=str(ROOT))
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "drills", *map(str, args)], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=e, cwd=tmp, preexec_fn=_limit_memory)


def refused(r, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr and "RecursionError" not in r.stderr, \
        r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("drills: "), r.stderr[-2000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# --- manifests: the scan's own event reader -------------------------------------------------------------------
def test_billion_laughs_in_a_manifest_is_refused_in_bounded_memory(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ROLLOUT_HEAD + _laughs() + "  strategy: {canary: {steps: [{setWeight: 5}]}}\n")
    line = refused(drills("scan", bomb, tmp=tmp_path), "bomb.yaml:", "aliases expand to more than")
    assert f":{ROLLOUT_HEAD.count(chr(10)) + 1}:" not in line       # it names the line where the budget ran out
    refused(drills("scan", "-", tmp=tmp_path, stdin=bomb.read_text()), "<stdin>:", "aliases expand")
    (tmp_path / "strings.yaml").write_text(ROLLOUT_HEAD + one_string_many_times("  "))
    refused(drills("scan", tmp_path / "strings.yaml", tmp=tmp_path), "strings.yaml:", "aliases expand")
    # the same aliases in a part the scan skips, named from a part it reads
    skipped = ROLLOUT_HEAD + "  template:\n    metadata:\n      labels:\n" + _laughs("        ") + \
        "  strategy: {canary: {steps: [{setWeight: 5}], extra: *i}}\n"
    (tmp_path / "skipped.yaml").write_text(skipped)
    refused(drills("scan", tmp_path / "skipped.yaml", tmp=tmp_path), "skipped.yaml:", "aliases expand")
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("flow", [False, True], ids=["block", "flow"])
def test_a_20000_deep_mapping_is_refused_naming_file_and_line(tmp_path, flow):
    deep = tmp_path / "deep.yaml"
    deep.write_text(ROLLOUT_HEAD + "  " + deep_mapping(flow=flow).replace("\n", "\n  ", 1))
    (tmp_path / "seq.yaml").write_text(ROLLOUT_HEAD + "  steps:\n    " + "- " * 20_000 + "x\n")
    refused(drills("scan", tmp_path / "seq.yaml", tmp=tmp_path), "seq.yaml:6:", "nested deeper than")
    line = refused(drills("scan", deep, tmp=tmp_path), "deep.yaml:", f"nested deeper than {inputs.MAX_DEPTH} levels")
    assert int(line.split("deep.yaml:")[1].split(":")[0]) >= 1
    # a document the scan does not read is held to the same budget (it is parsed all the same)
    (tmp_path / "svc.yaml").write_text("kind: Service\nmetadata: {name: s}\n" + deep_mapping(flow=flow))
    refused(drills("scan", tmp_path / "svc.yaml", tmp=tmp_path), "svc.yaml:", "nested deeper than")


def test_a_cycle_and_undefined_aliases_are_bad_input_and_merge_keys_read_as_yaml_merges_them():
    with pytest.raises(BadInput, match="c.yaml:5: alias .s is inside the node it names"):
        objects(ROLLOUT_HEAD + "  strategy: &s {canary: {x: *s}}\n", "c.yaml")
    with pytest.raises(inputs.InputError, match="inside the node it names"):
        inputs.load_all("a: &a [1, {b: *a}]\n", "c.yaml")
    with pytest.raises(BadInput, match="undefined alias"):
        objects(ROLLOUT_HEAD + "  replicas: *nope\n", "u.yaml")
    text = ROLLOUT_HEAD + """  template: &t {metadata: {labels: {app: x}}}
  defaults: &d {replicas: 3, minReadySeconds: 1}
  <<: [*d, {replicas: 9, paused: true}]
  strategy:
    canary:
      <<: {steps: [{setWeight: 1}], maxSurge: 2}
      maxSurge: 5
      extra: *t
"""
    got = objects(text, "m.yaml")[0].obj["spec"]
    want = yaml.safe_load(text)["spec"]
    want.pop("template")
    assert got == want and got["replicas"] == 3 and got["strategy"]["canary"]["maxSurge"] == 5


@pytest.mark.parametrize("value", ["2024-02-30", "2024-13-45", "!!int abc", "!!float abc", "!!bool maybe",
                                   "!!timestamp hello", "9" * 5000])
def test_a_value_the_safe_constructors_cannot_make_is_bad_input_naming_the_file(value):
    # PyYAML's constructors raise ValueError, KeyError or AttributeError on these; a reader of user input says
    # "not valid YAML" with the file (exit 2), never a traceback
    with pytest.raises(inputs.InputError, match=r"v\.yaml: not valid YAML: a value cannot be read"):
        inputs.load_all(f"a: {value}\n", "v.yaml")
    node = inputs.compose_all(f"a: {value}\n", "v.yaml")[0]
    with pytest.raises(inputs.InputError, match="not valid YAML"):
        inputs.construct(node, "v.yaml")
    # and the scan's own streaming reader of manifests refuses the same values the same way (exit 2, file and line)
    with pytest.raises(BadInput, match=r"m\.yaml:5: not valid YAML: cannot read"):
        objects(ROLLOUT_HEAD + f"  replicas: {value}\n", "m.yaml")
    assert inputs.load_all("a: 2024-02-29\nb: !!int 7\n", "v.yaml") == [{"a": __import__("datetime").date(2024, 2, 29),
                                                                         "b": 7}]


# --- every other reader of user input -----------------------------------------------------------------------------
def _kubeconfig(path: Path, server: str = "http://127.0.0.1:9") -> Path:
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "stage",
                                    "clusters": [{"name": "c", "cluster": {"server": server}}],
                                    "contexts": [{"name": "stage", "context": {"cluster": "c", "user": "u"}}],
                                    "users": [{"name": "u", "user": {"token": "t"}}]}))
    return path


HOSTILE = {"laughs": (laughs_document(), "aliases expand to more than"),
           "long-string": (one_string_many_times(), "aliases expand to more than"),
           "deep": (deep_mapping(), "nested deeper than"),
           "deep-flow": (deep_mapping(flow=True), "nested deeper than")}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_config_file_and_kubeconfigs_hold_to_the_budget(tmp_path, kind):
    text, needle = HOSTILE[kind]
    hostile = tmp_path / "hostile.yaml"
    hostile.write_text(text)
    kc = _kubeconfig(tmp_path / "kc.yaml")
    live = ["run", "--context", "stage", "--namespace", "n", "--rollout", "r", "--dry-run"]
    # the config file (the allowlist)
    refused(drills(*live, "--kubeconfig", kc, tmp=tmp_path, env={"DRILLS_CONFIG": str(hostile)}), "hostile.yaml",
            needle)
    # a kubeconfig given with --kubeconfig, and one file of a KUBECONFIG list
    refused(drills(*live, "--kubeconfig", hostile, tmp=tmp_path), "hostile.yaml", needle)
    refused(drills("scan", "--context", "stage", tmp=tmp_path, env={"KUBECONFIG": f"{kc}{os.pathsep}{hostile}"}),
            "hostile.yaml", needle)


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_fleet_app_lists_and_values_layers_hold_to_the_budget(tmp_path, kind):
    text, needle = HOSTILE[kind]
    fleet = tmp_path / "fleet"
    shutil.copytree(ROOT / "fixtures" / "fleet", fleet)
    values = fleet / "service" / "checkout" / "values" / "stage.yaml"
    values.write_text(text)
    refused(drills("scan", "--fleet", fleet, "--env", "stage", tmp=tmp_path), "checkout/values/stage.yaml", needle)
    refused(drills("render-diff", "--app", "checkout", "--env", "stage", "--from", "3.0.13", "--to", "3.0.14-rc.0",
                   "--fleet", fleet, tmp=tmp_path), "stage.yaml", needle)
    (fleet / "apps" / "stage.yaml").write_text(text)
    refused(drills("scan", "--fleet", fleet, "--env", "stage", tmp=tmp_path), "apps/stage.yaml", needle)


def _run_folder(path: Path, legs: list, plan: str = "p1") -> Path:
    path.mkdir(parents=True)
    (path / "ledger.json").write_text("[]")
    (path / "run.json").write_text(json.dumps({"run_id": path.name, "plan_digest": plan, "legs": legs,
                                               "all_legs": [x["id"] for x in legs if isinstance(x, dict)]}))
    return path


def test_json_records_a_user_hands_over_hold_to_the_budget_and_their_shape(tmp_path):
    deep = "[" * 20_000 + "]" * 20_000
    (tmp_path / "durations.json").write_text(deep)
    refused(drills("run", "--plan", "--durations", tmp_path / "durations.json", tmp=tmp_path), "--durations",
            "durations.json")
    a = _run_folder(tmp_path / "shard-a", [{"id": "v1.8.2/a/stage"}])
    b = _run_folder(tmp_path / "shard-b", [{"id": "v1.8.2/b/stage"}])
    (b / "run.json").write_text('{"legs": ' + deep + "}")
    refused(drills("report", "--merge", a, b, tmp=tmp_path), "shard-b", "nested deeper than")
    for bad in ('{"legs": [1, 2]}', '{"legs": [{"id": 7}]}', "[1]", '{"legs": [], "all_legs": [{}]}'):
        (b / "run.json").write_text(bad)
        refused(drills("report", "--merge", a, b, tmp=tmp_path), "shard-b")
    (a / "ledger.json").write_text(deep)
    refused(drills("report", a, tmp=tmp_path), "ledger", "nested deeper than")
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())


def test_files_past_the_size_budget_are_refused_unread(tmp_path):
    big = tmp_path / "big-kubeconfig.yaml"
    with open(big, "wb") as f:
        f.write(b"# padding\n")
        f.truncate(inputs.FILE_BYTES + 1)          # sparse: nothing of it is written, nothing of it is needed
    refused(drills("scan", "--kubeconfig", big, tmp=tmp_path), "big-kubeconfig.yaml", "larger than 16 MiB")
    refused(drills("run", "--kubeconfig", _kubeconfig(tmp_path / "kc.yaml"), "--context", "stage", "--namespace",
                   "n", "--rollout", "r", "--dry-run", tmp=tmp_path, env={"DRILLS_CONFIG": str(big)}),
            "big-kubeconfig.yaml", "larger than")
    with pytest.raises(inputs.InputError, match="larger than"):
        inputs.read_stream(open(big, "rb"), limit=1 << 20)


@pytest.mark.parametrize("kind", ["not-utf8", "past-budget"])
def test_a_go_source_tree_a_user_hands_over_holds_to_the_budget(tmp_path, kind):
    # --source is the user's: its trafficrouting.go is read within the size budget and as UTF-8, and a file that is
    # neither ends with exit 2 naming it (and the line), never a decode error as a failed scan (exit 1)
    from drills.drill.branches import find_branches
    go = tmp_path / "src" / "rollout" / "trafficrouting.go"
    go.parent.mkdir(parents=True)
    if kind == "not-utf8":
        go.write_bytes(b"package rollout\n\xff\xfe func reconcileTrafficRouting\n")
        needles = ("trafficrouting.go:2", "not UTF-8")
    else:
        with open(go, "wb") as f:
            f.write(b"package rollout\n")
            f.truncate(inputs.FILE_BYTES + 1)      # sparse
        needles = ("trafficrouting.go", "larger than 16 MiB")
    with pytest.raises(inputs.InputError) as e:
        find_branches(go)
    assert all(n in str(e.value) for n in needles), str(e.value)
    manifest = tmp_path / "rollout.yaml"
    manifest.write_text(ROLLOUT_HEAD + "  replicas: 2\n  strategy: {canary: {steps: [{setWeight: 5}]}}\n")
    line = refused(drills("scan", manifest, "--source", go.parent.parent, "--controller", "v1.8.2", tmp=tmp_path),
                   *needles)
    assert line.startswith("drills: --source: "), line
