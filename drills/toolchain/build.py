from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import yaml

from .. import config
from ..errors import BadInput

from .components import (
    BuildError,
    Component,
    components_for,
    optional_components,
    parse_gomod,
    require_go,
    rollouts_component,
    user_built_component,
    wrapper_gomod,
)


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


class Toolchain:
    """Builds components into the cache and tells where their files are."""

    def __init__(self, root: Path | None = None, log: Callable[[str], None] | None = None):
        self.root = Path(root or config.cache_dir())
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    # --- paths ------------------------------------------------------------------------------
    def dir(self, comp: Component) -> Path:
        return self.root / comp.name / comp.version

    def stamp(self, comp: Component) -> Path:
        return self.dir(comp) / "BUILD.json"

    def is_built(self, comp: Component) -> bool:
        st = self.stamp(comp)
        if not st.exists():
            return False
        return all((self.dir(comp) / b).exists() for b in comp.binaries)

    def bin(self, name: str, version: str, binary: str) -> Path:
        return self.root / name / version / binary

    def kube_bin(self, binary: str) -> Path:
        return self.bin("kubernetes", config.KUBERNETES_VERSION, binary)

    def rollouts_dir(self, version: str) -> Path:
        return self.root / "rollouts" / version

    # --- building ---------------------------------------------------------------------------
    def ensure(self, comps: list[Component]) -> None:
        """Build what is missing.  A file lock per component makes concurrent builders on one cache safe: the
        second waits for the first (saying so) and then finds the component built."""
        todo = [c for c in comps if not self.is_built(c)]
        if not todo:
            return
        require_go()
        self.log(f"toolchain: {len(todo)} component(s) to build: {', '.join(c.key for c in todo)}")
        for i, comp in enumerate(todo, 1):
            with self._locked(comp):
                if self.is_built(comp):
                    self.log(f"toolchain: [{i}/{len(todo)}] {comp.key} was built meanwhile")
                    continue
                self.log(f"toolchain: [{i}/{len(todo)}] {comp.key} ...")
                t0 = time.monotonic()
                self.build(comp)
                self.log(f"toolchain: [{i}/{len(todo)}] {comp.key} built in {time.monotonic() - t0:.0f}s")

    @contextmanager
    def _locked(self, comp: Component):
        path = self.root / "locks" / f"{re.sub(r'[^A-Za-z0-9.]+', '-', comp.key)}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.log(f"toolchain: {comp.key} is being built by another process; waiting for it")
                fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _env(self, comp: Component) -> dict:
        env = dict(os.environ)
        env["GOTOOLCHAIN"] = comp.gotoolchain or "local"
        env["GOFLAGS"] = "-mod=mod -buildvcs=false"
        env.setdefault("CGO_ENABLED", "0")
        return env

    def _run(self, comp: Component, args: list[str], cwd: Path, logf, what: str, progress: bool = False) -> str:
        logf.write(f"$ {' '.join(args)}\n")
        logf.flush()
        proc = subprocess.Popen(args, cwd=cwd, env=self._env(comp), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        out: list[str] = []
        t0 = time.monotonic()
        count = [0]
        stop = threading.Event()

        def ticker():
            while not stop.wait(20):
                self.log(f"toolchain:   {comp.key} {what}: {count[0]} packages, "
                         f"{time.monotonic() - t0:.0f}s elapsed")

        th = threading.Thread(target=ticker, daemon=True)
        if progress:
            th.start()
        assert proc.stdout
        for line in proc.stdout:
            out.append(line)
            logf.write(line)
            if not line.startswith("#") and not line.startswith("go:"):
                count[0] += 1
        rc = proc.wait()
        stop.set()
        logf.flush()
        if rc != 0:
            tail = "".join(out[-25:]).strip()
            raise BuildError(f"building {comp.module}@{comp.version} failed ({what}, exit {rc}):\n{tail}")
        return "".join(out)

    def build(self, comp: Component) -> None:
        dest = self.dir(comp)
        work = self.root / "build" / re.sub(r"[^A-Za-z0-9.]+", "-", comp.key)
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        dest.mkdir(parents=True, exist_ok=True)
        logs = self.root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        logpath = logs / f"{comp.name}-{comp.version}.log"
        t0 = time.monotonic()
        with open(logpath, "w") as logf:
            try:
                raw = self._run(comp, ["go", "mod", "download", "-json", f"{comp.module}@{comp.version}"], work, logf,
                                "download")
            except BuildError as e:
                raise BuildError(f"{comp.module}@{comp.version} could not be downloaded from the Go module "
                                 f"proxy: {e}") from None
            info = json.loads(raw[raw.index("{"):])
            if info.get("Error"):
                raise BuildError(f"{comp.module}@{comp.version}: {info['Error']}")
            moddir = Path(info["Dir"])
            target = parse_gomod(Path(info["GoMod"]).read_text())
            built: dict[str, str] = {}
            if comp.binaries:
                (work / "go.mod").write_text(wrapper_gomod(comp, target))
                imports = "\n".join(f'\t_ "{p}"' for p in sorted(set(comp.binaries.values())))
                (work / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")
                self._run(comp, ["go", "mod", "tidy"], work, logf, "go mod tidy")
                for out_name, pkg in comp.binaries.items():
                    args = ["go", "build", "-v", "-trimpath", "-o", str(dest / out_name)]
                    if comp.ldflags:
                        args += ["-ldflags", " ".join(comp.ldflags)]
                    args.append(pkg)
                    self._run(comp, args, work, logf, f"go build {out_name}", progress=True)
                    built[out_name] = sha256_file(dest / out_name)
            if comp.extra == "rollouts":
                self._collect_rollouts(moddir, dest)
            elif comp.extra == "kwok":
                self._collect_kwok(moddir, dest)
            elif comp.extra == "istio":
                self._collect_istio(moddir, dest)
        stamp = {"module": comp.module, "version": comp.version, "binaries": built,
                 "build_seconds": round(time.monotonic() - t0, 1), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                            time.gmtime()),
                 "gotoolchain": comp.gotoolchain or "local", "log": str(logpath)}
        self.stamp(comp).write_text(json.dumps(stamp, indent=2))
        shutil.rmtree(work, ignore_errors=True)

    # --- data that ships inside the modules -----------------------------------------------
    @staticmethod
    def _collect_rollouts(moddir: Path, dest: Path) -> None:
        crds = dest / "crds"
        crds.mkdir(exist_ok=True)
        for f in sorted((moddir / "manifests" / "crds").glob("*-crd.yaml")):
            shutil.copyfile(f, crds / f.name)
        src = dest / "source"
        src.mkdir(exist_ok=True)
        shutil.copyfile(moddir / "rollout" / "trafficrouting.go", src / "trafficrouting.go")

    @staticmethod
    def _collect_kwok(moddir: Path, dest: Path) -> None:
        stages = dest / "stages"
        stages.mkdir(exist_ok=True)
        base = moddir / "kustomize" / "stage"
        for rel in ("node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
                    "pod/general/pod-create.yaml", "pod/general/pod-init-container-running.yaml",
                    "pod/general/pod-init-container-completed.yaml", "pod/general/pod-ready.yaml",
                    "pod/general/pod-complete.yaml", "pod/general/pod-delete.yaml"):
            shutil.copyfile(base / rel, stages / Path(rel).name)

    @staticmethod
    def _collect_istio(moddir: Path, dest: Path) -> None:
        docs = yaml.safe_load_all((moddir / "kubernetes" / "customresourcedefinitions.gen.yaml").read_text())
        want = {"virtualservices.networking.istio.io", "destinationrules.networking.istio.io"}
        picked = [d for d in docs if d and d.get("metadata", {}).get("name") in want]
        if len(picked) != 2:
            raise BuildError(f"istio.io/api: expected VirtualService and DestinationRule CRDs, found {len(picked)}")
        (dest / "crds.yaml").write_text(yaml.safe_dump_all(picked, sort_keys=False))

    def _module_dir(self, comp: Component) -> Path:
        """The module's source in the Go module cache (downloaded from the proxy if need be)."""
        r = subprocess.run(["go", "mod", "download", "-json", f"{comp.module}@{comp.version}"], capture_output=True,
                           text=True, env=self._env(comp), timeout=600)
        info = json.loads(r.stdout or "{}")
        if not info.get("Dir"):
            raise BuildError(f"{comp.module}@{comp.version}: {info.get('Error') or r.stderr.strip()}")
        return Path(info["Dir"])

    def ensure_crds(self, version: str) -> Path:
        """The CRDs of a release, without building it (from its module)."""
        built = self.rollouts_dir(version) / "crds"
        if built.is_dir() and list(built.glob("*.yaml")):
            return built
        dest = self.root / "rollouts-crds" / version
        if dest.is_dir() and list(dest.glob("*.yaml")):
            return dest
        moddir = self._module_dir(rollouts_component(version))
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted((moddir / "manifests" / "crds").glob("*-crd.yaml")):
            shutil.copyfile(f, dest / f.name)
        return dest

    # --- user-built controllers (as a user's own build of a source tree would be) ----------------
    def build_controller_reporting(self, release: str, reported: str, out_dir: Path) -> Path:
        """Build (once, cached) a rollouts-controller from ``release``'s module whose ``--version`` says
        ``reported``, and copy it into ``out_dir``; returns the copy's path."""
        comp = user_built_component(release, reported)
        self.ensure([comp])
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        dst = out / "rollouts-controller"
        shutil.copy2(self.dir(comp) / "rollouts-controller", dst)
        return dst

    def lay_out_source_tree(self, release: str, dest: Path) -> Path:
        """A source-tree folder as a user's checkout of ``release`` has it, for ``--source``: the CRD manifests
        (manifests/crds/*-crd.yaml) and rollout/trafficrouting.go, copied from the release's module."""
        moddir = self._module_dir(rollouts_component(release))
        dest = Path(dest)
        (dest / "manifests" / "crds").mkdir(parents=True, exist_ok=True)
        (dest / "rollout").mkdir(parents=True, exist_ok=True)
        for f in sorted((moddir / "manifests" / "crds").glob("*-crd.yaml")):
            shutil.copyfile(f, dest / "manifests" / "crds" / f.name)
        shutil.copyfile(moddir / "rollout" / "trafficrouting.go", dest / "rollout" / "trafficrouting.go")
        return dest

    # --- listing ----------------------------------------------------------------------------
    def listing(self) -> list[dict]:
        rows = []
        seen = set()
        for comp in components_for(list(config.SUPPORTED_CONTROLLERS), list(optional_components())):
            seen.add(comp.key)
            rows.append(self._row(comp, supported=True))
        rdir = self.root / "rollouts"
        if rdir.exists():
            for d in sorted(rdir.iterdir()):
                comp = rollouts_component(d.name)
                if comp.key not in seen and self.is_built(comp):
                    rows.append(self._row(comp, supported=False))
        return rows

    def _row(self, comp: Component, supported: bool) -> dict:
        built = self.is_built(comp)
        row = {"component": comp.name, "version": comp.version, "module": comp.module, "built": built,
               "supported": supported, "path": str(self.dir(comp)) if built else None}
        if built:
            try:
                row["build_seconds"] = json.loads(self.stamp(comp).read_text()).get("build_seconds")
            except ValueError:
                pass
        return row
