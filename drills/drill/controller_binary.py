"""A rollouts-controller the user built (for instance with an unmerged upstream fix applied).

The binary must be an executable that answers ``--version`` as a rollouts controller does.  It is named by
what it is, never by a release: the version it reports plus its short commit, ``v1.2.0+<commit>`` (the commit of
``--source`` when that is a git checkout, else the commit the binary reports -- upstream's Makefile stamps it in:
``v1.2.0+351efb7`` --, else the first 12 characters of the binary's sha256), in plot titles,
captions, test ids, leg ids, cluster names and headings alike.  Its CRDs come from ``--crds DIR``,
else from ``--source DIR`` (the tree's own ``manifests/crds/*-crd.yaml``), else from the release nearest to
the reported version -- with a warning that says so, which the console and the report show.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..core import config, inputs
from ..core.errors import BadInput
from ..core.procs import run_bounded
from ..core.provenance import SHORT, git_commit
from ..toolchain.build import sha256_file


VERSION_TIMEOUT_S = 20.0


class ControllerBinaryError(ValueError):
    """Not an executable, or not a rollouts controller (exit 2)."""


CRDS_FROM_FLAG, CRDS_FROM_SOURCE, CRDS_FROM_NEAREST = "--crds", "--source", "nearest release"


@dataclass
class BinaryInfo:
    path: Path
    reported: str            # what the binary says, e.g. v1.2.0+351efb7
    version: str             # normalised, e.g. v1.2.0 (or the raw string when it is not a version)
    sha256: str
    nearest_release: str     # the release used for nothing but a fallback (CRDs, expectations)
    crds_dir: Path
    crd_origin: str = CRDS_FROM_FLAG        # --crds | --source | nearest release
    crd_warning: str | None = None
    commit: str | None = None               # the short commit it was built from (None: unknown)

    @property
    def name(self) -> str:
        """What every output calls it: the version it reports plus its commit (else its sha256 prefix)."""
        return f"{self.version}+{self.commit or self.sha256[:SHORT]}"

    @property
    def crd_source(self) -> str:
        return str(self.crds_dir)

    def cluster_kwargs(self) -> dict:
        """What EmbeddedCluster.up takes for this binary (its first argument: ``nearest_release``)."""
        return {"controller_binary": self.path, "crds_dir": self.crds_dir, "reported_version": self.reported,
                "crd_warning": self.crd_warning}


def source_crds(source: Path) -> Path | None:
    """The CRD folder of a source tree: ``manifests/crds`` with ``*-crd.yaml`` files, looked for at ``source``
    and, when it names ``rollout/`` or ``rollout/trafficrouting.go`` inside the tree, at the tree root."""
    p = Path(source).expanduser().resolve()
    start = p if p.is_dir() else p.parent
    for root in (start, start.parent) if start.name == "rollout" else (start,):
        crds = root / "manifests" / "crds"
        if crds.is_dir() and list(crds.glob("*-crd.yaml")):
            return crds
    return None


REPORTED_COMMIT_RE = re.compile(r"v?\d+\.\d+\.\d+\+([0-9a-f]{7,40})(\.dirty)?")


def reported_commit(reported: str) -> str | None:
    """The commit a controller's version string carries (upstream's ``v1.2.0+351efb7``, ``+351efb7.dirty`` from
    a dirty tree: ``351efb7-dirty``, as git_commit says it); None for ``+unknown``, a tag or anything else."""
    m = REPORTED_COMMIT_RE.fullmatch(reported or "")
    return (m.group(1) + ("-dirty" if m.group(2) else "")) if m else None


def built_from(source: Path | None, reported: str) -> str | None:
    """The commit to name a user-built controller by: ``--source``'s HEAD when that is a git checkout and agrees
    with the commit the binary reports (if it reports one); else the binary's own; None when neither tells."""
    own = reported_commit(reported)
    tree = git_commit(source, short=True) if source is not None else None
    if tree and (own is None or tree.startswith(own.removesuffix("-dirty"))):
        return tree
    return own


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


def inspect_binary(path: Path, crds: Path | None = None, source: Path | None = None) -> BinaryInfo:
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ControllerBinaryError(f"--controller-binary {path}: no such file")
    import os
    if not os.access(path, os.X_OK) or not path.stat().st_mode & 0o111:
        raise ControllerBinaryError(f"--controller-binary {path}: not an executable file")
    try:       # its own process group, killed with everything it started on a timeout or a signal
        r = run_bounded([str(path), "--version"], timeout=VERSION_TIMEOUT_S)
    except OSError as e:
        raise ControllerBinaryError(f"--controller-binary {path}: cannot run it: {e}")
    except subprocess.TimeoutExpired:
        raise ControllerBinaryError(f"--controller-binary {path}: '--version' did not return within "
                                    f"{VERSION_TIMEOUT_S:.0f}s: stopped it")
    out = (r.stdout + r.stderr).strip()
    m = re.search(r"\bv?\d+\.\d+\.\d+[^\s\"]*", out)
    if r.returncode != 0 or not m or ("rollouts" not in out.lower() and not re.fullmatch(r"v?\d+\.\d+\.\d+\S*", out)):
        raise ControllerBinaryError(f"--controller-binary {path} does not start as a rollouts controller "
                                    f"('--version' gave exit {r.returncode}: {out[:200]!r})")
    reported = m.group(0)
    version = config.normalise_version(reported) or reported
    near = nearest_release(config.normalise_version(reported))
    warning = None
    if crds is not None:
        origin = CRDS_FROM_FLAG
    elif source is not None and source_crds(source) is not None:
        crds, origin = source_crds(source), CRDS_FROM_SOURCE
    else:
        from ..toolchain import Toolchain
        crds, origin = Toolchain().ensure_crds(near), CRDS_FROM_NEAREST
        why = (f"--source {source} has no manifests/crds/*-crd.yaml" if source is not None
               else "neither --crds nor --source was given")
        warning = (f"{why}: the CRDs installed for this controller (it reports {reported}) are those of {near}, "
                   f"the nearest release, which it may not have been built with; give --crds DIR or --source DIR "
                   f"(a source tree with manifests/crds)")
    crds = Path(crds).expanduser().resolve()
    if not crds.is_dir() or not list(crds.glob("*.yaml")):
        raise ControllerBinaryError(f"--crds {crds}: no CRD files (*.yaml) there")
    for f in sorted(crds.glob("*.yaml")):          # read under the input budget before a cluster installs them
        try:
            inputs.load_all(inputs.read_text(f, inputs.FILE_BYTES, "CRD file"), f)
        except (BadInput, OSError) as e:
            raise ControllerBinaryError(f"--crds {crds}: {e}") from None
    return BinaryInfo(path=path, reported=reported, version=version, sha256=sha256_file(path),
                      nearest_release=near, crds_dir=crds, crd_origin=origin, crd_warning=warning,
                      commit=built_from(source, reported))
