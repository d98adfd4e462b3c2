"""The local log: every delivered message id, ordered by (Lamport timestamp, message id).

Theory of operation
-------------------
The log is a sorted list of ``(lamport, message_id, entry)`` keys plus a dict from id to
its :class:`LogEntry`. Insertion is O(log n) wherever the key lands, so a late message slots
into the middle without re-sorting anything; membership is O(1); the causal history is
the last few keys. Two messages with the same Lamport timestamp are ordered by id — the
spec's conflict resolution falls out of the key order.

Memory is bounded: beyond ``max_entries`` the oldest entries are handed to a
:class:`HistoryStore` (the application's long-term storage, per the reliability API
proposal), which keeps answering :meth:`LocalLog.__contains__` so an old message that
arrives again is still recognised as a duplicate.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from sortedcontainers import SortedList

from sdsync.wire import HistoryEntry


@dataclass(frozen=True, slots=True)
class LogEntry:
    message_id: str
    lamport_timestamp: int
    sender_id: str
    retrieval_hint: bytes | None = None
    _history_entry: HistoryEntry | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def history_entry(self) -> HistoryEntry:
        """This entry as a causal history names it.

        Built once, when first needed: only the newest entries are ever quoted (in many
        later messages), and a log holds one LogEntry per message delivered.
        """
        entry = self._history_entry
        if entry is None:
            entry = HistoryEntry(self.message_id, self.retrieval_hint, self.sender_id)
            object.__setattr__(self, "_history_entry", entry)
        return entry


_ENTRY = operator.itemgetter(2)
"""The LogEntry of a log key (lamport, message id, entry)."""


class HistoryStore(Protocol):
    """Long-term storage for log entries that left the in-memory window."""

    def append(self, entry: LogEntry) -> None: ...

    def __contains__(self, message_id: object) -> bool: ...


class MemoryHistoryStore:
    """Keeps a 64-bit digest of each evicted id: enough to recognise duplicates.

    About 70 bytes an id instead of 140 for a 64-character id. Two ids share a digest
    with probability 2^-64 per pair (a message would then be taken for a duplicate): at
    ten million evicted ids, one new id in 2 * 10^12 is.
    """

    def __init__(self) -> None:
        self._digests: set[int] = set()

    def append(self, entry: LogEntry) -> None:
        self._digests.add(_digest(entry.message_id))

    def __contains__(self, message_id: object) -> bool:
        # Every id a causal history names and the window lacks is looked up here: hashing
        # it is pointless while nothing was evicted (always, when the window holds a run).
        return (
            bool(self._digests)
            and isinstance(message_id, str)
            and (_digest(message_id) in self._digests)
        )

    def __len__(self) -> int:
        return len(self._digests)


def _digest(message_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(message_id.encode(), digest_size=8).digest(), "big")


class LocalLog:
    __slots__ = ("_entries", "_keys", "history_store", "max_entries", "total")

    def __init__(self, max_entries: int, history_store: HistoryStore | None = None) -> None:
        self.max_entries = max_entries
        self.history_store: HistoryStore = (
            history_store if history_store is not None else MemoryHistoryStore()
        )
        self._keys: SortedList = SortedList()
        self._entries: dict[str, LogEntry] = {}
        self.total = 0  # entries ever inserted, including evicted ones

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._entries or message_id in self.history_store

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, message_id: str) -> LogEntry | None:
        return self._entries.get(message_id)

    @property
    def window(self) -> dict[str, LogEntry]:
        """The in-memory entries by id (read-only by convention: for fast set operations)."""
        return self._entries

    def insert(self, entry: LogEntry) -> list[LogEntry]:
        """Add an entry; returns the entries evicted to the history store."""
        # Ids are unique, so comparisons never reach the entry itself.
        self._keys.add((entry.lamport_timestamp, entry.message_id, entry))
        self._entries[entry.message_id] = entry
        self.total += 1
        evicted = []
        while len(self._keys) > self.max_entries:
            old = self._keys.pop(0)[2]
            del self._entries[old.message_id]
            self.history_store.append(old)
            evicted.append(old)
        return evicted

    def restore(self, entries: Iterable[LogEntry], total: int) -> None:
        """Load the newest entries of a stored log (older ones are in the history store)."""
        keys = sorted((e.lamport_timestamp, e.message_id, e) for e in entries)
        if len(keys) > self.max_entries:
            keys = keys[len(keys) - self.max_entries :]
        self._keys = SortedList(keys)
        self._entries = {key[1]: key[2] for key in keys}
        self.total = total

    def set_retrieval_hint(self, message_id: str, hint: bytes) -> bool:
        entry = self._entries.get(message_id)
        if entry is None:
            return False
        updated = LogEntry(entry.message_id, entry.lamport_timestamp, entry.sender_id, hint)
        self._keys.remove((entry.lamport_timestamp, entry.message_id, entry))
        self._keys.add((entry.lamport_timestamp, entry.message_id, updated))
        self._entries[message_id] = updated
        return True

    def tail(self, n: int) -> list[LogEntry]:
        """The newest ``n`` entries, oldest first."""
        if n <= 0:
            return []
        return list(map(_ENTRY, self._keys[-n:]))

    def count_since(self, lamport_timestamp: int) -> int:
        """How many entries have a Lamport timestamp of at least ``lamport_timestamp``."""
        older: int = self._keys.bisect_left((lamport_timestamp,))
        return len(self._keys) - older

    def newest_before(self, lamport_timestamp: int, n: int) -> list[LogEntry]:
        """Up to ``n`` entries with an earlier Lamport timestamp, newest first."""
        if n <= 0:
            return []
        keys = self._keys
        # (t,) sorts before every key of timestamp t: the keys before it are the older ones.
        stop = keys.bisect_left((lamport_timestamp,))
        return list(map(_ENTRY, reversed(keys[max(0, stop - n) : stop])))

    def __iter__(self) -> Iterator[LogEntry]:
        return (key[2] for key in self._keys)
