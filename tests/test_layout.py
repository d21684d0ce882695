"""The package's shape stays as designed: imports point one way (nothing imports drills.cli, no import circle),
modules stay small, lanes are registered runbooks with their data and tests in one place each, and every
supported controller version has expectations in every lane (or says why not)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from drills.core import config
from drills import lanes

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


TOP_LEVEL = {"drills", "drills.__main__", "drills.cli", "drills.pytest_plugin"}


def folder_layers(text: str | None = None) -> dict[str, int]:
    """CONTRIBUTING.md's table: folder -> layer."""
    text = text if text is not None else (config.project_root() / "CONTRIBUTING.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `(\w+)/` \|", text, re.M)
    return {folder: int(layer) for layer, folder in rows}


def upward_imports(g: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Imports from a module's folder into a folder of a higher layer (or from a folder into the top level)."""
    def where(m: str) -> str | None:
        parts = m.split(".")
        return parts[1] if len(parts) > 1 and parts[1] in layers else None
    out = []
    for m, deps in g.items():
        a = where(m)
        for d in deps:
            b = where(d)
            if a is None or b == a or d == "drills":      # the top level may import any folder; `drills`: __version__
                continue
            if b is None or layers[b] > layers[a]:
                out.append(f"{m} ({a}, layer {layers[a]}) imports {d} ({b or 'the top level'}"
                           f"{'' if b is None else f', layer {layers[b]}'})")
    return sorted(out)


def test_the_folders_are_the_layers_and_imports_point_down():
    layers = folder_layers()
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert set(layers) == folders, "CONTRIBUTING.md's layer table and drills/'s folders differ"
    top = {module_name(p) for p in PKG.glob("*.py")}
    assert top == TOP_LEVEL, f"only {sorted(TOP_LEVEL)} at the top level: {sorted(top - TOP_LEVEL)}"
    assert upward_imports(graph(), layers) == []


def test_the_layer_check_sees_an_import_up():
    layers = folder_layers("| 0 | `core/` | x |\n| 4 | `drill/` | y |\n")
    assert layers == {"core": 0, "drill": 4}
    g = {"drills.core.wait": {"drills.drill.kit"}, "drills.drill.kit": {"drills.core.wait"}, "drills.cli": {"drills.drill.kit"}}
    assert upward_imports(g, layers) == ["drills.core.wait (core, layer 0) imports drills.drill.kit (drill, layer 4)"]


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
    # the registry is the one list: in BUILTIN's order (the brief's lanes A and B first), each key once
    assert list(lanes.REGISTRY) == [lane.key for lane in lanes.BUILTIN] and list(lanes.REGISTRY)[:2] == ["a", "b"]
    for lane in lanes.LANES:
        assert lane.data_dir().is_dir() and (lane.data_dir() / "expectations.yaml").is_file(), lane.key
        assert lane.tests_dir().is_dir(), lane.key


@pytest.mark.parametrize("key", list(lanes.REGISTRY))
def test_every_supported_version_has_expectations_or_says_why_not(key):
    entries = lanes.get(key).expectation_versions()
    keys = lanes.get(key).expectation_keys()
    missing = [v for v in keys if v not in entries]
    assert missing == [], f"lane {key}: no expectations for {missing} (add them, or 'unverified: true' with a reason)"
    for v in keys:
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


# --- every subprocess the product starts has a timeout and dies with drills ----------------------------------------
RUNS = {"run", "call", "check_call", "check_output"}      # subprocess functions that wait for the child's end
NEVER = {("os", "system"), ("os", "popen"), ("asyncio", "create_subprocess_exec"), ("asyncio", "create_subprocess_shell"),
         ("pty", "spawn")} | {("os", f) for f in ("spawnl", "spawnlp", "spawnv", "spawnvp", "posix_spawn",
                                                  "posix_spawnp", "fork", "forkpty", "execv", "execvp", "execve")}
# a child that must outlive the command that starts it, by design (file, function): why, and who takes it down
SUBPROCESS_EXEMPT = {
    ("cluster/embedded.py", "_spawn"): "the cluster's releaser and rollouts-controller outlive `drills cluster up` "
                                       "(the cluster stays up); state.json records each with its pid, start time and "
                                       "boot, and `cluster down` or the next run's reap takes it down",
}


def _dies_with_parent(call: ast.Call) -> bool:
    fn = next((k.value for k in call.keywords if k.arg == "preexec_fn"), None)
    return _a_die_with_parent(fn)


def _a_die_with_parent(fn) -> bool:
    """die_with_parent, or background_priority (die_with_parent, then a lower CPU priority: a toolchain build's go
    commands), or ``a if cond else b`` of two of them."""
    if isinstance(fn, ast.IfExp):
        return _a_die_with_parent(fn.body) and _a_die_with_parent(fn.orelse)
    return isinstance(fn, (ast.Name, ast.Attribute)) and (getattr(fn, "id", None) or fn.attr) in (
        "die_with_parent", "background_priority")


def _has_timeout(call: ast.Call) -> bool:
    t = next((k.value for k in call.keywords if k.arg == "timeout"), None)
    return t is not None and not (isinstance(t, ast.Constant) and t.value is None)


def subprocess_offences(source: str, name: str) -> list[str]:
    """Each call in ``source`` that starts a process without a timeout (subprocess.run, call, check_*) or without
    ``preexec_fn=die_with_parent`` (those and Popen), or by a way that offers neither (os.system, os.spawn*, ...),
    outside SUBPROCESS_EXEMPT: ``name:line: function: what is missing``."""
    tree = ast.parse(source)
    aliases = {a.asname or a.name: (n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               for a in n.names if n.module in ("subprocess", "os", "asyncio", "pty")}
    out = []

    def visit(node, func: str):
        for child in ast.iter_child_nodes(node):
            here = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Call):
                f = child.func
                target = ((f.value.id, f.attr) if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                          else aliases.get(f.id) if isinstance(f, ast.Name) else None)
                missing = []
                if target in NEVER:
                    missing = [f"{'.'.join(target)} (use drills.core.procs.run_bounded)"]
                elif target and target[0] == "subprocess" and target[1] in RUNS | {"Popen"}:
                    if any(k.arg is None for k in child.keywords):
                        missing.append("keywords passed as **kwargs (cannot be checked)")
                    if target[1] in RUNS and not _has_timeout(child):
                        missing.append("timeout=")
                    if not _dies_with_parent(child):
                        missing.append("preexec_fn=die_with_parent")
                if missing and (name, here) not in SUBPROCESS_EXEMPT:
                    out.append(f"{name}:{child.lineno}: {here}: subprocess.{target[1]} lacks {', '.join(missing)}"
                               if target[0] == "subprocess" else f"{name}:{child.lineno}: {here}: {missing[0]}")
            visit(child, here)
    visit(tree, "<module>")
    return out


def test_every_subprocess_has_a_timeout_and_dies_with_drills():
    hits = [h for p in sorted(PKG.rglob("*.py")) for h in subprocess_offences(p.read_text(), str(p.relative_to(PKG)))]
    assert hits == [], "every child gets a timeout and preexec_fn=drills.core.procs.die_with_parent (or " \
        "background_priority, which calls it; or runs through " \
        "drills.core.procs.run_bounded), or is listed in SUBPROCESS_EXEMPT with its reason:\n" + "\n".join(hits)


def test_background_priority_is_a_die_with_parent():
    """The subprocess rule takes ``preexec_fn=background_priority`` for ``die_with_parent``: it calls it first."""
    tree = ast.parse((PKG / "core" / "procs.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "background_priority")
    first = next(n for n in fn.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)))
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Call) and \
        getattr(first.value.func, "id", None) == "die_with_parent", ast.dump(first)
    assert subprocess_offences("import subprocess\nfrom drills.core.procs import background_priority\n"
                               "def f():\n    subprocess.Popen(['go'], preexec_fn=background_priority)\n"
                               "    subprocess.Popen(['go'], preexec_fn=background_priority if b else die_with_parent)\n",
                               "m.py") == []
    assert len(subprocess_offences("import subprocess\ndef f():\n"
                                   "    subprocess.Popen(['go'], preexec_fn=background_priority if b else other)\n",
                                   "m.py")) == 1


def test_every_exemption_names_a_function_that_starts_a_process():
    for (name, func), why in SUBPROCESS_EXEMPT.items():
        tree = ast.parse((PKG / name).read_text())
        fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == func), None)
        assert fn is not None and why.strip(), (name, func)
        assert any(isinstance(c, ast.Call) and getattr(c.func, "attr", None) == "Popen" for c in ast.walk(fn)), func


def test_the_subprocess_check_sees_what_is_missing():
    src = ("import subprocess, os\nfrom subprocess import Popen as P\nfrom drills.core.procs import die_with_parent\n"
           "def a():\n    subprocess.run(['x'], capture_output=True)\n"
           "def b():\n    subprocess.run(['x'], timeout=None, preexec_fn=die_with_parent)\n"
           "def c():\n    P(['x'])\n"
           "def d():\n    os.system('x')\n"
           "def e():\n    subprocess.check_output(['x'], **kw)\n"
           "def ok():\n    subprocess.run(['x'], timeout=5, preexec_fn=die_with_parent)\n"
           "    subprocess.Popen(['x'], preexec_fn=die_with_parent)\n")
    hits = subprocess_offences(src, "m.py")
    assert [h.split(": ", 2)[1] for h in hits] == ["a", "b", "c", "d", "e"], hits
    assert "timeout=, preexec_fn=die_with_parent" in hits[0] and hits[1].endswith("lacks timeout=")
    assert "Popen lacks preexec_fn" in hits[2] and "os.system" in hits[3] and "**kwargs" in hits[4]
    assert subprocess_offences("import subprocess\ndef _spawn():\n    subprocess.Popen(['x'])\n",
                               "cluster/embedded.py") == []
