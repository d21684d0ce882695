"""The package declares what it imports: the runtime dependencies are what drills/ imports or runs (`python -m
pytest` for the lanes, `python -m locust` for load), the `test` extra what the tests add; constraints.txt pins every
distribution `pip install '.[test]'` brings at the version tested here; nothing loads the pytest plugin by itself;
the wheel's build records the commit it was built from."""
from __future__ import annotations

import ast
import importlib.util
import platform
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from importlib.machinery import SourceFileLoader
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

import drills
from drills.core import config
from drills.core.procs import die_with_parent

ROOT = config.project_root()
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _files(*parts: str) -> list[Path]:
    out = []
    for part in parts:
        p = ROOT / part
        out += [p] if p.is_file() else [f for f in p.rglob("*.py") if "__pycache__" not in f.parts]
    return out


def third_party(files: list[Path]) -> set[str]:
    """The distributions these files import (top-level modules that are neither stdlib nor the project's own)."""
    local = {f.stem for f in _files("tests", "lanes", "benchmarks", "fixtures")} | {"drills", "conftest"}
    mods: set[str] = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                mods |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                mods.add(node.module.split(".")[0])
    mods = {m for m in mods if m not in sys.stdlib_module_names and m not in local and m != "__future__"}
    by_module = metadata.packages_distributions()
    missing = sorted(m for m in mods if m not in by_module)
    assert missing == [], f"imported but installed by no distribution here: {missing}"
    return {canon(d) for m in mods for d in by_module[m]}


def _run_as_module(files: list[Path]) -> set[str]:
    """Distributions drills runs as `python -m X` (not imported, still needed)."""
    mods = {m.split(".")[0] for f in files for m in re.findall(r'"-m",\s*"([\w.]+)"', f.read_text())}
    by_module = metadata.packages_distributions()
    return {canon(d) for m in mods if m != "drills" for d in by_module.get(m, [m])}


def declared(reqs: list[str]) -> set[str]:
    return {canon(Requirement(r).name) for r in reqs}


def test_runtime_dependencies_are_what_the_package_imports_or_runs():
    package = _files("drills")
    # the locustfiles are run by `python -m locust` with the package's load: their imports are the package's
    needed = third_party(package + _files("fixtures/locustfiles")) | _run_as_module(package)
    assert declared(PROJECT["dependencies"]) == needed
    assert "requests" not in declared(PROJECT["dependencies"]) and "urllib3" in needed


def test_the_test_extra_is_what_the_tests_add():
    runtime, extra = declared(PROJECT["dependencies"]), declared(PROJECT["optional-dependencies"]["test"])
    used = third_party(_files("tests", "lanes", "benchmarks", "conftest.py"))
    assert used - runtime <= extra, f"tests import undeclared {sorted(used - runtime - extra)}"
    # pytest-xdist is a plugin the README's test command uses (-n), never imported
    assert "-n $(TEST_WORKERS)" in (ROOT / "Makefile").read_text()
    assert extra == (used - runtime) | {"pytest-xdist"}
    assert {"pytest", "hypothesis", "jsonschema"} <= used


def test_constraints_pin_every_distribution_of_the_test_install_at_the_version_here():
    loader = SourceFileLoader("freeze_constraints", str(ROOT / ".ci" / "freeze-constraints"))
    spec = importlib.util.spec_from_loader("freeze_constraints", loader)
    freeze = importlib.util.module_from_spec(spec)
    loader.exec_module(freeze)
    closure = freeze.closure(PROJECT["dependencies"] + PROJECT["optional-dependencies"]["test"])
    pins = dict(line.split("==", 1) for line in (ROOT / "constraints.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    assert pins == closure, "constraints.txt differs from this environment: regenerate with .ci/freeze-constraints"
    assert {"kubernetes", "urllib3", "pytest", "pytest-xdist", "hypothesis", "jsonschema"} <= set(pins)


def test_install_and_ci_use_the_test_extra_and_the_constraints():
    install = [ln for ln in (ROOT / "Makefile").read_text().splitlines() if "pip install" in ln and "$(PYTHON)" in ln]
    assert install and all("-c constraints.txt" in ln and "'.[test]'" in ln for ln in install)
    assert "make install" in (ROOT / "examples" / "ci-matrix.yml").read_text()
    assert "-c constraints.txt" in (ROOT / "Containerfile").read_text()


def test_the_python_claimed_is_the_one_tested_here():
    assert SpecifierSet(PROJECT["requires-python"]).contains(platform.python_version())
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"Programming Language :: Python :: {minor}" in PROJECT["classifiers"]


def classified_minors() -> set[str]:
    prefix = "Programming Language :: Python :: 3."
    return {f"3.{c.removeprefix(prefix)}" for c in PROJECT["classifiers"]
            if c.startswith(prefix) and c.removeprefix(prefix).isdigit()}


def test_requires_python_admits_exactly_the_minors_of_the_classifiers():
    """The claim is one list of minors: pip installs on exactly those tests/test_install.py checks, no later one."""
    classified = classified_minors()
    spec = SpecifierSet(PROJECT["requires-python"])
    admitted = {f"3.{n}" for n in range(40) if any(spec.contains(f"3.{n}.{patch}") for patch in (0, 1, 99))}
    assert classified and admitted == classified


def test_the_ci_example_spreads_its_shards_over_every_claimed_python():
    job = yaml.safe_load((ROOT / "examples" / "ci-matrix.yml").read_text())["jobs"]["shard"]
    matrix = job["strategy"]["matrix"]
    pythons = {row["shard"]: row["python"] for row in matrix["include"]}
    assert set(pythons) == set(matrix["shard"]) and set(pythons.values()) == classified_minors()
    setup = next(s for s in job["steps"] if "setup-python" in s.get("uses", ""))
    assert setup["with"]["python-version"] == "${{ matrix.python }}"


def test_nothing_loads_the_pytest_plugin_by_itself():
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("entry-points", {})
    assert "pytest11" not in entry_points
    # asked for by name: `pytest -p drills` loads the plugin module through the package's pytest_plugins
    assert drills.pytest_plugins == ["drills.pytest_plugin"]


def test_the_wheel_build_records_its_commit(monkeypatch):
    spec = importlib.util.spec_from_file_location("drills_setup", ROOT / "setup.py")
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)               # not __main__: defines the build, runs nothing
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          timeout=30, preexec_fn=die_with_parent).stdout.strip()
    monkeypatch.delenv("DRILLS_BUILD_COMMIT", raising=False)
    assert setup_py._commit() == head and len(head) == 40
    monkeypatch.setenv("DRILLS_BUILD_COMMIT", "0123abcd")       # a copy without .git (the Containerfile's)
    assert setup_py._commit() == "0123abcd"
    assert set(setup_py.DATA) == {"fixtures", "lanes"} and all((ROOT / d).is_dir() for d in setup_py.DATA)


def test_the_makefiles_test_extras_are_what_the_test_session_builds():
    # make test picks its parallelism from whether these are built (Makefile TOOLCHAIN_BUILT): the same list the
    # session's background build makes, or a warm machine would be taken for a cold one (or the reverse)
    # read from the file, not imported: "conftest" names tests/conftest.py or tests/faults/conftest.py depending on
    # which one the worker loaded last
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    SESSION_EXTRAS = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                          and any(isinstance(t, ast.Name) and t.id == "SESSION_EXTRAS" for t in n.targets))
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("TEST_EXTRAS = "))
    assert line.removeprefix("TEST_EXTRAS = ").split(",") == list(SESSION_EXTRAS)
