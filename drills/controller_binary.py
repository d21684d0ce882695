"""A rollouts-controller the user built (for instance with an unmerged upstream fix applied).

The binary must be an executable that answers ``--version`` as a rollouts controller does.  Its rows are
keyed by the version it reports plus its sha256; CRDs default to those of the nearest release.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import config
from .toolchain.build import sha256_file


class ControllerBinaryError(ValueError):
    """Not an executable, or not a rollouts controller (exit 2)."""


@dataclass
class BinaryInfo:
    path: Path
    reported: str            # what the binary says, e.g. v1.8.2+unknown
    version: str             # normalised, e.g. v1.8.2 (or the raw string when it is not a release version)
    sha256: str
    nearest_release: str
    crds_dir: Path


def nearest_release(version: str | None) -> str:
    if not version:
        return config.DEFAULT_CONTROLLER
    try:
        want = config.version_tuple(version)
    except ValueError:
        return config.DEFAULT_CONTROLLER
    best = None
    for v in config.SUPPORTED_CONTROLLERS:
        t = config.version_tuple(v)
        key = (abs((t[0] * 1000 + t[1]) - (want[0] * 1000 + want[1])), abs(t[2] - want[2]))
        if best is None or key < best[0]:
            best = (key, v)
    return best[1]


def inspect_binary(path: Path, crds: Path | None = None) -> BinaryInfo:
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ControllerBinaryError(f"--controller-binary {path}: no such file")
    import os
    if not os.access(path, os.X_OK) or not path.stat().st_mode & 0o111:
        raise ControllerBinaryError(f"--controller-binary {path}: not an executable file")
    try:
        r = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=20)
    except OSError as e:
        raise ControllerBinaryError(f"--controller-binary {path}: cannot run it: {e}")
    except subprocess.TimeoutExpired:
        raise ControllerBinaryError(f"--controller-binary {path}: '--version' did not return within 20s")
    out = (r.stdout + r.stderr).strip()
    m = re.search(r"\bv?\d+\.\d+\.\d+[^\s\"]*", out)
    if r.returncode != 0 or not m or ("rollouts" not in out.lower() and not re.fullmatch(r"v?\d+\.\d+\.\d+\S*", out)):
        raise ControllerBinaryError(f"--controller-binary {path} does not start as a rollouts controller "
                                    f"('--version' gave exit {r.returncode}: {out[:200]!r})")
    reported = m.group(0)
    version = config.normalise_version(reported) or reported
    near = nearest_release(config.normalise_version(reported))
    if crds is None:
        from .toolchain import Toolchain
        crds = Toolchain().ensure_crds(near)
    crds = Path(crds)
    if not crds.is_dir() or not list(crds.glob("*.yaml")):
        raise ControllerBinaryError(f"--crds {crds}: no CRD files (*.yaml) there")
    return BinaryInfo(path=path, reported=reported, version=version, sha256=sha256_file(path),
                      nearest_release=near, crds_dir=crds)
