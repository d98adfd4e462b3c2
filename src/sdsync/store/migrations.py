"""Archive upgrades: the layout an archive is at, and the steps from each earlier one.

Theory of operation
-------------------
An archive's *layout* — its tables, their columns, their indexes — has a number, kept in
the database itself: the one row of the table ``sdsync_archive``.  Each backend's
constructor calls :func:`upgrade` inside ONE write transaction, which reads that number:

* no ``messages`` table: a new archive; the current layout is created, and its number;
* :data:`~sdsync.store.schema.SCHEMA_VERSION`, the current number: nothing is written;
* an earlier number: every step of :data:`MIGRATIONS` after it runs, in order, and the
  number becomes the current one;
* a later number: :class:`ArchiveVersionError`.  The archive was written by a newer
  release, whose layout this code cannot know, so the transaction is rolled back with
  nothing written: the archive is left as it was, byte for byte;
* a ``messages`` table but no number: an archive from before the numbers (up to commit
  62d48a8).  Its layout is read from its indexes — each layout added some, and every open
  created all the indexes its code knew — and it is upgraded from there, as above.

A crash at any instant of an upgrade (kill -9, power lost, a statement that fails) leaves
the archive as it was or fully upgraded, never between: every step and the new number
commit together, since SQLite and PostgreSQL both roll DDL back with its transaction.
The next open starts again from the number that was committed.  Two processes opening
one database cannot both upgrade it: SQLite's ``BEGIN IMMEDIATE`` admits one writer, and
on PostgreSQL the backend takes the advisory lock its partition DDL takes, before it
calls :func:`upgrade`; the second opener reads the number the first committed.

The number lives in a table rather than SQLite's ``PRAGMA user_version`` because the
same statements then serve both backends (PostgreSQL has no such header field), an
archive dumped with ``sqlite3 .dump`` and restored keeps it (the dump leaves the header
out), and an operator looking at the database sees it by name.

The layouts, from the history of ``store/sqlite.py`` and ``store/postgres.py`` (the
columns never changed):

1. ``messages`` and the indexes ``messages_hash``, ``messages_time`` (SQLite; on
   PostgreSQL the primary key) and ``messages_topics``: from 831d8db to d932fcb;
2. ``messages_pubsub_time`` added (queries by ``pubsubTopic`` alone): 520b35d;
3. ``messages_content_time`` added (content topics without ``pubsubTopic``): 44aedb6.
   The number is first written by the release after 62d48a8.

The steps are history: their SQL is written out here, not built from the current DDL,
so that a later change to the current layout cannot change what an old step does.  A new
layout is a new :data:`~sdsync.store.schema.SCHEMA_VERSION`, the backends' new DDL, and
one :class:`Migration` appended here, and a fixture archive written by the code before
it (``tests/store/fixtures``): ``tests/store/test_upgrade.py`` checks that an archive of
every earlier layout is brought to the layout of a new one, on both backends, with every
message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sdsync.errors import LocalProtocolError, SchemaVersionError
from sdsync.store.schema import SCHEMA_VERSION, Dialect

__all__ = [
    "MIGRATIONS",
    "ArchiveVersionError",
    "Migration",
    "NotAnArchiveError",
    "statements",
    "upgrade",
]

logger = logging.getLogger(__name__)

VERSION_TABLE = "sdsync_archive"
# One row (id 0). The same DDL on both backends.
_VERSION_DDL = (
    f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} ("
    " id INTEGER PRIMARY KEY CHECK (id = 0), schema_version INTEGER NOT NULL)"
)
# The columns of layout 1, which every layout since has kept: a ``messages`` table
# without them is some other application's, not an archive from before the numbers.
_ARCHIVE_COLUMNS_1 = frozenset(
    ("message_hash", "timestamp", "pubsub_topic", "content_topic", "payload", "meta", "version")
)


class Connection(Protocol):
    """A connection of either driver inside the caller's write transaction."""

    def execute(self, sql: str, /) -> Any: ...


class ArchiveVersionError(SchemaVersionError):
    """The archive is at a layout this release does not know; nothing was written."""

    def __init__(self, found: int, supported: int) -> None:
        super().__init__("the archive's", found, supported, "use another --db")


class NotAnArchiveError(LocalProtocolError):
    """The database has a ``messages`` table that is not an archive's; nothing was written."""


@dataclass(frozen=True)
class Migration:
    """One step: what turns the layout before :attr:`version` into that layout."""

    version: int
    """The layout this step makes."""
    commit: str
    """The commit whose code first made that layout (for people reading the list)."""
    marks: frozenset[str]
    """The indexes that layout added: how an archive from before the numbers is known to
    be at it already."""
    statements: Callable[[Dialect], Sequence[str]]
    """The step's SQL on a backend."""


def _add_pubsub_index(dialect: Dialect) -> Sequence[str]:
    # IF NOT EXISTS: a step may run on an archive from before the numbers whose indexes
    # were read as an earlier layout (one made by hand, say); it is harmless there.
    return (
        "CREATE INDEX IF NOT EXISTS messages_pubsub_time"
        " ON messages (pubsub_topic, timestamp, message_hash)",
    )


def _add_content_index(dialect: Dialect) -> Sequence[str]:
    return (
        "CREATE INDEX IF NOT EXISTS messages_content_time"
        " ON messages (content_topic, timestamp, message_hash)",
    )


#: Every step, in order; layout 1 is where they start.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(2, "520b35d", frozenset({"messages_pubsub_time"}), _add_pubsub_index),
    Migration(3, "44aedb6", frozenset({"messages_content_time"}), _add_content_index),
)

# Per backend: the catalog queries upgrade needs (every name in them is a constant).
_HAS_TABLE: dict[Dialect, str] = {
    "sqlite": "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '{}'",
    "postgresql": "SELECT to_regclass('{}') IS NOT NULL",
}
_COLUMNS: dict[Dialect, str] = {
    "sqlite": "SELECT name FROM pragma_table_info('messages')",
    "postgresql": "SELECT attname FROM pg_attribute"
    " WHERE attrelid = 'messages'::regclass AND attnum > 0 AND NOT attisdropped",
}
_INDEXES: dict[Dialect, str] = {
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'messages'",
    "postgresql": "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
    " WHERE i.indrelid = 'messages'::regclass",
}


def upgrade(conn: Connection, dialect: Dialect, layout: Sequence[str]) -> int:
    """Bring the archive on ``conn`` to :data:`~sdsync.store.schema.SCHEMA_VERSION`, or
    create it with ``layout`` (the backend's DDL of the current layout); returns the
    version it is at.

    Runs inside the caller's write transaction, which must roll back if this raises:
    :class:`ArchiveVersionError` for a layout this release does not know,
    :class:`NotAnArchiveError` for some other application's ``messages`` table.
    """
    marked = _marked_version(conn, dialect)
    if marked == SCHEMA_VERSION:
        return marked
    if marked is None and not _has_table(conn, dialect, "messages"):
        _run(conn, layout)
        _write_version(conn)
        return SCHEMA_VERSION
    found = marked if marked is not None else _unmarked_version(conn, dialect)
    if not 1 <= found <= SCHEMA_VERSION:
        raise ArchiveVersionError(found, SCHEMA_VERSION)
    for step in MIGRATIONS:
        if step.version > found:
            _run(conn, step.statements(dialect))
    _write_version(conn)
    logger.info("archive upgraded from schema version %d to %d", found, SCHEMA_VERSION)
    return SCHEMA_VERSION


def statements(script: str) -> tuple[str, ...]:
    """The statements of a DDL script, one by one (SQLite executes one per call; our DDL
    has no ``;`` inside a literal)."""
    return tuple(s.strip() for s in script.split(";") if s.strip())


def _run(conn: Connection, sql: Sequence[str]) -> None:
    for statement in sql:
        conn.execute(statement)


def _has_table(conn: Connection, dialect: Dialect, name: str) -> bool:
    return bool(conn.execute(_HAS_TABLE[dialect].format(name)).fetchone()[0])


def _marked_version(conn: Connection, dialect: Dialect) -> int | None:
    """The number in ``sdsync_archive``; None when the table or its row is missing."""
    if not _has_table(conn, dialect, VERSION_TABLE):
        return None
    row = conn.execute(f"SELECT schema_version FROM {VERSION_TABLE} WHERE id = 0").fetchone()
    return None if row is None else int(row[0])


def _unmarked_version(conn: Connection, dialect: Dialect) -> int:
    """The layout of an archive from before the numbers, read from its indexes: the last
    layout whose indexes, and those of every layout before it, are all there."""
    columns = {str(r[0]) for r in conn.execute(_COLUMNS[dialect]).fetchall()}
    if missing := sorted(_ARCHIVE_COLUMNS_1 - columns):
        raise NotAnArchiveError(
            f"its messages table has no column {', '.join(missing)}: it is not an sdsync"
            " archive; use another --db"
        )
    indexes = {str(r[0]) for r in conn.execute(_INDEXES[dialect]).fetchall()}
    version = 1
    for step in MIGRATIONS:
        if not step.marks <= indexes:
            break
        version = step.version
    return version


def _write_version(conn: Connection) -> None:
    conn.execute(_VERSION_DDL)
    conn.execute(
        f"INSERT INTO {VERSION_TABLE} (id, schema_version) VALUES (0, {SCHEMA_VERSION:d})"
        " ON CONFLICT (id) DO UPDATE SET schema_version = excluded.schema_version"
    )
