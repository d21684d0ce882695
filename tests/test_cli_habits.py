"""kubectl's habits on the command line: `drills version` / `--version`, `-o json|yaml` wherever there is `--json`,
`-n/--namespace` wherever a command takes a namespace, run folders in ./reports of the working directory (or
DRILLS_REPORTS, or `--reports-dir`)."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from drills import __version__
from drills.core import config
from drills.cli import build_parser
from drills.core.procs import die_with_parent

ROOT = config.project_root()


def drills(*args, cwd=None, env=None, timeout=120):
    base = {k: v for k, v in os.environ.items() if k != "DRILLS_REPORTS"}
    return subprocess.run([sys.executable, "-m", "drills", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=str(cwd or ROOT), stdin=subprocess.DEVNULL, preexec_fn=die_with_parent,
                          env={**base, "PYTHONPATH": str(ROOT), **(env or {})})


def subcommands(parser: argparse.ArgumentParser, path=()):
    """(name path, parser) of every subcommand, nested ones included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from subcommands(sub, (*path, name))


def options(parser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings}


def head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30,
                          preexec_fn=die_with_parent).stdout.strip()


def test_version_says_the_package_the_commit_and_the_components():
    r = drills("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"drills {__version__}, commit {head()[:12]} (this checkout)")
    r = drills("version", "-o", "json")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert (v["drills"], v["commit"], v["commit_from"], v["checkout"]) == (__version__, head(), "checkout", str(ROOT))
    assert v["components"] == {"kubernetes": config.KUBERNETES_VERSION, "kwok": config.KWOK_VERSION,
                               "etcd": config.ETCD_VERSION, "helm": config.HELM_VERSION,
                               "istio-api": config.ISTIO_API_VERSION, "registry": config.REGISTRY_VERSION,
                               "prometheus": config.PROMETHEUS_VERSION,
                               "kube-state-metrics": config.KUBE_STATE_METRICS_VERSION}
    assert v["controllers"]["supported"] == list(config.SUPPORTED_CONTROLLERS)
    go = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, timeout=60, cwd="/",
                        env=dict(os.environ, GOTOOLCHAIN="local"), preexec_fn=die_with_parent).stdout.strip()
    assert v["go"] == go and v["go_needed"] == ">= 1.26"
    assert yaml.safe_load(drills("version", "-o", "yaml").stdout) == v == json.loads(drills("version", "--json").stdout)


def test_every_command_with_json_takes_o_json_or_yaml_and_every_namespace_takes_n():
    found = 0
    for path, sub in subcommands(build_parser()):
        opts = options(sub)
        if "--json" in opts:
            found += 1
            assert {"-o", "--output"} <= set(opts) and list(opts["-o"].choices) == ["json", "yaml"], path
        if "--namespace" in opts:
            assert "-n" in opts and opts["-n"] is opts["--namespace"], path
    assert found >= 8
    args = build_parser().parse_args(["run", "-n", "payments", "--rollout", "checkout"])
    assert (args.namespace, args.rollout) == ("payments", "checkout")
    scan = build_parser().parse_args(["scan", "-A", "-l", "team=payments", "--context", "c"])
    assert scan.all_namespaces and scan.selector == "team=payments"


@pytest.mark.parametrize("args", [["lanes"], ["run", "--plan", "--controller", "v1.8.2,v1.10.2", "--lanes", "all"],
                                  ["toolchain", "list"]])
def test_o_yaml_is_the_json_document(args, tmp_path):
    # a cache of this test's own: the three answers describe one state (the machine's cache changes while the
    # session's background build runs, and `toolchain list` says what is built)
    env = {"DRILLS_CACHE": str(tmp_path / "cache")}
    as_json, as_o_json, as_yaml = (drills(*args, "--json", env=env), drills(*args, "-o", "json", env=env),
                                   drills(*args, "-o", "yaml", env=env))
    assert as_json.returncode == as_o_json.returncode == as_yaml.returncode == 0, as_yaml.stderr
    assert json.loads(as_json.stdout) == json.loads(as_o_json.stdout) == yaml.safe_load(as_yaml.stdout)
    assert not as_yaml.stdout.lstrip().startswith(("{", "["))


def test_run_takes_n_for_its_namespace(tmp_path):
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "stage",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "stage", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    r = drills("run", "-n", "payments", "--rollout", "checkout", "--kubeconfig", kc, "--context", "stage",
               "--dry-run", env={"DRILLS_CONFIG": str(tmp_path / "config.yaml")})
    # the live gate's refusal (exit 2, one line), not a usage error
    assert r.returncode == 2 and "unrecognized arguments" not in r.stderr, r.stderr
    assert "context 'stage' is not allowlisted" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_run_folders_go_to_reports_of_the_working_directory_or_where_told(tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    r = drills("report", cwd=here)
    assert r.returncode == 0, r.stderr
    # the headlines (none here) come first, the matrix's two files last
    assert r.stdout.split()[-2:] == [str(here / "reports" / "matrix.html"), str(here / "reports" / "matrix.md")]
    for args in (["--reports-dir", tmp_path / "one", "report"], ["report", "--reports-dir", tmp_path / "two"]):
        r = drills(*args, cwd=here)
        assert r.returncode == 0, r.stderr
        where = Path(args[1] if args[0] == "--reports-dir" else args[2])
        assert (where / "matrix.html").is_file()
    r = drills("report", cwd=here, env={"DRILLS_REPORTS": str(tmp_path / "env")})
    assert r.returncode == 0 and (tmp_path / "env" / "matrix.md").is_file()
    (tmp_path / "file").write_text("")
    r = drills("--reports-dir", tmp_path / "file", "report", cwd=here)
    assert r.returncode == 2 and "not a folder" in r.stderr
    v = json.loads(drills("version", "-o", "json", cwd=here).stdout)
    assert v["reports"] == str(here / "reports") and v["data"] == str(ROOT / "fixtures")


HERE_JOBS = re.compile(r"here \d+\)")
READER_CASES = [(("version",), 0), (("run", "--help"), 0),
                (("run", "--plan", "--lanes", "all", "--controller", "all"), 0), (("cluster", "status"), 1),
                (("cluster", "up", "--controller", ""), 2)]


def _with_reader_gone(args, env, stream: str) -> subprocess.CompletedProcess:
    """The command with ``stream`` (stdout or stderr) a pipe whose reader has gone before the first line, or with
    its standard output closed altogether (``stream == "closed"``: ``drills ... >&-``)."""
    read, write = os.pipe()
    os.close(read)

    def child():
        die_with_parent()
        if stream == "closed":
            os.close(1)
    try:
        return subprocess.run([sys.executable, "-m", "drills", *args], text=True, timeout=120, cwd=str(ROOT),
                              stdin=subprocess.DEVNULL, preexec_fn=child,
                              stdout=write if stream == "stdout" else None if stream == "closed" else subprocess.PIPE,
                              stderr=write if stream == "stderr" else subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    finally:
        os.close(write)


@pytest.mark.parametrize("stream", ["stdout", "stderr", "closed"])
@pytest.mark.parametrize("args, code", READER_CASES)
def test_a_reader_that_leaves_early_changes_neither_the_exit_code_nor_the_rest(args, code, stream, tmp_path):
    """`drills ... | head`, `drills ... 2>&1 | head`, `drills ... >&-`: what is still written goes nowhere and the
    command ends as it would have (the same exit code, the same other stream, no error line), as kubectl's and
    pytest's output does."""
    env = {"DRILLS_CACHE": str(tmp_path / "cache"), "DRILLS_CLUSTER": "pipe-reader"}
    kept = drills(*args, env=env)
    left = _with_reader_gone(args, env, stream)
    assert (kept.stdout or kept.stderr) and (kept.returncode, left.returncode) == (code, code), (kept.stderr, left)
    if stream == "stderr":
        # `run --help` says the legs this machine holds now ("here N"): its available memory may change in between
        assert HERE_JOBS.sub("here N)", left.stdout) == HERE_JOBS.sub("here N)", kept.stdout)
    elif stream == "stdout":
        assert left.stderr == kept.stderr, left.stderr
    else:       # no standard output at all: argparse's help goes to stderr then (Python's own choice)
        assert "Traceback" not in left.stderr and "Error:" not in left.stderr, left.stderr
