"""The pytest plugin, opt-in and namespaced, and the lanes other packages register (entry point group
``drills.lanes``): a small distribution installed by pip registers a lane that `drills lanes` lists and `drills run`
runs on the embedded cluster through the plugin's ``drills_lane`` fixture; a broken one is said and left out.  The
project keeps the older option and fixture names (its conftest.py)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from drills.core import config
from drills import lanes as drills_lanes
from drills.record.ledger import read_rows
from drills.core.procs import die_with_parent
from drills.toolchain import Toolchain, components_for

ROOT = config.project_root()

DEMO = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "drills-lane-demo"
        version = "0.1.0"

        [project.entry-points."drills.lanes"]
        demo = "drills_lane_demo:LaneDemo"

        [tool.setuptools]
        packages = ["drills_lane_demo"]

        [tool.setuptools.package-data]
        drills_lane_demo = ["data/*", "tests/*"]
        """,
    "drills_lane_demo/__init__.py": '''
        """A lane of another team's: its runbook, its data and its tests in its own package."""
        import json
        from pathlib import Path

        from kubernetes import client

        from drills.lanes import Runbook, step
        from drills.record.ledger import FAIL, PASS

        HERE = Path(__file__).parent


        class LaneDemo(Runbook):
            key = "demo"
            title = "a lane another package registers"

            @classmethod
            def data_dir(cls):
                return HERE / "data"

            @classmethod
            def tests_dir(cls):
                return HERE / "tests"

            @step()
            def namespace_is_opted_in(self):
                ns = client.CoreV1Api(self.ctx.api).read_namespace(self.ctx.namespace)
                seen = (ns.metadata.labels or {}).get("drills.dev/allow")
                evidence = self.ctx.evidence_dir / "demo-namespace.json"
                evidence.write_text(json.dumps(ns.to_dict(), default=str))
                want = self.expected("label", "true")
                return self.row("namespace", "the lane's namespace carries the opt-in label", want, seen,
                                PASS if seen == want else FAIL, evidence=evidence)
        ''',
    "drills_lane_demo/data/expectations.yaml": """
        versions:
          v1.8.2: {label: "true"}
        """,
    "drills_lane_demo/tests/test_lane_demo.py": """
        import pytest

        pytestmark = pytest.mark.drills_lane("demo")


        def test_namespace_is_opted_in(drills_lane):
            drills_lane.expect(drills_lane.namespace_is_opted_in())
        """,
}

BROKEN = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "drills-lane-broken"
        version = "0.1.0"

        [project.entry-points."drills.lanes"]
        broken = "drills_lane_broken:NoSuchLane"
        notalane = "drills_lane_broken:NOT_A_LANE"

        [tool.setuptools]
        packages = ["drills_lane_broken"]
        """,
    "drills_lane_broken/__init__.py": "NOT_A_LANE = 42\n",
}


def run(args, cwd=ROOT, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)


def install(files: dict, into: Path, tmp: Path, name: str) -> None:
    src = tmp / name
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(textwrap.dedent(text).lstrip())
    r = run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", "--target", into,
             src], cwd=tmp, timeout=900)
    if r.returncode != 0 and ("connection" in r.stderr.lower() or "no matching distribution" in r.stderr.lower()):
        pytest.skip(f"PyPI unreachable for the build's setuptools: {' '.join(r.stderr.split())[-300:]}")
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder pip installed the two small distributions into (on PYTHONPATH: an installed package)."""
    tmp = tmp_path_factory.mktemp("dists")
    into = tmp / "site"
    install(DEMO, into, tmp, "demo")
    install(BROKEN, into, tmp, "broken")
    assert (into / "drills_lane_demo-0.1.0.dist-info" / "entry_points.txt").is_file()
    return into


def env_with(site: Path, tmp: Path, **extra) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), DRILLS_REPORTS=str(tmp / "reports"),
                DRILLS_CONFIG=str(tmp / "config.yaml"), **extra)


def test_an_installed_package_registers_a_lane(site, tmp_path):
    r = run([sys.executable, "-m", "drills", "lanes", "--json"], env=env_with(site, tmp_path))
    assert r.returncode == 0, r.stderr
    lanes = json.loads(r.stdout)
    assert [x["key"] for x in lanes] == [*(x.key for x in drills_lanes.BUILTIN), "demo"]
    demo = lanes[-1]
    assert demo["title"] == "a lane another package registers" and demo["versions"] == ["v1.8.2"]
    assert Path(demo["data"]) == site / "drills_lane_demo" / "data"
    assert Path(demo["tests"]) == site / "drills_lane_demo" / "tests"
    # the broken distribution: each of its entry points said once on stderr, left out, the rest unharmed
    assert "lane entry point 'broken' (drills_lane_broken:NoSuchLane, from drills-lane-broken) does not load" \
        in r.stderr
    assert "lane entry point 'notalane'" in r.stderr and "is not a Runbook subclass" in r.stderr
    plan = run([sys.executable, "-m", "drills", "run", "--lanes", "demo", "--plan", "--json"],
               env=env_with(site, tmp_path))
    assert [leg["id"] for leg in json.loads(plan.stdout)["legs"]] == ["v1.8.2/demo/stage"]


def test_drills_run_runs_a_registered_lane_through_the_plugin(site, tmp_path):
    Toolchain().ensure(components_for([config.DEFAULT_CONTROLLER]))          # built, or waited for
    cluster = f"{os.environ.get('DRILLS_CLUSTER') or config.EMBEDDED_CLUSTER_NAME}-lane"
    env = env_with(site, tmp_path, DRILLS_CLUSTER=cluster)
    r = run([sys.executable, "-m", "drills", "run", "--lanes", "demo", "--controller", config.DEFAULT_CONTROLLER,
             "-j", "1"], env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (run_dir,) = [p for p in (tmp_path / "reports").iterdir() if p.is_dir() and not p.is_symlink()]
    (row,) = read_rows(run_dir / "ledger.json")
    assert (row["lane"], row["step"], row["verdict"], row["observed"]) == ("demo", "namespace", "pass", "true")
    assert (run_dir / row["evidence"]).is_file() and (run_dir / "report.html").is_file()


def test_the_plugin_asked_for_adds_only_drills_names(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    plain = run([sys.executable, "-m", "pytest", "--help"], cwd=tmp_path, env=env).stdout
    asked = run([sys.executable, "-m", "pytest", "-p", "drills", "--help"], cwd=tmp_path, env=env).stdout
    added = {w.split("=")[0] for w in asked.split() if w.startswith("--")} - \
        {w.split("=")[0] for w in plain.split() if w.startswith("--")}
    assert added and all(o.startswith("--drills-") for o in added), sorted(added)
    fixtures = run([sys.executable, "-m", "pytest", "-p", "drills", "--fixtures"], cwd=tmp_path, env=env).stdout
    mine = [line.split()[0] for line in fixtures.splitlines() if "pytest_plugin.py" in line]
    assert len(mine) >= 8 and all(name.startswith("drills_") for name in mine), mine


def test_the_project_keeps_the_older_names():
    def ids(*opts):
        r = run([sys.executable, "-m", "pytest", "-p", "no:locust", "--collect-only", "-q", *opts,
                 "tests/test_probe.py"], env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
        return [line for line in r.stdout.splitlines() if "::" in line]
    old, new = ids("--controller", "v1.10.2"), ids("--drills-controller", "v1.10.2")
    assert old == new and any("[v1.10.2" in i for i in old) and not any("v1.8.2" in i for i in old)
    r = run([sys.executable, "-m", "pytest", "-p", "no:locust", "--fixtures", "tests/test_probe.py"],
            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    aliases = {m.group(1) for m in re.finditer(r"^(\w+)\b.* -- conftest\.py:\d+$", r.stdout, re.M)}
    assert {"cluster", "kube", "namespace", "module_namespace", "ledger", "run_dir", "evidence_dir"} <= aliases
