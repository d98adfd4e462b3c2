"""SqliteHistoryStore: the application's long-term storage for the ReliabilityManager.

The reliability API proposal keeps only recent message ids in the library and leaves
older history to the application. :class:`~sdsync.core.LocalLog` hands every entry that
leaves its in-memory window to a :class:`~sdsync.core.HistoryStore`; this one keeps them
in SQLite (WAL), one table shared by any number of channels, so "have we seen it?" is
still answered for duplicates that arrive long after the fact, and across restarts.

Each append is its own small transaction: an entry is stored before the call returns.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

from sdsync.core import LogEntry

_SCHEMA = """
CREATE TABLE IF NOT EXISTS history (
    channel_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    lamport INTEGER NOT NULL,
    sender_id TEXT NOT NULL,
    retrieval_hint BLOB,
    PRIMARY KEY (channel_id, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS history_order ON history (channel_id, lamport, message_id);
"""


class SqliteHistoryStore:
    """Evicted log entries of ``channel_id``, in the SQLite database at ``path``."""

    def __init__(self, path: Path | str, channel_id: str) -> None:
        self.channel_id = channel_id
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.executescript(_SCHEMA)

    def append(self, entry: LogEntry) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO history VALUES (?, ?, ?, ?, ?)",
            (
                self.channel_id,
                entry.message_id,
                entry.lamport_timestamp,
                entry.sender_id,
                entry.retrieval_hint,
            ),
        )

    def __contains__(self, message_id: object) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM history WHERE channel_id = ? AND message_id = ?",
            (self.channel_id, message_id),
        ).fetchone()
        return row is not None

    def __len__(self) -> int:
        row = self._db.execute(
            "SELECT count(*) FROM history WHERE channel_id = ?", (self.channel_id,)
        ).fetchone()
        return int(row[0])

    def get(self, message_id: str) -> LogEntry | None:
        row = self._db.execute(
            "SELECT message_id, lamport, sender_id, retrieval_hint FROM history"
            " WHERE channel_id = ? AND message_id = ?",
            (self.channel_id, message_id),
        ).fetchone()
        return LogEntry(*row) if row is not None else None

    def __iter__(self) -> Iterator[LogEntry]:
        """Stored entries in log order: (Lamport timestamp, message id)."""
        rows = self._db.execute(
            "SELECT message_id, lamport, sender_id, retrieval_hint FROM history"
            " WHERE channel_id = ? ORDER BY lamport, message_id",
            (self.channel_id,),
        )
        return (LogEntry(*row) for row in rows)

    def close(self) -> None:
        self._db.close()
