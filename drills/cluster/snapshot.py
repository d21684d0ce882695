"""Ready snapshots of the embedded cluster's base state, cached by a digest of what shapes them.

A snapshot is the etcd data folder of a cluster that has the Argo Rollouts CRDs of one controller release
(or of a user-built controller's CRD set) and Istio's CRDs Established, the system namespace and the fake
nodes.  It is taken from a cleanly stopped etcd before any process of the project ran on that cluster: it
holds no Rollout (no sentinel), no availability holds, no drill namespace.  A warm ``up`` copies it into
the new cluster's etcd folder before kwokctl starts etcd, so the apiserver comes up serving those CRDs.

Why not ``kwokctl snapshot save/restore``: its etcd format runs etcdctl/etcdutl, which are not built here
(kwokctl would download them), and its restore stops and restarts etcd and the apiserver of a running
cluster; copying a stopped data folder before etcd starts costs neither.

The key is a sha256 over every input that shapes the data (``snapshot_inputs``): the snapshot format, the
Kubernetes, etcd and kwok versions and binary digests, each CRD file's content, the kwok Stages, the audit
policy, the control-plane options, the system namespace and the node count.  Any change gives another key:
a stale snapshot is never restored, the next ``up`` builds and saves a new one, and unused snapshots are
pruned (least recently used first).

Concurrency, per key, with ``flock`` on ``<key>.lock``: a lookup that finds the snapshot holds it shared
until the copy is done; a lookup that misses holds it exclusive until the snapshot is saved, so two ``up``
of the same key at once build it once (the second waits, then restores); pruning takes it exclusive
without waiting and skips a snapshot in use.  A snapshot is written into a temporary folder and renamed
into place, so no reader ever sees a partial one.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from ..core import config

FORMAT = 3              # bump when what a snapshot holds, or how it is taken, changes
KEEP = 8                # snapshots kept (least recently used pruned)
_CHUNK = 1 << 20


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stamped_sha256(binary: Path) -> str | None:
    """A toolchain-built binary's sha256 as its build stamp recorded it (hashing 100 MB costs a second)."""
    try:
        return json.loads((Path(binary).parent / "BUILD.json").read_text())["binaries"][Path(binary).name]
    except (OSError, ValueError, KeyError):
        return None


def _binary_digests(tc, component: str, version: str, names: list[str]) -> dict:
    out = {}
    for n in names:
        path = tc.bin(component, version, n)
        st = path.stat()
        out[n] = stamped_sha256(path) or f"size={st.st_size},mtime={st.st_mtime_ns}"
    return out


def snapshot_inputs(tc, crd_files: list[Path], stages: list[dict], audit_policy: dict, options: dict,
                    system_namespace: str, nodes: int) -> dict:
    """Everything that shapes a snapshot's data, as plain JSON.  Per-cluster values (ports, paths of the
    cluster folder) are left out: they do not reach etcd."""
    per_cluster = {"kubeApiserverPort", "etcdPort", "etcdPeerPort", "kwokControllerPort",
                   "kubeControllerManagerPort", "kubeSchedulerPort", "kubeAuditPolicy"}
    return {
        "format": FORMAT,
        "kubernetes": {"version": config.KUBERNETES_VERSION, "binaries": _binary_digests(
            tc, "kubernetes", config.KUBERNETES_VERSION,
            ["kube-apiserver", "kube-controller-manager", "kube-scheduler"])},
        "etcd": {"version": config.ETCD_VERSION,
                 "binaries": _binary_digests(tc, "etcd", config.ETCD_VERSION, ["etcd"])},
        "kwok": {"version": config.KWOK_VERSION,
                 "binaries": _binary_digests(tc, "kwok", config.KWOK_VERSION, ["kwok", "kwokctl"])},
        "crds": [{"file": Path(f).name, "sha256": _sha256_bytes(Path(f).read_bytes())} for f in crd_files],
        "stages": stages,
        "audit_policy": audit_policy,
        "options": {k: v for k, v in sorted(options.items()) if k not in per_cluster},
        "system_namespace": system_namespace,
        "nodes": nodes,
    }


def snapshot_key(inputs: dict) -> str:
    return _sha256_bytes(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode())[:24]


def copy_sparse(src: Path, dst: Path) -> None:
    """Copy a folder tree; runs of zero bytes become holes (etcd preallocates 64 MB WAL segments)."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copystat(src, dst)
    for entry in os.scandir(src):
        target = dst / entry.name
        if entry.is_dir(follow_symlinks=False):
            copy_sparse(Path(entry.path), target)
            continue
        size = entry.stat().st_size
        with open(entry.path, "rb") as fi, open(target, "wb") as fo:
            while True:
                chunk = fi.read(_CHUNK)
                if not chunk:
                    break
                if chunk.count(0) == len(chunk):
                    fo.seek(len(chunk), os.SEEK_CUR)
                else:
                    fo.write(chunk)
            fo.truncate(size)
        shutil.copystat(entry.path, target)


@contextmanager
def _flock(path: Path, mode: int):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)


class SnapshotLease:
    """The key's lock, held shared while the snapshot exists (``ready``: restore it), or exclusive while it
    does not (build it, then ``save``)."""

    def __init__(self, store: "SnapshotStore", key: str):
        self.store, self.key = store, key
        self.path = store.path(key)
        self._fd: int | None = None
        self.ready = False

    def _acquire(self) -> "SnapshotLease":
        self._fd = os.open(self.store.lock_path(self.key), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        if not self.store.is_ready(self.key):
            fcntl.flock(self._fd, fcntl.LOCK_EX)     # waits while another process builds this key
            if self.store.is_ready(self.key):
                fcntl.flock(self._fd, fcntl.LOCK_SH)
        self.ready = self.store.is_ready(self.key)
        return self

    def restore(self, etcd_dir: Path) -> dict:
        """Copy the snapshot's etcd data folder to ``etcd_dir``; the snapshot's metadata."""
        if not self.ready or self._fd is None:
            raise RuntimeError(f"snapshot {self.key} is not held ready")
        copy_sparse(self.path / "etcd", etcd_dir)
        os.utime(self.path / "SNAPSHOT.json")         # recently used: pruned last
        return json.loads((self.path / "SNAPSHOT.json").read_text())

    def save(self, etcd_dir: Path, inputs: dict, meta: dict) -> Path:
        """Store a stopped etcd's data folder under this key (the exclusive lock is held), then let go."""
        if self.ready or self._fd is None:
            raise RuntimeError(f"snapshot {self.key} is not held for building")
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{self.key}-", dir=self.store.root))
        try:
            copy_sparse(etcd_dir, tmp / "etcd")
            (tmp / "SNAPSHOT.json").write_text(json.dumps(
                {"key": self.key, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 **meta, "inputs": inputs}, indent=2))
            if self.path.exists():                   # an incomplete leftover of a crashed build
                shutil.rmtree(self.path)
            os.rename(tmp, self.path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.release()
        self.store.prune(keep={self.key})
        return self.path

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class SnapshotStore:
    """The folder ``$DRILLS_CACHE/snapshots``: ``<key>/etcd``, ``<key>/SNAPSHOT.json``, ``<key>.lock``."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or config.cache_dir() / "snapshots")
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / key

    def lock_path(self, key: str) -> Path:
        return self.root / f"{key}.lock"

    def is_ready(self, key: str) -> bool:
        return (self.path(key) / "SNAPSHOT.json").is_file()

    def acquire(self, key: str) -> SnapshotLease:
        return SnapshotLease(self, key)._acquire()

    def keys(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def remove(self, key: str, wait: bool = True) -> bool:
        """Delete a snapshot unless (``wait=False``) a process holds its lock."""
        try:
            with _flock(self.lock_path(key), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB)):
                shutil.rmtree(self.path(key), ignore_errors=True)
        except BlockingIOError:
            return False
        return True

    def prune(self, keep: set[str] = frozenset(), limit: int = KEEP) -> list[str]:
        """Remove the least recently used snapshots beyond ``limit`` and day-old temporary folders."""
        for p in self.root.glob(".tmp-*"):
            if time.time() - p.stat().st_mtime > 86400:
                shutil.rmtree(p, ignore_errors=True)

        def used(k: str) -> float:
            try:
                return (self.path(k) / "SNAPSHOT.json").stat().st_mtime
            except OSError:
                return 0.0
        ready = sorted((k for k in self.keys() if k not in keep), key=used, reverse=True)
        removed = []
        for k in ready[max(0, limit - len(keep)):]:
            if self.remove(k, wait=False):
                removed.append(k)
        return removed


__all__ = ["FORMAT", "SnapshotLease", "SnapshotStore", "copy_sparse", "snapshot_inputs", "snapshot_key",
           "stamped_sha256"]
