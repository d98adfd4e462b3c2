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
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from sdsync.wire import HistoryEntry


@dataclass(frozen=True, slots=True)
class MissingDependency:
    """A message id named in a causal history that we have never received."""

    entry: HistoryEntry
    named_by: str
    first_seen_ms: int

    @property
    def message_id(self) -> str:
        return self.entry.message_id


class KnownMissing:
    """The bounded set of missing dependencies, oldest first sighting first."""

    __slots__ = ("_by_id", "capacity", "touched")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
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
            self._by_id[mid] = replace(known, entry=better)
            self._touch(mid)
            return False, []
        evicted: list[MissingDependency] = []
        while len(self._by_id) >= self.capacity:
            oldest = self._by_id.pop(next(iter(self._by_id)))
            self._touch(oldest.message_id)
            evicted.append(oldest)
        self._by_id[mid] = MissingDependency(entry, named_by, now_ms)
        self._touch(mid)
        return True, evicted

    def remove(self, message_id: str) -> bool:
        if self._by_id.pop(message_id, None) is None:
            return False
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
            self._by_id[known.message_id] = known

    def clear(self) -> None:
        for mid in self._by_id:
            self._touch(mid)
        self._by_id.clear()

    def _touch(self, message_id: str) -> None:
        if self.touched is not None:
            self.touched.add(message_id)
