"""Command-line contracts: bad input exits 2 and mutates nothing."""
from __future__ import annotations

import subprocess
import sys

import pytest


def drills(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args,needle", [
    (["run", "--lanes", "a,z"], "unknown lane"),
    (["run", "--controller", "v0.0.1"], "v1.8.2"),
    (["run", "--controller", "next"], "not a version"),
    (["run", "--controller-binary", "/nonexistent/rollouts-controller"], "no such file"),
    (["run", "--controller-binary", "@plainfile"], "not an executable"),
    (["run", "--controller-binary", "/bin/true"], "does not start as a rollouts controller"),
    (["probe", "--steps", "5,pause:10s,100", "--replicas", "0"], "positive"),
    (["watch", "-n", "x", "r", "--out", "/tmp/x.jsonl"], "--until-healthy"),
    (["restore", "--journal", "/nonexistent/journal.json"], "does not exist"),
    (["report", "/nonexistent/run"], "nonexistent"),
    (["nonsense"], "invalid choice"),
])
def test_bad_input_exits_2(args, needle, tmp_path):
    plain = tmp_path / "rollouts-controller"
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    args = [str(plain) if a == "@plainfile" else a for a in args]
    r = drills(*args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert needle in r.stderr, r.stderr


def test_toolchain_list_shows_supported_and_built():
    import json
    from drills.toolchain import Toolchain
    for v in ("v1.8.2", "v1.10.2"):     # built here, or waited for while another process of the run builds them
        Toolchain().rollouts(v)
    r = drills("toolchain", "list", "--json")
    assert r.returncode == 0
    rows = json.loads(r.stdout)
    versions = {x["version"] for x in rows if x["component"] == "rollouts" and x["supported"]}
    assert versions == {"v1.7.1", "v1.7.2", "v1.8.2", "v1.8.5", "v1.9.3", "v1.10.2"}
    built = {x["version"] for x in rows if x["component"] == "rollouts" and x["built"]}
    assert {"v1.8.2", "v1.10.2"} <= built
