"""Plain names: every name the product joins into a path is one of these, checked before it is used.

A cluster (``$DRILLS_CLUSTER``), a namespace, a Rollout, a lane, a controller version or label, a shard, a run id:
each becomes a folder or a file name somewhere (``$DRILLS_CACHE/clusters/<cluster>``, ``reports/<run-id>``,
``<run>/<version>/``).  A plain name is letters, digits and ``._+-``, starts with a letter or a digit (so never
``.``, ``..``, a hidden file of the product's own or an option), and is at most ``MAX_NAME`` characters: it can
only ever name one entry inside the folder it is joined to.  Anything else is bad input (exit 2), refused before
anything is read, written or signalled.  Nothing in this module imports the rest of the package but ``errors``.
"""
from __future__ import annotations

import re

from .errors import BadInput

MAX_NAME = 128
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*", re.ASCII)


class BadName(BadInput):
    """A name that would not stay one plain entry of the folder it is joined to: exit 2."""


def is_plain_name(value: object, max_len: int = MAX_NAME) -> bool:
    return isinstance(value, str) and 0 < len(value) <= max_len and _PLAIN.fullmatch(value) is not None


def plain_name(value: object, what: str, max_len: int = MAX_NAME) -> str:
    """``value`` when it is a plain name; BadName (naming ``what``) otherwise."""
    if is_plain_name(value, max_len):
        return value  # type: ignore[return-value]
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise BadName(f"{what} {shown} is not a plain name: use letters, digits and ._+- (starting with a letter or a "
                  f"digit, at most {max_len} characters; no '/', '.' or '..')")


__all__ = ["MAX_NAME", "BadName", "is_plain_name", "plain_name"]
