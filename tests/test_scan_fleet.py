"""`drills scan --fleet`: the fixture fleet rendered with the real helm, traced back to its value layers."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import yaml

from drills.core import config
from drills.charts.helm import Helm
from drills.charts.fleet import Fleet, base_dependency, render_app, set_base_dependency

FLEET = config.fixtures_dir() / "fleet"


def drills(*args):
    env = dict(os.environ, PYTHONPATH=str(config.project_root()))
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, timeout=600,
                          cwd=config.project_root(), env=env)


def scan_json(*args) -> dict:
    r = drills("scan", *args, "--json", "--fail-on", "none")      # report only: the fixture fleet is exposed
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def fleet_copy(tmp_path):
    dest = tmp_path / "fleet"
    shutil.copytree(FLEET, dest, ignore=shutil.ignore_patterns("wrong"))
    return dest


def test_stage_and_prod_list_every_rollout_with_its_prediction(tmp_path):
    out = scan_json("--fleet", str(FLEET), "--env", "stage,prod")
    got = {(x["origin"]["env"], x["origin"]["app"], x["name"]): x for x in out["rollouts"]}
    fleet = Fleet(FLEET)
    want = {}
    with Helm() as helm:
        for env in ("stage", "prod"):
            for app in fleet.apps(env):
                r = render_app(fleet, app, base_dependency(fleet.chart_dir(app)).version, helm, tmp_path / env)
                for key, obj in r.objects.items():
                    if key.startswith("Rollout/"):
                        want[(env, app.name, obj["metadata"]["name"])] = obj["spec"]["strategy"]["canary"]["steps"]
    assert set(got) == set(want) and len(got) == 12
    for key, steps in want.items():
        x = got[key]
        assert x["steps"] == steps and x["controller_version"] == config.DEFAULT_CONTROLLER
        assert x["rule"]["id"] and "predicted_peak_weight" in x and x["wave"]
        # every step points at its line in the value layer that declares the steps
        lines = (config.project_root() / x["steps_file"]).read_text().splitlines()
        for step, line in zip(x["steps"], x["step_lines"], strict=True):
            text = lines[line - 1]
            assert f"setWeight: {step['setWeight']}" in text if "setWeight" in step else "pause" in text, (key, line)
    inheritor = got[("prod", "checkout", "checkout")]
    assert inheritor["steps_file"] == "fixtures/charts/base/3.0.13/values.yaml"
    assert got[("prod", "search", "search")]["steps_file"] == "fixtures/fleet/platform/service-manager/prod/search.yaml"
    assert out["summary"]["rollouts"] == 12 and set(out["summary"]["by_version"]) == {config.DEFAULT_CONTROLLER}


def _set_steps(values: Path, steps: list | None) -> None:
    data = yaml.safe_load(values.read_text()) or {}
    canary = data.setdefault("base", {}).setdefault("rollout", {}).setdefault("canary", {})
    if steps is None:
        canary.pop("steps", None)
    else:
        canary["steps"] = steps
    values.write_text(yaml.safe_dump(data, sort_keys=False))


def test_fail_on_lint_blocks_a_values_change_that_brings_back_the_final_100(fleet_copy, tmp_path):
    """checkout on the fixed base (3.0.14-rc.0) passes; a values change that re-adds a final setWeight 100
    fails with the SARIF result on that line; the fix passes again."""
    set_base_dependency(fleet_copy / "charts" / "checkout", version="3.0.14-rc.0")
    values = fleet_copy / "service" / "checkout" / "values" / "values.yaml"
    sarif = tmp_path / "scan.sarif"
    args = ["scan", "--fleet", str(fleet_copy), "--app", "checkout", "--fail-on", "lint", "--sarif", str(sarif)]
    r = drills(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    _set_steps(values, [{"setWeight": 5}, {"pause": {"duration": "10m"}}, {"setWeight": 100}])
    r = drills(*args)
    assert r.returncode == 1, r.stdout + r.stderr
    results = [x for x in json.loads(sarif.read_text())["runs"][0]["results"] if x["ruleId"] == "final-setweight-100"]
    assert len(results) == 2                                    # stage and prod
    for res in results:
        loc = res["locations"][0]["physicalLocation"]
        uri = urlparse(loc["artifactLocation"]["uri"])
        assert uri.scheme == "file" and Path(unquote(uri.path)) == values.resolve()
        assert values.read_text().splitlines()[loc["region"]["startLine"] - 1].strip() == "- setWeight: 100"
    _set_steps(values, [{"setWeight": 5}, {"pause": {"duration": "10m"}}])
    r = drills(*args)
    assert r.returncode == 0, r.stdout + r.stderr


def test_bad_values_yaml_exits_2_naming_the_file_and_line(fleet_copy):
    values = fleet_copy / "service" / "search" / "values" / "prod.yaml"
    values.write_text("base:\n  replicas: 8\n  image: [unclosed\n")
    r = drills("scan", "--fleet", str(fleet_copy))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{values}:4:" in r.stderr and "not valid YAML" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_identical_renders_are_deduplicated(fleet_copy):
    """int and int-1 share their value files, release names and namespaces: one render each."""
    stage = (fleet_copy / "apps" / "stage.yaml").read_text()
    for env in ("int", "int-1"):
        (fleet_copy / "apps" / f"{env}.yaml").write_text(stage.replace("-stage\n", f"-{env}\n"))
    out = scan_json("--fleet", str(fleet_copy), "--env", "int,int-1")
    st = out["stats"]
    assert (st["fleet_apps"], st["fleet_unique_renders"]) == (14, 7)
    by_env = {}
    for x in out["rollouts"]:
        by_env.setdefault(x["origin"]["env"], []).append((x["name"], x["predicted_peak_weight"], x["rule"]["id"]))
    assert by_env["int"] == by_env["int-1"] and len(by_env["int"]) == 6
    assert {x["origin"]["application"] for x in out["rollouts"]} >= {"checkout-int", "checkout-int-1"}


def test_one_render_predicted_on_several_versions():
    """Before an upgrade: the same renders on v1.8.2 and v1.8.5.  notifier's [100] (prod, 3 replicas) is held by
    v1.8.2's UpdateHash guard and exposed on v1.8.5, whose UpdateHash only delays the DestinationRule switch."""
    out = scan_json("--fleet", str(FLEET), "--env", "prod", "--controller", "v1.8.2,v1.8.5")
    got = {(x["name"], x["controller_version"]): x for x in out["rollouts"]}
    assert len(got) == 12 and out["stats"]["fleet_unique_renders"] == 7     # web renders a Deployment
    assert (got[("notifier", "v1.8.2")]["exposed"], got[("notifier", "v1.8.5")]["exposed"]) == (False, True)
    assert got[("notifier", "v1.8.5")]["wave"] == "1" and got[("notifier", "v1.8.2")]["wave"] == "-"
    assert got[("checkout", "v1.8.2")]["pods_carrying"] == 2 and got[("checkout", "v1.8.5")]["pods_carrying"] == 1
    assert list(out["summary"]["by_version"]) == ["v1.8.2", "v1.8.5"]


def test_the_autoscaled_component_is_predicted_at_min_and_max():
    """orders: prod on KEDA (min 10, max 360, replicas 20), stage on an autoscaling/v2 HPA (minReplicas left to its
    default 1, max 10, replicas 3), both rendered from the chart's own template.  Prod's window is closed at 10 and
    20 and open at 360, where the remaining rung 5 lands on the 4 pods the first rung sized."""
    out = scan_json("--fleet", str(FLEET), "--env", "stage,prod")
    got = {x["origin"]["env"]: x for x in out["rollouts"] if x["name"] == "orders"}
    prod, stage = got["prod"], got["stage"]
    assert (prod["autoscaler"]["kind"], prod["min_replicas"], prod["max_replicas"], prod["replicas"]) == \
        ("ScaledObject", 10, 360, 20)
    assert (prod["exposed"], prod["exposed_at_min"], prod["exposed_at_max"]) == (False, False, True)
    assert (prod["close_at_max"]["rung_at_most"], prod["close_at_max"]["min_pods_at_least"]) == (1.11, 18)
    assert prod["steps_file"] == "fixtures/fleet/service/orders/values/values.yaml"
    assert (stage["autoscaler"]["kind"], stage["min_replicas"], stage["max_replicas"]) == \
        ("HorizontalPodAutoscaler", 1, 10)
    assert stage["autoscaler"]["defaulted"] == ["minReplicas 1 by default"] and not stage["exposed_at_max"]
    assert out["autoscalers_unjoined"] == [] and out["summary"]["autoscaled"] == 2
    # the exposure at the maximum fails the default gate on its own
    assert drills("scan", "--fleet", str(FLEET), "--app", "orders", "--env", "prod").returncode == 1
    assert drills("scan", "--fleet", str(FLEET), "--app", "orders", "--env", "stage").returncode == 0
