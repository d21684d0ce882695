"""A command that never talks to a cluster never imports the Kubernetes client: ``import kubernetes`` imports every
API model (~870 modules, about half a second of CPU), which a plan, a refusal, ``--help`` or a file scan has no use
for (drills.kube.k8s imports it on first use).  And once a command does use it, the names stand for the client's own."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from drills.core import config

ROOT = config.project_root()
# runs one drills command; at its exit, whatever way it ends, writes the kubernetes modules it imported
PROBE = ("import atexit, os, runpy, sys\n"
         "def said():\n"
         "    of = os.environ.get('DRILLS_IMPORTS_OF', 'kubernetes').split(',')\n"
         "    with open(os.environ['DRILLS_IMPORTS_OUT'], 'w') as f:\n"
         "        f.write(' '.join(sorted(m for m in sys.modules if any(m == o or m.startswith(o + '.') for o in of))))\n"
         "atexit.register(said)\n"
         "sys.argv = ['drills', *sys.argv[1:]]\n"
         "runpy.run_module('drills', run_name='__main__', alter_sys=True)\n")


def imported(tmp_path, *args, of: str = "kubernetes") -> tuple[int, str]:
    """A drills command's exit code, and the modules of ``of`` (comma-separated packages) it had imported."""
    out = tmp_path / "imports.txt"
    r = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, DRILLS_IMPORTS_OUT=str(out), DRILLS_REPORTS=str(tmp_path),
                                         DRILLS_IMPORTS_OF=of, DRILLS_CLUSTER=f"imports-{os.getpid()}"))
    assert out.is_file(), r.stderr[-2000:]
    (tmp_path / "stdout.txt").write_text(r.stdout)
    return r.returncode, out.read_text()


@pytest.mark.parametrize("args, rc", [
    (("run", "--plan", "--controller", "v1.8.2,v1.10.2", "--lanes", "all"), 0),
    (("run", "--controller", "v0.0.1", "--lanes", "a"), 2),
    (("run", "--help"), 0),
    (("upgrade-check", "--help"), 0),
    (("report", "--help"), 0),
    (("lanes",), 0),
    # a Rollout file scanned for real (exposed: exit 1), then one with no Rollout (exit 2)
    (("scan", str(ROOT / "fixtures" / "alerts" / "rollouts.yaml")), 1),
    (("scan", str(ROOT / "examples" / "indexed-job.yaml")), 2),
    (("version",), 0),
], ids=lambda a: " ".join(a) if isinstance(a, tuple) else None)
def test_a_command_that_talks_to_no_cluster_imports_no_kubernetes_client(tmp_path, args, rc):
    code, modules = imported(tmp_path, *args)
    assert code == rc
    assert modules == ""


# the drill machinery: what the local commands (a test run calls them hundreds of times) never load
MACHINERY = "drills.lanes,drills.drill,drills.record,drills.charts,drills.run,kubernetes"


@pytest.mark.parametrize("args, rc", [
    (("cluster", "status"), 1),             # no cluster of this name
    (("cluster", "down"), 0),
    (("toolchain", "list", "--json"), 0),
    (("restore", "--journal", "no-such-journal.json"), 2),
], ids=lambda a: " ".join(a) if isinstance(a, tuple) else None)
def test_the_cluster_toolchain_and_restore_commands_load_no_drill_machinery(tmp_path, args, rc):
    code, modules = imported(tmp_path, *args, of=MACHINERY)
    assert code == rc
    if args == ("cluster", "status"):       # its answer, not the catch-all's exit 1 of a command that broke
        assert (tmp_path / "stdout.txt").read_text().strip() == "no embedded cluster"
    allowed = ("drills.drill.lease", "drills.drill.safety") if args[0] == "restore" else ()
    assert [m for m in modules.split() if not m.startswith(allowed or "\0") and m != "drills.drill"] == []


def test_the_client_is_imported_on_first_use_and_its_names_are_the_clients_own(tmp_path):
    r = subprocess.run([sys.executable, "-c",
                        "import sys\n"
                        "from drills.kube import k8s\n"
                        "assert 'kubernetes' not in sys.modules\n"
                        "meta = k8s.client.V1ObjectMeta(name='x')\n"
                        "import kubernetes.client, kubernetes.client.rest, kubernetes.watch.watch\n"
                        "assert type(meta) is kubernetes.client.V1ObjectMeta\n"
                        "assert k8s.ApiException is kubernetes.client.rest.ApiException\n"
                        "assert k8s.iter_resp_lines is kubernetes.watch.watch.iter_resp_lines\n"
                        "assert k8s.dynamic.DynamicClient is __import__('kubernetes.dynamic').dynamic.DynamicClient\n"
                        "try:\n"
                        "    k8s.no_such_name\n"
                        "except AttributeError:\n"
                        "    pass\n"
                        "else:\n"
                        "    raise SystemExit('no AttributeError')\n"
                        "import copy, pickle\n"      # copied or pickled, the stand-in stays one (no KeyError)
                        "assert copy.copy(k8s.client).V1ObjectMeta is kubernetes.client.V1ObjectMeta\n"
                        "assert pickle.loads(pickle.dumps(k8s.dynamic)).DynamicClient is k8s.dynamic.DynamicClient\n"],
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr


def test_no_module_of_the_package_imports_the_client_when_it_is_imported():
    """At a module's top level the client comes only through drills.kube.k8s (a function may import it: it runs
    when used); a class whose base is the client's is made on first use (drills.kube.api.kube_client_class)."""
    import ast
    top_level = []
    for path in sorted((ROOT / "drills").rglob("*.py")):
        if path.name == "k8s.py" and path.parent.name == "kube":
            continue
        todo = list(ast.parse(path.read_text(), str(path)).body)
        while todo:                         # what runs on import: the module's body, its ifs, trys and class bodies
            node = todo.pop()
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                todo.extend(ast.iter_child_nodes(node))
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            top_level += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                          if n.split(".")[0] == "kubernetes"]
    assert top_level == []
