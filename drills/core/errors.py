"""Errors and exit codes of every drill command.

Exit codes: 0 all pass, 1 a fail, 2 bad input or a refused target (nothing mutated), 3 inconclusive.
Precedence when a run combines several outcomes: 2 > 1 > 3 > 0.

Every library error that means "the input is wrong" or "this target is refused" subclasses ``BadInput``;
the command line maps it to exit 2 with one line.  Nothing in this module imports the rest of the package.
"""
from __future__ import annotations

import sys

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INCONCLUSIVE = 0, 1, 2, 3
EXIT_PRECEDENCE = (EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INCONCLUSIVE)


class DrillsError(Exception):
    """Base of the project's own errors."""


class BadInput(DrillsError):
    """Bad input: exit 2, one line, nothing mutated."""


class Refused(BadInput):
    """A target the drill refuses to touch (allowlist, opt-in label, lease, preconditions): exit 2."""


class Unreachable(BadInput):
    """The Kubernetes API could not be reached, authenticated or read before anything was mutated."""


def combine_exit_codes(*codes: int) -> int:
    """Precedence of drill exits: 2 bad input or refused target > 1 any fail > 3 any inconclusive > 0."""
    for c in EXIT_PRECEDENCE:
        if c in codes:
            return c
    return max(codes) if codes else EXIT_OK


def err(msg: str) -> None:
    """A command's error line on stderr, as every drills command writes it."""
    print(f"drills: {msg}", file=sys.stderr, flush=True)
