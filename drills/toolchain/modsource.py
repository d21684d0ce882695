"""A Go module's source from the module proxy, under the toolchain rule the builds use.

The machine's Go may be older than a module's ``go`` directive (Argo Rollouts v1.9+ asks for go >= 1.26.10):
then every go command on that module runs with ``GOTOOLCHAIN=<config.NEWER_GO_TOOLCHAIN>`` (the go command
fetches that toolchain from the proxy once per machine).  The rule is read from the module's own go.mod, never
from a table of versions, so the build and every reader of the source (lane order's branch map, the scan's
version facts, the CRDs of a release) follow one rule.  ``module_source`` downloads the module's source only
(``go mod download``): nothing is built.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..core import config
from ..core.procs import run_bounded

DOWNLOAD_TIMEOUT_S = 900.0          # a module zip and, once per machine, the newer toolchain (~76 MB)
MAX_JSON_BYTES = 1 << 20
_REQUIRES_RE = re.compile(r"requires go >= ?([0-9][0-9A-Za-z.]*)")
_GO_RE = re.compile(r"^go\s+([0-9][0-9A-Za-z.]*)\s*$", re.M)


class ModuleUnavailable(RuntimeError):
    """The module's source could not be downloaded (no module proxy, an unknown version, no toolchain)."""


@dataclass(frozen=True)
class ModuleInfo:
    module: str
    version: str
    dir: Path              # the extracted source in the module cache
    gomod: Path            # its go.mod (in the module cache's download folder)
    gotoolchain: str       # "local", or the newer toolchain its go directive needs


def go_version_tuple(text: str) -> tuple[int, ...]:
    """'go1.26.8' / '1.26.10' / '1.27rc1' -> (1, 26, 8) / (1, 26, 10) / (1, 27, 0)."""
    nums = re.findall(r"\d+", text.removeprefix("go").split("rc")[0].split("beta")[0])
    out = tuple(int(n) for n in nums[:3])
    return out + (0,) * (3 - len(out))


@lru_cache(maxsize=1)
def local_go_version() -> str:
    """The machine's Go ('1.26.8'), as ``go env GOVERSION`` prints it without the 'go'."""
    from .components import require_go
    require_go()
    try:
        r = run_bounded(["go", "env", "GOVERSION"], timeout=60, env=dict(os.environ, GOTOOLCHAIN="local"))
    except subprocess.TimeoutExpired:
        raise ModuleUnavailable("go env GOVERSION did not finish within 60s") from None
    if r.returncode != 0 or not r.stdout.strip():
        raise ModuleUnavailable(f"go env GOVERSION failed: {r.stderr.strip()[-300:]}")
    return r.stdout.strip().removeprefix("go")


def toolchain_for_go_directive(directive: str | None) -> str:
    """'local' when the machine's Go satisfies a go.mod's ``go`` directive, else the newer toolchain."""
    if not directive or go_version_tuple(directive) <= go_version_tuple(local_go_version()):
        return "local"
    if go_version_tuple(directive) > go_version_tuple(config.NEWER_GO_TOOLCHAIN):
        raise ModuleUnavailable(f"the module asks for go >= {directive}, newer than this machine's go "
                                f"{local_go_version()} and than {config.NEWER_GO_TOOLCHAIN}")
    return config.NEWER_GO_TOOLCHAIN


def go_env(gotoolchain: str = "local") -> dict:
    """The environment every go command of the toolchain runs in."""
    env = dict(os.environ)
    env["GOTOOLCHAIN"] = gotoolchain
    env["GOFLAGS"] = "-mod=mod -buildvcs=false -modcacherw"      # a module cache that rm -rf can remove
    env.setdefault("CGO_ENABLED", "0")
    return env


def _download(module: str, version: str, gotoolchain: str, timeout: float) -> dict:
    # outside any module of the caller's (a go.mod in the working directory would take part)
    with tempfile.TemporaryDirectory(prefix="drills-gomod-") as cwd:
        try:
            r = run_bounded(["go", "mod", "download", "-json", f"{module}@{version}"], timeout=timeout, cwd=cwd,
                            env=go_env(gotoolchain))
        except subprocess.TimeoutExpired:
            raise ModuleUnavailable(f"{module}@{version}: go mod download did not finish within {timeout:.0f}s "
                                    f"(module proxy unreachable?)") from None
    out = r.stdout[:MAX_JSON_BYTES]
    try:
        info = json.loads(out[out.index("{"): out.rindex("}") + 1])
    except ValueError:
        raise ModuleUnavailable(f"{module}@{version}: go mod download failed: "
                                f"{(r.stderr or r.stdout).strip()[-400:] or f'exit {r.returncode}'}") from None
    return info if isinstance(info, dict) else {}


@lru_cache(maxsize=None)
def _module_info(module: str, version: str, timeout: float) -> ModuleInfo:
    info = _download(module, version, "local", timeout)
    toolchain = "local"
    err = str(info.get("Error") or "")
    needs = _REQUIRES_RE.search(err)
    if not info.get("Dir") and (needs or info.get("GoMod")):
        directive = needs.group(1) if needs else None
        if directive is None and info.get("GoMod"):
            m = _GO_RE.search(Path(info["GoMod"]).read_text(errors="replace"))
            directive = m.group(1) if m else None
        toolchain = toolchain_for_go_directive(directive)
        if toolchain != "local":
            info = _download(module, version, toolchain, timeout)
            err = str(info.get("Error") or "")
    if not info.get("Dir") or not info.get("GoMod"):
        err = err or "no source in the module cache after go mod download"
        raise ModuleUnavailable(err if err.startswith(f"{module}@") else f"{module}@{version}: {err}")
    return ModuleInfo(module, version, Path(info["Dir"]), Path(info["GoMod"]), toolchain)


def module_source(module: str, version: str, timeout: float = DOWNLOAD_TIMEOUT_S) -> ModuleInfo:
    """The module's source (downloaded from the proxy when the module cache lacks it) and the toolchain its go
    directive needs.  ModuleUnavailable names module, version and the go command's error.  A success is
    remembered for the process; a failure is not (the next call tries again)."""
    return _module_info(module, version, timeout)


def rollouts_source(version: str) -> ModuleInfo:
    return module_source(config.ROLLOUTS_MODULE, version)
