"""Render, normalise, diff and bad input, with the real helm binary (and the real registry where named)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import yaml

from drills.core import config
from drills.cli import build_parser
from drills.core.errors import BadInput
from drills.charts.fleet import Fleet, Workspace, base_sources, normalise, render_app
from drills.charts.helm import ChartInputError, Helm, Registry, helm_binary, publish
from drills.lanes.b_checks import check_equivalence
from drills.charts.renderdiff import diff_objects, render_diff

PINNED, CANDIDATE = "3.0.13", "3.0.14-rc.0"


@pytest.fixture(scope="module")
def helm():
    with Helm() as h:
        yield h


@pytest.fixture
def fleet_copy(tmp_path):
    """A private copy of the fleet fixture that a test may break."""
    dest = tmp_path / "fleet"
    shutil.copytree(config.fixtures_dir() / "fleet", dest)
    return dest


def _parse(argv):
    return build_parser().parse_args(argv)


# --- the binary and a plain render ----------------------------------------------------------------------
def test_helm_is_the_toolchain_build(helm):
    assert helm.binary == helm_binary() and helm.version() == config.HELM_VERSION


def test_inheritor_render_takes_base_steps_and_istio_routing(helm, tmp_path):
    fleet = Fleet()
    r = render_app(fleet, fleet.app("checkout", "stage"), PINNED, helm, tmp_path)
    ro = r.objects["Rollout/checkout"]
    canary = ro["spec"]["strategy"]["canary"]
    got = {
        "kinds": sorted(r.objects),
        "steps": canary["steps"],
        "istio": canary["trafficRouting"]["istio"],
        "service_refs": [k for k in ("canaryService", "stableService") if k in canary],
        "minPods": canary["minPodsPerReplicaSet"],
        "rollbackWindow": ro["spec"]["rollbackWindow"],
        "chart_label": ro["spec"]["template"]["metadata"]["labels"]["helm.sh/chart"],
        "service_selector": r.objects["Service/checkout"]["spec"]["selector"],
        "subset_labels_equal": len({json.dumps(s["labels"], sort_keys=True) for s in
                                    r.objects["DestinationRule/checkout"]["spec"]["subsets"]}) == 1,
        "replicas": ro["spec"]["replicas"],
        "base_version": r.base_version,
    }
    assert got == {
        "kinds": ["DestinationRule/checkout", "Rollout/checkout", "Service/checkout", "VirtualService/checkout"],
        "steps": [{"setWeight": 5}, {"pause": {"duration": "10m"}}, {"setWeight": 100}],
        "istio": {"destinationRule": {"canarySubsetName": "canary", "name": "checkout", "stableSubsetName": "stable"},
                  "virtualService": {"name": "checkout", "routes": ["primary"]}},
        "service_refs": [],
        "minPods": 2,
        "rollbackWindow": {"revisions": 3},
        "chart_label": f"base-{PINNED}",
        "service_selector": {"app.kubernetes.io/instance": "checkout", "app.kubernetes.io/name": "checkout"},
        "subset_labels_equal": True,
        "replicas": 4,
        "base_version": PINNED,
    }


def test_prod_layer_keeps_analysis_with_the_error_rate_query(helm, tmp_path):
    fleet = Fleet()
    r = render_app(fleet, fleet.app("checkout", "prod"), PINNED, helm, tmp_path)
    er = r.objects["AnalysisTemplate/checkout-error-rate"]["spec"]["metrics"][0]
    got = (r.objects["Rollout/checkout"]["spec"]["strategy"]["canary"]["analysis"]["templates"],
           er["failureCondition"], er["failureLimit"], er["interval"],
           'destination_service=~"checkout.checkout.svc.cluster.local", response_code=~"5.*"'
           in er["provider"]["prometheus"]["query"], "OR on() vector(0)" in er["provider"]["prometheus"]["query"],
           r.objects["AnalysisTemplate/checkout-latency"]["spec"]["metrics"][0]["failureCondition"])
    assert got == ([{"templateName": "checkout-error-rate"}, {"templateName": "checkout-latency"}],
                   "result[0] >= 0.001", 2, "20s", True, True, "result[0] >= 0.3")


def test_value_files_apply_in_order_maps_merge_lists_replace(helm, tmp_path, fleet_copy):
    # A later layer overrides an earlier one; a list set in a layer replaces the base list whole.
    (fleet_copy / "service/checkout/values/stage.yaml").write_text(
        "base:\n  replicas: 7\n  rollout:\n    canary:\n      steps:\n        - setWeight: 20\n")
    fleet = Fleet(fleet_copy)
    r = render_app(fleet, fleet.app("checkout", "stage"), PINNED, helm, tmp_path / "w")
    ro = r.objects["Rollout/checkout"]
    assert (ro["spec"]["replicas"], ro["spec"]["strategy"]["canary"]["steps"],
            ro["spec"]["strategy"]["canary"]["maxSurge"]) == (7, [{"setWeight": 20}], "50%")


def test_rollout_disabled_component_renders_a_deployment_without_routing(helm, tmp_path):
    fleet = Fleet()
    r = render_app(fleet, fleet.app("web", "stage"), PINNED, helm, tmp_path)
    assert sorted(r.objects) == ["Deployment/web", "Service/web", "VirtualService/web"]


def test_normalise_sorts_keys_and_keys_objects_by_kind_and_name(helm, tmp_path):
    fleet = Fleet()
    r = render_app(fleet, fleet.app("search", "stage"), PINNED, helm, tmp_path)
    again = normalise(yaml.safe_dump_all(list(reversed(list(yaml.safe_load_all(r.text)))), sort_keys=False))
    keys = list(r.objects["Rollout/search"]["spec"])
    assert (again == r.objects and json.dumps(again) == json.dumps(r.objects) and keys == sorted(keys))


# --- diffs --------------------------------------------------------------------------------------------------
def test_render_diff_inheritor_changes_steps_and_restates_chart_version(helm):
    d = render_diff(Fleet(), "checkout", "stage", PINNED, CANDIDATE, helm)
    cv = {c.ref for c in d.chart_version}
    assert ([c.ref for c in d.real] == ["Rollout/checkout:spec.strategy.canary.steps"]
            and "Rollout/checkout:spec.template.metadata.labels[helm.sh/chart]" in cv
            and all("helm.sh/chart" in r for r in cv))


def test_render_diff_overrider_only_restates_chart_version(helm):
    d = render_diff(Fleet(), "search", "stage", PINNED, CANDIDATE, helm)
    assert (d.real, bool(d.chart_version)) == ([], True)


def test_render_diff_same_version_is_identical(helm):
    d = render_diff(Fleet(), "notifier", "prod", PINNED, PINNED, helm)
    assert d.changes == []


def test_diff_reports_added_and_removed_objects(helm, tmp_path):
    fleet = Fleet()
    a = render_app(fleet, fleet.app("checkout", "stage"), PINNED, helm, tmp_path / "a")
    b = render_app(fleet, fleet.app("checkout", "prod"), PINNED, helm, tmp_path / "b")
    refs = {(c.ref, c.op) for c in diff_objects(a.objects, b.objects)}
    assert {("AnalysisTemplate/checkout-error-rate", "added"), ("AnalysisTemplate/checkout-latency", "added"),
            ("Rollout/checkout:spec.replicas", "changed")} <= refs


def test_wrong_inheritor_fails_equivalence_naming_the_unexpected_path(helm, tmp_path):
    res = check_equivalence(Fleet(apps_dir="wrong/apps"), "stage", PINNED, CANDIDATE, helm, tmp_path)
    assert (res.ok, res.unexpected) == (False, ["ConfigMap/invoices-canary-policy:data[steps.json]"]) \
        and "ConfigMap/invoices-canary-policy:data[steps.json]" in res.describe()


# --- the command ------------------------------------------------------------------------------------------
def test_render_diff_command_json_exit_0_whether_or_not_it_differs(capsys):
    args_diff = _parse(["render-diff", "--app", "checkout", "--env", "stage", "--from", PINNED, "--to", CANDIDATE,
                        "--json"])
    args_same = _parse(["render-diff", "--app", "reports", "--env", "stage", "--from", PINNED, "--to", PINNED])
    rc1 = args_diff.func(args_diff)
    out1 = json.loads(capsys.readouterr().out)
    rc2 = args_same.func(args_same)
    out2 = capsys.readouterr().out
    assert (rc1, out1["changed"], rc2, "no changes" in out2) == (
        0, {"Rollout/checkout": ["spec.strategy.canary.steps"]}, 0, True)


def test_render_diff_runs_as_a_command(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "drills", "render-diff", "--app", "web", "--env", "prod",
                           "--from", PINNED, "--to", CANDIDATE], capture_output=True, text=True,
                          cwd=config.project_root())
    assert (proc.returncode, "Deployment/web" in proc.stdout, "changed: none" in proc.stdout) == (0, True, True)


# --- bad input ---------------------------------------------------------------------------------------------
def test_values_file_not_yaml_names_file_and_line(fleet_copy):
    bad = fleet_copy / "platform/service-manager/stage/checkout.yaml"
    bad.write_text("base:\n  rollout:\n    canary: [unclosed\n  replicas: 3\n")
    args = _parse(["render-diff", "--app", "checkout", "--env", "stage", "--from", PINNED, "--to", CANDIDATE,
                   "--fleet", str(fleet_copy)])
    with pytest.raises(BadInput, match=rf"{bad}:\d+: not valid YAML"):
        args.func(args)


def test_missing_value_file_names_the_app_list_and_line(fleet_copy):
    (fleet_copy / "service/payments/values/stage.yaml").unlink()
    args = _parse(["render-diff", "--app", "payments", "--env", "stage", "--from", PINNED, "--to", CANDIDATE,
                   "--fleet", str(fleet_copy)])
    line = next(i for i, text in enumerate((fleet_copy / "apps/stage.yaml").read_text().splitlines(), 1)
                if "service/payments/values/stage.yaml" in text)
    with pytest.raises(BadInput, match=rf"apps/stage.yaml:{line}: valueFile service/payments/values/stage.yaml"):
        args.func(args)


def test_unknown_chart_version_is_bad_input():
    args = _parse(["render-diff", "--app", "checkout", "--env", "stage", "--from", PINNED, "--to", "3.0.99"])
    with pytest.raises(BadInput, match=r"unknown base chart version '3.0.99' \(known: 3.0.13, 3.0.14-rc.0\)"):
        args.func(args)


def test_unknown_app_is_bad_input():
    args = _parse(["render-diff", "--app", "nosuch", "--env", "stage", "--from", PINNED, "--to", CANDIDATE])
    with pytest.raises(BadInput, match=r"apps/stage.yaml: no app 'nosuch' in stage"):
        args.func(args)


# --- the registry ------------------------------------------------------------------------------------------
def test_registry_serves_v2_on_loopback_and_stops(helm, tmp_path):
    with Registry() as reg:
        with urllib.request.urlopen(f"http://{reg.host}/v2/", timeout=5) as r:
            status = r.status
        pushed = publish(helm, base_sources()[PINNED], reg, tmp_path)
        pulled = helm.pull(f"{reg.url}/base", PINNED, tmp_path / "pulled")
        tags, host = reg.tags(), reg.host
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{host}/v2/", timeout=2)
    assert (status, tags, pushed["version"], pulled.name) == (200, [PINNED], PINNED, f"base-{PINNED}.tgz")


def test_pin_to_a_version_missing_from_the_registry_names_chart_yaml_and_line(helm, tmp_path):
    with Registry() as reg:
        publish(helm, base_sources()[PINNED], reg, tmp_path / "pkg")
        ws = Workspace(Fleet(), tmp_path / "ws", helm, reg.url)
        app = ws.fleet.app("checkout", "stage")
        ws.set_base_version(app, "3.0.77")
        chart_yaml = ws.chart_dir(app) / "Chart.yaml"
        line = next(i for i, t in enumerate(chart_yaml.read_text().splitlines(), 1) if "3.0.77" in t)
        with pytest.raises(ChartInputError, match=rf"{chart_yaml}:{line}: base chart version 3.0.77 not available"):
            ws.update(app)
