"""drills as a new user gets it: the wheel built from this checkout, installed (not editable) into a fresh venv at
the versions of constraints.txt (from PyPI: a venv that saw this machine's packages would also see the editable
install of another checkout), and run from an empty folder, where everything it writes goes; a pytest session of
another project in that venv, with and without the plugin asked for; the `test` extra enough to collect every test.
The same wheel on every other Python minor the package claims (pyproject.toml's classifiers): its own venv there,
the commands from an empty folder, the `test` extra collecting every test.  A claimed interpreter that is not on this
machine fails the test, naming how to get it: a claim nobody checks here is not made.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from drills.core import config
from drills import lanes as drills_lanes
from drills.core.procs import die_with_parent
from drills.toolchain import Toolchain, components_for

ROOT = config.project_root()
INSTALL_TIMEOUT_S = 1800
# no bytecode compiled at install (a third of a full install's CPU, 22.7 -> 15.6 CPU-s): the modules a test imports
# are compiled when imported, the rest never are (what runs is the same; the checks below skip __pycache__)
INSTALL_OPTS = ("--disable-pip-version-check", "--no-compile")
RUNNING = f"{sys.version_info.major}.{sys.version_info.minor}"


def claimed_minors() -> list[str]:
    """The Python minors the package claims: its `Programming Language :: Python :: 3.N` classifiers
    (tests/test_packaging.py checks that requires-python admits exactly these)."""
    prefix = "Programming Language :: Python :: 3."
    classifiers = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["classifiers"]
    return [c.removeprefix("Programming Language :: Python :: ") for c in classifiers
            if c.startswith(prefix) and c.removeprefix(prefix).isdigit()]


def pyenv_roots() -> list[Path]:
    roots = [os.environ.get("PYENV_ROOT")]
    if shutil.which("pyenv"):
        r = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                           preexec_fn=die_with_parent)
        roots.append(r.stdout.strip() if r.returncode == 0 else None)
    roots.append(str(Path.home() / ".pyenv"))
    return list(dict.fromkeys(Path(r) for r in roots if r))


def find_interpreter(minor: str) -> Path | None:
    """A CPython of that minor: `python3.N` on PATH, else the newest pyenv version of it; each candidate is asked
    which minor it is (a pyenv shim of a version that is not selected exits non-zero)."""
    candidates = [shutil.which(f"python{minor}")]
    for root in pyenv_roots():
        found = root.glob(f"versions/{minor}.*/bin/python{minor}")
        candidates += sorted(found, key=lambda p: [int(x) if x.isdigit() else -1 for x in
                                                   p.parents[1].name.split(".")], reverse=True)
    for c in filter(None, candidates):
        r = subprocess.run([str(c), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        if r.returncode == 0 and r.stdout.strip() == minor:
            return Path(c)
    return None


def run(args, cwd, env=None, timeout=600, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in args], cwd=str(cwd), env=env or os.environ.copy(), capture_output=True,
                       text=True, timeout=timeout, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    if check:
        assert r.returncode == 0, f"{' '.join(map(str, args))} exited {r.returncode}\n{r.stdout[-2000:]}\n" \
                                  f"{r.stderr[-3000:]}"
    return r


def checkout_files() -> list[str]:
    """The checkout's files as a build sees them: tracked and untracked, not ignored, present."""
    out = run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT).stdout
    return [f for f in out.split("\0") if f and (ROOT / f).is_file()]


def clean_env(**extra) -> dict:
    """The environment of a user's shell: nothing pointing at this checkout, reports where they are run."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DRILLS_REPORTS", "VIRTUAL_ENV")
           and not k.startswith("PYTEST_")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def pypi(tmp_path_factory) -> None:
    """PyPI answers (the build's setuptools and the venv's dependencies come from it)."""
    pin = next(line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("six=="))
    r = run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps", "--dest",
             tmp_path_factory.mktemp("probe"), pin], ROOT, clean_env(), timeout=300, check=False)
    if r.returncode != 0:
        pytest.skip(f"PyPI unreachable: {' '.join(r.stderr.split())[-300:]}")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the checkout (a build never writes into the one the tests run from)."""
    if config.checkout_root() is None or shutil.which("git") is None:
        pytest.skip("not a git checkout: there is no source tree to build a wheel from")
    src = tmp_path_factory.mktemp("src")
    for rel in checkout_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    return src


@pytest.fixture(scope="module")
def wheel(pypi, source, tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", dist, source],
        source, clean_env(), timeout=INSTALL_TIMEOUT_S)
    (whl,) = dist.glob("drills-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    v = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", v], v, clean_env())
    run([v / "bin" / "pip", "install", *INSTALL_OPTS, "-c", ROOT / "constraints.txt", wheel],
        v, clean_env(), timeout=INSTALL_TIMEOUT_S)
    run([v / "bin" / "pip", "check"], v, clean_env())          # every declared dependency is there, consistent
    return v


def site_packages(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    return site


def package_files(venv: Path) -> set[str]:
    pkg = site_packages(venv) / "drills"
    return {str(p.relative_to(pkg)) for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_the_wheel_carries_the_built_in_data_and_no_pytest_entry_point(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [f for f in checkout_files() if f.split("/")[0] in ("fixtures", "lanes")]
    assert data and {f"drills/_data/{f}" for f in data} <= names
    assert {"drills/templates/page.html.j2", "drills/_data/build.json", "drills/_data/lanes/conftest.py"} <= names
    (eps,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(eps).decode()
    assert "pytest11" not in text and "drills = drills.cli:main" in text


def test_installed_drills_works_from_an_empty_folder_and_writes_only_there(venv, tmp_path):
    bin_ = venv / "bin"
    work = tmp_path / "empty"
    work.mkdir()
    cluster = f"{os.environ.get('DRILLS_CLUSTER') or config.EMBEDDED_CLUSTER_NAME}-wheel"
    env = clean_env(DRILLS_CLUSTER=cluster, DRILLS_CONFIG=str(tmp_path / "config.yaml"))
    before = package_files(venv)
    site = site_packages(venv)

    version = json.loads(run([bin_ / "drills", "version", "-o", "json"], work, env).stdout)
    assert version["checkout"] is None and Path(version["data"]).is_relative_to(site)
    assert version["reports"] == str(work / "reports")

    lanes = json.loads(run([bin_ / "drills", "lanes", "--json"], work, env).stdout)
    assert [x["key"] for x in lanes] == [x.key for x in drills_lanes.BUILTIN]    # the checkout's lanes
    for lane in lanes:
        assert lane["versions"], lane            # expectations found: "versions none" was the bug
        assert Path(lane["data"]).is_relative_to(site) and Path(lane["tests"]).is_dir()

    fleet = Path(version["data"]) / "fleet"
    report_only = ["--fail-on", "none", "--json"]          # the fleet has exposed Rollouts: report, do not gate
    scan = json.loads(run([bin_ / "drills", "scan", "--fleet", fleet, *report_only], work, env).stdout)
    assert len(scan["rollouts"]) == 12 and scan["summary"]["exposed"] == 4
    assert {r["origin"]["base_chart"] for r in scan["rollouts"]} == {"3.0.13"}
    for given in ([], ["fixtures/fleet"]):         # --fleet alone, and the README's fixtures/fleet: the built-in one
        same = json.loads(run([bin_ / "drills", "scan", "--fleet", *given, *report_only], work, env).stdout)
        assert [r["source"] for r in same["rollouts"]] == [r["source"] for r in scan["rollouts"]]

    Toolchain().ensure(components_for([config.DEFAULT_CONTROLLER]))      # built, or waited for
    try:
        r = run([bin_ / "drills", "probe", "--steps", "5,100", "--replicas", "2", "--hold", "2", "--json"], work, env,
                timeout=900)
    finally:
        run([bin_ / "drills", "cluster", "down"], work, env, timeout=300, check=False)
    probe = json.loads(r.stdout)
    assert probe["peak_canary_weight_while_partial"] == 100 and probe["complete"]
    assert Path(probe["timeline"]).is_relative_to(work / "reports" / "probes") and Path(probe["timeline"]).is_file()
    assert package_files(venv) == before             # nothing written into the installed package


def test_pytest_in_another_project_sees_no_drills_unless_it_asks(venv, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_trivial.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    py, env = venv / "bin" / "python", clean_env()
    plain_help = run([py, "-m", "pytest", "--help"], project, env).stdout
    plain_fixtures = run([py, "-m", "pytest", "--fixtures"], project, env).stdout
    assert "drills" not in plain_help.lower() and "drills" not in plain_fixtures
    assert run([py, "-m", "pytest", "-q"], project, env).stdout.splitlines()[-1].startswith("1 passed")
    asked_help = run([py, "-m", "pytest", "-p", "drills", "--help"], project, env).stdout
    asked_fixtures = run([py, "-m", "pytest", "-p", "drills", "--fixtures"], project, env).stdout
    options = [w.split("=")[0] for w in asked_help.split() if w.startswith("--drills")]
    assert {"--drills-controller", "--drills-source", "--drills-crds", "--drills-keep-cluster"} <= set(options)
    assert "--controller" not in asked_help.split() and "--crds" not in asked_help.split()
    fixtures = {line.split()[0] for line in asked_fixtures.splitlines() if "drills/pytest_plugin.py" in line}
    assert fixtures >= {"drills_cluster", "drills_kube", "drills_namespace", "drills_ledger", "drills_lane"}
    assert all(name.startswith("drills_") for name in fixtures), fixtures
    assert "drills_controller_version" in fixtures
    long_name = run([py, "-m", "pytest", "-p", "drills.pytest_plugin", "--help"], project, env).stdout
    assert "--drills-controller" in long_name
    assert run([py, "-m", "pytest", "-q", "-p", "drills"], project, env).stdout.splitlines()[-1].startswith("1 passed")


COLLECT = ["-m", "pytest", "-p", "no:locust", "--collect-only", "-q", "tests", "lanes"]


def collected_ids(out: str) -> list[str]:
    return [line for line in out.splitlines() if "::" in line]


@pytest.fixture(scope="module")
def collected_here(source) -> list[str]:
    """Every test id this interpreter's environment collects from the copy (a collection error exits 2: run fails)."""
    ids = collected_ids(run([sys.executable, *COLLECT], source, clean_env(PYTHONPATH=str(source))).stdout)
    assert len(ids) > 400
    return ids


def other_minors_apart(ids: list[str]) -> tuple[list[str], set[str]]:
    """The ids but this file's smoke on the other claimed minors, and the minors of that smoke (which depend on the
    collecting interpreter: every claimed one but its own)."""
    smoke = "tests/test_install.py::test_the_wheel_works_on_every_other_python_claimed["
    return [i for i in ids if not i.startswith(smoke)], {i[len(smoke):-1] for i in ids if i.startswith(smoke)}


def install_test_extra_and_collect(venv: Path, wheel: Path, source: Path) -> list[str]:
    # the extra of the wheel already installed (its metadata declares it, as the checkout's does): only the extra's
    # dependencies are added, where `source[test]` built the package from the checkout a second time
    run([venv / "bin" / "pip", "install", *INSTALL_OPTS, "-c", ROOT / "constraints.txt",
         f"{wheel}[test]"], source, clean_env(), timeout=INSTALL_TIMEOUT_S)
    return collected_ids(run([venv / "bin" / "python", *COLLECT], source, clean_env()).stdout)


def test_the_test_extra_collects_every_test(venv, wheel, source, collected_here):
    assert install_test_extra_and_collect(venv, wheel, source) == collected_here


@pytest.mark.parametrize("minor", [m for m in claimed_minors() if m != RUNNING])
def test_the_wheel_works_on_every_other_python_claimed(minor, wheel, source, collected_here, tmp_path):
    """One smoke per other claimed minor (the running one is the rest of this file): the wheel and its pinned
    dependencies install there, the commands run from an empty folder and write nothing elsewhere, and the `test`
    extra collects every test this interpreter collects."""
    py = find_interpreter(minor)
    assert py is not None, (
        f"CPython {minor} is claimed (pyproject.toml: requires-python and its classifiers) but no python{minor} was "
        f"found on PATH or in {', '.join(str(r / 'versions') for r in pyenv_roots())}: install it (`pyenv install "
        f"{minor}`, the distribution's python{minor} package, or actions/setup-python in CI) before `make test`, "
        f"or take {minor} out of the claim")
    v = tmp_path / "venv"
    run([py, "-m", "venv", v], tmp_path, clean_env())
    run([v / "bin" / "pip", "install", *INSTALL_OPTS, "-c", ROOT / "constraints.txt", wheel],
        tmp_path, clean_env(), timeout=INSTALL_TIMEOUT_S)
    run([v / "bin" / "pip", "check"], tmp_path, clean_env())
    work = tmp_path / "empty"
    work.mkdir()
    env = clean_env(DRILLS_CONFIG=str(tmp_path / "config.yaml"))
    before = package_files(v)
    drills_ = v / "bin" / "drills"

    version = json.loads(run([drills_, "version", "-o", "json"], work, env).stdout)
    assert version["python"].startswith(f"{minor}.") and version["checkout"] is None
    assert Path(version["data"]).is_relative_to(site_packages(v)) and version["reports"] == str(work / "reports")
    lanes = json.loads(run([drills_, "lanes", "--json"], work, env).stdout)
    assert [x["key"] for x in lanes] == [x.key for x in drills_lanes.BUILTIN] and all(x["versions"] for x in lanes)
    scan = json.loads(run([drills_, "scan", "--fleet", "--fail-on", "none", "--json"], work, env).stdout)
    assert len(scan["rollouts"]) == 12 and scan["summary"]["exposed"] == 4
    assert package_files(v) == before
    assert {p.relative_to(work).parts[0] for p in work.rglob("*")} <= {"reports"}

    rest, smoke_minors = other_minors_apart(install_test_extra_and_collect(v, wheel, source))
    assert rest == other_minors_apart(collected_here)[0]
    assert smoke_minors == set(claimed_minors()) - {minor} and minor != RUNNING


def test_the_readme_example_suite_runs_on_the_embedded_cluster(venv, tmp_path):
    """The README's "Using the fixtures in your own suite" example, as a user's project runs it."""
    readme = (ROOT / "README.md").read_text()
    example = readme.split("```python\n# test_my_canary.py", 1)[1].split("```", 1)[0]
    project = tmp_path / "theirs"
    project.mkdir()
    (project / "test_my_canary.py").write_text("# test_my_canary.py" + example)
    Toolchain().ensure(components_for([config.DEFAULT_CONTROLLER]))      # built, or waited for
    cluster = f"{os.environ.get('DRILLS_CLUSTER') or config.EMBEDDED_CLUSTER_NAME}-suite"
    env = clean_env(DRILLS_CLUSTER=cluster)
    try:
        r = run([venv / "bin" / "python", "-m", "pytest", "-q", "-p", "drills", "--drills-controller",
                 config.DEFAULT_CONTROLLER], project, env, timeout=900, check=False)
    finally:
        run([venv / "bin" / "drills", "cluster", "down"], project, env, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-3000:]
    assert r.stdout.splitlines()[-1].startswith("1 passed")
