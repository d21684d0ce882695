"""Charts among the scanned manifests: rendered with the real helm (values.yaml, then --values), never read as
YAML, findings on the template's own lines; a chart helm cannot render is a finding and the scan goes on."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from drills.scan.charts import split

CHART = "apiVersion: v2\nname: shop\nversion: 0.1.0\n"
VALUES = "replicas: 4\nfinal: 100\n"
ROLLOUT_TPL = """apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata:
  name: {{ .Release.Name }}-checkout
spec:
  replicas: {{ .Values.replicas }}
  rollbackWindow:
    revisions: 3
  strategy:
    canary:
      trafficRouting:
        istio:
          virtualService: {name: checkout}
          destinationRule: {name: checkout, canarySubsetName: canary, stableSubsetName: stable}
      steps:
        - setWeight: 5
        - pause: {duration: 10m}
        - setWeight: {{ .Values.final }}
"""
SERVICE_TPL = "apiVersion: v1\nkind: Service\nmetadata:\n  name: {{ .Release.Name }}\nspec:\n  ports: [{port: 80}]\n"
PLAIN = """apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata: {name: plain, namespace: n}
spec:
  replicas: 2
  strategy: {canary: {steps: [{setWeight: 5}]}}
"""


def drills(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def make_chart(root: Path, name: str = "shop") -> Path:
    c = root / name
    (c / "templates").mkdir(parents=True)
    (c / "Chart.yaml").write_text(CHART.replace("shop", name))
    (c / "values.yaml").write_text(VALUES)
    (c / "templates" / "rollout.yaml").write_text(ROLLOUT_TPL)
    (c / "templates" / "service.yaml").write_text(SERVICE_TPL)
    (c / "templates" / "_helpers.tpl").write_text('{{- define "x" -}}x{{- end -}}\n')
    return c


def _line(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_a_folder_with_a_chart_renders_it_and_reports_on_the_template_lines(tmp_path):
    make_chart(tmp_path / "repo")
    (tmp_path / "repo" / "plain.yaml").write_text(PLAIN)
    plain, charts = split([str(tmp_path / "repo")])
    assert plain == [str(tmp_path / "repo" / "plain.yaml")] and [c.root.name for c in charts] == ["shop"]
    r = drills("scan", "repo", "--json", "--fail-on", "none", "--sarif", "s.sarif", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = {x["name"]: x for x in json.loads(r.stdout)["rollouts"]}
    assert set(got) == {"plain", "shop-checkout"}
    ro = got["shop-checkout"]
    tpl = "repo/shop/templates/rollout.yaml"
    assert (ro["file"], ro["line"], ro["source"]) == (tpl, 1, f"{tpl}:1")
    assert ro["origin"]["chart"] == "repo/shop" and ro["replicas"] == 4 and ro["rollbackWindow"] == 3
    # lines helm's output allows: the literal step lines; the templated final step has none
    assert ro["step_lines"] == [_line(ROLLOUT_TPL, "- setWeight: 5"), _line(ROLLOUT_TPL, "- pause:"), None]
    (final,) = [f for f in ro["lint"] if f["rule"] == "final-setweight-100"]
    assert (final["file"], final["line"]) == (tpl, _line(ROLLOUT_TPL, "steps:"))
    assert ro["predicted_peak_weight"] == 100 and ro["exposed"]
    results = json.loads((tmp_path / "s.sarif").read_text())["runs"][0]["results"]
    locs = {x["ruleId"]: x["locations"][0]["physicalLocation"] for x in results if "shop-checkout" in
            x["message"]["text"]}
    assert locs["final-setweight-100"]["artifactLocation"]["uri"] == tpl
    assert locs["final-setweight-100"]["region"]["startLine"] == _line(ROLLOUT_TPL, "steps:")


def test_values_files_are_applied_after_the_charts_own(tmp_path):
    c = make_chart(tmp_path)
    (tmp_path / "cut.yaml").write_text("final: 50\n")
    base = json.loads(drills("scan", str(c), "--json", "--fail-on", "none").stdout)["rollouts"][0]
    r = drills("scan", str(c), "--values", str(tmp_path / "cut.yaml"), "--json", "--fail-on", "none")
    assert r.returncode == 0, r.stderr
    cut = json.loads(r.stdout)["rollouts"][0]
    assert base["steps"][-1] == {"setWeight": 100} and cut["steps"][-1] == {"setWeight": 50}
    assert not [f for f in cut["lint"] if f["rule"] == "final-setweight-100"]
    r = drills("scan", str(tmp_path / "cut.yaml"), "--values", str(tmp_path / "cut.yaml"))
    assert r.returncode == 2 and "--values applies to charts" in r.stderr
    r = drills("scan", str(c), "--values", str(tmp_path / "absent.yaml"))
    assert r.returncode == 2 and "absent.yaml: --values: no such file" in r.stderr


def test_a_template_given_alone_is_read_from_its_charts_render(tmp_path):
    c = make_chart(tmp_path)
    r = drills("scan", str(c / "templates" / "rollout.yaml"), "--json", "--fail-on", "none")
    assert r.returncode == 0, r.stderr
    (ro,) = json.loads(r.stdout)["rollouts"]
    assert ro["name"] == "shop-checkout" and ro["file"].endswith("shop/templates/rollout.yaml")
    r = drills("scan", str(c / "templates" / "service.yaml"))
    assert r.returncode == 2 and "no Rollout found" in r.stderr, r.stderr


def test_a_chart_helm_cannot_render_is_a_finding_and_the_scan_goes_on(tmp_path):
    good = make_chart(tmp_path / "repo", "good")
    broken = make_chart(tmp_path / "repo", "broken")
    (broken / "Chart.yaml").write_text(CHART.replace("shop", "broken") +
                                       "dependencies:\n  - {name: base, version: 1.0.0, repository: oci://x/y}\n")
    bad_tpl = make_chart(tmp_path / "repo", "badtpl")
    (bad_tpl / "templates" / "rollout.yaml").write_text(ROLLOUT_TPL.replace("{{ .Values.final }}",
                                                                            "{{ .Values.final | nope }}"))
    r = drills("scan", "repo", "--json", "--fail-on", "none", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    out = json.loads(r.stdout)
    assert [x["name"] for x in out["rollouts"]] == ["good-checkout"] and good.is_dir()
    bad = {u["file"]: u for u in out["unreadable"]}
    assert set(bad) == {"repo/broken/Chart.yaml", "repo/badtpl/templates/rollout.yaml"}, bad
    assert "helm template failed" in bad["repo/broken/Chart.yaml"]["problem"]
    assert bad["repo/badtpl/templates/rollout.yaml"]["line"] == _line(ROLLOUT_TPL, "{{ .Values.final }}")
    assert sum(ln.startswith("drills: cannot read repo/") for ln in r.stderr.splitlines()) == 2, r.stderr


# --- a chart's own files are the user's input: read under drills.core.inputs' budget ------------------------------
def _chart_with(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "chart"
    (root / "templates").mkdir(parents=True)
    (root / "Chart.yaml").write_text(text)
    return root


def test_a_chart_yaml_past_the_size_budget_is_not_read(tmp_path, monkeypatch):
    from drills.core import inputs
    from drills.scan.charts import _chart
    small = _chart_with(tmp_path / "a", "apiVersion: v2\nname: small\nversion: 0.1.0\n")
    assert _chart(small).release == "small"
    monkeypatch.setattr(inputs, "FILE_BYTES", 1024)
    big = _chart_with(tmp_path / "b", "apiVersion: v2\nname: big\nversion: 0.1.0\n" + "# padding\n" * 200)
    # refused unread: its name is not taken, helm renders it under the default release name and says what is wrong
    assert _chart(big).release == "release-name"
    assert _chart(small).release == "small"


def test_a_chart_yaml_nested_past_the_depth_budget_is_refused(tmp_path):
    from drills.core import inputs
    from drills.scan.charts import _chart
    deep = "a: " + "[" * (inputs.MAX_DEPTH + 5) + "]" * (inputs.MAX_DEPTH + 5) + "\n"
    root = _chart_with(tmp_path, "apiVersion: v2\nname: deep\nversion: 0.1.0\n" + deep)
    assert _chart(root).release == "release-name"
    ok = _chart_with(tmp_path / "ok", "apiVersion: v2\nname: shallow\nversion: 0.1.0\na: [[1]]\n")
    assert _chart(ok).release == "shallow"


def test_a_chart_yaml_with_a_value_yaml_cannot_make_is_not_a_crash(tmp_path):
    from drills.scan.charts import _chart
    for i, value in enumerate(["2024-02-30", "!!bool maybe"]):
        root = _chart_with(tmp_path / str(i), f"apiVersion: v2\nname: odd\nversion: 0.1.0\nannotations: {{released: {value}}}\n")
        assert _chart(root).release == "release-name"


def test_a_chart_template_past_the_size_budget_leaves_its_lines_unknown(tmp_path, monkeypatch):
    from drills.core import inputs
    from drills.scan.charts import line_map
    root = _chart_with(tmp_path, "apiVersion: v2\nname: c\nversion: 0.1.0\n")
    (root / "templates" / "ro.yaml").write_text("kind: Rollout\nmetadata:\n  name: svc\n" + "# pad\n" * 300)
    rendered = "---\n# Source: c/templates/ro.yaml\nkind: Rollout\nmetadata:\n  name: svc\n"
    assert [line for _, line in line_map(rendered, root).values()] == [1, 2, 3]
    monkeypatch.setattr(inputs, "FILE_BYTES", 512)          # the template is past it: read no more, lines unknown
    assert [line for _, line in line_map(rendered, root).values()] == [None, None, None]
