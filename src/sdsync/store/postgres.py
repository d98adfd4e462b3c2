"""The archive on PostgreSQL, partitioned by hour of timestamp.

Theory of operation
-------------------
``messages`` is a range-partitioned table with one partition per hour of
``timestamp`` (named ``messages_h<hours since the epoch>``), created on demand by the
insert that first needs it.  Hourly partitions keep every index small, let queries over
a time range touch only the hours in it (partition pruning, and ordered appends for
``ORDER BY timestamp``), and make retention cheap: whole hours older than a bound are
dropped, which returns their space at once; rows are deleted only inside the hour the
bound falls in.  The primary key ``(timestamp, message_hash)`` includes the partition
key as PostgreSQL requires; since the hash covers the timestamp, it is as unique as the
hash alone.

Connections come from a small pool; ``psycopg`` returns ``bytea`` as ``bytes`` so the
shared SQL in :class:`~sdsync.store.archive.SqlArchive` works unchanged.  Partition
creation takes a transaction-scoped advisory lock so that concurrent writers (threads
or other processes) never race on the same ``CREATE TABLE``.  Every use of the pool is
inside :func:`~sdsync.store.archive.map_driver_errors`: a ``psycopg`` error (the pool's
timeouts among them) leaves the archive as
:class:`~sdsync.store.archive.ArchiveUnavailable`.

Opening creates the tables at the current layout, or upgrades an archive written by an
earlier release, in one transaction under the same advisory lock, so that two processes
opening one database at once upgrade it once (:mod:`~sdsync.store.migrations`); an
archive written by a newer release is refused, that transaction rolled back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from sdsync.store.archive import (
    TOPIC_INDEXES,
    ItemArrays,
    Key,
    SqlArchive,
    item_arrays,
    map_driver_errors,
)
from sdsync.store.migrations import statements, upgrade
from sdsync.store.schema import create_table

HOUR_NS = 3_600 * 10**9
_PREFIX = "messages_h"
_LOCK_ID = 0x5D5_57012  # advisory lock guarding the archive's DDL (partitions, upgrades)
# The current layout, which a new archive is created with.
_SCHEMA = statements(
    create_table(
        "postgresql",
        constraints="PRIMARY KEY (timestamp, message_hash)",
        options="PARTITION BY RANGE (timestamp)",
    )
    + """
CREATE INDEX IF NOT EXISTS messages_hash ON messages (message_hash);"""
    + TOPIC_INDEXES
)


class PostgresArchive(SqlArchive):
    backend = "postgresql"

    def __init__(self, url: str, *, pool_size: int = 8) -> None:
        self.url = url
        self._partitions: set[int] = set()
        self._partitions_lock = threading.Lock()
        with map_driver_errors(psycopg.Error):
            self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
                url, min_size=1, max_size=pool_size, open=False
            )
            self._pool.open(wait=True, timeout=30)
        try:
            with self._write() as conn:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_ID])
                self.schema_version = upgrade(conn, "postgresql", _SCHEMA)
            self._partitions.update(self._existing_partitions())
        except BaseException:
            self.close()
            raise

    def _sql(self, text: str) -> str:
        return text.replace("?", "%s")

    @contextmanager
    def _read(self) -> Iterator[psycopg.Connection[Any]]:
        with map_driver_errors(psycopg.Error), self._pool.connection() as conn:
            yield conn

    @contextmanager
    def _write(self) -> Iterator[psycopg.Connection[Any]]:
        with map_driver_errors(psycopg.Error), self._pool.connection() as conn, conn.transaction():
            yield conn

    def _prepare(self, rows: list[tuple[Any, ...]]) -> None:
        needed = {row[1] // HOUR_NS for row in rows} - self._partitions
        if not needed:
            return
        # Committed on their own: an insert that rolls back leaves empty hours, harmless.
        with self._write() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_ID])
            for hour in sorted(needed):
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} PARTITION OF messages "
                        "FOR VALUES FROM ({}) TO ({})"
                    ).format(
                        _partition(hour),
                        sql.Literal(hour * HOUR_NS),
                        sql.Literal((hour + 1) * HOUR_NS),
                    )
                )
        with self._partitions_lock:
            self._partitions.update(needed)

    def _merge(
        self, arms: Sequence[tuple[str, list[Any]]], order: str, limit: int
    ) -> tuple[str, list[Any]]:
        # PostgreSQL merges ordered subqueries (Merge Append), but not the partition
        # appends of a flattened UNION ALL: each arm is ordered and limited on its own.
        sql = " UNION ALL ".join(f"({arm} {order} LIMIT ?)" for arm, _ in arms)
        args = [a for _, arm_args in arms for a in [*arm_args, limit]]
        return f"{sql} {order} LIMIT ?", [*args, limit]

    def _existing_partitions(self, conn: psycopg.Connection[Any] | None = None) -> list[int]:
        query = (
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'messages'::regclass"
        )
        rows = conn.execute(query).fetchall() if conn is not None else self._fetch(query, [])
        return sorted(int(name.removeprefix(_PREFIX)) for (name,) in rows)

    def item_arrays(self, start: int, end: int) -> ItemArrays:
        # The server concatenates each hour's hashes and big-endian timestamps into two
        # bytea values (one aggregate pass feeds both, so rows pair up), which numpy reads
        # as they are: no per-row objects on our side.  Order is irrelevant, the item store
        # sorts.  One repeatable-read transaction: a consistent snapshot across the hours.
        stamps: list[npt.NDArray[np.int64]] = []
        hashes: list[bytes] = []
        with self._read() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for lo, hi in _hours(start, end):
                row = conn.execute(
                    "SELECT string_agg(message_hash, ''), string_agg(int8send(timestamp), '') "
                    "FROM messages WHERE timestamp >= %s AND timestamp < %s",
                    [lo, hi],
                ).fetchone()
                if row is not None and row[0] is not None:
                    hashes.append(row[0])
                    stamps.append(np.frombuffer(row[1], dtype=">i8").astype(np.int64))
        return item_arrays(stamps, hashes)

    def _delete_below(self, key: Key) -> int:
        timestamp, message_hash = key
        deleted = 0
        with self._write() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_ID])
            for hour in self._existing_partitions(conn):
                if (hour + 1) * HOUR_NS > timestamp:
                    break
                count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_partition(hour)))
                deleted += _scalar(count)
                conn.execute(sql.SQL("DROP TABLE {}").format(_partition(hour)))
                with self._partitions_lock:
                    self._partitions.discard(hour)
            # Only the hour the bound falls in still holds rows below it.
            deleted += conn.execute(
                "DELETE FROM messages "
                "WHERE timestamp <= %s AND (timestamp, message_hash) < (%s, %s)",
                [timestamp, timestamp, message_hash],
            ).rowcount
        return deleted

    def size_bytes(self) -> int:
        rows = self._fetch(
            "SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits "
            "WHERE inhparent = 'messages'::regclass",
            [],
        )
        return int(rows[0][0])

    def close(self) -> None:
        with map_driver_errors(psycopg.Error):
            self._pool.close()


def _hours(start: int, end: int) -> Iterator[tuple[int, int]]:
    """``[start, end)`` cut at hour boundaries: one partition per piece."""
    while start < end:
        cut = min(end, (start // HOUR_NS + 1) * HOUR_NS)
        yield start, cut
        start = cut


def _partition(hour: int) -> sql.Identifier:
    return sql.Identifier(f"{_PREFIX}{hour}")


def _scalar(cursor: psycopg.Cursor[Any]) -> int:
    row = cursor.fetchone()
    return int(row[0]) if row is not None else 0
