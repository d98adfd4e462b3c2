"""The incoming buffer: received content messages waiting for their causal dependencies.

Theory of operation
-------------------
A content message whose causal history names ids that are not in the local log waits
here until they are. It is indexed both ways (message -> unmet dependencies, dependency ->
waiting messages), so an arriving dependency releases its dependents in O(their number),
and a dependency that is itself waiting is not met: it is released only when it is
delivered. What delivery, the lost timeout and the known-missing set make of this is the
channel's (see :mod:`sdsync.core.channel`); this module keeps the buffer, its index, its
bounds and which message gives way.

The buffer is bounded twice (``max_incoming_buffer`` messages and
``max_incoming_buffer_bytes``), because what a waiting message holds grows with what it
names: its bytes, their decoded copy, and for every unmet dependency a decoded history
entry and two index entries — a peer naming 4,096 ids that never arrive pins ~3 MB with
each message. Each message is charged on arrival (:func:`waiting_charge`, after
:func:`~sdsync.core.config.incoming_charge`: twice its encoded size plus a measured
per-dependency cost, an upper bound of what Python holds) and the charge is released when
it leaves. When a message that must wait does not fit, the waiting message with the
**most unmet dependencies** gives way, the oldest among equals: it is the least likely to
be delivered (it needs every one of them) and frees the most per-dependency state; honest
gaps hold messages back for a few ids, forged histories for thousands, so the forgers go
first whatever their age and an honest message is not pushed out by a flood of them; and
as later messages name the earlier waiting ones, they give way before what they wait for.
Among equals the oldest has had its SDS-R request answered or not (``t_max_ms``) and has
waited longest for nothing. The newcomer counts as the newest: when it would be the first
to go it is refused unrecorded (:class:`~sdsync.core.events.MessageDropped`; it is not in
our bloom filter, so its sender resends it) and nothing is evicted for it. An evicted
message is reported (:class:`~sdsync.core.events.MessageEvicted`: why, its unmet
dependencies and charge; counted in ``stats.evicted``), and if others wait for it it
becomes a known-missing gap again, so retrieval asks for it. Finding the victims is one
pass over the buffer, a sort only when one eviction is not enough.

Only facts are stored (:class:`~sdsync.core.journal.StoredIncoming`: the bytes, the
retrieval hint, the arrival time); :meth:`IncomingBuffer.restore` charges a stored message
as on arrival and rebuilds its index entries.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sdsync.core.config import incoming_charge
from sdsync.core.events import DropReason
from sdsync.core.journal import StoredIncoming
from sdsync.wire import HistoryEntry, Message, encode


@dataclass(slots=True)
class WaitingMessage:
    """A content message in the incoming buffer."""

    message: Message
    data: bytes | None
    retrieval_hint: bytes | None
    received_ms: int
    unmet: set[str]
    # What it counts against the byte budget (waiting_charge), fixed on arrival.
    charge: int

    @property
    def message_id(self) -> str:
        return self.message.message_id


def waiting_charge(message: Message, data: bytes | None, unmet: int) -> int:
    """What ``message`` counts against the byte budget while it waits for ``unmet``
    dependencies (its bytes encoded again only when the caller did not keep them)."""
    return incoming_charge(len(data) if data is not None else len(encode(message)), unmet)


def _unmet_count(waiting: WaitingMessage) -> int:
    return len(waiting.unmet)


class IncomingBuffer:
    """Waiting messages in arrival order, and the index of what they wait for."""

    __slots__ = ("_by_id", "_waiters", "byte_budget", "bytes", "capacity", "touched")

    def __init__(self, capacity: int, byte_budget: int) -> None:
        self.capacity = capacity
        self.byte_budget = byte_budget
        #: What the waiting messages are charged, in all.
        self.bytes = 0
        # In arrival order: among equals, the first to give way is the first key.
        self._by_id: dict[str, WaitingMessage] = {}
        # Unmet dependency -> the waiting messages that need it.
        self._waiters: dict[str, set[str]] = {}
        # Ids that entered or left, for durable storage (None: nobody is recording).
        self.touched: set[str] | None = None

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[WaitingMessage]:
        return iter(self._by_id.values())

    def get(self, message_id: str) -> WaitingMessage | None:
        return self._by_id.get(message_id)

    def awaited(self, message_id: str) -> bool:
        """Whether a waiting message waits for ``message_id``."""
        return message_id in self._waiters

    def add(self, waiting: WaitingMessage) -> None:
        """Let ``waiting`` wait (at the end of the arrival order); room was made for it."""
        waiting_id = waiting.message_id
        self._by_id[waiting_id] = waiting
        self.bytes += waiting.charge
        self._touch(waiting_id)
        waiters = self._waiters
        for dep_id in waiting.unmet:
            dependents = waiters.get(dep_id)
            if dependents is None:
                waiters[dep_id] = {waiting_id}
            else:
                dependents.add(waiting_id)

    def remove(self, waiting_id: str) -> None:
        """Take a waiting message out, with the index entries of what it still waits for."""
        waiting = self._by_id.pop(waiting_id)
        for dep_id in waiting.unmet:
            self.unindex(waiting_id, dep_id)
        self.bytes -= waiting.charge
        self._touch(waiting_id)

    def unindex(self, waiting_id: str, dependency_id: str) -> None:
        """Stop ``dependency_id``'s arrival from releasing ``waiting_id``; it stays among
        the message's unmet dependencies (see ``MessageChannel._give_up_waiting``)."""
        dependents = self._waiters[dependency_id]
        dependents.discard(waiting_id)
        if not dependents:
            del self._waiters[dependency_id]

    def release(self, dependency_id: str) -> Iterator[WaitingMessage]:
        """Messages that became deliverable because ``dependency_id`` is now met (taken
        out of the buffer), by message id; the others wait for one dependency less."""
        for waiting_id in sorted(self._waiters.pop(dependency_id, ())):
            waiting = self._by_id[waiting_id]
            waiting.unmet.discard(dependency_id)
            if not waiting.unmet:
                self.remove(waiting_id)
                yield waiting

    def expired(self, now_ms: int, timeout_ms: int) -> list[WaitingMessage]:
        """Messages that arrived at least ``timeout_ms`` ago (they are not removed here)."""
        return [w for w in self._by_id.values() if now_ms - w.received_ms >= timeout_ms]

    def over_cap(self, added: int, added_bytes: int) -> DropReason | None:
        """Which cap the buffer would break with ``added`` messages of ``added_bytes``."""
        if len(self._by_id) + added > self.capacity:
            return DropReason.INCOMING_BUFFER_FULL
        if self.bytes + added_bytes > self.byte_budget:
            return DropReason.INCOMING_BUFFER_BYTES
        return None

    def victims(self, unmet: int, charge: int) -> list[WaitingMessage] | None:
        """What must give way, in order, for a newcomer with ``unmet`` dependencies,
        charged ``charge``, that does not fit (see :meth:`over_cap`) to fit under both
        caps; None when it must be refused instead.

        The message with the most unmet dependencies goes first, the oldest among equals
        (see the module doc); the newcomer counts as the newest, so it is refused —
        before anything is evicted — when it would be the first to go anyway. Nothing is
        removed here.
        """
        # The config's floor holds the largest message peers may send: once the buffer is
        # empty, the newcomer fits, so there is a first victim and the last one suffices.
        victims: list[WaitingMessage] = []
        count, freed = 1, charge
        for victim in self._eviction_order():
            if len(victim.unmet) < unmet:
                return None  # everything before it was worth keeping over the newcomer
            victims.append(victim)
            count -= 1
            freed -= victim.charge
            if self.over_cap(count, freed) is None:
                break
        return victims

    def _eviction_order(self) -> Iterator[WaitingMessage]:
        """Waiting messages, most unmet dependencies first, oldest among equals."""
        waiting = self._by_id.values()
        # Nearly always the first is all it takes: one pass, no sort.
        first = max(waiting, key=_unmet_count)
        yield first
        # Sorting is stable, reversed too: arrival order among equals stays.
        yield from sorted((w for w in waiting if w is not first), key=_unmet_count, reverse=True)

    def stored(self, message_id: str) -> StoredIncoming | None:
        """A waiting message as it must be stored (None once it left the buffer)."""
        waiting = self._by_id.get(message_id)
        if waiting is None:
            return None
        data = waiting.data if waiting.data is not None else encode(waiting.message)
        return StoredIncoming(data, waiting.retrieval_hint, waiting.received_ms)

    def restore(
        self, stored: StoredIncoming, message: Message, unmet: Sequence[HistoryEntry]
    ) -> None:
        """Let a stored message (``message`` decoded from its bytes) wait again for the
        entries of its causal history that the restored log lacks, charged as on arrival
        (per entry: a history naming an id twice is charged twice, as it was then)."""
        charge = waiting_charge(message, stored.data, len(unmet))
        unmet_ids = {entry.message_id for entry in unmet}
        self.add(
            WaitingMessage(
                message, stored.data, stored.retrieval_hint, stored.received_ms, unmet_ids, charge
            )
        )

    def clear(self) -> None:
        for waiting_id in self._by_id:
            self._touch(waiting_id)
        self._by_id.clear()
        self._waiters.clear()
        self.bytes = 0

    def _touch(self, message_id: str) -> None:
        if self.touched is not None:
            self.touched.add(message_id)
