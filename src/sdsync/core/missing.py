"""Known missing dependencies: ids we were told about and never received.

Theory of operation
-------------------
Every causal history a channel processes — of a content message *or* a sync message, as
the spec requires — may name ids that are not in the local log. Each of them is recorded
here once, with the retrieval hint and original sender from the history entry, the peer
whose message named it and when it was first seen, and stays until the message arrives
(buffered or delivered), the application marks it met, or the lost timeout declares it
lost. Every incoming sweep reports the whole set, so retrieval (stores, SDS-R, the
application) keeps being asked for a gap however it was learnt; a gap that only a sync
message named is not forgotten after its first report.

The set is ordered by first sighting, which makes both jobs over it cheap: the lost
timeout expires a prefix, and when the set is full the oldest entry is evicted (and
reported) to make room, so a hostile peer naming thousands of junk ids costs a bounded
amount of memory and can push out real gaps only until they are named again — which real
gaps are, in every causal history and sync message that still covers them.

Full means either cap: ``capacity`` entries, or ``byte_budget`` bytes as
:func:`missing_charge` counts them (the Python sizes of the id, hint, sender and naming
peer, plus :data:`MISSING_ENTRY_BYTES` for the objects and the index). The count alone
let ids of the largest size the wire allows hold ~3.8 kB each, ~38 MB at 10,000; the
budget makes such a flood evict sooner, while honest entries (64-character ids, ~650 B
charged) reach the count cap first. An entry that learns a hint or sender is charged
again, and may evict older ones likewise; it never evicts itself.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from functools import lru_cache

from sdsync.wire import HistoryEntry, WireLimits

#: What an entry is charged besides its strings and hint: the MissingDependency and
#: HistoryEntry objects, the first-sighting int and the index slot (measured ~180 bytes),
#: rounded up.
MISSING_ENTRY_BYTES = 256


@dataclass(frozen=True, slots=True)
class MissingDependency:
    """A message id named in a causal history that we have never received."""

    entry: HistoryEntry
    named_by: str
    first_seen_ms: int

    @property
    def message_id(self) -> str:
        return self.entry.message_id


def missing_charge(entry: HistoryEntry, named_by: str) -> int:
    """Bytes a known-missing entry counts against the byte budget."""
    return (
        MISSING_ENTRY_BYTES
        + sys.getsizeof(entry.message_id)
        + sys.getsizeof(entry.retrieval_hint)
        + sys.getsizeof(entry.sender_id)
        + sys.getsizeof(named_by)
    )


@lru_cache(maxsize=8)
def largest_missing_charge(limits: WireLimits) -> int:
    """The charge of the largest entry peers may name under ``limits`` (ids of
    the widest characters)."""
    widest = "\U0010ffff" * limits.max_id_length
    entry = HistoryEntry(widest, bytes(limits.max_retrieval_hint_bytes), widest)
    return missing_charge(entry, widest)


class KnownMissing:
    """The bounded set of missing dependencies, oldest first sighting first."""

    __slots__ = ("_by_id", "byte_budget", "bytes", "capacity", "touched")

    def __init__(self, capacity: int, byte_budget: int | None = None) -> None:
        self.capacity = capacity
        self.byte_budget = byte_budget
        #: What the entries are charged (missing_charge), in all.
        self.bytes = 0
        self._by_id: dict[str, MissingDependency] = {}
        # Ids added, changed or removed, for durable storage (None: nobody is recording).
        self.touched: set[str] | None = None

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[MissingDependency]:
        return iter(self._by_id.values())

    def get(self, message_id: str) -> MissingDependency | None:
        return self._by_id.get(message_id)

    def add(
        self, entry: HistoryEntry, named_by: str, now_ms: int
    ) -> tuple[bool, list[MissingDependency]]:
        """Record a gap; returns whether it is new, and what was evicted to make room.

        A gap named again keeps its first sighting but learns a retrieval hint or original
        sender it did not have, so a later, better-informed history is not wasted.
        """
        mid = entry.message_id
        known = self._by_id.get(mid)
        if known is not None:
            old = known.entry
            # Named again, most often with what we knew: then nothing is built or compared.
            if (old.retrieval_hint or entry.retrieval_hint == old.retrieval_hint) and (
                old.sender_id or entry.sender_id == old.sender_id
            ):
                return False, []
            better = HistoryEntry(
                mid, old.retrieval_hint or entry.retrieval_hint, old.sender_id or entry.sender_id
            )
            self._put(replace(known, entry=better))
            return False, self._make_room(0, keep=mid)
        evicted = self._make_room(1, missing_charge(entry, named_by))
        self._put(MissingDependency(entry, named_by, now_ms))
        return True, evicted

    def _put(self, known: MissingDependency) -> None:
        self._set(known)
        self._touch(known.message_id)

    def _set(self, known: MissingDependency) -> None:
        """Add ``known`` (at the end) or replace the entry of its id (in its place)."""
        old = self._by_id.get(known.message_id)
        if old is not None:
            self.bytes -= missing_charge(old.entry, old.named_by)
        self._by_id[known.message_id] = known
        self.bytes += missing_charge(known.entry, known.named_by)

    def _make_room(
        self, entries: int, charge: int = 0, keep: str | None = None
    ) -> list[MissingDependency]:
        """Evict the oldest entries (never ``keep``) until ``entries`` more, charged
        ``charge``, fit both caps; the evicted, oldest first."""
        evicted: list[MissingDependency] = []
        budget = self.byte_budget
        while len(self._by_id) + entries > self.capacity or (
            budget is not None and self.bytes + charge > budget
        ):
            oldest = next((mid for mid in self._by_id if mid != keep), None)
            if oldest is None:
                break
            evicted.append(self._by_id[oldest])
            self.remove(oldest)
        return evicted

    def remove(self, message_id: str) -> bool:
        known = self._by_id.pop(message_id, None)
        if known is None:
            return False
        self.bytes -= missing_charge(known.entry, known.named_by)
        self._touch(message_id)
        return True

    def expired(self, now_ms: int, timeout_ms: int) -> list[MissingDependency]:
        """Gaps first seen at least ``timeout_ms`` ago (they are not removed here)."""
        out: list[MissingDependency] = []
        for known in self._by_id.values():
            if now_ms - known.first_seen_ms < timeout_ms:
                break
            out.append(known)
        return out

    def restore(self, stored: Iterable[MissingDependency]) -> None:
        for known in sorted(stored, key=lambda k: k.first_seen_ms):
            self._set(known)

    def clear(self) -> None:
        for mid in self._by_id:
            self._touch(mid)
        self._by_id.clear()
        self.bytes = 0

    def _touch(self, message_id: str) -> None:
        if self.touched is not None:
            self.touched.add(message_id)
