"""Bad input and unusable targets end with exit 2 and one line, before anything is sent (no cluster needed):
misbehaving API servers on loopback stand in for the failures a real apiserver cannot be made to produce."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from drills.core.errors import Refused
from drills.drill.safety import Journal, allowed_contexts, check_context


def _one_line_error(r) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.strip().splitlines() if x.startswith("drills:")]
    assert lines, r.stderr
    return lines[-1]


# --- 3. the allowlist fails closed ----------------------------------------------------------------------
def test_allowlist_written_as_a_string_is_refused_not_split_into_characters(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("allowed_contexts: prod-eu-1\n")
    with pytest.raises(Refused, match="must be a list"):
        allowed_contexts(cfg)
    with pytest.raises(Refused):
        check_context("e", embedded=False, config_file=cfg)
    cfg.write_text("allowed_contexts: [stage-1, 7]\n")
    with pytest.raises(Refused, match="must be a list of context names"):
        allowed_contexts(cfg)
    cfg.write_text("allowed_contexts: [stage-1]\n")
    assert allowed_contexts(cfg) == {"stage-1"}


def test_string_allowlist_never_contacts_the_api_server(tmp_path, drills_cmd, status_server_factory, kubeconfig_to):
    srv = status_server_factory(200, "OK")
    kc = kubeconfig_to(tmp_path / "kc", srv.url, context="e")
    drills_cmd.config.write_text("allowed_contexts: prod-eu-1\n")
    r = drills_cmd("run", "--kubeconfig", kc, "--context", "e", "--namespace", "ns", "--rollout", "r")
    assert r.returncode == 2, r.stderr
    assert "must be a list" in _one_line_error(r)
    assert srv.requests == []


def test_config_file_that_is_not_yaml_is_refused(tmp_path, drills_cmd, status_server_factory, kubeconfig_to):
    srv = status_server_factory(200, "OK")
    kc = kubeconfig_to(tmp_path / "kc", srv.url)
    drills_cmd.config.write_text("allowed_contexts: [stage\n")
    r = drills_cmd("run", "--kubeconfig", kc, "--context", "stage", "--namespace", "ns", "--rollout", "r")
    assert r.returncode == 2 and "not valid YAML" in _one_line_error(r)
    assert srv.requests == []


# --- 6. every request has a timeout ------------------------------------------------------------------------
def test_silent_api_server_ends_watch_and_dry_run_with_exit_2(tmp_path, drills_cmd, silent_server, kubeconfig_to):
    kc = kubeconfig_to(tmp_path / "kc", silent_server.url)
    env = {"DRILLS_REQUEST_TIMEOUT": "2"}
    r = drills_cmd("watch", "-n", "ns", "r", "--kubeconfig", kc, "--duration", "5s", "--out",
                   tmp_path / "t.jsonl", env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "did not answer within 2s" in _one_line_error(r)
    drills_cmd.config.write_text("allowed_contexts: [stage]\n")
    r = drills_cmd("run", "--kubeconfig", kc, "--context", "stage", "--namespace", "ns", "--rollout", "r",
                   "--dry-run", env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "did not answer" in _one_line_error(r)
    assert silent_server.accepted >= 2


# --- 9. failures reading the target are one line, exit 2 ----------------------------------------------------
@pytest.mark.parametrize("code,reason,needle", [(403, "Forbidden", "forbidden (403)"),
                                                (500, "InternalError", "answered 500")])
def test_namespace_read_failure_is_exit_2(tmp_path, drills_cmd, status_server_factory, code, reason, needle, kubeconfig_to):
    srv = status_server_factory(code, reason)
    kc = kubeconfig_to(tmp_path / "kc", srv.url)
    drills_cmd.config.write_text("allowed_contexts: [stage]\n")
    r = drills_cmd("run", "--kubeconfig", kc, "--context", "stage", "--namespace", "ns", "--rollout", "r")
    assert r.returncode == 2, r.stderr
    line = _one_line_error(r)
    assert needle in line and "namespace 'ns'" in line
    assert srv.mutations == []


def test_unreachable_server_is_exit_2(tmp_path, drills_cmd, kubeconfig_to):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                       # nothing listens there now
    kc = kubeconfig_to(tmp_path / "kc", f"http://127.0.0.1:{port}")
    drills_cmd.config.write_text("allowed_contexts: [stage]\n")
    r = drills_cmd("run", "--kubeconfig", kc, "--context", "stage", "--namespace", "ns", "--rollout", "r")
    assert r.returncode == 2 and "cannot reach the API server" in _one_line_error(r), r.stderr


@pytest.mark.parametrize("case", ["no-user", "bad-ca", "exec-fails"])
def test_unusable_kubeconfig_is_exit_2(tmp_path, drills_cmd, status_server_factory, case, kubeconfig_to):
    srv = status_server_factory(200, "OK", require_auth=True)
    if case == "no-user":
        kc = kubeconfig_to(tmp_path / "kc", srv.url, with_user=False)
        needle = "names no user"
    elif case == "bad-ca":
        kc = kubeconfig_to(tmp_path / "kc", "https://127.0.0.1:1",
                              cluster_extra={"certificate-authority-data": "not base64 at all!"})
        needle = "cannot load it"
    else:
        kc = kubeconfig_to(tmp_path / "kc", srv.url, user={"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "/bin/false", "args": []}})
        needle = "exec plugin /bin/false failed (exit 1)"    # never a request without its credentials
    drills_cmd.config.write_text("allowed_contexts: [stage]\n")
    r = drills_cmd("run", "--kubeconfig", kc, "--context", "stage", "--namespace", "ns", "--rollout", "r")
    assert r.returncode == 2, r.stderr
    assert needle in _one_line_error(r)
    assert srv.requests == []


# --- 8. input is checked before the first mutating request ---------------------------------------------------
def test_bad_service_url_is_refused_before_any_request(tmp_path, drills_cmd, status_server_factory, kubeconfig_to):
    srv = status_server_factory(200, "OK")
    kc = kubeconfig_to(tmp_path / "kc", srv.url)
    drills_cmd.config.write_text("allowed_contexts: [stage]\n")
    r = drills_cmd("run", "--kubeconfig", kc, "--context", "stage", "--namespace", "ns", "--rollout", "r",
                   "--service-url", "ftp://stage.example/")
    assert r.returncode == 2 and "--service-url" in _one_line_error(r)
    assert srv.requests == []


@pytest.mark.parametrize("flags", [["--dry-run"], ["--service-url", "http://127.0.0.1:1/"], ["--sync-paused"],
                                   ["--container", "app"]])
def test_live_only_flags_without_a_live_target_are_exit_2(drills_cmd, flags):
    r = drills_cmd("run", *flags)
    assert r.returncode == 2 and "live mode only" in _one_line_error(r)


# --- 9. commands and files --------------------------------------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    (["toolchain", "build", "--extra", "grafana"], "unknown component"),
    (["cluster", "up", "--api-port", "70000"], "--api-port"),
    (["cluster", "up", "--api-port", "-1"], "--api-port"),
    (["probe", "--steps", "5,100", "--replicas", "2", "--min-pods", "3"], "--min-pods"),
    (["probe", "--steps", "5,100", "--hold", "nan"], "--hold"),
    (["probe", "--steps", "5,100", "--replicas", "4", "--scale-out", "4"], "--scale-out"),
    (["probe", "--steps", "5,100", "--replicas", "4", "--scale-out", "501"], "--scale-out"),
    (["probe", "--steps", "5,100", "--replicas", "501"], "--replicas"),
    (["probe", "--steps", "5,100", "--scale-out", "8", "--availability-control", "off"], "--scale-out"),
    (["probe", "--steps", "5,100", "--scale-out-by", "subresource"], "--scale-out-by needs --scale-out"),
    (["probe", "--steps", "5,100", "--hold", "inf"], "--hold"),
    (["probe", "--steps", "\uff15,100"], "unknown step"),
    (["probe", "--steps", "\u00b2"], "unknown step"),
    (["probe", "--steps", ",".join(["5"] * 20000)], "at most"),
    (["watch", "-n", "x", "r", "--duration", "5s", "--out", "/proc/drills-no/such/out.jsonl"], "--out"),
])
def test_bad_arguments_are_exit_2(drills_cmd, args, needle):
    r = drills_cmd(*args, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in _one_line_error(r)


def test_no_go_on_path_is_exit_2(tmp_path):
    env = dict(os.environ, PATH="/nonexistent", DRILLS_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "drills", "toolchain", "build"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 2 and "go command is not on PATH" in _one_line_error(r)


@pytest.mark.parametrize("content,needle", [("{not json", "not valid JSON"), ("[1, 2]", "not a drills journal"),
                                            ('{"rollouts": {"x": {}}}', "namespace/name")])
def test_malformed_journal_is_exit_2(tmp_path, drills_cmd, content, needle):
    j = tmp_path / "journal.json"
    j.write_text(content)
    r = drills_cmd("restore", "--journal", j)
    assert r.returncode == 2 and needle in _one_line_error(r) and str(j) in _one_line_error(r)


def test_restored_journal_is_not_replayed(tmp_path, drills_cmd, status_server_factory, kubeconfig_to):
    srv = status_server_factory(200, "OK")
    kc = kubeconfig_to(tmp_path / "kc", srv.url)
    j = Journal(tmp_path / "journal.json", kubeconfig=str(kc), context="stage", run_id="r1")
    j.before_spec_change({"metadata": {"namespace": "ns", "name": "svc"}, "spec": {
        "template": {"spec": {"containers": [{"name": "app", "image": "a:v2"}]}},
        "strategy": {"canary": {"steps": [{"setWeight": 5}]}}}, "status": {"phase": "Healthy"}})
    j.set_state("restored")
    r = drills_cmd("restore", "--journal", j.path, "--allow-context", "stage")
    assert r.returncode == 0, r.stderr
    assert "already restored" in r.stdout and "nothing to do" in r.stdout
    assert srv.requests == []


def test_one_bad_ledger_does_not_break_every_report(tmp_path):
    from drills.reporting.report import write_matrix
    good = tmp_path / "reports" / "run-good"
    bad = tmp_path / "reports" / "run-bad"
    good.mkdir(parents=True)
    bad.mkdir()
    (good / "ledger.json").write_text(json.dumps([{
        "run_id": "run-good", "target": "embedded", "controller_version": "v1.8.2", "lane": "a", "step": "before",
        "assertion": "peak", "expected": 100, "observed": 100, "verdict": "pass", "evidence": "peak.json"}]))
    (good / "peak.json").write_text('{"peak": 100}\n')           # its evidence: the good run passes whole
    (bad / "ledger.json").write_text("[{truncated")
    html, md = write_matrix(None, tmp_path / "reports")
    assert "run-good" in md.read_text()
    env = dict(os.environ, DRILLS_REPORTS=str(tmp_path / "reports"))
    r = subprocess.run([sys.executable, "-m", "drills", "report"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and "skipping" in r.stderr and "run-bad" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "drills", "report", str(bad)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2 and "not valid JSON" in _one_line_error(r)


def test_malformed_state_file_status_and_down(tmp_path):
    cache = tmp_path / "cache"
    folder = cache / "clusters" / "broken"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text("{half a state")
    env = dict(os.environ, DRILLS_CACHE=str(cache), DRILLS_CLUSTER="broken")
    # a process whose command line names the cluster's kubeconfig, which no record proves drills started: it is
    # named, never signalled (it may be anyone's)
    orphan = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()", str(folder / "kubeconfig")],
                              start_new_session=True)
    try:
        r = subprocess.run([sys.executable, "-m", "drills", "cluster", "status", "--json"], capture_output=True,
                           text=True, env=env, timeout=60)
        assert r.returncode == 1
        st = json.loads(r.stdout)
        assert st["ready"] is False and "not valid JSON" in st["error"]
        r = subprocess.run([sys.executable, "-m", "drills", "cluster", "down"], capture_output=True, text=True,
                           env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        assert orphan.poll() is None and f"pid {orphan.pid}" in r.stderr and "never signalled" in r.stderr, r.stderr
    finally:
        if orphan.poll() is None:
            orphan.kill()
    assert not folder.exists()


def test_journal_records_what_the_drill_wrote_and_detects_a_change_by_someone_else(tmp_path):
    def ro(image, steps):
        return {"metadata": {"namespace": "ns", "name": "svc"}, "spec": {
            "template": {"spec": {"containers": [{"name": "app", "image": image},
                                                 {"name": "istio-proxy", "image": "proxy:1"}]}},
            "strategy": {"canary": {"steps": steps}}}, "status": {"phase": "Healthy"}}
    j = Journal(tmp_path / "j.json", run_id="r")
    j.before_spec_change(ro("a:v2", [{"setWeight": 5}, {"setWeight": 100}]))
    j.after_spec_change(ro("a:v1", [{"setWeight": 5}, {"setWeight": 100}]))
    j.after_spec_change(ro("a:v1", [{"setWeight": 5}]))
    assert j.moved_on("ns/svc", ro("a:v1", [{"setWeight": 5}])) == []
    assert j.moved_on("ns/svc", ro("a:v2", [{"setWeight": 5}, {"setWeight": 100}])) == []
    moved = j.moved_on("ns/svc", ro("a:v3", [{"setWeight": 5}]))
    assert len(moved) == 1 and "a:v3" in moved[0]
    reread = Journal.load(j.path)
    assert reread.data["rollouts"]["ns/svc"]["written"][-1]["steps"] == [{"setWeight": 5}]
    assert "app image now a:v3" in " ".join(reread.moved_on("ns/svc", ro("a:v3", [{"setWeight": 50}])))


@pytest.mark.parametrize("args", [["scan", "-", "--controller", ""], ["run", "--plan", "--controller", " "],
                                  ["probe", "--steps", "5", "--controller", ""]])
def test_an_empty_controller_is_an_unset_variable_never_the_default(tmp_path, args):
    r = subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, timeout=120,
                       input="", env=dict(os.environ, DRILLS_REPORTS=str(tmp_path / "reports")))
    assert r.returncode == 2 and "--controller" in r.stderr and "unset variable" in r.stderr, r.stderr
    assert r.stdout == "" and not (tmp_path / "reports").exists()
