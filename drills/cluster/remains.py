"""The remains of a run that could not clean up after itself (SIGKILL, a crash, a machine that lost power).

A run marks each embedded cluster it starts with its owner: ``clusters/.<name>.owner.json`` beside the cluster
folder, written before `up` (so a run killed during `up` is found too) and removed when the run takes the cluster
down.  The owner is the run's id and its process as drills.core.procs.identity records it (pid, start time, boot id).
A mark whose process is provably gone (no such pid, another start time, another boot) names the remains of a
killed run: the next `drills run` or `drills cluster up` takes that cluster down (only what the cluster's record
proves is its own is signalled, drills.cluster.state) and says so.  A cluster somebody still holds
(drills.cluster.usage) is never taken down on that ground; a cluster kept on purpose (`--keep-cluster`, `drills
cluster up`) carries no mark.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..core import config
from ..core.names import is_plain_name
from ..core.procs import boot_id, identity, is_pid, start_time

MAX_MARK_BYTES = 4096
SUFFIX = ".owner.json"


def mark_path(name: str) -> Path:
    return config.clusters_dir().absolute() / f".{name}{SUFFIX}"


def mark(name: str, run_id: str) -> None:
    """Record this process (run ``run_id``) as the owner of cluster ``name``."""
    path = mark_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(identity(os.getpid()), run_id=str(run_id)[:100])))
    os.replace(tmp, path)


def unmark(name: str) -> None:
    """The owner took its cluster down (or keeps it on purpose): the mark goes."""
    mark_path(name).unlink(missing_ok=True)


def read_mark(path: Path) -> dict | None:
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(MAX_MARK_BYTES + 1)[:MAX_MARK_BYTES] or b"{}")
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def owner_gone(owner: dict) -> bool:
    """True when the process the mark names has provably exited (its pid free or reused, or another boot); a mark
    that does not say who is taken as gone too (its writer never leaves one so)."""
    pid, started, boot = owner.get("pid"), owner.get("start_time"), owner.get("boot_id")
    if not is_pid(pid) or not isinstance(started, int) or not isinstance(boot, str):
        return True
    return boot != boot_id() or start_time(pid) != started


def abandoned() -> list[tuple[str, dict]]:
    """(cluster name, owner) of every mark whose owner is gone."""
    out = []
    folder = config.clusters_dir().absolute()
    try:
        entries = sorted(folder.glob(f".*{SUFFIX}"))
    except OSError:
        return []
    for path in entries:
        name = path.name[1:-len(SUFFIX)]
        if not is_plain_name(name):
            continue
        owner = read_mark(path) or {}
        if owner_gone(owner):
            out.append((name, owner))
    return out


def reap(log, skip: tuple[str, ...] = ()) -> list[str]:
    """Take down every cluster a killed run left (its mark's owner gone, nobody holding it) and say so for each;
    returns their names.  A cluster in use is left, and said."""
    from .embedded import EmbeddedCluster
    reaped = []
    for name, owner in abandoned():
        if name in skip:
            continue
        c = EmbeddedCluster(name, log=log)
        who = f"run {owner.get('run_id') or '?'} (pid {owner.get('pid')})"
        if not (c.folder.exists() or c.kwok_dir.exists()):
            unmark(name)                        # that run had taken it down already
            continue
        users = c.holders()
        if users:
            log(f"cluster: {name} was started by {who}, which is gone, but it is in use by {len(users)} holder(s): "
                f"left up")
            continue
        log(f"cluster: {name} is what {who} left behind (that process is gone): taking it down")
        result = c.down(quiet=True, if_unused=True)
        if "left_up" in result:
            continue
        unmark(name)
        reaped.append(name)
        left = result.get("left_running") or []
        log(f"cluster: {name} of {who} taken down (stopped: {', '.join(result.get('stopped') or []) or 'nothing'})"
            + (f"; left running, not proven to be its own: pid {', '.join(map(str, left[:10]))}" if left else ""))
    return reaped


__all__ = ["abandoned", "mark", "mark_path", "owner_gone", "reap", "read_mark", "unmark"]
