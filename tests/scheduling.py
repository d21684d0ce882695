"""How `make test` hands its tests to the workers (tests/conftest.py's pytest_xdist_make_scheduler): whole files, as
--dist loadfile does, except that every test on a later controller version goes to one worker.  A module of its own
(not conftest.py): a test imports it by a name no other folder's module has."""
from __future__ import annotations

from xdist.scheduler import LoadFileScheduling


def later_version(nodeid: str, later: tuple[str, ...], first: tuple[str, ...] = ()) -> str | None:
    """The controller version after the first one (``later``) that a test's parameters name (``test_x[v1.10.2]``,
    ``test_y[v1.10.2-case]``, ``test_z[v1.11.0-rc1]``), or None: a version is whole ``-``-separated parts of the id,
    and of the versions under test (``first`` and ``later``) the longest that fits is the test's (``v1.11.0-rc1``
    under test beside ``v1.11.0``: its tests are not ``v1.11.0``'s)."""
    if not nodeid.endswith("]") or "[" not in nodeid:
        return None
    ident = "-" + nodeid[nodeid.index("[") + 1:-1] + "-"
    named = [v for v in (*first, *later) if f"-{v}-" in ident]
    version = max(named, key=len, default=None)
    return version if version in later else None


class VersionGroupedFileScheduling(LoadFileScheduling):
    """--dist loadfile, but a test on a later controller version (``later``) goes with every other test on that
    version, to one worker: a worker's cluster is replaced at each version change (a fresh cluster, never a
    controller swapped under it), and a file that runs on both versions replaced it twice, on each worker that took
    one."""
    later: tuple[str, ...] = ()
    first: tuple[str, ...] = ()

    def _split_scope(self, nodeid: str) -> str:
        version = later_version(nodeid, self.later, self.first)
        return f"controller {version}" if version else super()._split_scope(nodeid)
