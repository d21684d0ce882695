"""A build's record: the go flags every build uses, a component's fingerprint (what beside its module and version
decides its binaries), the check of a built binary against its stamp before it runs, and the copy of a build from
another drills cache (an image builder's cache mount) instead of a build."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Callable

from ..core.errors import BadInput
from .components import Component

# no symbol table or DWARF in the built binaries: nothing here debugs them, and the linker then writes less for
# the large Kubernetes and Argo Rollouts binaries (figures: benchmarks/bench_toolchain.py)
LINK_FLAGS = ("-s", "-w")
# nor compiler DWARF the linker would drop: ~9 % less compile CPU, a cold machine's largest share (`go build -trimpath
# std`, empty GOCACHE, twice each way: 54.6 and 53.7 CPU-s with DWARF, 49.3 and 48.8 without)
COMPILE_FLAGS = ("-gcflags=all=-dwarf=false",)


def build_fingerprint(comp: Component) -> str:
    """What, beside a component's module and version, decides the binaries a build of it makes here: the go flags,
    the tags, the packages and the data collected.  A build stamp records it; a build in another cache is copied
    (Toolchain ``reuse``) only when it is the same."""
    what = {"compile": list(COMPILE_FLAGS), "link": list(LINK_FLAGS), "ldflags": list(comp.ldflags),
            "tags": list(comp.tags), "binaries": dict(sorted(comp.binaries.items())), "extra": comp.extra,
            "trimpath": True}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


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


def copy_build(comp: Component, reuse: Path, dest: Path, log: Callable[[str], None]) -> bool:
    """``comp`` copied from the drills cache ``reuse`` into the folder ``dest`` when it was built there the same
    way (its stamp's module, version and fingerprint); False, and nothing written, when it was not or when anything
    there is not what its stamp says (a binary's sha256, a symbolic link, a file that is not a regular file)."""
    src = reuse / comp.name / comp.version
    try:
        if src.resolve() == dest.resolve():
            return False
        stamp = json.loads((src / "BUILD.json").read_text())
    except (OSError, ValueError, RuntimeError):
        return False
    if not isinstance(stamp, dict) or (stamp.get("module"), stamp.get("version"), stamp.get("fingerprint")) != \
            (comp.module, comp.version, build_fingerprint(comp)):
        return False
    shas = stamp.get("binaries")
    if not isinstance(shas, dict) or set(shas) != set(comp.binaries):
        return False
    tmp = dest.with_name(f".{dest.name}.copy-{os.getpid()}")
    try:
        for path in [src, *src.rglob("*")]:
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                log(f"toolchain: {comp.key} in {reuse}: {path} is not a plain file or folder: built here")
                return False
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("BUILD.json", ".verified.json", ".*.tmp"))
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
