"""Readers of `drills scan`: streams, Lists, folders, stdin, and bad input with file and line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from drills.scan.readers import read_manifests, rollouts_in
from drills.scan.yamlstream import objects

ROLLOUT = """apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata:
  name: {name}
  namespace: {ns}
  annotations:
    note: skipped by the reader
spec:
  replicas: {replicas}
  rollbackWindow:
    revisions: 3
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      containers: [{{name: app, image: "x:1"}}]
  strategy:
    canary:
      minPodsPerReplicaSet: 2
      trafficRouting:
        istio:
          virtualService: {{name: {name}, routes: [primary]}}
          destinationRule: {{name: {name}, canarySubsetName: canary, stableSubsetName: stable}}
      steps:
        - setWeight: 5
        - pause: {{duration: 10m}}
        - setWeight: 100
status:
  phase: Healthy
"""


def drills(*args, stdin=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "drills", *args], input=stdin, capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def _line_of(text: str, needle: str, start: int = 1) -> int:
    lines = text.splitlines()
    return next(i for i in range(start - 1, len(lines)) if needle in lines[i]) + 1


def test_multi_document_stream_keeps_lines_and_helm_source():
    svc = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 80}]}\n"
    text = ("---\n# Source: shop/charts/base/templates/service.yaml\n" + svc +
            "---\n# Source: shop/charts/base/templates/rollout.yaml\n" + ROLLOUT.format(name="a", ns="x", replicas=4) +
            "---\n" + ROLLOUT.format(name="b", ns="y", replicas=20))
    res = rollouts_in(text, "render.yaml", "v1.8.2")
    assert [r.key for r in res.rollouts] == ["x/a", "y/b"]
    assert res.kinds == {"Service": 1, "Rollout": 2}
    a, b = res.rollouts
    assert a.line == _line_of(text, "apiVersion: argoproj.io") and a.source == f"render.yaml:{a.line}"
    second = _line_of(text, "name: b") - 3
    assert b.line == second
    assert a.step_lines == [_line_of(text, "- setWeight: 5"), _line_of(text, "- pause:"),
                            _line_of(text, "- setWeight: 100")]
    assert b.step_lines[2] == _line_of(text, "- setWeight: 100", second)
    assert (a.replicas, a.min_pods, a.rollback_window, a.routing) == (4, 2, 3, "subset")
    assert a.origin["template"] == "shop/charts/base/templates/rollout.yaml"
    assert "template" not in b.origin


def test_reader_agrees_with_a_full_yaml_load():
    """The event walker builds what a full load builds for every field it keeps (anchors, merge keys and
    tags go through the full loader)."""
    text = ROLLOUT.format(name="a", ns="x", replicas=3) + """---
apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata: {name: merged, namespace: m}
spec:
  replicas: 0x10
  strategy:
    canary: &c
      steps: [{setWeight: !!int "7"}, {pause: {}}]
      dynamicStableScale: yes
      trafficRouting: {istio: {virtualService: {name: v}}}
      canaryService: c
  template:
    metadata: {labels: *c}
---
apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata: {name: m2}
spec:
  <<: {replicas: 5}
  strategy: {canary: {steps: []}}
"""
    got = {f"{o.obj['metadata'].get('namespace')}/{o.obj['metadata']['name']}": o.obj for o in objects(text, "t")}
    for doc in yaml.safe_load_all(text):
        key = f"{doc['metadata'].get('namespace')}/{doc['metadata']['name']}"
        want_spec = {k: v for k, v in doc["spec"].items() if k != "template"}
        assert {k: v for k, v in got[key]["spec"].items() if k != "template"} == want_spec, key
    merged = rollouts_in(text, "t").rollouts
    assert [(r.name, r.replicas, r.dss, r.routing) for r in merged] == \
        [("a", 3, False, "subset"), ("merged", 16, True, "host"), ("m2", 5, False, "none")]


def test_kubectl_list_items_become_rollouts_with_their_lines(tmp_path):
    items = [yaml.safe_load(ROLLOUT.format(name=f"r{i}", ns="ns", replicas=2 + i)) for i in range(3)]
    items.insert(1, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}})
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items, "metadata": {}}, sort_keys=False)
    (tmp_path / "list.yaml").write_text(text)
    res = read_manifests([str(tmp_path / "list.yaml")], "v1.8.2")
    assert [r.name for r in res.rollouts] == ["r0", "r1", "r2"]
    assert [r.replicas for r in res.rollouts] == [2, 3, 4]
    lines = text.splitlines()
    for r in res.rollouts:
        assert lines[r.line - 1].lstrip("- ").startswith("apiVersion: argoproj.io"), r.line
        assert "setWeight: 100" in lines[r.step_lines[2] - 1]
    rl = yaml.safe_dump({"apiVersion": "argoproj.io/v1alpha1", "kind": "RolloutList", "items": items[:1]})
    assert [r.name for r in rollouts_in(rl, "x").rollouts] == ["r0"]


def test_folders_recurse_over_yaml_and_json_only(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "one.yaml").write_text(ROLLOUT.format(name="one", ns="n", replicas=2))
    (tmp_path / "a" / "b" / "two.yml").write_text(ROLLOUT.format(name="two", ns="n", replicas=2))
    (tmp_path / "a" / "b" / "three.json").write_text(json.dumps(yaml.safe_load(
        ROLLOUT.format(name="three", ns="n", replicas=2))))
    (tmp_path / "a" / "notes.txt").write_text("kind: Rollout\n")
    (tmp_path / "a" / ".hidden").mkdir()
    (tmp_path / "a" / ".hidden" / "x.yaml").write_text("::: not yaml")
    res = read_manifests([str(tmp_path / "a")], "v1.8.2")
    assert sorted(r.name for r in res.rollouts) == ["one", "three", "two"] and res.files == 3


def test_stdin_stream_through_the_command():
    text = ROLLOUT.format(name="a", ns="x", replicas=4) + "---\n" + ROLLOUT.format(name="b", ns="x", replicas=1)
    r = drills("scan", "-", "--json", "--fail-on", "none", stdin=text)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [(x["name"], x["source"]) for x in out["rollouts"]] == \
        [("a", "<stdin>:1"), ("b", f"<stdin>:{_line_of(text, 'name: b') - 3}")]


@pytest.mark.parametrize("text,line,needle", [
    ("apiVersion: v1\nkind: Rollout\nmetadata:\n  name: x\n spec: [\n", 5, "not valid YAML"),
    ("a: 1\n---\nkey: [1, 2\n", 4, "not valid YAML"),
    ("kind: Rollout\nmetadata: {name: x}\nspec:\n  replicas: many\n", 4, "spec.replicas"),
    ("kind: Rollout\nmetadata: {name: x}\nspec:\n  strategy:\n    canary:\n      steps:\n      - setWeight: 5\n"
     "      - {setWeight: high}\n", 8, "canary step 1: setWeight"),
])
def test_bad_input_names_file_and_line(tmp_path, text, line, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    (e,) = read_manifests([str(p)], "v1.8.2").unreadable
    assert e.line == line and needle in str(e)
    r = drills("scan", str(p))
    assert r.returncode == 2 and f"bad.yaml:{line}:" in r.stderr and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_unreadable_files_are_named_and_the_scan_goes_on(tmp_path):
    """Each file or Rollout that cannot be read is a finding with its file and line; the others are scanned, and
    the exit is 2 at the end (never at the first)."""
    (tmp_path / "a-bad.yaml").write_text("kind: Rollout\nmetadata: {name: x}\nspec: [\n")
    (tmp_path / "b-good.yaml").write_text(ROLLOUT.format(name="good", ns="n", replicas=4))
    (tmp_path / "c-template.yaml").write_text("kind: Rollout\nmetadata:\n  name: {{ .Values.name }}\n")
    two = ROLLOUT.format(name="fine", ns="n", replicas=2) + "---\n" + \
        ROLLOUT.format(name="broken", ns="n", replicas=2).replace("replicas: 2", "replicas: two")
    (tmp_path / "d-two.yaml").write_text(two)
    res = read_manifests([str(tmp_path)], "v1.8.2")
    assert sorted(r.name for r in res.rollouts) == ["fine", "good"]
    where = sorted((e.file.rsplit("/", 1)[-1], e.line) for e in res.unreadable)
    assert where == [("a-bad.yaml", 4), ("c-template.yaml", 3), ("d-two.yaml", _line_of(two, "replicas: two"))]
    r = drills("scan", str(tmp_path), "--json", "--fail-on", "none", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    out = json.loads(r.stdout)
    assert sorted(x["name"] for x in out["rollouts"]) == ["fine", "good"]
    assert sorted((u["file"], u["line"]) for u in out["unreadable"]) == \
        [("a-bad.yaml", 4), ("c-template.yaml", 3), ("d-two.yaml", _line_of(two, "replicas: two"))]
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("drills: cannot read ")]
    assert len(said) == 3 and "a-bad.yaml:4: not valid YAML" in said[0] and "spec.replicas" in said[2], r.stderr
    t = drills("scan", str(tmp_path), "--fail-on", "none", "--sarif", str(tmp_path / "s.sarif"), cwd=tmp_path)
    assert t.returncode == 2 and "3 input(s) could not be read" in t.stdout and "c-template.yaml:3:" in t.stdout
    results = json.loads((tmp_path / "s.sarif").read_text())["runs"][0]["results"]
    bad = [x for x in results if x["ruleId"] == "unreadable-input"]
    assert sorted((x["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
                   x["locations"][0]["physicalLocation"]["region"]["startLine"]) for x in bad) == where


def test_not_utf8_and_missing_paths_exit_2(tmp_path):
    p = tmp_path / "latin.yaml"
    p.write_bytes(b"kind: Rollout\nmetadata: {name: caf\xe9}\n")
    r = drills("scan", str(p))
    assert r.returncode == 2 and "latin.yaml:2: not UTF-8" in r.stderr
    r = drills("scan", str(tmp_path / "absent"))
    assert r.returncode == 2 and "absent: no such file or folder" in r.stderr
    r = drills("scan")
    assert r.returncode == 2 and "nothing to scan" in r.stderr


def test_a_large_folder_is_read_in_parallel_with_the_same_result(tmp_path):
    from drills.scan.readers import PARALLEL_BYTES
    stream = "---\n".join(ROLLOUT.format(name=f"r{i}", ns="n", replicas=2 + i % 5) for i in range(200))
    for f in range(PARALLEL_BYTES // len(stream) + 2):
        (tmp_path / f"part-{f:02d}.yaml").write_text(stream.replace("name: r", f"name: f{f}-r"))
    serial = read_manifests([str(tmp_path)], "v1.8.2", workers=1)
    parallel = read_manifests([str(tmp_path)], "v1.8.2", workers=2)
    assert [(r.source, r.key, r.replicas, r.step_lines) for r in parallel.rollouts] == \
        [(r.source, r.key, r.replicas, r.step_lines) for r in serial.rollouts]
    assert parallel.kinds == serial.kinds and parallel.files == serial.files
    (tmp_path / "zz-bad.yaml").write_text("kind: Rollout\nmetadata: {name: x}\nspec:\n  replicas: [1,\n")
    res = read_manifests([str(tmp_path)], "v1.8.2", workers=2)
    (e,) = res.unreadable
    assert (e.file, e.line) == (str(tmp_path / "zz-bad.yaml"), 5) and "not valid YAML" in str(e)
    assert len(res.rollouts) == len(serial.rollouts)
