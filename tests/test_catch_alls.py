"""Inputs that used to end in the one-line catch-all (exit 1) end with the documented refusal (exit 2, one line,
nothing sent or written): out-of-range numbers, live objects that are not objects, a probe expectation no weight can
meet, a pause no drill can wait out, an unknown app before helm is built; a control character in a Rollout's name
keeps the JUnit XML well-formed, and a Flux-managed Rollout is GitOps-managed as an Argo CD one is (no cluster
needed)."""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from apistub import StubAPI, kubeconfig_for, namespace, rollout_path

ROOT = Path(__file__).resolve().parent.parent


def rollout(name: str = "checkout", ns: str = "shop", replicas="4", labels: dict | None = None,
            steps: str = "[{setWeight: 5}, {pause: {}}, {setWeight: 100}]") -> str:
    return (f"apiVersion: argoproj.io/v1alpha1\nkind: Rollout\nmetadata: {{name: {name}, namespace: {ns}, labels: "
            f"{labels or {}}}}\nspec:\n  replicas: {replicas}\n  rollbackWindow: {{revisions: 3}}\n  strategy:\n"
            f"    canary:\n      trafficRouting: {{istio: {{virtualService: {{name: vs}}, destinationRule: "
            f"{{name: dr}}}}}}\n      steps: {steps}\n")


def live_rollout(labels: dict | None = None, steps: list | None = None) -> dict:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "checkout", "namespace": "shop", "labels": labels or {}, "resourceVersion": "1"},
            "spec": {"replicas": 2, "rollbackWindow": {"revisions": 3},
                     "template": {"metadata": {"labels": {"app": "checkout"}},
                                  "spec": {"containers": [{"name": "checkout", "image": "img:2"}]}},
                     "selector": {"matchLabels": {"app": "checkout"}},
                     "strategy": {"canary": {"trafficRouting": {"istio": {"virtualService": {"name": "vs"}}},
                                             "steps": steps if steps is not None else [{"setWeight": 5}]}}},
            "status": {"phase": "Healthy", "stableRS": "abc", "currentPodHash": "abc"}}


def drills(*args, tmp: Path, env: dict | None = None, timeout: float = 120):
    e = dict(os.environ, DRILLS_REPORTS=str(tmp / "reports"), DRILLS_CONFIG=str(tmp / "config.yaml"),
             DRILLS_CACHE=str(tmp / "cache"), PYTHONPATH=str(ROOT))
    e.pop("KUBECONFIG", None)
    e.update(env or {})
    if args and args[0] == "scan" and "--fail-on" not in args:
        args = (*args, "--fail-on", "none", "--allow-empty")   # what is tested here is not the scan's gate
    return subprocess.run([sys.executable, "-m", "drills", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=tmp)


def refused(r, *needles) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("drills: ") and "Error:" not in lines[0], r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.mark.parametrize("field,text", [("replicas", "1000000000000000000000000000000"),
                                        ("replicas", "2147483648")])
def test_numbers_past_what_kubernetes_holds_are_bad_input(tmp_path, field, text):
    (tmp_path / "huge.yaml").write_text(rollout(replicas=text))
    refused(drills("scan", tmp_path / "huge.yaml", "--json", tmp=tmp_path), "huge.yaml:5:", "spec.replicas")
    (tmp_path / "w.yaml").write_text(rollout(steps="[{setWeight: 5}, {setCanaryScale: {replicas: 10000000000000}}]"))
    refused(drills("scan", tmp_path / "w.yaml", tmp=tmp_path), "w.yaml:", "setCanaryScale.replicas")


def test_a_control_character_in_a_rollout_name_keeps_the_junit_xml_well_formed(tmp_path):
    (tmp_path / "odd.yaml").write_text(rollout(name='"check\\x01out\\x1b[31m"'))
    r = drills("scan", tmp_path / "odd.yaml", "--junit", tmp_path / "j.xml", "--sarif", tmp_path / "s.sarif",
               tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    names = [c.get("name") for c in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")]
    assert names and all("check\\x01out\\x1b[31m" in n for n in names), names


@pytest.fixture
def stub():
    made = []

    def make(routes) -> StubAPI:
        made.append(StubAPI(routes))
        return made[-1]
    yield make
    for s in made:
        s.close()


@pytest.mark.parametrize("labels,gitops", [({"kustomize.toolkit.fluxcd.io/name": "apps"}, "Flux"),
                                           ({"helm.toolkit.fluxcd.io/name": "checkout"}, "Flux"),
                                           ({"app.kubernetes.io/instance": "checkout"}, "Argo CD")])
def test_a_flux_managed_rollout_is_refused_as_gitops_managed(tmp_path, stub, labels, gitops):
    api = stub({"/api/v1/namespaces/shop": namespace("shop"), rollout_path("shop", "checkout"): live_rollout(labels)})
    kc = kubeconfig_for(tmp_path / "kc", api.url)
    (tmp_path / "config.yaml").write_text("allowed_contexts: [stage]\n")
    line = refused(drills("run", "--kubeconfig", kc, "--namespace", "shop", "--rollout", "checkout", "--dry-run",
                          tmp=tmp_path), f"managed by {gitops}", "--sync-paused")
    assert ("flux suspend" in line) == (gitops == "Flux")
    r = drills("run", "--kubeconfig", kc, "--namespace", "shop", "--rollout", "checkout", "--dry-run",
               "--sync-paused", tmp=tmp_path)
    assert r.returncode == 2 and "managed by" not in r.stderr, r.stderr        # refused later, for its shape
    assert api.mutations == []


@pytest.mark.parametrize("steps", [[1], ["setWeight: 5"], [{"setWeight": 5}, None], [{"setWeight": 5, "pause": {}}]])
def test_live_steps_that_are_not_objects_are_refused(tmp_path, stub, steps):
    api = stub({"/api/v1/namespaces/shop": namespace("shop"),
                rollout_path("shop", "checkout"): live_rollout(steps=steps)})
    kc = kubeconfig_for(tmp_path / "kc", api.url)
    (tmp_path / "config.yaml").write_text("allowed_contexts: [stage]\n")
    refused(drills("run", "--kubeconfig", kc, "--namespace", "shop", "--rollout", "checkout", "--dry-run",
                   tmp=tmp_path), "canary step", "not an object with one field")
    assert api.mutations == []


@pytest.mark.parametrize("items", [[1], ["a Rollout"], [None], {"not": "a list"}])
def test_live_items_that_are_not_objects_are_bad_input(tmp_path, stub, items):
    api = stub({"/apis/argoproj.io/v1alpha1/rollouts": {"kind": "RolloutList", "items": items}})
    kc = kubeconfig_for(tmp_path / "kc", api.url)
    line = refused(drills("scan", "--kubeconfig", kc, tmp=tmp_path), "context stage", "listing Rollouts")
    assert "not an object" in line or "not a list" in line


@pytest.mark.parametrize("args,needle", [
    (["probe", "--steps", "5,100", "--expect", "500"], "--expect 500"),
    (["probe", "--steps", "5,100", "--expect", "-1"], "--expect -1"),
    (["probe", "--steps", "5,pause:99999999999999999999s,100"], "pause:99999999999999999999s"),
    (["probe", "--steps", "5,pause:25h,100"], "pause:25h"),
])
def test_probe_inputs_no_drill_can_meet_are_refused_before_a_cluster(tmp_path, args, needle):
    refused(drills(*args, tmp=tmp_path), needle)
    assert not (tmp_path / "cache" / "clusters").exists() and not (tmp_path / "reports").exists()


def test_render_diff_checks_the_app_before_helm_is_built(tmp_path):
    no_go = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                            if not (Path(p) / "go").exists())
    for args, needle in ((["--app", "nope", "--env", "stage"], "no app 'nope'"),
                         (["--app", "checkout", "--env", "nowhere"], "unknown environment 'nowhere'")):
        refused(drills("render-diff", *args, "--from", "3.0.13", "--to", "3.0.14-rc.0", tmp=tmp_path,
                       env={"PATH": no_go}), needle)
    refused(drills("render-diff", "--app", "checkout", "--env", "stage", "--from", "3.0.13", "--to", "9.9.9",
                   tmp=tmp_path, env={"PATH": no_go}), "unknown base chart version '9.9.9'")
    assert not (tmp_path / "cache").exists()          # nothing was built or fetched for it
