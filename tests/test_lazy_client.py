"""drills.kube.lazy_client: the client library's packages served lazily serve exactly the names the library's own
packages export, from the same modules, and import only what is read."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from drills.kube import lazy_client

PACKAGES = lazy_client.PACKAGES
LAZY = "from drills.kube import lazy_client; assert lazy_client.install()"


def _python(code: str) -> dict:
    r = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", textwrap.dedent(code)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


# every name a package exports (its __all__, else its public attributes), as "module.qualname" or a module's name;
# then what `from kubernetes.client import *` binds once the client has been used
EXPORTS = """
    import importlib, json, sys
    {setup}
    def named(v):
        return v.__name__ if isinstance(v, type(sys)) else f"{{v.__module__}}.{{v.__qualname__}}" \\
            if hasattr(v, "__qualname__") else repr(v)
    out = {{}}
    for p in {packages!r}:
        mod = importlib.import_module(p)
        names = getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")]
        out[p] = {{n: named(getattr(mod, n)) for n in sorted(names)}}
    importlib.import_module("kubernetes.client").ApiClient       # the client used, as a command uses it
    star = {{}}
    exec("from kubernetes.client import *", star)
    out["star"] = {{n: named(v) for n, v in star.items() if not n.startswith("_") and n != "absolute_import"}}
    print(json.dumps(out))
"""


def test_the_lazy_packages_export_what_the_library_exports_from_the_same_modules():
    lazy = _python(EXPORTS.format(setup=LAZY, packages=PACKAGES))
    real = _python(EXPORTS.format(setup="import kubernetes", packages=PACKAGES))
    for p in PACKAGES:
        # the real packages also hold the submodules their imports loaded as attributes (read through the lazy ones
        # below); every name the lazy ones export is the library's, the same object
        wrong = {n: v for n, v in lazy[p].items() if real[p].get(n) != v}
        assert not wrong, (p, dict(list(wrong.items())[:5]))
        assert len(lazy[p]) >= (8 if p == "kubernetes" else 60), (p, len(lazy[p]))
    assert len(lazy["kubernetes.client.models"]) > 700
    # a star import binds the same names to the same objects
    assert lazy["star"] == real["star"], (set(lazy["star"]) ^ set(real["star"]))


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
        import kubernetes
        # submodules read as attributes, as the library's own code reads them (client.rest.ApiException)
        subs = [kubernetes.client.rest.ApiException is ApiException, kubernetes.client.models.v1_pod.V1Pod is type(pod),
                kubernetes.client.api.core_v1_api.CoreV1Api is type(api)]
        modules = sorted(m for m in sys.modules if m.startswith("kubernetes"))
        # and one no import has loaded yet, read as an attribute the same way
        subs.append(kubernetes.client.models.v1_deployment.V1Deployment is client.V1Deployment)
        print(json.dumps({"modules": modules,
                          "pod": [type(pod).__name__, pod.metadata.name], "api": type(api).__name__, "subs": subs,
                          "exc": issubclass(ApiException, Exception), "version": kubernetes.__version__}))
    """)
    assert out["pod"] == ["V1Pod", "p"] and out["api"] == "CoreV1Api" and out["exc"], out
    assert out["subs"] == [True, True, True, True], out
    assert "kubernetes.client.api.core_v1_api" in out["modules"]
    assert "kubernetes.client.api.apps_v1_api" not in out["modules"]          # never read: never imported
    assert "kubernetes.client.models.v1_deployment" not in out["modules"]
    assert len(out["modules"]) < 60, out["modules"]                          # the library's own import: ~870
    assert out["version"] and out["version"][0].isdigit(), out


def test_a_library_imported_already_is_left_as_it_is_and_the_answer_is_kept():
    out = _python("""
        import json, sys
        import kubernetes.config
        before = {k: id(v) for k, v in sys.modules.items() if k.startswith("kubernetes")}
        from drills.kube import lazy_client
        answers = [lazy_client.install(), lazy_client.install()]
        after = {k: id(v) for k, v in sys.modules.items() if k.startswith("kubernetes")}
        print(json.dumps({"answers": answers, "same": before == after}))
    """)
    assert out == {"answers": [False, False], "same": True}


def test_a_package_file_that_is_not_the_plain_list_is_refused(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text('"""doc"""\nfrom __future__ import absolute_import\n__version__ = "1.0"\n'
                    'from kubernetes.client.api.core_v1_api import CoreV1Api  # noqa\n')
    assert lazy_client._parse(init, "kubernetes.client") == (
        {"CoreV1Api": "kubernetes.client.api.core_v1_api"}, {"__version__": "1.0"})
    for extra in ("import os", "if True:\n    pass", "from .api import x", "X = compute()"):
        init.write_text(f"from kubernetes.client.api.core_v1_api import CoreV1Api\n{extra}\n")
        assert lazy_client._parse(init, "kubernetes.client") is None, extra
