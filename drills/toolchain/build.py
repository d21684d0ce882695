from __future__ import annotations

import functools
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Callable

import yaml

from ..core import config
from ..routers import ISTIO
from ..core.procs import background_priority, die_with_parent
from .locks import _RUNNING, _RUNNING_LOCK, WAITS, build_jobs, build_priority, check_jobs, hold_any  # noqa: F401
from .modsource import ModuleUnavailable, go_env, module_source
from .components import (
    BuildError, Component, components_for, optional_components, parse_gomod, require_go, rollouts_component,
    user_built_component, wrapper_gomod
)
from .stamps import (  # noqa: F401  (the names drills.toolchain and its users import from here)
    COMPILE_FLAGS, LINK_FLAGS, CorruptBinary, build_fingerprint, check_built, copy_build, go_platform, sha256_file
)
from ..core import fastyaml


GO_COMMAND_TIMEOUT_S = 3600.0      # one go command of a build (the Kubernetes apiserver takes minutes, not hours)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(30)


# how long a stopped build waits for its threads before the signal goes on
STOP_JOIN_S = 10.0


def _build_groups(binaries: dict[str, str]) -> list[tuple[str, list[str]]]:
    """The go build commands of a component: one for every binary named as go names it (the last element of its
    package path), so their packages compile and their links run side by side in one command (``-o DIR/``); one
    command per binary named otherwise (``etcd`` from ``.../server/v3``)."""
    same = [p for n, p in binaries.items() if p.rstrip("/").rsplit("/", 1)[-1] == n]
    groups = [("/", same)] if len(same) > 1 else []
    groups += [(n, [p]) for n, p in binaries.items() if len(same) <= 1 or p not in same]
    return groups


class Toolchain:
    """Builds components into the cache and tells where their files are."""

    def __init__(self, root: Path | None = None, log: Callable[[str], None] | None = None,
                 background: bool | None = None, reuse: Path | None = None):
        """``background``: the go commands run below the drills beside them (drills.core.procs.background_priority);
        None: as DRILLS_BUILD_PRIORITY says, normal when unset (locks.build_priority).  ``reuse``: another drills
        cache (an image builder's cache mount): a component built there with the same module, version and
        fingerprint (build_fingerprint) is copied from it, each binary checked against that build's sha256,
        instead of being compiled and linked again."""
        self.root = Path(root or config.cache_dir())
        self.reuse = Path(reuse) if reuse else None
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._background = background
        self._stopping = threading.Event()       # set when a build here is stopped: nothing new starts
        self._slots = 1

    @property
    def background(self) -> bool:       # BadInput: a bad DRILLS_BUILD_PRIORITY
        return build_priority() == "background" if self._background is None else self._background

    # --- paths ------------------------------------------------------------------------------
    def dir(self, comp: Component) -> Path:
        return self.root / comp.name / comp.version

    def stamp(self, comp: Component) -> Path:
        return self.dir(comp) / "BUILD.json"

    def is_built(self, comp: Component) -> bool:
        """Built here the way this drills builds it: a stamp with the component's fingerprint (a stamp of other flags,
        or of a drills that recorded none, is built again: with warm Go caches, links only) and every binary."""
        try:
            stamp = json.loads(self.stamp(comp).read_text())
        except (OSError, ValueError):
            return False
        if not isinstance(stamp, dict) or stamp.get("fingerprint") != self.fingerprint(comp):
            return False
        return all((self.dir(comp) / b).exists() for b in comp.binaries)

    @staticmethod
    def fingerprint(comp: Component) -> str:
        """build_fingerprint with the code that collects the component's data (a change there is a new build)."""
        return _fingerprint(comp)

    def bin(self, name: str, version: str, binary: str) -> Path:
        return self.root / name / version / binary

    def kube_bin(self, binary: str) -> Path:
        return self.bin("kubernetes", config.KUBERNETES_VERSION, binary)

    def rollouts_dir(self, version: str) -> Path:
        return self.root / "rollouts" / version

    # --- getting a component: the one way (built here, or waited for while another process builds it) ---------
    def get(self, comp: Component) -> Path:
        """The component's folder, built first when it is not (or waited for while another process of this
        machine builds it, with a progress line).  Every user of a built file goes through here."""
        self.ensure([comp])
        return self.dir(comp)

    def rollouts(self, version: str) -> Path:
        """The folder of the built Argo Rollouts release ``version``: rollouts-controller, kubectl-argo-rollouts,
        crds/, source/."""
        return self.get(rollouts_component(version))

    def controller(self, version: str) -> Path:
        return self.rollouts(version) / "rollouts-controller"

    def component(self, name: str) -> Path:
        """The folder of a base or optional component by name (kubernetes, kwok, etcd, helm, istio-crds, registry,
        prometheus), built first if need be."""
        known = {c.name: c for c in components_for([], list(optional_components()))}
        if name not in known:
            raise KeyError(f"unknown component {name!r} (known: {', '.join(known)})")
        return self.get(known[name])

    def kubernetes(self, binary: str) -> Path:
        """A Kubernetes binary (kube-apiserver, kubectl, ...), built first if need be."""
        return self.component("kubernetes") / binary

    # --- building ---------------------------------------------------------------------------
    def ensure(self, comps: list[Component], jobs: int | None = None,
               on_built: Callable[[Component], None] | None = None) -> None:
        """Build what is missing, in the order given, ``jobs`` components at a time (default: build_jobs()).

        Locks keep concurrent builders on one cache apart, whether threads here or other processes: a lock per
        component (whoever holds it builds that component; the others wait for it, saying so, and then find it
        built), and build_jobs() build slots per cache, held only while go compiles and links.  A component's
        source and dependencies download (go mod tidy) before it takes a slot, so a download overlaps another
        component's compile.  A slot is never held while waiting for a component's lock, so they cannot
        deadlock.  ``on_built(comp)`` is called as each component is ready (built here or by another process)."""
        slots = check_jobs(jobs) if jobs is not None else build_jobs()     # bad input before anything is done
        self._background = self.background                                # (DRILLS_BUILD_PRIORITY too)
        todo = [c for c in comps if not self.is_built(c)]
        for c in comps:
            if c not in todo and on_built:
                on_built(c)
        if not todo:
            return
        require_go()
        self._stopping.clear()
        self._slots = slots
        jobs = max(1, min(slots, len(todo)))
        self.log(f"toolchain: {len(todo)} component(s) to build: {', '.join(c.key for c in todo)}"
                 + (f" ({jobs} at a time)" if jobs > 1 else ""))
        if jobs == 1:
            try:
                for i, comp in enumerate(todo, 1):
                    self._ensure_one(comp, i, len(todo))
                    if on_built:
                        on_built(comp)
            except BaseException:
                self._stop()
                raise
            return
        queue = deque(enumerate(todo, 1))
        errors: list[BaseException] = []
        qlock = threading.Lock()

        def worker():
            while True:
                with qlock:
                    if errors or not queue:
                        return
                    i, comp = queue.popleft()
                try:
                    self._ensure_one(comp, i, len(todo))
                    if on_built:
                        on_built(comp)
                except BaseException as e:       # the first error ends the build: the others start nothing new
                    with qlock:
                        errors.append(e)
                    return
        threads = [threading.Thread(target=worker, name=f"toolchain-build-{n}", daemon=True) for n in range(jobs)]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(0.5)
        except BaseException:        # a signal in this thread: the go commands of every build go with it, and a
            with qlock:              # build waiting for a lock or a slot starts nothing
                queue.clear()
            self._stop()
            # the builds end at once (their go commands are killed, their waits stop); a download that is not a
            # go command of ours (a module's source) is not waited for: it dies with this process
            deadline = time.monotonic() + STOP_JOIN_S
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            raise
        if errors:
            raise errors[0]

    def _ensure_one(self, comp: Component, i: int, n: int) -> None:
        if self._stopping.is_set():
            raise BuildError(f"{comp.key}: the build was stopped before it started")
        with self._lock(self._lock_path(comp.key), f"{comp.key} is being built by another process", what=comp.key):
            if self.is_built(comp):
                self.log(f"toolchain: [{i}/{n}] {comp.key} was built meanwhile")
                return
            if self.reuse is not None and copy_build(comp, self.fingerprint(comp), self.reuse, self.dir(comp),
                                                     self.log):
                self.log(f"toolchain: [{i}/{n}] {comp.key} copied from {self.reuse} (the same build: its stamp's "
                         f"module, version and fingerprint, each binary's sha256)")
                return
            self.log(f"toolchain: [{i}/{n}] {comp.key} ...")
            t0 = time.monotonic()
            self.build(comp, slot=lambda: self._slot(comp))
            self.log(f"toolchain: [{i}/{n}] {comp.key} built in {time.monotonic() - t0:.0f}s")

    def _slot(self, comp: Component):
        """One of the cache's build slots (as many as this build's jobs), held while go compiles and links
        ``comp``."""
        paths = [self._lock_path("build-slot" if k == 0 else f"build-slot-{k}") for k in range(self._slots)]
        return hold_any(paths, f"a build slot for {comp.key} (builds by other processes)", comp.key, self.log,
                        lambda holders: f"every build slot of this cache is in use ({'; '.join(holders)}); "
                                        f"{comp.key} compiles after one of them", stop=self._stopping)

    def _stop(self) -> None:
        """Stop every build of this process: nothing new starts (a wait for a lock or a slot ends), and the go
        commands running now are killed with their compilers."""
        self._stopping.set()
        with _RUNNING_LOCK:
            procs = list(_RUNNING)
        for proc in procs:
            if proc.poll() is None:
                _kill_group(proc)

    def _lock_path(self, key: str) -> Path:
        return self.root / "locks" / f"{re.sub(r'[^A-Za-z0-9.]+', '-', key)}.lock"

    def _lock(self, path: Path, busy: str, what: str | None = None):
        """flock ``path``; while another process holds it, a progress line every WAIT_PROGRESS_S naming the holder
        (the lock file says who: pid, what, since when); the wait is counted in WAITS."""
        return hold_any([path], f"the lock {path.name} (a build by another process)", what or path.stem, self.log,
                        lambda holders: f"{busy} ({holders[0]})" if holders[0] else busy, count=True,
                        stop=self._stopping)

    def _run(self, comp: Component, args: list[str], cwd: Path, logf, what: str, progress: bool = False,
             gotoolchain: str = "local") -> str:
        logf.write(f"$ GOTOOLCHAIN={gotoolchain} {' '.join(args)}\n")
        logf.flush()
        proc = subprocess.Popen(args, cwd=cwd, env=go_env(gotoolchain), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                preexec_fn=background_priority if self.background else die_with_parent)
        with _RUNNING_LOCK:
            stopped = self._stopping.is_set()
            if not stopped:
                _RUNNING.add(proc)
        if stopped:                 # the build was stopped while this command started
            _kill_group(proc)
            raise BuildError(f"building {comp.module}@{comp.version}: stopped ({what} not run)")
        out: deque[str] = deque(maxlen=200)
        t0 = time.monotonic()
        count = [0]
        stop = threading.Event()
        timed_out = threading.Event()

        def ticker():
            while not stop.wait(20):
                if time.monotonic() - t0 > GO_COMMAND_TIMEOUT_S:
                    timed_out.set()
                    _kill_group(proc)
                    return
                if progress:
                    self.log(f"toolchain:   {comp.key} {what}: {count[0]} packages, "
                             f"{time.monotonic() - t0:.0f}s elapsed")

        threading.Thread(target=ticker, daemon=True).start()
        assert proc.stdout
        try:
            for line in proc.stdout:
                out.append(line)
                logf.write(line)
                if not line.startswith("#") and not line.startswith("go:"):
                    count[0] += 1
            rc = proc.wait()
        finally:                 # interrupted (a signal, an error): the go command and its compilers go too
            stop.set()
            if proc.poll() is None:
                _kill_group(proc)
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
            logf.flush()
        if timed_out.is_set():
            raise BuildError(f"building {comp.module}@{comp.version}: {what} did not finish within "
                             f"{GO_COMMAND_TIMEOUT_S:.0f}s and was stopped (log {logf.name})")
        if rc != 0:
            tail = "".join(list(out)[-25:]).strip()
            raise BuildError(f"building {comp.module}@{comp.version} failed ({what}, exit {rc}):\n{tail}")
        return "".join(out)

    def build(self, comp: Component, slot: Callable[[], AbstractContextManager] = nullcontext) -> None:
        """Download the component's source and dependencies (go mod tidy), then, inside ``slot()``, compile and
        link its binaries; collect the data it ships; write its build stamp."""
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
                info = module_source(comp.module, comp.version)
            except ModuleUnavailable as e:
                raise BuildError(f"{comp.module}@{comp.version} could not be downloaded from the Go module "
                                 f"proxy: {e}") from None
            gotoolchain = info.gotoolchain
            logf.write(f"source {info.dir}; go.mod {info.gomod}; GOTOOLCHAIN={gotoolchain}\n")
            moddir = info.dir
            target = parse_gomod(info.gomod.read_text())
            built: dict[str, str] = {}
            if comp.binaries:
                (work / "go.mod").write_text(wrapper_gomod(comp, target))
                imports = "\n".join(f'\t_ "{p}"' for p in sorted(set(comp.binaries.values())))
                (work / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")
                self._run(comp, ["go", "mod", "tidy"], work, logf, "go mod tidy", gotoolchain=gotoolchain)
                flags = ["-v", "-trimpath", *COMPILE_FLAGS, *(["-tags", ",".join(comp.tags)] if comp.tags else []),
                         "-ldflags", " ".join((*LINK_FLAGS, *comp.ldflags))]
                with slot():
                    for out, pkgs in _build_groups(comp.binaries):
                        names = ", ".join(comp.binaries) if out.endswith("/") else out
                        args = ["go", "build", *flags, "-o",
                                str(dest) + "/" if out.endswith("/") else str(dest / out), *pkgs]
                        self._run(comp, args, work, logf, f"go build {names}", progress=True,
                                  gotoolchain=gotoolchain)
                for out_name in comp.binaries:
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
                 "gotoolchain": gotoolchain, "tags": list(comp.tags), "fingerprint": self.fingerprint(comp),
                 "go": go_platform(),
                 "log": str(logpath)}
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
        docs = fastyaml.safe_load_all((moddir / "kubernetes" / "customresourcedefinitions.gen.yaml").read_text())
        want = ISTIO.crds
        picked = [d for d in docs if d and d.get("metadata", {}).get("name") in want]
        if len(picked) != len(want):
            raise BuildError(f"istio.io/api: expected the CRDs {', '.join(sorted(want))}, found {len(picked)}")
        (dest / "crds.yaml").write_text(yaml.safe_dump_all(picked, sort_keys=False))

    @staticmethod
    def _module_dir(comp: Component) -> Path:
        """The module's source in the Go module cache (downloaded from the proxy if need be, never built)."""
        try:
            return module_source(comp.module, comp.version).dir
        except ModuleUnavailable as e:
            raise BuildError(str(e)) from None

    def ensure_crds(self, version: str) -> Path:
        """The CRDs of a release, without building it (from its module)."""
        if self.is_built(rollouts_component(version)):       # its stamp is written after the CRDs are copied
            return self.rollouts_dir(version) / "crds"
        dest = self.root / "rollouts-crds" / version
        if dest.is_dir() and list(dest.glob("*.yaml")):
            return dest
        moddir = self._module_dir(rollouts_component(version))
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted((moddir / "manifests" / "crds").glob("*-crd.yaml")):
            shutil.copyfile(f, dest / f.name)
        return dest

    # --- user-built controllers (as a user's own build of a source tree would be) ----------------
    def build_controller_reporting(self, release: str, reported: str, out_dir: Path,
                                   commit: str | None = None) -> Path:
        """Build (once, cached) a rollouts-controller from ``release``'s module whose ``--version`` says
        ``reported`` (stamped with ``commit`` as upstream's Makefile stamps it, when given), and copy it into
        ``out_dir``; returns the copy's path.  Not cached yet: the release is built (or waited for) first."""
        comp = user_built_component(release, reported, commit)
        if not self.is_built(comp):     # the release first (or waited for): this build then only links
            self.ensure([rollouts_component(release)])
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


def _fingerprint(comp: Component) -> str:
    return build_fingerprint(comp, _collecting_code(comp.extra))


@functools.lru_cache(maxsize=None)
def _collecting_code(extra: str | None) -> str:
    """The code that collects a component's data (its ``extra`` step) and what it reads, as the fingerprint sees it."""
    collect = {"rollouts": Toolchain._collect_rollouts, "kwok": Toolchain._collect_kwok,
               "istio": Toolchain._collect_istio}.get(extra or "")
    try:
        code = inspect.getsource(collect) if collect else ""
    except (OSError, TypeError):        # no source beside the package: the flags and packages still count
        code = ""
    return code + (repr(sorted(ISTIO.crds)) if extra == "istio" else "")    # (a set: in a fixed order)
