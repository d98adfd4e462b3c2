"""The embedded archive: one SQLite file in WAL mode.

Theory of operation
-------------------
WAL lets readers run beside the single writer, so every thread reads through its own
connection while writes go through one connection behind a lock (SQLite allows one
writer at a time anyway; queueing in Python is cheaper than spinning on
``SQLITE_BUSY``).  ``synchronous=NORMAL`` is WAL's recommended durability: a power
loss may drop the last transactions, never corrupt the file.  The file is created with
``auto_vacuum=INCREMENTAL`` so that pages freed by retention are handed back to the
file system, which is what the size retention policy measures.  Every use of a
connection is inside :func:`~sdsync.store.archive.map_driver_errors`: a ``sqlite3``
error leaves the archive as :class:`~sdsync.store.archive.ArchiveUnavailable`.

Opening creates the file at the current layout, or upgrades one written by an earlier
release, in one ``BEGIN IMMEDIATE`` transaction (:mod:`~sdsync.store.migrations`); a file
written by a newer release is refused, that transaction rolled back with nothing written.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sdsync.store.archive import TOPIC_INDEXES, Key, SqlArchive, map_driver_errors
from sdsync.store.migrations import statements, upgrade
from sdsync.store.schema import create_table

CACHE_KIB = 64 * 1024  # per connection; pages are allocated as they are used
# The current layout, which a new archive is created with.
_SCHEMA = statements(
    create_table("sqlite")
    + """
CREATE UNIQUE INDEX IF NOT EXISTS messages_hash ON messages (message_hash);
CREATE INDEX IF NOT EXISTS messages_time ON messages (timestamp, message_hash);"""
    + TOPIC_INDEXES
)


class SqliteArchive(SqlArchive):
    backend = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self._local = threading.local()
        self._write_lock = threading.Lock()
        with map_driver_errors(sqlite3.Error):
            self._writer = self._connect(wal=False)
        try:
            with self._write() as conn:
                self.schema_version = upgrade(conn, "sqlite", _SCHEMA)
            # Only now: WAL is written into the file's header, and a file refused above
            # (a newer release's archive, another application's database) stays as it was.
            with map_driver_errors(sqlite3.Error):
                self._writer.execute("PRAGMA journal_mode = WAL")
        except BaseException:
            self.close()
            raise

    def _connect(self, *, wal: bool = True) -> sqlite3.Connection:
        # isolation_level=None: we say where transactions begin (BEGIN IMMEDIATE).
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 10000")
        # Before anything writes the file header, so on a new file only: on an existing one
        # it would change nothing but the header's change counter, which is a write (and an
        # archive this release refuses must be left as it was, byte for byte).
        if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        if wal:
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        # 2 MiB by default: too little to keep the upper index levels of a large archive.
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        with self._connections_lock:
            self._connections.append(conn)
        return conn

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with map_driver_errors(sqlite3.Error):
            conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self._connect()
            yield conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with map_driver_errors(sqlite3.Error), self._write_lock:
            self._writer.execute("BEGIN IMMEDIATE")
            try:
                yield self._writer
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

    def _table(self, index: str) -> str:
        # Without statistics (no ANALYZE) SQLite's planner can take a shorter index and
        # filter, or sort; each query shape has its index, so the statement names it.
        return f"messages INDEXED BY {index}"

    def _delete_below(self, key: Key) -> int:
        with self._write() as conn:
            deleted = conn.execute(
                "DELETE FROM messages WHERE (timestamp, message_hash) < (?, ?)", key
            ).rowcount
        with map_driver_errors(sqlite3.Error), self._write_lock:
            # execute() would step it once, freeing a single page; a script runs it to the end.
            self._writer.executescript("PRAGMA incremental_vacuum;")
        return int(deleted)

    def release_memory(self) -> None:
        # Each connection caches the pages it read, and other threads own them: only where
        # SQLite serializes each connection's calls (threadsafety 3, its default build).
        if sqlite3.threadsafety < 3:
            return
        with map_driver_errors(sqlite3.Error), self._connections_lock:
            for conn in self._connections:
                conn.execute("PRAGMA shrink_memory")

    def size_bytes(self) -> int:
        rows = self._fetch(
            "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()", []
        )
        return int(rows[0][0])

    def close(self) -> None:
        with map_driver_errors(sqlite3.Error), self._connections_lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
