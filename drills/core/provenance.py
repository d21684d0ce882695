"""Where a record comes from: the drills version and commit that wrote it, and a source tree's commit.

run.json and every ledger row carry ``drills_version``, ``drills_commit`` (the checkout's HEAD, ``None`` when the
package is not a git checkout, with ``-dirty`` when its tracked files differ from HEAD) and the Kubernetes version
the drill ran against.  ``git_commit`` also names a user-built controller by the commit of its ``--source`` tree.
"""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from .. import __version__
from . import config
from .procs import die_with_parent

GIT_TIMEOUT_S = 10.0
SHORT = 12                 # characters of a commit or a sha256 in a name


def git_commit(tree: Path | str | None, short: bool = False, dirty: bool = True) -> str | None:
    """HEAD of the git checkout ``tree`` is in (None when it is none, or git is missing or slow)."""
    if not tree:
        return None
    p = Path(tree).expanduser()
    where = p if p.is_dir() else p.parent
    if not where.is_dir():
        return None

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True,
                               timeout=GIT_TIMEOUT_S, preexec_fn=die_with_parent)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None
    head = git("rev-parse", f"--short={SHORT}" if short else "--verify", "HEAD")
    if not head:
        return None
    if dirty and git("status", "--porcelain", "--untracked-files=no"):
        head += "-dirty"
    return head


@functools.lru_cache(maxsize=1)
def drills_commit() -> str | None:
    return git_commit(config.project_root())


def stamp(kubernetes_version: str | None = None) -> dict:
    """The provenance fields of run.json and of every ledger row."""
    return {"drills_version": __version__, "drills_commit": drills_commit(),
            "kubernetes_version": kubernetes_version}
