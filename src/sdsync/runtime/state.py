"""Durable channel state: one SQLite database (WAL) per channel, one transaction per step.

Theory of operation
-------------------
The driver and the channel under it stay in memory; the database is their write-ahead
record. After every driver step (a send, a received frame, a tick) :meth:`commit` reads
the channel's :class:`~sdsync.core.Journal` and the driver's rescheduled resends and
writes what changed in ONE transaction — log rows, bloom filter ids, outgoing and incoming
buffer rows, known missing, lost and met ids, peers heard from, SDS-R schedules and wire
cache, the Lamport timestamp, the store catch-up's caught-up time — and
only then are the step's events handed to the application and its bytes transmitted. So a
kill -9 at any instant leaves either the state before the step (the frame was not
processed; its sender resends it, or a store has it) or after it, never half of it, and
no byte goes out that the stored state does not explain. Rows are written per change, so
the cost of a step does not grow with the log.

Nothing derived is stored: on open, the channel is rebuilt from facts (see
:mod:`sdsync.core.journal`) — the log window is the newest rows by (Lamport timestamp,
id), the rolling bloom filter is replayed from the ids that entered it and how many did,
the outgoing buffer comes back with its attempts and planned resend times. Log entries
beyond the in-memory window stay in SQLite, which answers "have we seen it?" for them, and
the wire bytes of the outgoing buffer stay in its rows, read back only for a resend (see
:mod:`sdsync.core.outgoing`): a long run of unacknowledged messages costs memory per
message, not per byte.

What the application must hear of (deliveries, acknowledgements, ...: see
:mod:`sdsync.runtime.event_log`) is numbered by its owner before the commit and written
by the commit, in the same transaction as the change that caused it, into the ``events``
table; it stays there until the application acknowledges it (:class:`StoredEventLog`), so
after a restart every event not acknowledged is reported again under its number. The
channel row keeps the last number (``event_seq``) and the acknowledged one
(``delivered_cursor``). Wraps under an id the application chose keep their bytes
(``wrapped``, the newest :data:`WRAPS_KEPT`) so a retried wrap can answer them again.

The caught-up time moves in the step that ends a catch-up, after every message the store
found was committed by its own receive step: a crash in between asks the same window
again on restart, and what was already received is recognised and skipped. A database
from before catch-ups (schema 2) has no caught-up time: its channel catches up the whole
``store_catchup_max_window_ms``.

WAL with ``synchronous=NORMAL`` survives the process dying at any instant; ``FULL`` also
survives the machine losing power, at the price of an fsync per step. The database is
opened in exclusive locking mode: one process per channel state.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from sdsync.core import (
    ChannelSnapshot,
    LogEntry,
    MessageDelivered,
    MessageDeliveredEarly,
    MissingDependency,
    StoredIncoming,
    StoredOutgoing,
)
from sdsync.errors import LocalProtocolError, SchemaVersionError
from sdsync.runtime.driver import ChannelDriver
from sdsync.runtime.event_log import (
    Delivery,
    EventLimits,
    EventLog,
    Reported,
    from_row,
    to_row,
)
from sdsync.wire import HistoryEntry, decode

Synchronous = Literal["NORMAL", "FULL"]
SCHEMA_VERSION = 4
#: Events held in memory besides the database, per channel (the newest).
HELD_EVENTS = 4_096
#: Wraps under an explicit message id whose bytes are kept for a retried wrap, per channel.
WRAPS_KEPT = 10_000
# What each older schema needs to become the next one (new tables are created by
# _SCHEMA itself; schema 3's deliveries not yet taken become events in _events_from_v3).
_MIGRATIONS = {
    1: "ALTER TABLE outgoing ADD COLUMN retrieval_hint BLOB;",
    2: "ALTER TABLE channel ADD COLUMN caught_up_ms INTEGER;",  # NULL: unknown
    3: "ALTER TABLE channel ADD COLUMN participants INTEGER;"
    " ALTER TABLE channel ADD COLUMN closed INTEGER NOT NULL DEFAULT 0;"
    " DROP INDEX IF EXISTS log_delivered;",
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS channel (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    schema_version INTEGER NOT NULL,
    channel_id TEXT NOT NULL,
    participant_id TEXT NOT NULL,
    lamport INTEGER NOT NULL,
    bloom_total INTEGER NOT NULL,
    event_seq INTEGER NOT NULL,         -- the last event number
    delivered_cursor INTEGER NOT NULL,  -- events acknowledged up to this number
    caught_up_ms INTEGER,
    participants INTEGER,
    closed INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS log (
    message_id TEXT PRIMARY KEY,
    lamport INTEGER NOT NULL,
    sender_id TEXT NOT NULL,
    retrieval_hint BLOB,
    content BLOB
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS log_order ON log (lamport, message_id);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    message_id TEXT NOT NULL,
    sender_id TEXT,
    number INTEGER,
    flag INTEGER,
    text TEXT,
    data BLOB,
    hint BLOB
);
CREATE TABLE IF NOT EXISTS wrapped (
    seq INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL UNIQUE,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS bloom (seq INTEGER PRIMARY KEY, message_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS wire (
    seq INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL UNIQUE,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS outgoing (
    seq INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL UNIQUE,
    data BLOB NOT NULL,
    first_sent_ms INTEGER NOT NULL,
    last_sent_ms INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    possible_ackers TEXT NOT NULL,
    next_due_ms INTEGER,
    retrieval_hint BLOB
);
CREATE TABLE IF NOT EXISTS incoming (
    seq INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL UNIQUE,
    data BLOB NOT NULL,
    retrieval_hint BLOB,
    received_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS lost (message_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS met_elsewhere (message_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS missing (
    message_id TEXT PRIMARY KEY,
    retrieval_hint BLOB,
    sender_id TEXT,
    named_by TEXT NOT NULL,
    first_seen_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS peers (participant_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repair (
    kind TEXT NOT NULL,
    message_id TEXT NOT NULL,
    retrieval_hint BLOB,
    sender_id TEXT,
    due_ms INTEGER NOT NULL,
    PRIMARY KEY (kind, message_id)
) WITHOUT ROWID;
"""

# One event row: its number, then the columns of event_log.to_row.
_INSERT_EVENT = """
INSERT INTO events (seq, kind, message_id, sender_id, number, flag, text, data, hint)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
_INSERT_OUTGOING = """
INSERT INTO outgoing (first_sent_ms, last_sent_ms, attempts, possible_ackers, next_due_ms,
                      retrieval_hint, message_id, data)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""
_UPDATE_OUTGOING = """
UPDATE outgoing SET first_sent_ms = ?, last_sent_ms = ?, attempts = ?, possible_ackers = ?,
                    next_due_ms = ?, retrieval_hint = ?
WHERE message_id = ?
"""


def state_path(state_dir: Path, channel_id: str) -> Path:
    """``<state_dir>/<channel_id>.sqlite``, the id percent-encoded to a safe file name."""
    return state_dir / f"{quote(channel_id, safe='')}.sqlite"


@dataclass(frozen=True, slots=True)
class LogRecord:
    """A message of the stored log, ours or delivered, with its content."""

    message_id: str
    sender_id: str
    lamport_timestamp: int
    content: bytes | None
    retrieval_hint: bytes | None


class _StoredHistory:
    """The HistoryStore of a stored channel: evicted entries are log rows already.

    Entries evicted during a step are remembered until the step is committed, because
    their rows may be written by that very commit.
    """

    def __init__(self, db: sqlite3.Connection, evicted: int) -> None:
        self._db = db
        self._evicted = evicted
        self._uncommitted: set[str] = set()

    def append(self, entry: LogEntry) -> None:
        self._evicted += 1
        self._uncommitted.add(entry.message_id)

    def __contains__(self, message_id: object) -> bool:
        if not self._evicted:  # the common case: the whole log fits in memory
            return False
        if message_id in self._uncommitted:
            return True
        row = self._db.execute("SELECT 1 FROM log WHERE message_id = ?", (message_id,))
        return row.fetchone() is not None

    def committed(self) -> None:
        self._uncommitted.clear()


class _StoredWires:
    """The WireStore of a stored channel: outgoing rows hold the bytes already.

    Bytes of messages sent during a step are kept until the step is committed, because
    that commit writes their rows; after that they are read back only for a resend.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._uncommitted: dict[str, bytes] = {}

    def __getitem__(self, message_id: str) -> bytes:
        data = self._uncommitted.get(message_id)
        if data is not None:
            return data
        row = self._db.execute("SELECT data FROM outgoing WHERE message_id = ?", (message_id,))
        found = row.fetchone()
        if found is None:
            raise KeyError(message_id)
        return bytes(found[0])

    def __setitem__(self, message_id: str, data: bytes) -> None:
        self._uncommitted[message_id] = data

    def __delitem__(self, message_id: str) -> None:
        # The row goes with the commit that writes the outgoing buffer's change.
        self._uncommitted.pop(message_id, None)

    def __contains__(self, message_id: object) -> bool:
        if message_id in self._uncommitted:
            return True
        row = self._db.execute("SELECT 1 FROM outgoing WHERE message_id = ?", (message_id,))
        return row.fetchone() is not None

    def uncommitted(self, message_id: str) -> bytes | None:
        """The bytes of a message whose row is not written yet (None if it is)."""
        return self._uncommitted.get(message_id)

    def committed(self) -> None:
        self._uncommitted.clear()


class ChannelState:
    """The stored state of ``driver``'s channel; restores it on open."""

    def __init__(
        self,
        path: Path,
        driver: ChannelDriver,
        *,
        synchronous: Synchronous = "NORMAL",
        event_limits: EventLimits | None = None,
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise LocalProtocolError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        self.path = path
        self.driver = driver
        self.channel = driver.channel
        self._db = _connect(path, synchronous)
        self._broken = False
        try:
            self._open(event_limits)
        except BaseException:
            self._db.close()
            raise

    # ------------------------------------------------------------------ open

    def _open(self, event_limits: EventLimits | None) -> None:
        db = self._db
        # An existing file is judged before anything is written to it: a newer release's
        # is refused untouched, an older one upgraded (new tables included) in one step.
        version = self._stored_version()
        if version is not None:
            self._migrate(version)
        db.executescript(_SCHEMA)
        row = db.execute(
            "SELECT schema_version, channel_id, participant_id, lamport, bloom_total,"
            " event_seq, delivered_cursor FROM channel"
        ).fetchone()
        channel = self.channel
        if row is None:
            row = (SCHEMA_VERSION, channel.channel_id, channel.participant_id)
            row += (channel.lamport_timestamp, 0, 0, 0)
            db.execute(
                "INSERT INTO channel (id, schema_version, channel_id, participant_id, lamport,"
                " bloom_total, event_seq, delivered_cursor, caught_up_ms)"
                " VALUES (0, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*row, self.driver.caught_up_ms),
            )
        version, channel_id, participant_id, lamport, bloom_total, event_seq, cursor = row
        self._migrate(version)
        self._caught_up, participants, closed = db.execute(
            "SELECT caught_up_ms, participants, closed FROM channel"
        ).fetchone()
        if (channel_id, participant_id) != (channel.channel_id, channel.participant_id):
            raise LocalProtocolError(
                f"{self.path} holds channel {channel_id!r} of participant {participant_id!r},"
                f" not {channel.channel_id!r} of {channel.participant_id!r}"
            )
        self.events = StoredEventLog(db, event_limits, last_seq=event_seq, acked_seq=cursor)
        self.participants: int | None = participants
        self.closed = bool(closed)
        self._wraps: dict[str, bytes] = {}  # wrapped in this step, kept by the commit
        self._lamport: int = lamport
        log_total = db.execute("SELECT count(*) FROM log").fetchone()[0]
        window = channel.config.max_log_entries
        self._history = _StoredHistory(db, max(0, log_total - window))
        channel.log.history_store = self._history
        self._wires = _StoredWires(db)
        channel.use_wire_store(self._wires)
        self.driver.start_journal()
        self._journal = channel.start_journal()
        channel.restore(self._snapshot(lamport, log_total, bloom_total))
        self.driver.restore_resends(
            dict(db.execute("SELECT message_id, COALESCE(next_due_ms, 0) FROM outgoing"))
        )
        self.driver.take_rescheduled()  # what was restored is stored already
        self.driver.restore_caught_up(self._caught_up)
        if participants is not None:
            self.driver.set_participant_count(participants)

    def _stored_version(self) -> int | None:
        """The file's schema version; None for a new file."""
        db = self._db
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'channel'").fetchone() is None:
            return None
        row = db.execute("SELECT schema_version FROM channel").fetchone()
        return None if row is None else int(row[0])

    def _migrate(self, version: int) -> None:
        if version == SCHEMA_VERSION:
            return
        if version not in _MIGRATIONS:  # a newer release's file is not ours to change
            raise SchemaVersionError(
                f"{self.path}: its", version, SCHEMA_VERSION, "use another state directory"
            )
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        # The tables and indexes later versions added, then each step's changes to the
        # older ones: all of it commits with the new version, or none.
        for statement in _SCHEMA.split(";"):
            db.execute(statement)
        for step in range(version, SCHEMA_VERSION):
            for statement in _MIGRATIONS[step].split(";"):
                db.execute(statement)
        self._events_from_v3()
        db.execute("UPDATE channel SET schema_version = ?", (SCHEMA_VERSION,))
        db.execute("COMMIT")

    def _snapshot(self, lamport: int, log_total: int, bloom_total: int) -> ChannelSnapshot:
        db = self._db
        config = self.channel.config
        window = db.execute(
            "SELECT message_id, lamport, sender_id, retrieval_hint FROM log"
            " ORDER BY lamport DESC, message_id DESC LIMIT ?",
            (config.max_log_entries,),
        )
        bloom_limit = config.bloom.capacity if config.bloom_rollover else -1
        bloom = [
            mid
            for (mid,) in db.execute(
                "SELECT message_id FROM bloom ORDER BY seq DESC LIMIT ?", (bloom_limit,)
            )
        ]
        bloom.reverse()
        return ChannelSnapshot(
            lamport_timestamp=lamport,
            log=[LogEntry(mid, ts, sender, hint) for mid, ts, sender, hint in window],
            log_total=log_total,
            bloom_recent=bloom,
            bloom_total=bloom_total,
            # Streamed: the bytes of one message at a time are in memory while restoring.
            outgoing=(
                StoredOutgoing(data, first, last, attempts, frozenset(json.loads(ackers)), hint)
                for data, first, last, attempts, ackers, hint in db.execute(
                    "SELECT data, first_sent_ms, last_sent_ms, attempts, possible_ackers,"
                    " retrieval_hint FROM outgoing ORDER BY seq"
                )
            ),
            incoming=[
                StoredIncoming(data, hint, received)
                for data, hint, received in db.execute(
                    "SELECT data, retrieval_hint, received_ms FROM incoming ORDER BY seq"
                )
            ],
            lost=[mid for (mid,) in db.execute("SELECT message_id FROM lost")],
            met_elsewhere=[mid for (mid,) in db.execute("SELECT message_id FROM met_elsewhere")],
            wire_cache=list(db.execute("SELECT message_id, data FROM wire ORDER BY seq")),
            repair_requests=self._repairs("request"),
            repair_responses=self._repairs("response"),
            missing=[
                MissingDependency(HistoryEntry(mid, hint, sender), named_by, first_seen)
                for mid, hint, sender, named_by, first_seen in db.execute(
                    "SELECT message_id, retrieval_hint, sender_id, named_by, first_seen_ms"
                    " FROM missing ORDER BY first_seen_ms"
                )
            ],
            peers_heard=[pid for (pid,) in db.execute("SELECT participant_id FROM peers")],
        )

    def _repairs(self, kind: str) -> list[tuple[HistoryEntry, int]]:
        rows = self._db.execute(
            "SELECT message_id, retrieval_hint, sender_id, due_ms FROM repair WHERE kind = ?"
            " ORDER BY due_ms",
            (kind,),
        )
        return [(HistoryEntry(mid, hint, sender), due) for mid, hint, sender, due in rows]

    def _events_from_v3(self) -> None:
        """Schema 3 numbered deliveries only, in the log and incoming rows; those not taken
        yet (above the cursor) become events."""
        db = self._db
        (cursor,) = db.execute("SELECT delivered_cursor FROM channel").fetchone()
        db.execute(
            "INSERT INTO events (seq, kind, message_id, sender_id, number, data, hint)"
            " SELECT delivered_seq, ?, message_id, sender_id, lamport, content, retrieval_hint"
            " FROM log WHERE delivered_seq > ?",
            (MessageDelivered.type, cursor),
        )
        limits = self.channel.config.limits
        for seq, data, hint in db.execute(
            "SELECT early_seq, data, retrieval_hint FROM incoming WHERE early_seq > ?", (cursor,)
        ).fetchall():
            message = decode(data, limits)
            early = MessageDeliveredEarly(
                message.message_id,
                message.sender_id,
                message.lamport_timestamp or 0,
                message.content or b"",
                hint,
                0,
            )
            db.execute(
                _INSERT_EVENT,
                (seq, *to_row(early)),
            )

    # ---------------------------------------------------------------- commit

    def commit(self) -> None:
        """Store what the steps since the last commit changed (the journal's keys, the
        rescheduled resends), the events numbered for them and the acknowledgements, in
        one transaction."""
        if self._broken:
            raise LocalProtocolError(f"{self.path}: an earlier commit failed; reopen the channel")
        rescheduled = self.driver.take_rescheduled()
        lamport = self.channel.lamport_timestamp
        caught_up = self.driver.caught_up_ms
        changed = self._changed(rescheduled, lamport) or caught_up != self._caught_up
        if not (changed or self.events.dirty):
            return
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            self._write(rescheduled)
            self.events.write()
            db.execute(
                "UPDATE channel SET lamport = ?, bloom_total = ?, event_seq = ?,"
                " delivered_cursor = ?, caught_up_ms = ?",
                (
                    lamport,
                    self.channel.bloom_inserted(),
                    self.events.last_seq,
                    self.events.acked_seq,
                    caught_up,
                ),
            )
            db.execute("COMMIT")
        except BaseException:
            # Memory is ahead of the database now: only reopening is safe.
            self._broken = True
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self._journal.clear()
        self._history.committed()
        self._wires.committed()
        self.events.committed()
        self._wraps.clear()
        self._lamport = lamport
        self._caught_up = caught_up

    def _changed(self, rescheduled: set[str], lamport: int) -> bool:
        return (
            bool(rescheduled or self._wraps)
            or lamport != self._lamport
            or not self._journal.is_empty()
        )

    def _write(self, rescheduled: set[str]) -> None:
        db = self._db
        journal = self._journal
        channel = self.channel
        if journal.bloom:
            total = channel.bloom_inserted()
            first = total - len(journal.bloom) + 1
            db.executemany(
                "INSERT INTO bloom (seq, message_id) VALUES (?, ?)",
                enumerate(journal.bloom, start=first),
            )
            keep = channel.config.bloom.capacity
            if channel.config.bloom_rollover and (first - 1) // keep != total // keep:
                # Only the newest `keep` ids are ever read; prune once per `keep` inserts.
                db.execute("DELETE FROM bloom WHERE seq <= ?", (total - keep,))
        if journal.log:
            db.executemany(
                "INSERT INTO log (message_id, lamport, sender_id, retrieval_hint, content)"
                " VALUES (?, ?, ?, ?, ?)",
                (
                    (e.message_id, e.lamport_timestamp, e.sender_id, e.retrieval_hint, content)
                    for e, content in journal.log
                ),
            )
        if journal.hints:
            db.executemany(
                "UPDATE log SET retrieval_hint = ? WHERE message_id = ?",
                ((hint, mid) for mid, hint in journal.hints.items()),
            )
        for mid, data in journal.wire.items():
            if data is None:
                db.execute("DELETE FROM wire WHERE message_id = ?", (mid,))
            else:
                db.execute("INSERT INTO wire (message_id, data) VALUES (?, ?)", (mid, data))
        self._write_outgoing(journal.outgoing | rescheduled)
        self._write_incoming(journal.incoming)
        for mid, lost in journal.lost.items():
            if lost:
                db.execute("INSERT OR IGNORE INTO lost VALUES (?)", (mid,))
            else:
                db.execute("DELETE FROM lost WHERE message_id = ?", (mid,))
        if journal.met_elsewhere:
            db.executemany(
                "INSERT OR IGNORE INTO met_elsewhere VALUES (?)",
                ((m,) for m in journal.met_elsewhere),
            )
        self._write_repairs("request", journal.repair_requests, 0)
        self._write_repairs("response", journal.repair_responses, 1)
        self._write_missing(journal.missing)
        if journal.peers:
            db.executemany(
                "INSERT OR IGNORE INTO peers VALUES (?)", ((pid,) for pid in journal.peers)
            )
        if self._wraps:
            self._write_wraps()

    def _write_outgoing(self, ids: set[str]) -> None:
        db = self._db
        inserts: list[tuple[object, ...]] = []
        updates: list[tuple[object, ...]] = []
        for mid in ids:
            entry = self.channel.outgoing_entry(mid)
            if entry is None:
                db.execute("DELETE FROM outgoing WHERE message_id = ?", (mid,))
                continue
            ackers = json.dumps(sorted(entry.possible_ackers))
            due = self.driver.resend_at(mid)
            row = (
                entry.first_sent_ms,
                entry.last_sent_ms,
                entry.attempts,
                ackers,
                due,
                entry.retrieval_hint,
                mid,
            )
            data = self._wires.uncommitted(mid)
            if data is None:
                updates.append(row)
            else:
                inserts.append((*row, data))
        if inserts:
            inserts.sort(key=lambda row: (row[0], row[6]))  # sent order
            db.executemany(_INSERT_OUTGOING, inserts)
        if updates:
            db.executemany(_UPDATE_OUTGOING, updates)

    def _write_missing(self, ids: set[str]) -> None:
        db = self._db
        for mid in ids:
            known = self.channel.missing_dependency(mid)
            if known is None:
                db.execute("DELETE FROM missing WHERE message_id = ?", (mid,))
                continue
            entry = known.entry
            db.execute(
                "INSERT OR REPLACE INTO missing VALUES (?, ?, ?, ?, ?)",
                (mid, entry.retrieval_hint, entry.sender_id, known.named_by, known.first_seen_ms),
            )

    def _write_incoming(self, ids: set[str]) -> None:
        db = self._db
        for mid in ids:
            waiting = self.channel.stored_incoming(mid)
            if waiting is None:
                db.execute("DELETE FROM incoming WHERE message_id = ?", (mid,))
            else:
                db.execute(
                    "INSERT OR IGNORE INTO incoming (message_id, data, retrieval_hint,"
                    " received_ms) VALUES (?, ?, ?, ?)",
                    (mid, waiting.data, waiting.retrieval_hint, waiting.received_ms),
                )

    def _write_wraps(self) -> None:
        db = self._db
        db.executemany("INSERT INTO wrapped (message_id, data) VALUES (?, ?)", self._wraps.items())
        (newest,) = db.execute("SELECT max(seq) FROM wrapped").fetchone()
        if newest % 1_000 < len(self._wraps):  # prune about once per thousand wraps
            db.execute("DELETE FROM wrapped WHERE seq <= ?", (newest - WRAPS_KEPT,))

    def _write_repairs(self, kind: str, ids: set[str], which: int) -> None:
        db = self._db
        for mid in ids:
            scheduled = self.channel.repair_schedule(mid)[which]
            if scheduled is None:
                db.execute("DELETE FROM repair WHERE kind = ? AND message_id = ?", (kind, mid))
                continue
            entry, due = scheduled
            db.execute(
                "INSERT OR REPLACE INTO repair VALUES (?, ?, ?, ?, ?)",
                (kind, mid, entry.retrieval_hint, entry.sender_id, due),
            )

    # -------------------------------------------------- what the application set

    def keep_wrap(self, message_id: str, data: bytes) -> None:
        """Keep the bytes of a wrap under an explicit id, with the step's commit."""
        self._wraps[message_id] = data

    def wrapped(self, message_id: str) -> bytes | None:
        """The bytes of an earlier wrap under ``message_id``, if still kept."""
        if message_id in self._wraps:
            return self._wraps[message_id]
        row = self._db.execute("SELECT data FROM wrapped WHERE message_id = ?", (message_id,))
        found = row.fetchone()
        return None if found is None else bytes(found[0])

    def set_participants(self, participants: int) -> None:
        self._update("participants", participants)
        self.participants = participants

    def set_closed(self, closed: bool) -> None:
        """Whether the application closed the channel (a restart does not reopen it)."""
        self._update("closed", int(closed))
        self.closed = closed

    def _update(self, column: str, value: int) -> None:
        if self._broken:
            raise LocalProtocolError(f"{self.path}: an earlier commit failed; reopen the channel")
        self._db.execute(f"UPDATE channel SET {column} = ?", (value,))

    # ---------------------------------------------------------------- reading

    def history(self, limit: int | None = None) -> list[LogRecord]:
        """The stored log in order, ours and delivered messages, the newest ``limit``."""
        rows = self._db.execute(
            "SELECT message_id, sender_id, lamport, content, retrieval_hint FROM log"
            " ORDER BY lamport DESC, message_id DESC LIMIT ?",
            (-1 if limit is None else limit,),
        ).fetchall()
        rows.reverse()
        return [LogRecord(*row) for row in rows]

    def close(self) -> None:
        """Store what is still only in memory (retrieval hints, acknowledgements), then
        close."""
        if not self._broken:
            self.commit()
        self._db.close()


class StoredEventLog(EventLog):
    """A channel's events in its database: numbered events are written by the commit of
    their step, acknowledgements and discards with the next commit (:meth:`write`).

    The events numbered since the channel was opened are held in memory as well, the
    newest :data:`HELD_EVENTS` of them once committed, so reading just-committed events
    costs no query.
    """

    def __init__(
        self,
        db: sqlite3.Connection,
        limits: EventLimits | None,
        *,
        last_seq: int,
        acked_seq: int,
    ) -> None:
        super().__init__(limits, last_seq=last_seq, acked_seq=acked_seq)
        self._db = db
        self._held_from = last_seq  # nothing earlier is held
        self._count, self._bytes = self._totals(acked_seq, last_seq)
        self._new: list[Delivery] = []
        self._discarded: Delivery | None = None
        self._stored_ack = acked_seq

    @property
    def dirty(self) -> bool:
        """Something to write with the next commit."""
        return bool(self._new) or self._discarded is not None or self._stored_ack != self._acked

    def write(self) -> None:
        """Inside the commit's transaction: new events, discards, acknowledgements."""
        db = self._db
        if self._new:
            db.executemany(
                _INSERT_EVENT,
                ((d.seq, *to_row(d.event)) for d in self._new),
            )
        marker = self._discarded
        if marker is not None and marker.seq is not None:
            db.execute("DELETE FROM events WHERE seq <= ?", (marker.seq,))
            db.execute(
                _INSERT_EVENT,
                (marker.seq, *to_row(marker.event)),
            )
        if self._stored_ack != self._acked:
            db.execute("DELETE FROM events WHERE seq <= ?", (self._acked,))

    def committed(self) -> None:
        self._new.clear()
        self._discarded = None
        self._stored_ack = self._acked
        if len(self._held) > HELD_EVENTS:  # hold the newest only; the store has them all
            while len(self._held) > HELD_EVENTS // 2:
                gone = self._held.popleft()
                self._held_from = gone.seq or self._held_from

    def _stored(self, numbered: list[Delivery]) -> None:
        self._new.extend(numbered)

    def _oldest(self) -> Iterator[tuple[int, Reported]]:
        for row in self._db.execute(
            "SELECT seq, kind, message_id, sender_id, number, flag, text, data, hint"
            " FROM events WHERE seq > ? AND seq <= ? ORDER BY seq",
            (self._acked, self._held_from),
        ):
            delivery = from_row(row[0], row[1:])
            yield row[0], delivery.event
        yield from super()._oldest()

    def _discard(self, through: int, marker: Delivery) -> None:
        self._discarded = marker

    def _read_stored(self, after: int, limit: int) -> list[Delivery]:
        rows = self._db.execute(
            "SELECT seq, kind, message_id, sender_id, number, flag, text, data, hint"
            " FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, limit),
        )
        return [from_row(row[0], row[1:]) for row in rows]

    def _forget_stored(self, through: int, unheld: int) -> tuple[int, int]:
        return self._totals(self._acked, unheld) if unheld > self._acked else (0, 0)

    def _totals(self, after: int, through: int) -> tuple[int, int]:
        count, size = self._db.execute(
            "SELECT count(*), total(length(data)) FROM events WHERE seq > ? AND seq <= ?",
            (after, through),
        ).fetchone()
        return int(count), int(size)


def _connect(path: Path, synchronous: Synchronous) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Autocommit mode: transactions are exactly the BEGIN ... COMMIT written here. Any
    # thread may use it, one at a time: the owner serialises (the ReliabilityManager's
    # lock; a ReliableChannel runs on one event loop).
    db = sqlite3.connect(path, isolation_level=None, timeout=0.1, check_same_thread=False)
    try:
        db.execute("PRAGMA locking_mode = EXCLUSIVE")
        mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise LocalProtocolError(f"{path}: SQLite refused WAL mode ({mode})")
        db.execute(f"PRAGMA synchronous = {synchronous}")
        # Checkpoints (which fsync) every 32 MB of WAL rather than 4 MB: a step writes tens
        # of KB with default parameters, and this was 15 % more steps per second.
        db.execute("PRAGMA wal_autocheckpoint = 8000")
        db.execute("PRAGMA cache_size = -16000")
        db.execute("BEGIN IMMEDIATE")  # take the exclusive lock now, not at the first step
        db.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        db.close()
        if "locked" in str(exc):
            raise LocalProtocolError(f"{path} is in use by another process") from exc
        raise
    except BaseException:
        db.close()
        raise
    return db
