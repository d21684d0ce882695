"""`drills run --plan` with a live target prints what the live run would do and opens no connection (not even a
credential plugin runs); the flags that shape only the embedded run's legs and clusters are refused in live mode,
and --controller there names the live controller's version."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

EXEC_API = "client.authentication.k8s.io/v1beta1"


@pytest.fixture
def live_target(tmp_path, silent_server, kubeconfig_to, drills_cmd):
    """A kubeconfig whose API server counts connections and never answers, with a credential plugin that leaves a
    mark when it runs; the context allowlisted."""
    marker = tmp_path / "plugin-ran"
    kc = kubeconfig_to(tmp_path / "kc", silent_server.url, user={"exec": {
        "apiVersion": EXEC_API, "command": "/bin/sh", "args": ["-c", f"touch {marker}; exit 1"]}})
    drills_cmd.config.write_text("allowed_contexts: [stage]\n")

    def untouched():
        assert silent_server.accepted == 0, "a plan opened a connection"
        assert not marker.exists(), "a plan ran the credential plugin"
        assert not (tmp_path / "reports").exists(), "a plan wrote a run folder"
    return ["--kubeconfig", str(kc), "--context", "stage", "--namespace", "payments", "--rollout", "checkout"], \
        untouched


def test_live_plan_prints_the_plan_and_sends_nothing(drills_cmd, live_target):
    target, untouched = live_target
    r = drills_cmd("run", "--plan", *target)
    assert r.returncode == 0, r.stderr
    assert "live plan: lane a on payments/checkout, context stage" in r.stdout and "restore" in r.stdout, r.stdout
    r = drills_cmd("run", "--plan", "--json", *target, "--service-url", "http://127.0.0.1:8080/")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["mode"], doc["lane"], doc["context"], doc["namespace"], doc["rollout"], doc["connections"]) == \
        ("live", "a", "stage", "payments", "checkout", 0)
    assert [leg["id"] for leg in doc["legs"]] == ["live/a/stage/payments/checkout"] and doc["total_legs"] == 1
    assert any("http://127.0.0.1:8080/" in s for s in doc["steps"])
    r = drills_cmd("run", "--plan", "--json", "--lanes", "b", "--duration", "10m", *target)
    assert r.returncode == 0 and json.loads(r.stdout)["lane"] == "b", r.stderr
    r = drills_cmd("run", "--plan", "--dry-run", "--controller", "1.9.3", "--json", *target)
    assert r.returncode == 0 and json.loads(r.stdout)["legs"][0]["controller"] == "v1.9.3", r.stderr
    untouched()


def test_live_plan_still_checks_what_it_can_without_a_connection(drills_cmd, live_target, tmp_path):
    target, untouched = live_target
    drills_cmd.config.write_text("allowed_contexts: [other]\n")
    r = drills_cmd("run", "--plan", *target)
    assert r.returncode == 2 and "not allowlisted" in r.stderr, r.stderr
    drills_cmd.config.write_text("allowed_contexts: [stage]\n")
    r = drills_cmd("run", "--plan", *target, "--service-url", "http://169.254.169.254/latest/meta-data")
    assert r.returncode == 2 and "--service-url" in r.stderr, r.stderr
    untouched()


@pytest.mark.parametrize("flags", [["--shard", "1/2"], ["-j", "2"], ["--variant", "prod"], ["--variant", "stage"],
                                   ["--keep-cluster"], ["--durations", "d.json"], ["--availability-control", "off"],
                                   ["--controller-binary", "/bin/true"], ["--crds", "/tmp"], ["--source", "/tmp"]])
def test_flags_of_the_embedded_run_are_refused_in_live_mode_naming_them(drills_cmd, live_target, flags):
    target, untouched = live_target
    plan = flags[0] in ("--shard", "--variant", "--keep-cluster")      # with --plan too: refused, not ignored
    r = drills_cmd("run", *(["--plan"] if plan else []), *target, *flags)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith("drills: ") and flags[0] in line and "live mode" in line, line
    untouched()


@pytest.mark.parametrize("spec", ["all", "v1.8.2,v1.10.2", "latest"])
def test_live_controller_is_one_version(drills_cmd, live_target, spec):
    target, untouched = live_target
    r = drills_cmd("run", "--plan", *target, "--controller", spec)
    assert r.returncode == 2 and "--controller" in r.stderr and "live controller" in r.stderr, r.stderr
    untouched()


def test_live_controller_flag_names_the_version_the_ledger_records(cluster, namespace, stage_rollout, tmp_path,
                                                                   drills_cmd):
    """The embedded cluster as the live stage (its controller is not v1.9.3): --controller is what the rows say."""
    stage_rollout()
    ctx = yaml.safe_load(Path(cluster.kubeconfig).read_text())["current-context"]
    drills_cmd.config.write_text(f"allowed_contexts: [{ctx}]\n")
    r = drills_cmd("run", "--lanes", "b", "--duration", "2s", "--kubeconfig", cluster.kubeconfig, "--context", ctx,
                   "--namespace", namespace, "--rollout", "svc", "--controller", "v1.9.3", timeout=300)
    assert r.returncode == 3, r.stderr                 # no deploy within 2s: inconclusive, read-only
    rows = [row for p in (tmp_path / "reports").glob("*/ledger.json") for row in json.loads(p.read_text())]
    assert rows and {row["controller_version"] for row in rows} == {"v1.9.3"}, rows
