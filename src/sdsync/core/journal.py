"""What a channel changed, and what it needs to start again: the interface to durable state.

Theory of operation
-------------------
The core does no I/O, so it cannot persist itself; but only it knows what each protocol
step changed. Once :meth:`MessageChannel.start_journal` is called the channel records, in
a :class:`Journal`, the *keys* every step touched — ids that entered the bloom filter or the
log, outgoing and incoming buffer entries, known missing, lost and "met elsewhere" ids,
peers heard from, SDS-R schedules, the SDS-R wire cache. A storage layer reads the
journal after a step, looks up the current value of each touched key (latest state wins,
so an entry created and removed within one step simply disappears), writes it all in one
transaction and clears the journal. The cost is proportional to what the step changed,
never to the size of the state.

Starting again is the reverse: the storage layer hands a fresh channel a
:class:`ChannelSnapshot` and :meth:`MessageChannel.restore` rebuilds everything derived
— the dependency index of the incoming buffer, the rolling bloom filter (from the ids that
entered it, in order), the positions and decoded messages of the outgoing buffer — so the
store keeps only facts, never a serialised data structure.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from sdsync.core.log import LogEntry
from sdsync.core.missing import MissingDependency
from sdsync.wire import HistoryEntry


@dataclass(slots=True)
class Journal:
    """Keys touched since the last :meth:`clear` (sets and dicts are cleared in place)."""

    bloom: list[str] = field(default_factory=list)
    # Entries that entered the log, with the content the application saw.
    log: list[tuple[LogEntry, bytes | None]] = field(default_factory=list)
    hints: dict[str, bytes] = field(default_factory=dict)
    # SDS-R wire cache: bytes added, or None once dropped.
    wire: dict[str, bytes | None] = field(default_factory=dict)
    outgoing: set[str] = field(default_factory=set)
    incoming: set[str] = field(default_factory=set)
    # True when an id was declared lost, False when it arrived after all.
    lost: dict[str, bool] = field(default_factory=dict)
    met_elsewhere: list[str] = field(default_factory=list)
    repair_requests: set[str] = field(default_factory=set)
    repair_responses: set[str] = field(default_factory=set)
    # Known missing ids added, changed or removed.
    missing: set[str] = field(default_factory=set)
    # Peers heard from for the first time.
    peers: list[str] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (
            self.missing
            or self.peers
            or self.bloom
            or self.log
            or self.hints
            or self.wire
            or self.outgoing
            or self.incoming
            or self.lost
            or self.met_elsewhere
            or self.repair_requests
            or self.repair_responses
        )

    def clear(self) -> None:
        self.bloom.clear()
        self.log.clear()
        self.hints.clear()
        self.wire.clear()
        self.outgoing.clear()
        self.incoming.clear()
        self.lost.clear()
        self.met_elsewhere.clear()
        self.repair_requests.clear()
        self.repair_responses.clear()
        self.missing.clear()
        self.peers.clear()


@dataclass(frozen=True, slots=True)
class StoredOutgoing:
    """One of our unacknowledged messages, as stored."""

    data: bytes
    first_sent_ms: int
    last_sent_ms: int
    attempts: int
    possible_ackers: frozenset[str] = frozenset()
    retrieval_hint: bytes | None = None


@dataclass(frozen=True, slots=True)
class StoredIncoming:
    """A received message waiting for its dependencies, as stored."""

    data: bytes
    retrieval_hint: bytes | None
    received_ms: int


@dataclass(frozen=True, slots=True)
class ChannelSnapshot:
    """Everything a channel needs to carry on where it stopped.

    ``log`` is the newest ``max_log_entries`` entries (any order; older ones stay in the
    history store), ``bloom_recent`` the newest ids that entered the bloom filter, oldest
    first, out of ``bloom_total`` ever. Sequences that have an order (outgoing, incoming,
    wire cache) are oldest first.
    """

    lamport_timestamp: int
    log: Sequence[LogEntry] = ()
    log_total: int = 0
    bloom_recent: Sequence[str] = ()
    bloom_total: int = 0
    # Iterated once: a storage layer may stream the rows rather than load them all.
    outgoing: Iterable[StoredOutgoing] = ()
    incoming: Sequence[StoredIncoming] = ()
    lost: Collection[str] = ()
    met_elsewhere: Collection[str] = ()
    wire_cache: Sequence[tuple[str, bytes]] = ()
    repair_requests: Sequence[tuple[HistoryEntry, int]] = ()
    repair_responses: Sequence[tuple[HistoryEntry, int]] = ()
    missing: Collection[MissingDependency] = ()
    peers_heard: Collection[str] = ()
