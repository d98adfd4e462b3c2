"""Small files written whole or not at all: identities, node keys, the last-online time.

A process killed mid-write must leave either the old file or the new one, never half of
either; and a file that holds a key must be readable by its owner only from the first
byte.  So the text goes to a name of its own beside the target (created owner-only, so
two writers never share one), is flushed to disk, and only then takes the target's name:
replacing what was there, or — for a file that must be created once, such as a node key
two first starts could race to make — hard-linked into place, which fails if the name
exists.  The directory is flushed last, so the new name survives a power loss too.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["fsync_path", "write_whole"]


def write_whole(path: Path, text: str, *, replace: bool = True) -> None:
    """``text`` at ``path`` (mode 0600), whole or not at all; with ``replace=False``,
    ``FileExistsError`` if ``path`` exists, and nothing written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if replace:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)
        fsync_path(path.parent)
    finally:
        Path(temporary).unlink(missing_ok=True)


def fsync_path(path: Path) -> None:
    """Flush ``path`` to disk: a file, or a directory after a name changed in it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
