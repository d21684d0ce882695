"""A journal on disk: read within a size and depth budget, written private (0600) with a digest of its content.

The journal is what `drills restore` sends back to a live Rollout, so it is never trusted as found: it is read
within ``MAX_JOURNAL_BYTES`` and ``MAX_DEPTH`` (a document nested 100,000 deep is bad input, never a
RecursionError), its rollout keys must be ``namespace/name`` of plain names (drills.core.names), and it carries
``digest``, the sha256 of its canonical JSON without that field, written with every save.  A journal whose
content is not what its digest says (an edited ``original`` template) is refused before anything is sent.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .procs import cmdline, pid_alive, proven

MAX_JOURNAL_BYTES = 64 << 20
MAX_DEPTH = 100
DIGEST_KEY = "digest"


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def digest_of(data: dict) -> str:
    """The digest a journal carries: of its content as it reads back from disk, the digest itself left out."""
    plain = json.loads(json.dumps({k: v for k, v in data.items() if k != DIGEST_KEY}, default=str))
    return "sha256:" + hashlib.sha256(canonical(plain).encode()).hexdigest()


def depth_within(value, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests no deeper than ``limit`` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > limit:
                return False
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return True


def read_json(path: Path):
    """The JSON document at ``path``; ValueError saying why not (too large, too deep, not JSON)."""
    with open(path, "rb") as fh:
        raw = fh.read(MAX_JOURNAL_BYTES + 1)
    if len(raw) > MAX_JOURNAL_BYTES:
        raise ValueError(f"larger than {MAX_JOURNAL_BYTES >> 20} MiB")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 ({e.reason})") from None
    if not depth_within(data):
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    return data


def write_private(path: Path, data: dict, sign: bool = True) -> None:
    """Write ``data`` (with its digest, unless ``sign`` is false), readable by its owner only, atomically (a reader
    sees the old or the new)."""
    if sign:
        data[DIGEST_KEY] = digest_of(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(data, indent=2, default=str))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def unsigned(path, found, way_out: str) -> str:
    said = "carries no digest of its content" if not found else "does not match the digest it carries"
    return (f"journal {path}: {said} (edited since the drill wrote it, or written by a drills that did not sign "
            f"journals): refused, nothing was sent. To give the Rollout up without restoring it: drills restore "
            f"--release-lease --journal {path} ({way_out})")


def edited_original(path, key: str, way_out: str) -> str:
    return (f"journal {path}: its record of rollout {key} as it was is not the one the drill's lease records: the "
            f"journal was edited; refused, nothing was sent. To give the Rollout up without restoring it: drills "
            f"restore --release-lease --journal {path} ({way_out})")


def drill_running(data: dict) -> int | None:
    """The pid of the drill that wrote the journal ``data`` while it still runs (its recorded start time proves it;
    a journal of before that record: its command line)."""
    pid, rec = data.get("pid"), data.get("process")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid == os.getpid():
        return None
    if isinstance(rec, dict) and "start_time" in rec:
        return pid if rec.get("pid") == pid and proven(rec, ["drills"]) else None
    return pid if pid_alive(pid) and "drills" in cmdline(pid) else None


__all__ = ["DIGEST_KEY", "MAX_DEPTH", "MAX_JOURNAL_BYTES", "canonical", "depth_within", "digest_of", "drill_running",
           "edited_original", "read_json", "unsigned", "write_private"]
