"""drills.kube.lazy_client: the client library's packages served lazily serve exactly the names the library's own
packages export, from the same modules, and import only what is read."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from drills.kube import lazy_client

PACKAGES = lazy_client.PACKAGES


def _python(code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


EXPORTS = """
    import importlib, json, sys
    {setup}
    out = {{}}
    for p in {packages!r}:
        mod = importlib.import_module(p)
        names = sorted(getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")])
        out[p] = {{}}
        for n in names:
            v = getattr(mod, n)
            out[p][n] = v.__name__ if isinstance(v, type(sys)) else f"{{v.__module__}}.{{v.__qualname__}}" \\
                if hasattr(v, "__qualname__") else repr(v)
    out["lazy"] = type(sys.modules["kubernetes.client"]).__name__ == "module" and \\
        "CoreV1Api" not in vars(sys.modules["kubernetes.client"]) if {lazy!r} else None
    print(json.dumps(out))
"""


def test_the_lazy_packages_export_what_the_library_exports_from_the_same_modules():
    lazy = _python(EXPORTS.format(setup="from drills.kube import lazy_client; assert lazy_client.install()", packages=PACKAGES[1:], lazy=True))
    real = _python(EXPORTS.format(setup="import kubernetes", packages=PACKAGES[1:], lazy=False))
    for p in PACKAGES[1:]:
        # the real packages also hold their submodules as attributes; the names they export are the lazy ones' all
        missing = {n: v for n, v in lazy[p].items() if real[p].get(n) != v}
        assert not missing, (p, dict(list(missing.items())[:5]))
        assert len(lazy[p]) > (1 if p == "kubernetes" else 20), (p, len(lazy[p]))
    assert len(lazy["kubernetes.client.models"]) > 700 and len(lazy["kubernetes.client.api"]) > 50


def test_a_process_imports_only_the_api_and_models_it_reads():
    out = _python("""
        import json, sys
        from drills.kube import k8s
        assert "kubernetes" not in sys.modules              # drills.kube.k8s: nothing until the client is used
        k8s.client.Configuration
        from kubernetes import client, config, watch
        from kubernetes.client.rest import ApiException
        pod = client.ApiClient().deserialize(type("R", (), {"data": json.dumps({"metadata": {"name": "p"},
                                                                                "spec": {"containers": []}})})(),
                                             "V1Pod")
        api = client.CoreV1Api(client.ApiClient())
        print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("kubernetes")),
                          "pod": [type(pod).__name__, pod.metadata.name], "api": type(api).__name__,
                          "exc": issubclass(ApiException, Exception), "version": __import__("kubernetes").__version__}))
    """)
    assert out["pod"] == ["V1Pod", "p"] and out["api"] == "CoreV1Api" and out["exc"], out
    assert "kubernetes.client.api.core_v1_api" in out["modules"]
    assert "kubernetes.client.api.apps_v1_api" not in out["modules"]          # never read: never imported
    assert "kubernetes.client.models.v1_deployment" not in out["modules"]
    assert len(out["modules"]) < 120, len(out["modules"])                     # the library's own import: ~870
    assert out["version"] and out["version"][0].isdigit(), out


def test_a_library_imported_already_is_left_as_it_is():
    out = _python("""
        import json, sys
        import kubernetes
        real = sys.modules["kubernetes.client"]
        from drills.kube import lazy_client
        print(json.dumps({"installed": lazy_client.install(), "same": sys.modules["kubernetes.client"] is real}))
    """)
    assert out == {"installed": False, "same": True}


def test_a_package_file_that_is_not_the_plain_list_is_refused(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text('"""doc"""\nfrom __future__ import absolute_import\n__version__ = "1.0"\n'
                    'from kubernetes.client.api.core_v1_api import CoreV1Api  # noqa\n')
    assert lazy_client._parse(init, "kubernetes.client") == (
        {"CoreV1Api": "kubernetes.client.api.core_v1_api"}, {"__version__": "1.0"})
    for extra in ("import os", "if True:\n    pass", "from .api import x", "X = compute()"):
        init.write_text(f"from kubernetes.client.api.core_v1_api import CoreV1Api\n{extra}\n")
        assert lazy_client._parse(init, "kubernetes.client") is None, extra
