"""A full disk under the run folder of a live drill.

The drill runs in a mount namespace of its own whose run folder (DRILLS_REPORTS) is a small tmpfs; at a named
phase the case fills that tmpfs to the last byte through /proc/<pid>/root, so every later write of the drill (its
timelines, its ledger, its journal) fails with ENOSPC as on a full disk.  The drill must stop, restore the target
exactly and release its lease (the cluster is what matters; a journal it cannot update is said), leave nothing,
and never `pass` a step whose record it could not write.  When the drill is done the wrapper frees the tmpfs and
copies the run folder out for the checks."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.single_version

TMPFS_SIZE = "2m"


def _in_own_tmpfs(reports: Path, out: Path) -> list[str]:
    """The drill's command prefixed: a private mount namespace with a tmpfs on ``reports``; afterwards the filler is
    removed and the run folder copied to ``out`` (the namespace, and its tmpfs, end with the drill)."""
    script = (f'mount -t tmpfs -o size={TMPFS_SIZE} tmpfs "$0" || exit 97; "$@"; rc=$?; rm -f "$0/filler"; '
              f'cp -a "$0/." "{out}/"; exit $rc')
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--propagation", "private", "sh", "-c", script, str(reports)]


def _fill(pid: int, reports: Path) -> int:
    """Fill the drill's tmpfs (seen through its mount namespace) until ENOSPC; returns the bytes written."""
    path = Path(f"/proc/{pid}/root{reports}") / "filler"
    n = 0
    with open(path, "wb", buffering=0) as f:
        chunk = b"\0" * (1 << 16)
        while True:
            try:
                n += f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return n
                chunk = chunk[: len(chunk) // 2]


@pytest.mark.parametrize("phase", [pytest.param("before", id="full-disk-during-before"),
                                   pytest.param("after", id="full-disk-during-after")])
def test_full_disk_under_the_run_folder(stage, phase):
    s = stage()
    s.reports.mkdir(parents=True)
    out = s.tmp / "run-folder-copy"
    out.mkdir()
    if phase == "before":
        s.hold(s.d.hash_v1)
    drill = s.live(wrap=_in_own_tmpfs(s.reports, out))
    if phase == "after":
        s.reach("redeploy", drill)
        s.hold(s.d.hash_v1)
    s.reach(phase, drill)
    assert _fill(drill.pid, s.reports) > 0
    s.release()
    rc = drill.wait()
    assert rc != 97, "the tmpfs could not be mounted: " + drill.tail()
    assert rc in (1, 3), drill.tail()
    assert "Traceback" not in drill.console, drill.tail()
    assert "No space left on device" in drill.console, drill.tail()
    s.assert_restored()
    s.reports = out             # the run folder as the drill left it, copied out of its tmpfs
    s.assert_no_pass_from(phase)
    s.assert_nothing_left()
