"""A build's record: the go flags every build uses, a component's fingerprint (what beside its module and version
decides its binaries), the check of a built binary against its stamp before it runs, and the copy of a build from
another drills cache (an image builder's cache mount) instead of a build."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Callable

from ..core.errors import BadInput
from ..core.procs import pid_alive, run_bounded
from .components import Component

# no symbol table or DWARF in the built binaries: nothing here debugs them, and the linker then writes less for
# the large Kubernetes and Argo Rollouts binaries (figures: benchmarks/bench_toolchain.py)
LINK_FLAGS = ("-s", "-w")
# nor compiler DWARF the linker would drop: ~9 % less compile CPU, a cold machine's largest share (`go build -trimpath
# std`, empty GOCACHE, twice each way: 54.6 and 53.7 CPU-s with DWARF, 49.3 and 48.8 without)
COMPILE_FLAGS = ("-gcflags=all=-dwarf=false",)


def build_fingerprint(comp: Component, collected: str = "") -> str:
    """What, beside a component's module and version, decides what a build of it makes here: the go flags, the tags,
    the packages, and how its data is collected (``collected``: the collecting code, Toolchain.fingerprint).  A build
    stamp records it; a stamp with another one is built again, and a build in another cache is copied (Toolchain
    ``reuse``) only when it is the same."""
    what = {"compile": list(COMPILE_FLAGS), "link": list(LINK_FLAGS), "ldflags": list(comp.ldflags),
            "tags": list(comp.tags), "binaries": dict(sorted(comp.binaries.items())), "extra": comp.extra,
            "collected": hashlib.sha256(collected.encode()).hexdigest(), "trimpath": True}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def go_platform() -> dict | None:
    """The machine's Go and what it builds for (GOVERSION, GOOS, GOARCH, GOAMD64, CGO_ENABLED, as a build here sets
    them), recorded in a build stamp: a build is copied from another cache only when it was made by the same Go for
    the same platform (a builder's cache mount outlives a Go upgrade and may be shared by two architectures).  None
    where go cannot say."""
    from .modsource import go_env
    try:
        r = run_bounded(["go", "env", "-json", "GOVERSION", "GOOS", "GOARCH", "GOAMD64", "CGO_ENABLED"], timeout=60,
                        env=go_env("local"))
        return json.loads(r.stdout) if r.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class CorruptBinary(BadInput):
    """A built binary in the cache is not the one its build stamp recorded (truncated, overwritten): refused, exit 2."""


def check_built(binary: Path) -> str:
    """The sha256 of a toolchain-built binary, checked against its build stamp (``BUILD.json`` beside it) before it
    is run; CorruptBinary when they differ.  The hash is computed once per (size, mtime, inode) of the file and
    remembered beside the stamp (``.verified.json``): hashing 100 MB on every start costs a second."""
    binary = Path(binary)
    try:
        want = json.loads((binary.parent / "BUILD.json").read_text())["binaries"][binary.name]
    except (OSError, ValueError, KeyError, TypeError):
        raise CorruptBinary(f"cached binary {binary} has no build stamp with its sha256 ({binary.parent / 'BUILD.json'}); "
                            f"it is not run") from None
    st = binary.stat()
    seen = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
    record = binary.parent / ".verified.json"
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    if known.get(binary.name) == {**seen, "sha256": want}:
        return want
    got = sha256_file(binary)
    if got != want:
        raise CorruptBinary(f"cached binary {binary} is not the one built there (sha256 {got[:12]}, built as "
                            f"{want[:12]}: truncated or overwritten); it is not run. Remove {binary.parent} and "
                            f"run: drills toolchain build")
    known = known if isinstance(known, dict) else {}
    known[binary.name] = {**seen, "sha256": want}
    tmp = record.with_name(f".verified.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(json.dumps(known))
        os.replace(tmp, record)
    except OSError:             # a read-only cache: checked again next time
        pass
    return want


def copy_build(comp: Component, fingerprint: str, reuse: Path, dest: Path, log: Callable[[str], None]) -> bool:
    """``comp`` copied from the drills cache ``reuse`` into the folder ``dest`` when it was built there the same
    way (its stamp's module, version, ``fingerprint``, and Go and platform, go_platform); False, and nothing left
    written, when it was not or when anything copied is not what its stamp says (a binary's sha256) or not a plain
    file or folder (a symbolic link is copied as a link, never followed, and refused)."""
    src = reuse / comp.name / comp.version
    try:
        if src.resolve() == dest.resolve():
            return False
        stamp = json.loads((src / "BUILD.json").read_text())
    except (OSError, ValueError, RuntimeError):
        return False
    if not isinstance(stamp, dict) or (stamp.get("module"), stamp.get("version"), stamp.get("fingerprint")) != \
            (comp.module, comp.version, fingerprint):
        return False
    shas = stamp.get("binaries")
    if not isinstance(shas, dict) or set(shas) != set(comp.binaries):
        return False
    here = go_platform()
    if here is None or stamp.get("go") != here:
        log(f"toolchain: {comp.key} in {reuse} was built by {stamp.get('go') or 'a Go it does not name'}, not this "
            f"machine's {here or '(go env failed)'}: built here")
        return False
    for left in dest.parent.glob(f".{dest.name}.copy-*"):      # a copy a killed process left half-done
        pid = left.name.rsplit("-", 1)[-1]
        if not (pid.isdigit() and pid_alive(int(pid))):
            shutil.rmtree(left, ignore_errors=True)
    tmp = dest.with_name(f".{dest.name}.copy-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, symlinks=True,
                        ignore=shutil.ignore_patterns("BUILD.json", ".verified.json", ".*.tmp"))
        for path in tmp.rglob("*"):                # what was copied, not what the source holds now
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                log(f"toolchain: {comp.key} in {reuse}: {path.relative_to(tmp)} is not a plain file or folder: "
                    f"built here")
                return False
        for name, sha in shas.items():
            if sha256_file(tmp / name) != sha:
                log(f"toolchain: {comp.key} in {reuse}: {name} is not the binary its stamp recorded "
                    f"(truncated or overwritten): built here")
                return False
        (tmp / "BUILD.json").write_text(json.dumps({**stamp, "copied_from": str(src)}, indent=2))
        if dest.exists():
            shutil.rmtree(dest)          # (not built: a build that failed, or stopped, left it)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
        return True
    except OSError as e:
        log(f"toolchain: {comp.key} could not be copied from {reuse} ({e}): built here")
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
