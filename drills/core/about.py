"""`drills version` (and `drills --version`): this drills, the commit it is (a checkout's HEAD, or the commit an
installed wheel was built from), where its data, reports and cache are, and the versions of the Go components it
builds (drills.core.config pins them), with the Go on PATH that builds them."""
from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

from .. import __version__
from . import config
from .errors import EXIT_OK
from .procs import die_with_parent

GO_NEEDED = "1.26"          # the oldest Go the toolchain builds with (newer modules bring their own, GOTOOLCHAIN)


def _run(args: list[str]) -> str | None:
    # from /, with the Go on PATH as it is (GOTOOLCHAIN=local: a go.mod nearby never makes it fetch another)
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=20, cwd="/", stdin=subprocess.DEVNULL,
                           env=dict(os.environ, GOTOOLCHAIN="local"), preexec_fn=die_with_parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def commit() -> tuple[str | None, str | None]:
    """(commit, where it was read): the checkout's HEAD ('checkout'), else the wheel's build record ('build')."""
    root = config.checkout_root()
    if root is not None:
        head = _run(["git", "-C", str(root), "rev-parse", "HEAD"])
        if head:
            return head, "checkout"
    try:
        built = json.loads((config.PACKAGE / "_data" / "build.json").read_text())
    except (OSError, ValueError):
        return None, None
    return (built.get("commit"), "build") if built.get("commit") else (None, None)


def info() -> dict:
    sha, source = commit()
    go = _run(["go", "env", "GOVERSION"])
    return {
        "drills": __version__,
        "commit": sha,
        "commit_from": source,
        "checkout": str(config.checkout_root()) if config.checkout_root() else None,
        "python": platform.python_version(),
        "go": go,
        "go_needed": f">= {GO_NEEDED}",
        "go_toolchain_for_newer_modules": config.NEWER_GO_TOOLCHAIN,
        "components": {"kubernetes": config.KUBERNETES_VERSION, "kwok": config.KWOK_VERSION,
                       "etcd": config.ETCD_VERSION, "helm": config.HELM_VERSION,
                       "istio-api": config.ISTIO_API_VERSION, "registry": config.REGISTRY_VERSION,
                       "prometheus": config.PROMETHEUS_VERSION,
                       "kube-state-metrics": config.KUBE_STATE_METRICS_VERSION},
        "controllers": {"supported": list(config.SUPPORTED_CONTROLLERS), "default": config.DEFAULT_CONTROLLER,
                        "tested_by_make_test": list(config.TEST_CONTROLLERS)},
        "data": str(config.fixtures_dir()),
        "reports": str(config.reports_dir()),
        "cache": str(config.cache_dir()),
    }


def text(d: dict) -> str:
    sha = f"commit {d['commit'][:12]} ({'this checkout' if d['commit_from'] == 'checkout' else 'built from'})" \
        if d["commit"] else "commit unknown"
    lines = [f"drills {d['drills']}, {sha}; python {d['python']}; go {d['go'] or 'not on PATH'} "
             f"(needs {d['go_needed']})",
             "components: " + ", ".join(f"{k} {v}" for k, v in d["components"].items()),
             f"controllers: {', '.join(d['controllers']['supported'])} (default {d['controllers']['default']})",
             f"data {d['data']}; reports {d['reports']}; cache {d['cache']}"]
    return "\n".join(lines)


def cmd_version(args) -> int:
    d = info()
    print(json.dumps(d, indent=2) if getattr(args, "json", False) else text(d))
    return EXIT_OK
