"""Numbered events, kept until the application says it has processed them.

Theory of operation
-------------------
What the application must hear of a channel — a message ready to deliver, one of ours
acknowledged, possibly acknowledged or given up on, dependencies missing, a waiting
message evicted from the incoming buffer, bytes to transmit, a periodic sync — is
reported *at least once*: each such event gets the channel's next sequence number (1, 2,
3, ...) in the step that caused it and is kept until the application acknowledges it, by
number (:meth:`EventLog.ack`: "everything up to ``seq`` is processed"). Until then it is
reported again — after a callback raised, after a reconnect, after the process died —
always under the same number. So an application that remembers the last number it
processed per channel processes every event exactly once.

Durability is the owner's: :class:`EventLog` keeps events in memory, and
:class:`~sdsync.runtime.state.StoredEventLog` writes them in the same SQLite transaction
as the state change that caused them, so an event exists exactly when its change does.

What is kept is bounded (:class:`EventLimits`, a count and a byte total per channel): an
application that never acknowledges cannot make us hold unbounded memory or disk. At the
bound the oldest unacknowledged events are discarded, never silently: an
:class:`EventsDiscarded` takes the place (and the number) of the last of them and says
which numbers are gone; later discards merge into it while it is unacknowledged.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sdsync.core import (
    DropReason,
    Event,
    MessageAcknowledged,
    MessageDelivered,
    MessageDeliveredEarly,
    MessageEvicted,
    MessageLost,
    MessageMissing,
    MessagePossiblyAcknowledged,
    SendFailed,
)
from sdsync.errors import LocalProtocolError
from sdsync.runtime.driver import Transmit


@dataclass(frozen=True, slots=True)
class PeriodicSync(Event):
    """The channel's sync interval elapsed; its sync message, if any, was the
    :class:`~sdsync.runtime.Transmit` just before (``message_id`` is that message's)."""

    type = "periodic_sync"


@dataclass(frozen=True, slots=True)
class EventsDiscarded(Event):
    """Events ``first_seq`` .. ``last_seq`` were discarded unacknowledged at the bound;
    ``ready`` of them were deliveries (``message_id`` is empty)."""

    first_seq: int
    last_seq: int
    ready: int
    type = "events_discarded"


Reported = Event | Transmit
"""What a numbered event can be: a core event, bytes to transmit, or one of the two above."""

#: The core events an application must hear of at least once; the others describe
#: passing states (a message received, a sync sent, the sync status) and are live only.
DURABLE_EVENTS = (
    MessageDelivered,
    MessageDeliveredEarly,
    MessageAcknowledged,
    MessagePossiblyAcknowledged,
    MessageMissing,
    MessageEvicted,
    MessageLost,
    SendFailed,
)


@dataclass(frozen=True, slots=True)
class Delivery:
    """An event for the application: ``seq`` is its number, or None for a live-only one."""

    seq: int | None
    event: Reported


DEFAULT_MAX_EVENTS = 100_000
DEFAULT_MAX_EVENT_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class EventLimits:
    """How much a channel keeps for an application that does not acknowledge."""

    max_events: int = DEFAULT_MAX_EVENTS
    max_bytes: int = DEFAULT_MAX_EVENT_BYTES

    def __post_init__(self) -> None:
        if self.max_events < 2 or self.max_bytes < 1:
            raise LocalProtocolError("EventLimits need max_events >= 2 and max_bytes >= 1")


Row = tuple[str, str, str | None, int | None, int | None, str | None, bytes | None, bytes | None]
"""(kind, message_id, sender_id, number, flag, text, data, hint): one event, stored."""


def to_row(event: Reported) -> Row:
    """The columns of an event (the inverse of :func:`from_row`)."""
    mid = event.message_id
    match event:
        case Transmit(data=data, kind=kind):
            return ("transmit", mid, None, None, None, kind, data, None)
        case MessageDelivered(sender_id=s, lamport_timestamp=ts, content=c, retrieval_hint=h):
            return (event.type, mid, s, ts, None, None, c, h)
        case MessageDeliveredEarly(
            sender_id=s, lamport_timestamp=ts, content=c, retrieval_hint=h, missing_dependencies=n
        ):
            return (event.type, mid, s, ts, n, None, c, h)
        case MessageAcknowledged(by_causal_history=by_history, acker_id=acker):
            return (event.type, mid, None, None, int(by_history), acker, None, None)
        case MessagePossiblyAcknowledged(count=count, acker_id=acker):
            return (event.type, mid, None, count, None, acker, None, None)
        case MessageMissing(retrieval_hint=hint, sender_id=sender):
            return (event.type, mid, sender, None, None, None, None, hint)
        case MessageEvicted(
            reason=why, sender_id=s, unmet_dependencies=n, size_bytes=size, retrieval_hint=h
        ):
            return (event.type, mid, s, size, n, why.value, None, h)
        case EventsDiscarded(first_seq=first, ready=ready):
            return (event.type, mid, None, first, ready, None, None, None)
        case MessageLost() | SendFailed() | PeriodicSync():
            return (event.type, mid, None, None, None, None, None, None)
    raise LocalProtocolError(f"{type(event).__name__} is not an event that is kept")


def from_row(seq: int, row: Row) -> Delivery:
    kind, mid, sender, number, flag, text, data, hint = row
    event: Reported
    if kind == "transmit":
        event = Transmit(data or b"", mid, text)  # type: ignore[arg-type]
    elif kind == MessageDelivered.type:
        event = MessageDelivered(mid, sender or "", number or 0, data or b"", hint)
    elif kind == MessageDeliveredEarly.type:
        event = MessageDeliveredEarly(mid, sender or "", number or 0, data or b"", hint, flag or 0)
    elif kind == MessageAcknowledged.type:
        event = MessageAcknowledged(mid, bool(flag), text or "")
    elif kind == MessagePossiblyAcknowledged.type:
        event = MessagePossiblyAcknowledged(mid, number or 0, text or "")
    elif kind == MessageMissing.type:
        event = MessageMissing(mid, hint, sender)
    elif kind == MessageEvicted.type:
        event = MessageEvicted(
            mid, DropReason(text or ""), sender or "", flag or 0, number or 0, hint
        )
    elif kind == EventsDiscarded.type:
        event = EventsDiscarded(mid, number or 0, seq, flag or 0)
    else:
        event = _BARE[kind](mid)
    return Delivery(seq, event)


_BARE: dict[str, type[MessageLost | SendFailed | PeriodicSync]] = {
    cls.type: cls for cls in (MessageLost, SendFailed, PeriodicSync)
}


def _size(event: Reported) -> int:
    if isinstance(event, Transmit):
        return len(event.data)
    if isinstance(event, MessageDelivered | MessageDeliveredEarly):
        return len(event.content)
    return 0


class EventLog:
    """One channel's numbered events, kept in memory until acknowledged.

    ``read`` serves what it holds; subclasses that keep events elsewhere too
    (:class:`~sdsync.runtime.state.StoredEventLog`) hold only a recent tail here and read
    the rest from their store.
    """

    def __init__(
        self, limits: EventLimits | None = None, *, last_seq: int = 0, acked_seq: int = 0
    ) -> None:
        self.limits = limits if limits is not None else EventLimits()
        self._last = last_seq
        self._acked = acked_seq
        # Unacknowledged events held here, oldest first; everything after _held_from.
        self._held: deque[Delivery] = deque()
        self._held_from = acked_seq
        self._count = 0  # every unacknowledged event, held here or not
        self._bytes = 0

    @property
    def last_seq(self) -> int:
        """The number of the newest event (0: none yet)."""
        return self._last

    @property
    def acked_seq(self) -> int:
        """Events up to this number are acknowledged and forgotten."""
        return self._acked

    @property
    def unacknowledged(self) -> int:
        return self._count

    def record(self, events: Iterable[Reported]) -> list[Delivery]:
        """Number ``events`` and keep them; the numbered deliveries, in order."""
        numbered = []
        for event in events:
            self._last += 1
            delivery = Delivery(self._last, event)
            self._held.append(delivery)
            self._count += 1
            self._bytes += _size(event)
            numbered.append(delivery)
        if numbered:
            self._stored(numbered)
            self._bound()
        return numbered

    def read(self, after: int, limit: int) -> list[Delivery]:
        """Up to ``limit`` unacknowledged events numbered above ``after``, in order."""
        after = max(after, self._acked)
        if after >= self._last or limit < 1:
            return []
        if after < self._held_from:
            return self._read_stored(after, limit)
        start = len(self._held) - (self._last - after)
        if start >= 0 and self._held[start].seq == after + 1:  # no discard gap in between
            return [self._held[i] for i in range(start, min(start + limit, len(self._held)))]
        return [d for d in self._held if d.seq is not None and d.seq > after][:limit]

    def ack(self, through: int) -> bool:
        """Events up to ``through`` are processed: forget them. False if nothing moved."""
        through = min(through, self._last)
        if through <= self._acked:
            return False
        count, size = self._forget_stored(through, min(through, self._held_from))
        while self._held and (self._held[0].seq or 0) <= through:
            gone = self._held.popleft()
            count += 1
            size += _size(gone.event)
        self._count -= count
        self._bytes -= size
        self._held_from = max(self._held_from, through)
        self._acked = through
        return True

    # ------------------------------------------------------------- the bound

    def _bound(self) -> None:
        limits = self.limits
        if self._count <= limits.max_events and self._bytes <= limits.max_bytes:
            return
        # Discard down to 7/8 of the bound (the marker that replaces them being one of the
        # 1/8 left), so that a full log does not discard per event.
        keep_events = limits.max_events - max(1, limits.max_events // 8)
        keep_bytes = limits.max_bytes - limits.max_bytes // 8
        count, size, ready, first, through = 0, 0, 0, 0, 0
        for seq, event in self._oldest():
            if (self._count - count <= keep_events and self._bytes - size <= keep_bytes) or (
                seq == self._last
            ):
                break
            count += 1
            size += _size(event)
            if isinstance(event, EventsDiscarded):
                ready += event.ready
                first = first or event.first_seq
            else:
                ready += isinstance(event, MessageDelivered)
                first = first or seq
            through = seq
        if not count:
            return
        marker = Delivery(through, EventsDiscarded("", first, through, ready))
        self._discard(through, marker)
        if through > self._held_from:  # else only events not held here were discarded
            while self._held and (self._held[0].seq or 0) <= through:
                self._held.popleft()
            self._held.appendleft(marker)
            self._held_from = self._acked  # every earlier one was discarded
        self._count -= count - 1
        self._bytes -= size

    # ------------------------------------------------ what a store adds (none here)

    def _stored(self, numbered: list[Delivery]) -> None:
        """Newly numbered events, to be stored with the step that caused them."""

    def _oldest(self) -> Iterator[tuple[int, Reported]]:
        """Every unacknowledged event, oldest first."""
        for delivery in list(self._held):
            yield delivery.seq or 0, delivery.event

    def _discard(self, through: int, marker: Delivery) -> None:
        """Events up to ``through`` give way to ``marker`` (numbered ``through``)."""

    def _read_stored(self, after: int, limit: int) -> list[Delivery]:
        raise LocalProtocolError(f"events after {after} are not held")  # unreachable here

    def _forget_stored(self, through: int, unheld: int) -> tuple[int, int]:
        """Forget stored events up to ``through``; the count and bytes of those up to
        ``unheld``, which are not held here."""
        return 0, 0
