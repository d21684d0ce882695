"""`drills alerts`: the rules it writes pass `promtool check rules` and `promtool test rules` (unit tests written by
hand in fixtures/alerts/pinned.test.yaml, and the ones drills.alerts.promtool generates for every Rollout of the
fixture fleet); a rule broken on purpose fails them; the ramp formula; the command's contract (formats, --out,
exit codes); the real kube-state-metrics' page with the config they need.  promtool and kube-state-metrics are
the toolchain's (drills.toolchain, waited for while another process builds them)."""
from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest
import yaml

from drills.core import config
from drills.alerts import metrics, promtool
from drills.alerts.ramp import RampParams, expected_ramp
from drills.alerts.rules import ABORTED, BLIND, STUCK, rules_document
from drills.cli import main
from drills.drill.kit import DrillRollout
from drills.scan.readers import read_manifests
from drills.core.wait import until

FIXTURES = config.fixtures_dir() / "alerts"
ROLLOUTS = FIXTURES / "rollouts.yaml"


def alerts(capsys, *args) -> tuple[int, str, str]:
    code = main(["alerts", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def fixture_rules() -> dict:
    """The rules `drills alerts fixtures/alerts/rollouts.yaml` writes, with its defaults."""
    doc, _ = rules_document(read_manifests([str(ROLLOUTS)], config.DEFAULT_CONTROLLER).rollouts)
    return doc


def pinned(rules: dict) -> dict:
    return promtool.fill_annotations(yaml.safe_load((FIXTURES / "pinned.test.yaml").read_text()), rules)


def rule(doc: dict, group_suffix: str, alert: str) -> dict:
    return next(r for g in doc["groups"] if g["name"].endswith(group_suffix) for r in g["rules"] if r["alert"] == alert)


# --- the formula ------------------------------------------------------------------------------------------
def test_the_ramp_of_the_incident_shape_prescribed():
    # replicas 20, minPodsPerReplicaSet 2, remaining rung 5: first wave max(ceil(5*20/100), 2) = 2, then 18
    r = expected_ramp(20, 2, 5)
    assert (r.first_wave, r.waves, r.ramp_s, r.for_s) == (2, 2, 60.0, 90)
    assert "min(20, max(ceil(5*20/100), 2)) = 2" in r.formula() and "for = ceil(ramp * (1 + 0.5)) = 1m30s" in r.formula()


def test_the_ramp_counts_waves_of_pods_that_turn_ready_at_a_time():
    one_by_one = RampParams(readiness_s=4, margin=1.0, pods_at_once=1)
    assert (expected_ramp(2, 1, 5, params=one_by_one).ramp_s, expected_ramp(2, 1, 5, params=one_by_one).for_s) == (8, 16)
    assert expected_ramp(20, 2, 5, params=RampParams(pods_at_once=5)).waves == 1 + 4
    assert expected_ramp(1, None, 50).waves == 1                     # the first wave is the whole ReplicaSet
    assert expected_ramp(4, 1, None).first_wave == 4                 # no setWeight: every pod before the weight moves
    assert expected_ramp(10, 1, 50, max_weight=1000).first_wave == 1  # the rung is a share of maxTrafficWeight


def test_the_drill_fixture_states_the_for_its_formula_gives():
    fx = yaml.safe_load((config.fixtures_dir() / "lanes" / "alert" / "drill.yaml").read_text())
    a, r = fx["alerts"], fx["rollout"]
    ramp = expected_ramp(r["replicas"], r["minPodsPerReplicaSet"], r["steps"][0]["setWeight"],
                         params=RampParams(readiness_s=float(a["readiness"].rstrip("s")), margin=a["margin"],
                                           pods_at_once=a["pods_at_once"]))
    assert (ramp.ramp_s, ramp.for_s) == (12, 24)


# --- promtool ---------------------------------------------------------------------------------------------
def test_promtool_checks_the_rules_of_the_fixtures_and_of_both_formats(capsys, tmp_path):
    code, _, _ = alerts(capsys, ROLLOUTS, "--out", tmp_path / "rules.yaml")
    assert code == 0
    rc, out = promtool.check_rules(tmp_path / "rules.yaml")
    assert rc == 0 and "SUCCESS: 7 rules found" in out, out
    code, text, _ = alerts(capsys, ROLLOUTS, "--format", "prometheusrule")
    manifest = yaml.safe_load(text)
    assert code == 0 and (manifest["apiVersion"], manifest["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert manifest["spec"]["groups"] == yaml.safe_load((tmp_path / "rules.yaml").read_text())["groups"]


def test_promtool_unit_tests_pass_on_the_generated_rules(fixture_rules, tmp_path):
    rc, out = promtool.test_rules(tmp_path, fixture_rules, {"pinned.test.yaml": pinned(fixture_rules),
                                                            "generated.test.yaml": promtool.unit_tests(fixture_rules)})
    assert rc == 0, out
    assert out.count("SUCCESS") == 2, out


@pytest.mark.parametrize("env", ["stage", "prod"])
def test_promtool_checks_and_unit_tests_the_rules_of_every_fleet_rollout(capsys, tmp_path, env):
    code, text, err = alerts(capsys, "--fleet", config.fixtures_dir() / "fleet", "--env", env)
    assert code == 0, err
    doc = yaml.safe_load(text)
    assert len(doc["groups"]) == 6 and all(any(r["alert"] == STUCK for r in g["rules"]) for g in doc["groups"])
    (tmp_path / "rules.yaml").write_text(text)
    rc, out = promtool.check_rules(tmp_path / "rules.yaml")
    assert rc == 0, out
    rc, out = promtool.test_rules(tmp_path / "t", doc, {"generated.test.yaml": promtool.unit_tests(doc)})
    assert rc == 0, out


def _break(doc: dict, alert: str, fn) -> dict:
    bad = copy.deepcopy(doc)
    for g in bad["groups"]:
        for r in g["rules"]:
            if r["alert"] == alert:
                fn(r)
    return bad


BROKEN = {
    "the weight metric misnamed": (STUCK, lambda r: r.__setitem__(
        "expr", r["expr"].replace(metrics.CANARY_WEIGHT, metrics.CANARY_WEIGHT + "_percent"))),
    "the controller's metric misnamed": (ABORTED, lambda r: r.__setitem__(
        "expr", r["expr"].replace("rollout_info{", "rollout_phase_info{"))),
    "for: longer than the hold": (STUCK, lambda r: r.__setitem__("for", "11m")),
    "for: shorter than the ramp": (STUCK, lambda r: r.__setitem__("for", "30s")),
    "the weight threshold at the rung": (STUCK, lambda r: r.__setitem__("expr", r["expr"].replace(") < 100)", ") < 5)"))),
    "the abort not excluded": (STUCK, lambda r: r.__setitem__("expr", r["expr"].split("\nunless")[0])),
    "a fully promoted Rollout not excluded": (STUCK, lambda r: r.__setitem__(
        "expr", r["expr"].rsplit("\nunless", 1)[0])),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_rule_broken_on_purpose_fails_its_unit_tests(fixture_rules, tmp_path, broken):
    alert, fn = BROKEN[broken]
    bad = _break(fixture_rules, alert, fn)
    assert bad != fixture_rules
    rc, out = promtool.test_rules(tmp_path, bad, {"pinned.test.yaml": pinned(fixture_rules)})
    assert rc == 1, out
    assert f"alertname: {alert}" in out, out


def test_the_stuck_rule_reads_the_metrics_its_annotations_name(fixture_rules):
    stuck = rule(fixture_rules, "payments.checkout", STUCK)
    for name in (metrics.CANARY_WEIGHT, metrics.STEP_INDEX, metrics.PHASE, metrics.POD_HASHES,
                 metrics.ROLLOUT_INFO):
        assert name in stuck["expr"] and name in stuck["annotations"]["metrics"]
    assert metrics.ROLLOUT_UNAVAILABLE not in stuck["expr"]      # not written while a revived ReplicaSet is partial
    assert stuck["for"] == "1m30s" and "ramp = waves * T = 2 * 30s = 1m" in stuck["annotations"]["ramp_formula"]
    assert "promote --full checkout -n payments" in stuck["annotations"]["runbook"]
    aborted = rule(fixture_rules, "payments.checkout", ABORTED)
    assert "kubectl argo rollouts promote --full checkout -n payments" in aborted["annotations"]["runbook"]
    assert 'rollout_info{namespace="payments", name="checkout", phase="Abort"}' in aborted["expr"]
    assert rule(fixture_rules, "payments.checkout", BLIND)["labels"]["severity"] == "warning"
    batch = next(g for g in fixture_rules["groups"] if g["name"].endswith("ops.batch"))
    assert [r["alert"] for r in batch["rules"]] == [ABORTED]      # no trafficRouting: no weight to watch


# --- the command ------------------------------------------------------------------------------------------
def test_the_rules_go_to_standard_output_or_to_out(capsys, tmp_path):
    code, text, err = alerts(capsys, ROLLOUTS)
    assert code == 0 and text.startswith("# drills alerts (rules): 3 Rollout(s)") and "no trafficRouting" in err
    code, text2, err = alerts(capsys, ROLLOUTS, "--out", tmp_path / "r.yaml", "--ksm-config", tmp_path / "ksm.yaml")
    assert code == 0 and text2 == "" and (tmp_path / "r.yaml").read_text() == text
    assert yaml.safe_load((tmp_path / "ksm.yaml").read_text()) == metrics.KSM_CONFIG


def test_the_rules_read_standard_input_as_drills_scan_does(tmp_path):
    r = subprocess.run([sys.executable, "-m", "drills", "alerts", "-"], input=ROLLOUTS.read_text(), text=True,
                       capture_output=True, cwd=str(config.project_root()), timeout=120)
    assert r.returncode == 0, r.stderr
    assert [g["name"] for g in yaml.safe_load(r.stdout)["groups"]] == [
        "drills.rollout.payments.checkout", "drills.rollout.web.front", "drills.rollout.ops.batch"]


def test_out_never_overwrites_an_input(capsys, tmp_path):
    src = tmp_path / "in.yaml"
    src.write_text(ROLLOUTS.read_text())
    code, _, err = alerts(capsys, tmp_path, "--out", src)
    assert code == 2 and "it is one of the inputs" in err and src.read_text() == ROLLOUTS.read_text()
    code, _, err = alerts(capsys, src, "--ksm-config", src)
    assert code == 2 and src.read_text() == ROLLOUTS.read_text()


@pytest.mark.parametrize("args, says", [
    ([], "nothing to read"),
    ([str(ROLLOUTS), "--format", "alertmanager"], ""),
    ([str(ROLLOUTS), "--readiness", "soon"], "--readiness"),
    ([str(ROLLOUTS), "--margin", "-1"], "--margin"),
    ([str(ROLLOUTS), "--pods-at-once", "0"], "--pods-at-once"),
    ([str(FIXTURES / "pinned.test.yaml")], "no Rollout found"),
    ([str(FIXTURES / "missing.yaml")], "no such file"),
])
def test_bad_input_exits_2(capsys, args, says):
    code, out, err = alerts(capsys, *args)
    assert code == 2 and out == "" and says in err


def test_a_rollout_read_twice_with_other_sizes_gets_the_longest_ramp(capsys):
    code, text, err = alerts(capsys, "--fleet", config.fixtures_dir() / "fleet")
    assert code == 0 and "read 2 times with different sizes" in err
    doc = yaml.safe_load(text)
    assert len(doc["groups"]) == 6                                 # one group per namespace/name


# --- the real kube-state-metrics with the config `drills alerts --ksm-config` writes ------------------------------
_SAMPLE = re.compile(r'^([a-z_]+)\{([^}]*)\}\s+(\S+)$')


def _samples(text: str, name: str) -> dict:
    """metric name -> [(labels, value)] of one Rollout's samples in a /metrics page."""
    out: dict = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            labels = dict(re.findall(r'([a-z_]+)="([^"]*)"', m.group(2)))
            if labels.get("name") == name:
                out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


def test_the_real_kube_state_metrics_exports_what_the_rules_read(kube, cluster, namespace, tmp_path,
                                                                  controller_version):
    """kube-state-metrics, built from its module, run with the config the rules need, on two Rollouts the real
    controller wrote the status of: one deployed and Healthy (its weights written), one whose traffic routing
    objects do not exist (Degraded, no weights): each sample is the Rollout's status field, with the labels the
    rules match on, and a missing field gives no sample."""
    from kubernetes import client

    from drills.alerts.ksm import KubeStateMetrics
    from drills.kube.rollout import degraded
    from drills.drill.shapes import RolloutSpec, manifests
    spec = RolloutSpec(steps=[{"setWeight": 5}, {"pause": {"duration": "2s"}}], name="checkout",
                       image_v1="registry.local/checkout:v1", image_v2="registry.local/checkout:v2")
    d = DrillRollout(kube, namespace, spec, tmp_path / "drill", controller_version=controller_version)
    d.deploy_v1()
    co = client.CustomObjectsApi(kube)
    lone = manifests(RolloutSpec(steps=[{"setWeight": 5}], name="lone"), namespace)["rollout"]
    co.create_namespaced_custom_object(config.ARGO_GROUP, config.ARGO_VERSION, namespace, "rollouts", lone)
    d.ro.wait("lone", degraded(), 60)
    with KubeStateMetrics(cluster.kubeconfig, tmp_path, metrics.KSM_CONFIG) as ksm:
        text = until("kube-state-metrics exports both Rollouts' status", ksm.metrics,
                     lambda t: metrics.POD_HASHES in t and 'name="lone"' in t and 'name="checkout"' in t,
                     timeout=60, interval=0.5)
    for name in ("checkout", "lone"):
        st = co.get_namespaced_custom_object(config.ARGO_GROUP, config.ARGO_VERSION, namespace, "rollouts",
                                             name)["status"]
        got, base = _samples(text, name), metrics.ksm_labels(namespace, name)
        weight = ((st.get("canary") or {}).get("weights") or {}).get("canary", {}).get("weight")
        assert got.get(metrics.CANARY_WEIGHT) == (None if weight is None else [(base, float(weight))])
        step = st.get("currentStepIndex")
        assert got.get(metrics.STEP_INDEX) == (None if step is None else [(base, float(step))])
        assert {lb["phase"]: v for lb, v in got[metrics.PHASE]} == {
            p: float(p == st["phase"]) for p in metrics.PHASES}
        hashes = {k: st[f] for k, f in ((metrics.STABLE_LABEL, "stableRS"), (metrics.CURRENT_LABEL, "currentPodHash"))
                  if f in st}
        assert got.get(metrics.POD_HASHES) == ([({**base, **hashes}, 1.0)] if hashes else None)
    checkout, lone = _samples(text, "checkout"), _samples(text, "lone")       # both cases were seen
    assert checkout[metrics.CANARY_WEIGHT] == [(metrics.ksm_labels(namespace, "checkout"), 0.0)]
    assert metrics.STEP_INDEX in checkout and metrics.CANARY_WEIGHT not in lone
    rc, out = promtool.check_metrics(text)
    assert rc == 0, out


def test_prometheus_loads_the_rules_and_honours_the_targets_labels(tmp_path):
    from drills.traffic.prometheus import scrape_config
    conf = scrape_config({"argo-rollouts": "127.0.0.1:8090"}, 1.0, rule_files=[tmp_path / "rules.yaml"],
                         honor_labels=True)
    assert conf["rule_files"] == [str(tmp_path / "rules.yaml")]
    assert conf["scrape_configs"][0]["honor_labels"] is True
    assert "rule_files" not in scrape_config({"mesh": "127.0.0.1:1"}) and \
        "honor_labels" not in scrape_config({"mesh": "127.0.0.1:1"})["scrape_configs"][0]


def test_the_drills_own_reading_of_the_stuck_condition_leaves_a_fully_promoted_rollout_out():
    from drills.alerts.evidence import stuck_now
    rollback = {"phase": "Progressing", "currentStepIndex": 2, "canaryWeight": 5, "stableRS": "b", "currentPodHash": "a"}
    assert stuck_now(rollback, 2, 100)
    first_deploy = {**rollback, "canaryWeight": 0, "stableRS": "a"}        # a first deploy, a scale-up: pods short
    assert not stuck_now(first_deploy, 2, 100)
