"""The archive: full messages keyed by message hash, ordered by (timestamp, hash).

Theory of operation
-------------------
Two backends, one contract (:class:`Archive`): SQLite, embedded and the default, and
PostgreSQL, time-partitioned by hour of timestamp for large stores.  Both keep one
table ``messages`` with the columns of a WakuMessage archive (``message_hash``,
``timestamp``, ``pubsub_topic``, ``content_topic``, ``payload``, ``meta``,
``version``) and one index per query shape, so that every v3 query is an index range
scan that returns its rows in result order (a page reads about a page of rows, never
the whole match, and nothing is sorted):

=====================================  ================================================
query                                  index
=====================================  ================================================
no filter (time bounds, cursor)        ``(timestamp, message_hash)``
``pubsubTopic`` only                   ``(pubsub_topic, timestamp, message_hash)``
``pubsubTopic`` + one content topic    ``(pubsub_topic, content_topic, timestamp,
                                       message_hash)``
``pubsubTopic`` + n content topics     the same, n range scans merged in order
content topics, no ``pubsubTopic``     ``(content_topic, timestamp, message_hash)``,
                                       one range scan per topic, merged in order
``hashes`` (with ``pubsubTopic``)      unique ``message_hash`` (at most 100 lookups,
                                       ordered in memory)
=====================================  ================================================

in both directions, with or without time bounds and cursor.  An archive made by an
earlier release gains the indexes it lacks when it is opened: the layout has a version,
and :mod:`~sdsync.store.migrations` upgrades it in one transaction (or refuses an archive
written by a newer release).  ``tests/store/test_query_plans.py`` checks every shape's
plan on both backends.

Everything both backends can say in the same SQL lives in :class:`SqlArchive`: v3
queries with keyset pagination (``(timestamp, message_hash) > (cursor row)``, never
OFFSET, so a page costs the same at any depth), idempotent inserts (``ON CONFLICT DO
NOTHING``), and the batched sorted scans that reconciliation and the Parquet export
iterate.  The backends supply connections, the DDL, and the deletions that retention
needs, because there they differ: SQLite deletes rows and returns the pages to the file
system (incremental vacuum); PostgreSQL drops whole hourly partitions and deletes rows
only in the partition a bound falls in.

The archive is synchronous and thread-safe; the HTTP server runs it on a thread pool.
Every :class:`~sdsync.waku.messages.StoredMessage` has had its hash checked, so inserts
cannot store a message under a hash that does not match it.

A database that fails — a lost connection, a full disk, a locked or broken file — raises
:class:`ArchiveUnavailable` from every method, the driver's error chained to it: each
backend translates its driver's errors wherever it uses a connection
(:func:`map_driver_errors`), so nothing above the archive imports ``sqlite3`` or
``psycopg`` to catch them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from sdsync.errors import ServiceUnavailable
from sdsync.store.schema import COLUMNS
from sdsync.waku.messages import StoredMessage
from sdsync.waku.store.model import INT64_MAX, Page, QueryError, StatusCode, StoreQuery
from sdsync.waku.sync import ItemRows, SnapshotTooLarge
from sdsync.wire.waku import HASH_SIZE

SCAN_BATCH = 10_000
ARRAY_BATCH = 65_536
_ABOVE_EVERY_HASH = b"\xff" * 33
# The index of each query shape (both backends create them under these names).
TIME_INDEX = "messages_time"  # PostgreSQL: the primary key
PUBSUB_INDEX = "messages_pubsub_time"
TOPICS_INDEX = "messages_topics"
CONTENT_INDEX = "messages_content_time"
HASH_INDEX = "messages_hash"
TOPIC_INDEXES = f"""
CREATE INDEX IF NOT EXISTS {PUBSUB_INDEX}
    ON messages (pubsub_topic, timestamp, message_hash);
CREATE INDEX IF NOT EXISTS {TOPICS_INDEX}
    ON messages (pubsub_topic, content_topic, timestamp, message_hash);
CREATE INDEX IF NOT EXISTS {CONTENT_INDEX}
    ON messages (content_topic, timestamp, message_hash);
"""
"""The indexes of the topic query shapes, the same on both backends."""
_INDEX = {  # (content topics?, pubsub topic?): the index of that shape
    (False, False): TIME_INDEX,
    (False, True): PUBSUB_INDEX,
    (True, True): TOPICS_INDEX,
    (True, False): CONTENT_INDEX,
}
Key = tuple[int, bytes]
"""A position in archive order: (timestamp ns, message hash)."""
ItemArrays = tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]
"""Timestamps ``(n,)`` and message hashes ``(n, 32)`` of ``n`` items, row by row."""


class TopicCount(NamedTuple):
    """The messages archived on one (pubsub topic, content topic)."""

    pubsub_topic: str
    content_topic: str
    messages: int
    oldest: int
    """Timestamp (Unix ns) of the oldest."""
    newest: int


class ArchiveUnavailable(ServiceUnavailable):
    """The archive's database failed; the driver's own error is the ``__cause__``.

    Nobody's fault — neither the caller's nor a peer's — so not an
    :class:`~sdsync.errors.SdsError`: it is the *unavailable* family of
    :mod:`sdsync.errors`.  Retry later; what the archive did before the failure stays
    done.  Not an ``OSError`` either (as the store client's
    :class:`~sdsync.store.client.StoreUnavailableError` is): handlers of ``OSError``
    around the archive mean a file or socket of ours (the export's directory, the port
    a node listens on) and would report a failing database as theirs.
    """


@contextmanager
def map_driver_errors(driver_error: type[Exception]) -> Iterator[None]:
    """Raise ``driver_error`` (the base of a database driver's errors), in the block, as
    :class:`ArchiveUnavailable`.

    The message is the driver's, which the HTTP API passes on (``archive unavailable:
    ...``); the driver's error is chained.
    """
    try:
        yield
    except driver_error as exc:
        raise ArchiveUnavailable(str(exc)) from exc


class Archive(Protocol):
    """What a store node, Store Resume, Store Sync and the export need.

    Every method raises :class:`ArchiveUnavailable` when the database fails.
    """

    backend: str
    schema_version: int
    """The layout the archive is at: :data:`~sdsync.store.schema.SCHEMA_VERSION` once open."""

    def insert(self, messages: Iterable[StoredMessage]) -> int:
        """Store ``messages``; returns how many were new (inserting twice is harmless)."""
        ...

    def query(self, query: StoreQuery) -> Page:
        """Answer one v3 query (one page)."""
        ...

    def get(self, hashes: Sequence[bytes]) -> list[StoredMessage]:
        """The stored messages among ``hashes``, in archive order."""
        ...

    def items(self, start: int, end: int) -> Iterator[Key]:
        """Every (timestamp, hash) with ``start <= timestamp < end``, in order."""
        ...

    def item_arrays(self, start: int, end: int) -> ItemArrays:
        """The items of ``items(start, end)`` as arrays, read in bulk (Store Sync's snapshot)."""
        ...

    def messages(self, start: int | None = None, end: int | None = None) -> Iterator[StoredMessage]:
        """Every message with ``start <= timestamp < end`` (open bounds: all), in order."""
        ...

    def sync_rows(self, start: int, end: int, max_items: int) -> ItemRows:
        """Every item with ``start <= timestamp <= end`` and its topics, in order, read in
        bulk (Waku Sync's snapshot); :class:`~sdsync.waku.sync.SnapshotTooLarge` past
        ``max_items``."""
        ...

    def count(self) -> int: ...

    def count_items(self, start: int, end: int) -> int:
        """How many messages have ``start <= timestamp < end`` (an index range count)."""
        ...

    def size_bytes(self) -> int:
        """Bytes the archive occupies on disk."""
        ...

    def topic_counts(self, limit: int) -> list[TopicCount]:
        """The ``limit`` (pubsub topic, content topic) pairs holding most messages, most
        first: one scan of the topics index (the status page's archive table)."""
        ...

    def delete_before(self, timestamp: int) -> int:
        """Delete every message older than ``timestamp``; returns how many."""
        ...

    def delete_oldest(self, count: int) -> int:
        """Delete the ``count`` oldest messages; returns how many."""
        ...

    def release_memory(self) -> None:
        """Empty what the archive caches in the node's memory, from any thread (the node
        gives memory back once a load ends: :mod:`~sdsync.store.memory`)."""
        ...

    def close(self) -> None: ...


class SizeWatch(Protocol):
    """Told of every insert (:class:`~sdsync.store.retention.ByteBudget`: a size
    policy enforced as the archive grows, not only every retention interval)."""

    def inserted(self, archive: Archive, payload_bytes: int) -> None: ...


class SqlArchive(ABC):
    """The SQL both backends share; subclasses provide connections and deletions.

    SQL here is written with ``?`` placeholders; :meth:`_sql` adapts it.
    """

    backend: str
    schema_version: int  # set by the constructor, which upgrades the archive
    size_watch: SizeWatch | None = None

    # -- backend hooks

    @abstractmethod
    def _read(self) -> AbstractContextManager[Any]:
        """A connection for reading; the driver's errors in the block are raised as
        :class:`ArchiveUnavailable` (:func:`map_driver_errors`), as in every hook that
        touches the database."""

    @abstractmethod
    def _write(self) -> AbstractContextManager[Any]:
        """A connection in a write transaction, committed when the block ends."""

    def _sql(self, text: str) -> str:
        return text

    def _prepare(self, rows: list[tuple[Any, ...]]) -> None:
        """Make room for ``rows`` before inserting them (PostgreSQL: hourly partitions)."""
        return  # SQLite's single table needs nothing

    def release_memory(self) -> None:
        return  # PostgreSQL caches pages in its server, not in the node

    @abstractmethod
    def _delete_below(self, key: Key) -> int:
        """Delete every row ordered before ``key``; returns how many."""

    @abstractmethod
    def size_bytes(self) -> int:
        """Bytes the archive occupies on disk."""

    @abstractmethod
    def close(self) -> None: ...

    # -- writing

    def insert(self, messages: Iterable[StoredMessage]) -> int:
        batch = list(messages)
        rows = [_row(m) for m in batch]
        if not rows:
            return 0
        marks = ", ".join("?" * len(COLUMNS))
        sql = self._sql(
            f"INSERT INTO messages ({', '.join(COLUMNS)}) VALUES ({marks}) ON CONFLICT DO NOTHING"
        )
        self._prepare(rows)
        with self._write() as conn:
            cursor = conn.cursor()
            cursor.executemany(sql, rows)
            new = int(cursor.rowcount)
        if self.size_watch is not None and new:
            self.size_watch.inserted(self, sum(len(m.message.payload) for m in batch))
        return new

    def delete_before(self, timestamp: int) -> int:
        return self._delete_below((timestamp, b""))

    def delete_oldest(self, count: int) -> int:
        if count <= 0:
            return 0
        sql = "SELECT timestamp, message_hash FROM messages ORDER BY timestamp, message_hash"
        rows = self._fetch(f"{sql} LIMIT 1 OFFSET ?", [count])
        key = (rows[0][0], bytes(rows[0][1])) if rows else (INT64_MAX, _ABOVE_EVERY_HASH)
        return self._delete_below(key)

    # -- reading

    def count(self) -> int:
        return int(self._fetch("SELECT count(*) FROM messages", [])[0][0])

    def count_items(self, start: int, end: int) -> int:
        sql = "SELECT count(*) FROM messages WHERE timestamp >= ? AND timestamp < ?"
        return int(self._fetch(sql, [start, end])[0][0])

    def topic_counts(self, limit: int) -> list[TopicCount]:
        sql = (
            "SELECT pubsub_topic, content_topic, count(*), min(timestamp), max(timestamp)"
            " FROM messages GROUP BY pubsub_topic, content_topic"
            " ORDER BY count(*) DESC, pubsub_topic, content_topic LIMIT ?"
        )
        return [
            TopicCount(p, c, int(n), int(lo), int(hi))
            for p, c, n, lo, hi in self._fetch(sql, [limit])
        ]

    def query(self, query: StoreQuery) -> Page:
        cursor, size = query.pagination_cursor, query.pagination_limit
        after = self._cursor_key(cursor) if cursor is not None else None
        rows = self._fetch(*self._page_statement(query, after))
        if query.message_hashes:  # every row found (at most MAX_HASHES): paged here
            rows = _hash_page(rows, query, after)
        next_cursor = bytes(rows[size - 1][0]) if len(rows) > size else None
        rows = rows[:size]
        if not query.pagination_forward:
            rows.reverse()  # pages are always chronological; the cursor says where we were
        return Page(
            hashes=[bytes(r[0]) for r in rows],
            messages=[_message(r) for r in rows] if query.include_data else [],
            cursor=next_cursor,
        )

    def _page_statement(self, query: StoreQuery, after: Key | None) -> tuple[str, list[Any]]:
        """The statement answering one page of ``query`` after the cursor row ``after``.

        Each shape is an index range scan returning rows in result order (the module doc
        lists the indexes), so a page reads ``pagination_limit + 1`` rows however many match.
        Hashes are unique-index lookups only: the at most
        :data:`~sdsync.waku.store.model.MAX_HASHES` rows found are ordered and paged by
        :meth:`query`.  Several content topics are one range scan per topic, merged in
        order (:meth:`_merge`): no index returns ``content_topic IN (...)`` in time order.
        """
        columns = ", ".join(COLUMNS if query.include_data else COLUMNS[:2])
        if query.message_hashes:
            lookup = f"message_hash IN ({', '.join('?' * len(query.message_hashes))})"
            args: list[Any] = list(query.message_hashes)
            if query.pubsub_topic is not None:
                lookup += " AND pubsub_topic = ?"
                args.append(query.pubsub_topic)
            return f"SELECT {columns} FROM {self._table(HASH_INDEX)} WHERE {lookup}", args
        direction = "ASC" if query.pagination_forward else "DESC"
        order = f"ORDER BY timestamp {direction}, message_hash {direction}"
        index = _INDEX[bool(query.content_topics), query.pubsub_topic is not None]
        arms = []
        for topic in dict.fromkeys(query.content_topics) or (None,):  # a topic twice: once
            where, args = _filters(query, after, topic)
            arms.append((f"SELECT {columns} FROM {self._table(index)} {_where(where)}", args))
        limit = query.pagination_limit + 1
        if len(arms) == 1:
            arm, args = arms[0]
            return f"{arm} {order} LIMIT ?", [*args, limit]
        return self._merge(arms, order, limit)

    def _table(self, index: str) -> str:
        """``messages`` read through ``index`` (SQLite names it; PostgreSQL's planner picks)."""
        return "messages"

    def _merge(
        self, arms: Sequence[tuple[str, list[Any]]], order: str, limit: int
    ) -> tuple[str, list[Any]]:
        """The first ``limit`` rows, in ``order``, of several ordered ``SELECT``s.

        SQLite merges the arms of a compound ``SELECT`` under one ``ORDER BY`` (``MERGE
        (UNION ALL)``), each arm read in index order.
        """
        args = [a for _, arm_args in arms for a in arm_args]
        return f"{' UNION ALL '.join(sql for sql, _ in arms)} {order} LIMIT ?", [*args, limit]

    def get(self, hashes: Sequence[bytes]) -> list[StoredMessage]:
        found: list[StoredMessage] = []
        for start in range(0, len(hashes), 500):  # bounded statements, any input size
            chunk = list(hashes[start : start + 500])
            rows = self._fetch(
                f"SELECT {', '.join(COLUMNS)} FROM messages "
                f"WHERE message_hash IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            found.extend(_message(r) for r in rows)
        return sorted(found, key=lambda m: (m.timestamp, m.message_hash))

    def items(self, start: int, end: int) -> Iterator[Key]:
        for row in self._scan(COLUMNS[:2], start, end):
            yield int(row[1]), bytes(row[0])

    def item_arrays(self, start: int, end: int) -> ItemArrays:
        # One statement (one consistent snapshot), drained in batches of rows that become
        # arrays at once: the per-row tuples the driver makes live one batch at a time.
        stamps: list[npt.NDArray[np.int64]] = []
        hashes: list[bytes] = []
        with self._read() as conn:
            cursor = conn.execute(
                self._sql(
                    "SELECT timestamp, message_hash FROM messages "
                    "WHERE timestamp >= ? AND timestamp < ? ORDER BY timestamp, message_hash"
                ),
                [start, end],
            )
            while rows := cursor.fetchmany(ARRAY_BATCH):
                stamps.append(np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)))
                hashes.append(b"".join([r[1] for r in rows]))
        return item_arrays(stamps, hashes)

    def messages(self, start: int | None = None, end: int | None = None) -> Iterator[StoredMessage]:
        for row in self._scan(COLUMNS, start, end):
            yield _message(row)

    def sync_rows(self, start: int, end: int, max_items: int) -> ItemRows:
        stamps: list[npt.NDArray[np.int64]] = []
        hashes: list[bytes] = []
        pubsub: list[int] = []
        content: list[int] = []
        codes: tuple[dict[str, int], dict[str, int]] = ({}, {})
        with self._read() as conn:
            cursor = conn.execute(
                self._sql(
                    "SELECT timestamp, message_hash, pubsub_topic, content_topic FROM messages"
                    " WHERE timestamp >= ? AND timestamp <= ? ORDER BY timestamp, message_hash"
                    " LIMIT ?"
                ),
                [start, end, max_items + 1],
            )
            while rows := cursor.fetchmany(ARRAY_BATCH):
                stamps.append(np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)))
                hashes.append(b"".join([r[1] for r in rows]))
                pubsub += [codes[0].setdefault(r[2], len(codes[0])) for r in rows]
                content += [codes[1].setdefault(r[3], len(codes[1])) for r in rows]
        if len(pubsub) > max_items:
            raise SnapshotTooLarge(f"the window holds more than {max_items} messages")
        times, blob = item_arrays(stamps, hashes)
        return ItemRows(
            times,
            blob,
            np.array(pubsub, dtype=np.int32),
            np.array(content, dtype=np.int32),
            list(codes[0]),
            list(codes[1]),
        )

    def _scan(self, columns: Sequence[str], start: int | None, end: int | None) -> Iterator[Any]:
        # Keyset batches: no transaction or server cursor stays open between batches.
        bounds: list[str] = []
        args: list[Any] = []
        _unless_none(bounds, args, "timestamp >= ?", start)
        _unless_none(bounds, args, "timestamp < ?", end)
        after: list[Any] = []
        while True:
            where = [*bounds, "(timestamp, message_hash) > (?, ?)"] if after else bounds
            rows = self._fetch(
                f"SELECT {', '.join(columns)} FROM messages {_where(where)} "
                "ORDER BY timestamp, message_hash LIMIT ?",
                [*args, *after, SCAN_BATCH],
            )
            yield from rows
            if len(rows) < SCAN_BATCH:
                return
            after = [rows[-1][1], rows[-1][0]]

    def _cursor_key(self, cursor: bytes) -> Key:
        rows = self._fetch("SELECT timestamp FROM messages WHERE message_hash = ?", [cursor])
        if not rows:
            raise QueryError(
                StatusCode.BAD_REQUEST, f"unknown cursor {cursor.hex()}", "unknown_cursor"
            )
        return int(rows[0][0]), cursor

    def _fetch(self, sql: str, args: Sequence[Any]) -> list[Any]:
        with self._read() as conn:
            return list(conn.execute(self._sql(sql), args).fetchall())


def _filters(
    query: StoreQuery, after: Key | None, content_topic: str | None
) -> tuple[list[str], list[Any]]:
    """SQL conditions of ``query`` on ``content_topic`` (None: any), resuming after the
    cursor row ``after``.

    The time bound in the direction of travel is tightened to the cursor's timestamp:
    given a looser one, SQLite seeks the index with it and walks every row up to the
    cursor (deep pages would cost all the pages before them), and PostgreSQL could not
    prune the partitions before the cursor.
    """
    where: list[str] = []
    args: list[Any] = []
    _unless_none(where, args, "pubsub_topic = ?", query.pubsub_topic)
    _unless_none(where, args, "content_topic = ?", content_topic)
    start, end = query.time_start, query.time_end
    if after is not None and query.pagination_forward:
        where.append("(timestamp, message_hash) > (?, ?)")
        args.extend(after)
        start = after[0] if start is None else max(start, after[0])
    elif after is not None:
        where.append("(timestamp, message_hash) < (?, ?)")
        args.extend(after)
        end = after[0] if end is None else min(end, after[0])
    _unless_none(where, args, "timestamp >= ?", start)
    _unless_none(where, args, "timestamp <= ?", end)
    return where, args


def _unless_none(where: list[str], args: list[Any], condition: str, value: object) -> None:
    """Add ``condition`` on ``value`` (one ``?``), unless ``value`` is None: no condition."""
    if value is not None:
        where.append(condition)
        args.append(value)


def _hash_page(rows: list[Any], query: StoreQuery, after: Key | None) -> list[Any]:
    """The ``pagination_limit + 1`` rows of a hash query's page, from all the rows it found."""

    def key(row: Any) -> Key:
        return int(row[1]), bytes(row[0])

    if after is not None:
        rows = [r for r in rows if (key(r) > after if query.pagination_forward else key(r) < after)]
    rows.sort(key=key, reverse=not query.pagination_forward)
    return rows[: query.pagination_limit + 1]


def item_arrays(stamps: Sequence[npt.NDArray[np.int64]], hashes: Sequence[bytes]) -> ItemArrays:
    """Arrays from batches of timestamps and of concatenated 32-byte hashes."""
    ts = np.concatenate(stamps) if stamps else np.zeros(0, dtype=np.int64)
    blob = np.frombuffer(b"".join(hashes), dtype=np.uint8)
    return ts, blob.reshape(len(ts), HASH_SIZE)


def _where(conditions: Sequence[str]) -> str:
    return f"WHERE {' AND '.join(conditions)}" if conditions else ""


def _row(m: StoredMessage) -> tuple[Any, ...]:
    msg = m.message
    return (
        m.message_hash,
        msg.timestamp,
        m.pubsub_topic,
        msg.content_topic,
        msg.payload,
        msg.meta,
        msg.version,
    )


def _message(row: Sequence[Any]) -> StoredMessage:
    return StoredMessage.from_columns(*row)
