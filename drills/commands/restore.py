"""`drills restore`: a drill's journal played back (its Rollout restored), or its lease released (drills.cli owns the
arguments).  A module of its own, apart from drills.commands.main: it loads the safety code only."""
from __future__ import annotations

from pathlib import Path

from ..core.errors import EXIT_INCONCLUSIVE, EXIT_OK
from ..drill.lease import release_lease
from ..drill.safety import restore_journal


def cmd_restore(args, log) -> int:
    if args.release_lease:
        return EXIT_OK if release_lease(Path(args.journal), args.allow_context, log=log) else EXIT_INCONCLUSIVE
    return EXIT_OK if restore_journal(Path(args.journal), args.allow_context, log=log) else EXIT_INCONCLUSIVE
