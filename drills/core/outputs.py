"""Where the product writes: every output path a user names is checked before the first byte of the command is
written (and before anything is read or sent that the check does not need), so a bad one is exit 2 with one line
and nothing written, never a traceback after the work is done.

An output path is refused when it is empty, a folder, not writable (its folder or its nearest existing ancestor
cannot take a new file: checked by creating and removing a probe file there, which holds for root and read-only
filesystems too), one of the command's inputs (the same file, or a file an input folder would be read for), or
inside a run folder (a folder with a ledger.json or run.json: another run's record).  The reports folder
(``DRILLS_REPORTS``) is checked the same way by the commands that write into it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from .errors import BadInput

RUN_MARKERS = ("ledger.json", "run.json")
INPUT_SUFFIXES = (".yaml", ".yml", ".json")


class OutputRefused(BadInput):
    """An output path that cannot or must not be written: exit 2, nothing written."""


def _probe(folder: Path) -> str | None:
    """Why a new file cannot be made in ``folder`` (None when it can)."""
    probe = folder / f".drills-write-check-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass
    return None


def _existing_ancestor(p: Path) -> Path:
    for a in (p, *p.parents):
        if os.path.lexists(a):
            return a
    return Path("/")


def writable_folder(folder: str | Path, what: str) -> Path:
    """A folder the command may create files in (or, when missing, whose nearest existing ancestor may take it);
    OutputRefused otherwise.  Nothing is created here: the command makes the folder when it writes."""
    f = Path(folder).expanduser()
    anc = _existing_ancestor(f)
    if not anc.is_dir():
        raise OutputRefused(f"{what} {f}: cannot write there ({anc} is not a folder)")
    why = _probe(anc)
    if why:
        raise OutputRefused(f"{what} {f}: cannot write there ({why})")
    return f


def reports_folder() -> Path:
    """The reports folder, checked writable (DRILLS_REPORTS, else reports/)."""
    from .config import reports_dir
    return writable_folder(reports_dir(), "the reports folder (DRILLS_REPORTS)")


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def _inside(p: Path, folder: Path) -> bool:
    try:
        p.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def check_output(path: str | Path | None, flag: str, inputs: Iterable[str | Path] = (),
                 input_folders: Iterable[str | Path] = (), whole_folders: Iterable[str | Path] = ()) -> Path:
    """An output file named by ``flag``, checked before anything is written (nothing is created here but a probe
    file that is removed at once).  ``inputs`` are the input files, ``input_folders`` folders whose YAML/JSON
    files are read, ``whole_folders`` folders every file of which is input (a fleet layout)."""
    if path is None or not str(path).strip():
        raise OutputRefused(f"{flag} {str(path)!r}: give a file to write")
    p = Path(str(path)).expanduser()
    if p.is_dir():
        raise OutputRefused(f"{flag} {p}: is a folder, give a file")
    for i in inputs:
        i = Path(str(i))
        if str(i) != "-" and os.path.lexists(i) and (os.path.lexists(p) and _same(p, i) or
                                                      p.resolve() == i.resolve()):
            raise OutputRefused(f"{flag} {p}: is an input of this command ({i}); writing it would overwrite it")
    for d in input_folders:
        d = Path(str(d))
        if d.is_dir() and _inside(p, d) and p.suffix.lower() in INPUT_SUFFIXES and \
                not any(part.startswith(".") for part in p.resolve().relative_to(d.resolve()).parts):
            raise OutputRefused(f"{flag} {p}: inside the input folder {d}, where it would be read as input")
    for d in whole_folders:
        d = Path(str(d))
        if d.is_dir() and _inside(p, d):
            raise OutputRefused(f"{flag} {p}: inside {d}, an input of this command")
    for a in p.resolve().parents:
        if any((a / m).is_file() for m in RUN_MARKERS):
            raise OutputRefused(f"{flag} {p}: inside the run folder {a} (another run's record); write it elsewhere")
    if os.path.lexists(p):
        if not os.access(p, os.W_OK):
            raise OutputRefused(f"{flag} {p}: cannot write there (not writable)")
        try:
            with open(p, "ab"):
                pass
        except OSError as e:
            raise OutputRefused(f"{flag} {p}: cannot write there ({e.strerror or e})") from None
        return p
    anc = _existing_ancestor(p.parent)
    if not anc.is_dir():
        raise OutputRefused(f"{flag} {p}: cannot write there ({anc} is not a folder)")
    why = _probe(anc)
    if why:
        raise OutputRefused(f"{flag} {p}: cannot write there ({why})")
    return p


def check_distinct(paths: dict[str, str | None]) -> None:
    """Two outputs of one command must not be one file."""
    seen: dict[Path, str] = {}
    for flag, path in paths.items():
        if not path:
            continue
        r = Path(path).expanduser().resolve()
        if r in seen:
            raise OutputRefused(f"{flag} and {seen[r]} name the same file {path}: give each its own")
        seen[r] = flag
