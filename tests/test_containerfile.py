"""The shard image, checked where no container builder runs: .ci/containerfile-check runs the Containerfile's steps
in a fresh root folder the way the file does (its ARGs, ENV, COPY, each RUN as written but for the paths; the cache
mounts are the machine's pip and Go caches, as a warm builder's; the machine's git and Go stand for the system
lines), then what a shard pod runs first from that root.  examples/indexed-job.yaml runs that image."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib.machinery import SourceFileLoader

import yaml

from drills.core import config
from drills.core.procs import die_with_parent
from drills.toolchain import Toolchain, components_for
from drills.toolchain.components import rollouts_component

ROOT = config.project_root()
CHECK = ROOT / ".ci" / "containerfile-check"
IMAGE = "registry.example/drills:main"


def check_module():
    loader = SourceFileLoader("containerfile_check", str(CHECK))
    spec = importlib.util.spec_from_loader("containerfile_check", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_the_indexed_job_runs_the_image_the_containerfile_builds():
    cf = check_module()
    steps = cf.instructions((ROOT / "Containerfile").read_text())
    workdir = [rest for word, rest in steps if word == "WORKDIR"][-1]
    assert f"-t {IMAGE}" in (ROOT / "Containerfile").read_text()
    (job,) = [d for d in yaml.safe_load_all((ROOT / "examples" / "indexed-job.yaml").read_text()) if d["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE and container["workingDir"] == workdir
    assert container["args"][0].startswith("drills run ") and "--shard $((JOB_COMPLETION_INDEX + 1))/5" in \
        container["args"][0]


def test_the_check_reads_the_file_as_a_builder_does(tmp_path):
    cf = check_module()
    steps = cf.instructions("FROM x\n# a comment\nRUN a \\\n    && b\nENV A=/opt/x B=2\n")
    assert steps == [("FROM", "x"), ("RUN", "a      && b"), ("ENV", "A=/opt/x B=2")]
    c = cf.Check(tmp_path, {}, cold=False)
    c.do_env("ENV", "HOME_DIR=/opt/x VENV=/opt/x/venv")
    assert c.local('"$VENV/bin/pip" /opt/x/venv/bin/x /opt/xy /srv/z') == \
        f'"$VENV/bin/pip" {tmp_path}/opt/x/venv/bin/x /opt/xy /srv/z'
    assert cf.SYSTEM.search("apt-get update") and not cf.SYSTEM.search("drills toolchain build")


def test_the_containerfile_steps_run_in_a_fresh_root(tmp_path):
    # the machine's Go caches hold the toolchain's builds first (a warm builder), built or waited for
    Toolchain().ensure(components_for([config.DEFAULT_CONTROLLER]))
    root = tmp_path / "root"
    r = subprocess.run([sys.executable, str(CHECK), "--root", str(root), "--build-arg",
                        f"CONTROLLERS={config.DEFAULT_CONTROLLER}", "--build-arg", "EXTRAS="],
                       capture_output=True, text=True, timeout=3600, cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                       preexec_fn=die_with_parent)
    said = [line for line in r.stdout.splitlines() if line.startswith("containerfile-check:")]
    assert r.returncode == 0, "\n".join(said[-20:]) + r.stderr[-2000:]
    assert said[-1].startswith(f"containerfile-check: ok: every step ran in {root}")
    assert sum("RUN (system, not run" in line for line in said) == 2
    assert any("pod: cluster up from the image's toolchain" in line for line in said)
    # what the image holds: drills in its venv, the toolchain in its drills cache, the release source in its module
    # cache; the builder's cache mounts are not in it
    assert (root / "opt" / "drills" / "venv" / "bin" / "drills").is_file()
    assert Toolchain(root / "opt" / "drills" / "cache").is_built(rollouts_component(config.DEFAULT_CONTROLLER))
    assert (root / "opt" / "drills" / "gomod" / f"github.com/argoproj/argo-rollouts@{config.DEFAULT_CONTROLLER}"
            / "rollout" / "trafficrouting.go").is_file()
    assert not any((root / "var" / "cache" / m).exists() for m in ("go-build", "go-mod", "drills"))
    # a warm builder's toolchain is copied from its drills cache mount (the machine's), never compiled or linked again
    image, machine = Toolchain(root / "opt" / "drills" / "cache"), Toolchain()
    for comp in components_for([config.DEFAULT_CONTROLLER]):
        stamp = json.loads(image.stamp(comp).read_text())
        assert stamp["copied_from"] == str(root / "var" / "cache" / "drills" / comp.name / comp.version), stamp
        assert stamp["binaries"] == json.loads(machine.stamp(comp).read_text())["binaries"], comp.key
