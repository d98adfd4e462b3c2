"""A consistent copy of a live SQLite archive (``sdsync store backup``).

Theory of operation
-------------------
The copy is made with SQLite's online backup API (:meth:`sqlite3.Connection.backup`),
which copies the database page by page, a step of :data:`STEP_PAGES` at a time, so that a
large archive reports progress and Ctrl-C stops it between steps.  The API alone restarts
the copy from the first page whenever another connection writes between two steps (it
then cannot know which pages changed), so under a node's steady ingestion a stepped copy
of a large archive would never end.  Ours therefore opens a read transaction on the
source first and keeps it open until the last step: the backup runs inside that one
snapshot, never restarts, and holds exactly what was committed when the transaction
began.  That snapshot is the guarantee: every message whose commit came before the
backup started is in it.

An archive runs in WAL mode (:mod:`~sdsync.store.sqlite`), where a reader blocks no
writer: the serving node goes on ingesting, its commits landing in the WAL behind our
snapshot.  The one cost is that checkpoints cannot move past the snapshot while the copy
runs, so the WAL grows by what is written meanwhile and is folded back afterwards.  The
source is opened read-only (``mode=ro``) and none of its settings is touched: a backup
never writes the archive nor changes its journal mode.

The copy goes to a temporary file beside PATH, is checked there (``PRAGMA quick_check``,
and its message count against the snapshot's), flushed to disk, and only then put at
PATH: linked there, which fails if PATH appeared meanwhile, or with ``overwrite`` renamed
over it, atomically.  A failure, Ctrl-C or a crash at any instant leaves PATH as it was,
never half a backup; the temporary file is removed, except after a crash (it is named
``.PATH.….partial``, and can be deleted).  PATH's own ``-wal`` or ``-journal`` beside it,
if not empty, is refused: SQLite would apply such a leftover to the new file when it is
first opened.  (A read-only reader cannot remove the ``-wal`` and ``-shm`` it needed, so a
backup of a stopped archive leaves an empty pair beside it; the node's next open uses
them and removes them at its close.)

PostgreSQL has its own tools for this, which see into its MVCC snapshots; a
``postgresql://`` source is refused with the ``pg_dump`` and ``pg_restore`` commands to
use instead (docs/store.md, "Backup and restore").
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sdsync.errors import LocalProtocolError, ServiceUnavailable
from sdsync.files import fsync_path
from sdsync.store.backend import sqlite_path

__all__ = [
    "STEP_PAGES",
    "BackupFailed",
    "BackupRefusedError",
    "BackupReport",
    "Progress",
    "backup_archive",
]

STEP_PAGES = 1024
"""Pages copied per step (4 MiB at SQLite's default page size): a progress report and a
chance to stop between any two."""
# Files SQLite reads beside a database when it opens it: a leftover one would be applied
# to (or rolled back into) a new file put at that name.
_HOT_SUFFIXES = ("-wal", "-journal")
_SIDE_SUFFIXES = (*_HOT_SUFFIXES, "-shm")
BUSY_TIMEOUT_MS = 10_000  # the archive's own: waits out a node opening the file

Progress = Callable[[int, int], None]
"""Told after every step: bytes copied so far, bytes in all."""


class BackupRefusedError(LocalProtocolError):
    """The backup cannot be made as asked (PATH exists, the source is not an archive or is
    on PostgreSQL...); nothing was written."""


class BackupFailed(ServiceUnavailable):
    """The copy failed (the disk, the database, a copy that did not check out); PATH is
    as it was. The driver's or the system's error is the cause."""


@dataclass(frozen=True)
class BackupReport:
    source: Path
    path: Path
    messages: int
    """Messages in the backup: the archive's, when the backup began."""
    bytes: int
    """Size of the backup file."""
    seconds: float


def backup_archive(
    db: str,
    path: Path,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
    step_pages: int | None = None,
) -> BackupReport:
    """Copy the SQLite archive ``db`` (a path, ``sqlite://`` prefix optional) to ``path``
    while it may be serving; ``progress`` is told after every step of ``step_pages``
    (:data:`STEP_PAGES` if None).

    Raises :class:`BackupRefusedError` for a request that cannot be done (nothing written),
    :class:`BackupFailed` when the copy fails (``path`` as it was); an exception from
    ``progress`` (``KeyboardInterrupt`` among them) stops the copy and is raised as it is.
    """
    started = time.monotonic()
    target = path.expanduser().absolute()
    source = _sqlite_source(db, target)
    _check_target(source, target, overwrite=overwrite)
    try:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
        os.close(fd)
    except OSError as exc:
        raise BackupFailed(f"cannot write in {target.parent}: {exc}") from exc
    partial = Path(name)
    try:
        messages = _copy(source, partial, progress, step_pages or STEP_PAGES)
        size = _put_in_place(partial, target, overwrite=overwrite)
    finally:
        for leftover in (partial, *_beside(partial, _SIDE_SUFFIXES)):
            leftover.unlink(missing_ok=True)
    return BackupReport(
        source=source,
        path=target,
        messages=messages,
        bytes=size,
        seconds=time.monotonic() - started,
    )


def _put_in_place(partial: Path, target: Path, *, overwrite: bool) -> int:
    """Make the checked copy durable and put it at ``target``, whole; its size."""
    try:
        fsync_path(partial)
        size = partial.stat().st_size
        try:
            if overwrite:
                os.replace(partial, target)
            else:
                os.link(partial, target)  # fails if PATH appeared during the copy
        except FileExistsError:
            raise BackupRefusedError(f"{target} exists (give --overwrite to replace it)") from None
        fsync_path(target.parent)  # the new name survives a power loss too
    except OSError as exc:
        raise BackupFailed(f"cannot write the backup {target}: {exc}") from exc
    return size


def postgres_advice(path: Path) -> str:
    """What to run instead of backing up a PostgreSQL archive to ``path``."""
    return (
        "a PostgreSQL archive is backed up with PostgreSQL's tools, not sdsync: "
        f"pg_dump --format=custom --file {path} DBURL (DBURL: the --db URL; a consistent "
        "snapshot while the node serves), restored with the node stopped by "
        f"pg_restore --clean --if-exists --dbname DBURL {path} (see docs/store.md, "
        "'Backup and restore')"
    )


def _sqlite_source(db: str, target: Path) -> Path:
    path = sqlite_path(db)
    if path is None:
        raise BackupRefusedError(postgres_advice(target))
    source = Path(path).expanduser().absolute()
    if not source.is_file():
        raise BackupRefusedError(f"no archive at {source} (give --db or --data-dir)")
    return source


def _check_target(source: Path, target: Path, *, overwrite: bool) -> None:
    if not target.parent.is_dir():
        raise BackupRefusedError(f"no directory {target.parent} to write the backup in")
    if target.is_dir():
        raise BackupRefusedError(f"{target} is a directory; name the backup file")
    if target.exists():
        if target.samefile(source):
            raise BackupRefusedError(f"{target} is the archive itself")
        if not overwrite:
            raise BackupRefusedError(f"{target} exists (give --overwrite to replace it)")
    for hot in _beside(target, _HOT_SUFFIXES):
        # Empty, it is nothing to SQLite (a read-only reader of PATH leaves such a -wal).
        if hot.exists() and hot.stat().st_size > 0:
            raise BackupRefusedError(
                f"{hot} exists: a database at {target} is open or was not closed cleanly, and "
                "SQLite would apply it to the backup; stop what uses it, or name another file"
            )


def _copy(source: Path, partial: Path, progress: Progress | None, step_pages: int) -> int:
    """Copy ``source`` to ``partial`` in one snapshot and check the copy; its message count."""
    try:
        # isolation_level=None: the module opens no transaction of its own; ours is the
        # snapshot, begun and ended here.
        src = sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise BackupFailed(f"cannot open the archive {source}: {exc}") from exc
    try:
        try:
            src.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            src.execute("BEGIN")
            # The first read starts the snapshot the whole copy is taken in.
            is_archive = src.execute(
                "SELECT count(*) FROM pragma_table_info('messages') WHERE name = 'message_hash'"
            ).fetchone()[0]
        except sqlite3.DatabaseError as exc:
            if exc.sqlite_errorname == "SQLITE_NOTADB":
                raise BackupRefusedError(f"{source} is not an sdsync archive: {exc}") from None
            raise BackupFailed(f"cannot read the archive {source}: {exc}") from exc
        if not is_archive:
            raise BackupRefusedError(f"{source} is not an sdsync archive: it has no messages table")
        try:
            page_size = int(src.execute("PRAGMA page_size").fetchone()[0])
            expected = int(src.execute("SELECT count(*) FROM messages").fetchone()[0])
            dst = sqlite3.connect(partial, isolation_level=None)
            try:
                src.backup(dst, pages=step_pages, progress=_step_reporter(progress, page_size))
            finally:
                dst.close()
        except sqlite3.Error as exc:
            raise BackupFailed(f"cannot copy the archive {source}: {exc}") from exc
    finally:
        src.close()  # ends the snapshot: the node's checkpoints may pass it again
    _verify(partial, expected)
    return expected


def _step_reporter(
    progress: Progress | None, page_size: int
) -> Callable[[int, int, int], object] | None:
    if progress is None:
        return None

    def step(status: int, remaining: int, pages: int) -> None:
        progress((pages - remaining) * page_size, pages * page_size)

    return step


def _verify(partial: Path, expected: int) -> None:
    """Refuse a copy that is damaged or is not the snapshot it was taken from."""
    try:
        check = sqlite3.connect(partial, isolation_level=None)
        try:
            verdict = [row[0] for row in check.execute("PRAGMA quick_check")]
            count = int(check.execute("SELECT count(*) FROM messages").fetchone()[0])
        finally:
            # The last connection to close removes the -wal and -shm it made.
            check.close()
    except sqlite3.Error as exc:
        raise BackupFailed(f"the copy cannot be read back: {exc}") from exc
    if verdict != ["ok"]:
        raise BackupFailed(f"the copy failed its check: {'; '.join(map(str, verdict[:5]))}")
    if count != expected:
        raise BackupFailed(f"the copy holds {count} messages, the archive held {expected}")


def _beside(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    return [path.with_name(path.name + suffix) for suffix in suffixes]
