"""The package's shape stays as designed: imports point one way (nothing imports drills.cli, no import circle),
modules stay small, lanes are registered runbooks with their data and tests in one place each, and every
supported controller version has expectations in every lane (or says why not)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from drills import config, lanes

PKG = config.project_root() / "drills"
MAX_LINES = 500


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every drills.* module a file imports, at the top or inside a function (relative imports resolved)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("drills")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("drills"):
                continue
            out.add(mod)
            for a in node.names:          # `from . import timeline` imports a module
                if (PKG.parent / Path(*f"{mod}.{a.name}".split("."))).with_suffix(".py").exists() or \
                        (PKG.parent / Path(*f"{mod}.{a.name}".split(".")) / "__init__.py").exists():
                    out.add(f"{mod}.{a.name}")
    return out - {me}


def graph() -> dict[str, set[str]]:
    mods = {module_name(p): p for p in PKG.rglob("*.py")}
    return {m: {i for i in imports_of(p) if i in mods} for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_nothing_imports_the_command_line():
    g = graph()
    # `python -m drills` (drills/__main__.py) is the program's entry: it runs the command line
    assert [m for m, deps in g.items() if "drills.cli" in deps and m != "drills.__main__"] == []


def test_no_import_circle_in_the_package():
    g = graph()
    # a package's __init__ re-exporting its own modules is not a circle of the design
    g = {m: {d for d in deps if not (m.startswith(d + ".") and d in g)} for m, deps in g.items()}
    assert cycles(g) == []


def test_the_circle_check_sees_a_circle():
    assert cycles({"drills.a": {"drills.b"}, "drills.b": {"drills.c"}, "drills.c": {"drills.a"}}) == [
        ["drills.a", "drills.b", "drills.c"]]


def test_modules_are_small():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_one_assigns_another_objects_internals():
    pattern = re.compile(r"\b(?!self\b)\w+\.(recorder|run_label|holds|_\w+)\s*=(?!=)")
    hits = [f"{p.relative_to(config.project_root())}:{i}: {line.strip()}"
            for p in [*PKG.rglob("*.py"), *(config.project_root() / "lanes").rglob("*.py")]
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_lanes_folder_holds_only_pytest_files_one_folder_per_lane():
    root = config.project_root() / "lanes"
    files = [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert all(p.name == "conftest.py" or re.fullmatch(r"test_\w+\.py", p.name) for p in files), files
    assert sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(lanes.REGISTRY)


def test_registry_is_in_lane_order_with_data_and_tests():
    assert list(lanes.REGISTRY)[:4] == ["a", "b", "abort", "order"] and list(lanes.REGISTRY)[4:] == ["escape", "scan",
                                                                                                   "alert"]
    for lane in lanes.LANES:
        assert lane.data_dir().is_dir() and (lane.data_dir() / "expectations.yaml").is_file(), lane.key
        assert lane.tests_dir().is_dir(), lane.key


@pytest.mark.parametrize("key", list(lanes.REGISTRY))
def test_every_supported_version_has_expectations_or_says_why_not(key):
    entries = lanes.get(key).expectation_versions()
    missing = [v for v in config.SUPPORTED_CONTROLLERS if v not in entries]
    assert missing == [], f"lane {key}: no expectations for {missing} (add them, or 'unverified: true' with a reason)"
    for v in config.SUPPORTED_CONTROLLERS:
        if entries[v].get("unverified"):
            assert str(entries[v].get("reason") or "").strip(), (key, v)


def test_fixtures_hold_data_only():
    code = [p for p in (config.project_root() / "fixtures").rglob("*.py") if "locustfiles" not in p.parts]
    assert code == []


# a cached component's file read by path: the build may not have written it yet (a cold cache), or may be
# writing it right now; Toolchain.get / .rollouts / .controller / .component / .kubernetes build it or wait
_BY_PATH = re.compile(r"\.(rollouts_dir|kube_bin)\(|\.bin\(\s*[\"']|"
                      r"cache_dir\(\)\s*/\s*[\"'](rollouts|kubernetes|kwok|etcd|helm|prometheus|registry|istio-crds)[\"']")


def test_no_test_opens_a_cached_component_by_path():
    root = config.project_root()
    hits = [f"{p.relative_to(root)}:{i}: {line.strip()}"
            for folder in ("tests", "lanes", "benchmarks") for p in (root / folder).rglob("*.py")
            if p != Path(__file__).resolve() for i, line in enumerate(p.read_text().splitlines(), 1) if _BY_PATH.search(line)]
    assert hits == [], "get the component through drills.toolchain.Toolchain (get, rollouts, controller, component):\n" \
        + "\n".join(hits)


def test_the_by_path_check_sees_a_path():
    assert _BY_PATH.search('binary = Toolchain().rollouts_dir("v1.8.2") / "rollouts-controller"')
    assert _BY_PATH.search('real = config.cache_dir() / "rollouts" / controller_version')
    assert not _BY_PATH.search('binary = Toolchain().controller("v1.8.2")')
