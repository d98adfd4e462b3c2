"""Waku Sync's range-based set reconciliation, one side of one exchange, sans-I/O.

Theory of operation
-------------------
Two store nodes find which messages of a time window one holds and the other lacks
without sending every hash. The *initiator* sends one range covering the window
``[now - range - jitter, now - jitter]`` with its fingerprint; from then on both sides
run the same step on every payload they receive (:func:`respond`, nwaku's
``processPayload``), range by range:

* a **skip** is echoed (nothing to do there);
* a **fingerprint** equal to ours becomes a skip. Otherwise, if we hold at most
  ``threshold`` (100) items there we answer with them as an *item set*; if more, we
  split the range into ``partitions`` (8) parts of equal time and answer each with its
  fingerprint, or its item set when it is that small (an empty part too: an empty
  item set, *not* marked reconciled, so that the peer answers with its items there and
  we learn what we lack: we archive only what we expect);
* an **item set** is compared with ours: their items we lack are *to receive*, ours
  they lack are *to send* (each side pushes what it holds over the transfer protocol:
  :mod:`~sdsync.waku.sync.transfer`). If it was not marked reconciled, we answer with
  our own items, marked reconciled, so that the other side finds the differences too;
  if it was, the range is done: a skip.

Consecutive skips are merged; a reply of skips only is sent as the empty payload and
ends the exchange, as does receiving one (:meth:`Reconciler.receive`).

Each side filters the items by the topics both sync: every payload names the sender's
pubsub and content topics (none: all), and a side uses the intersection with its own
(:meth:`Topics.meet`; disjoint: nothing to sync, the empty payload).

Differences with nwaku. One on the wire: where we hold nothing we answer with an empty
item set *not* marked reconciled (nwaku marks it reconciled, and then only the side
holding the items learns of the difference: enough for nwaku, which archives whatever is
pushed to it; nwaku reads ours as any other item set). None visible on the wire: a range
too narrow to split into 8 (fewer nanoseconds than parts) but holding more than
``threshold`` items is answered as one item set (nwaku drops it from its reply, so the
exchange ends with it unresolved); an item set's elements outside its range are ignored;
and ranges outside the window this node serves (:attr:`Reconciler.window`) are skipped,
so that a peer cannot make us want, or send, what we do not keep.

What XOR fingerprints allow a hostile peer: a fingerprint is linear, so a peer that
knows our items can craft a payload whose fingerprint equals ours while its items differ
— it can *hide* a difference from us (we then lack something it has, or it pretends to
have what it lacks). It cannot make us archive anything: every id it names only enters
:attr:`Reconciler.wanted`, and a message it then pushes is archived only after the
checks a relayed one passes and a match with a wanted id (docs/store.md, "With nwaku").
Between two sdsync nodes, sum-then-hash fingerprints (RBSR, RIBLT) are used instead.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from sdsync.errors import RejectReason, RemoteProtocolError
from sdsync.waku.sync.codec import (
    ItemSet,
    Range,
    RangesData,
    RangeType,
    SyncId,
    decode_ranges,
    encode_ranges,
)
from sdsync.waku.sync.index import ItemRows, SyncIndex
from sdsync.wire.waku import HASH_SIZE

THRESHOLD = 100
"""Items in a range up to which it is sent as an item set (nwaku's ``lengthThreshold``)."""
PARTITIONS = 8
"""Parts a differing range is split into (nwaku's ``partitionCount``)."""
END_PAYLOAD = b"\x00"


@dataclass(frozen=True)
class Topics:
    """The pubsub and content topics a side syncs (empty: all)."""

    pubsub: frozenset[str] = frozenset()
    content: frozenset[str] = frozenset()

    def meet(self, pubsub: Collection[str], content: Collection[str]) -> Topics | None:
        """The topics both sides sync, or None if none (nwaku's ``preProcessPayload``)."""
        met = []
        for ours, theirs in ((self.pubsub, pubsub), (self.content, content)):
            if ours and theirs:
                both = ours & frozenset(theirs)
                if not both:
                    return None
                met.append(both)
            else:
                met.append(ours or frozenset(theirs))
        return Topics(met[0], met[1])


@dataclass
class Differences:
    """What the exchange found so far."""

    to_send: dict[bytes, None] = field(default_factory=dict)
    """Hashes of ours the peer lacks, in the order found."""
    wanted: dict[bytes, int] = field(default_factory=dict)
    """Hashes the peer holds and we lack, with the timestamp it claimed for each."""


@dataclass(frozen=True)
class Limits:
    max_rounds: int = 64
    """Payloads one exchange may receive (a window of millions of items needs ~12)."""
    max_ranges: int = 1 << 16
    """Ranges in one payload."""
    max_wanted: int = 1 << 20
    """Ids we may come to want in one exchange."""


class Reconciler:
    """One side of one exchange (see the module): feed it the peer's payloads with
    :meth:`receive`, send what it returns; :attr:`differences` is what was found.

    ``window`` is the span of time this side compares, ``(lower, upper)`` inclusive, in
    ns: ``rows`` holds this side's items in it; a range wholly outside is skipped.
    """

    def __init__(
        self,
        rows: ItemRows,
        own: Topics,
        window: tuple[int, int],
        *,
        limits: Limits | None = None,
        threshold: int = THRESHOLD,
        partitions: int = PARTITIONS,
    ) -> None:
        self.rows = rows
        self.own = own
        self.window = window
        self.limits = limits if limits is not None else Limits()
        self.threshold = threshold
        self.partitions = partitions
        self.differences = Differences()
        self.rounds = 0
        self.finished = False
        self._indexes: dict[Topics, SyncIndex] = {}

    def first_payload(self) -> bytes:
        """The initiator's opening: the whole window, its fingerprint over our topics."""
        lower, upper = (SyncId(t, bytes(HASH_SIZE)) for t in self.window)
        index = self._index(self.own)
        start, end = index.span(lower, upper)
        opening = Range(
            lower, upper, RangeType.FINGERPRINT, fingerprint=index.fingerprint(start, end)
        )
        return encode_ranges(self._signed(RangesData((opening,))))

    def receive(self, frame: bytes) -> bytes | None:
        """The reply to the peer's payload ``frame``, or None when none is due; after
        either, :attr:`finished` says whether the exchange is over. Raises only
        :class:`~sdsync.errors.RemoteProtocolError` (the exchange must then end)."""
        self.rounds += 1
        if self.rounds > self.limits.max_rounds:
            raise _violation(f"more than {self.limits.max_rounds} payloads in one exchange")
        payload = decode_ranges(frame)
        if len(payload.ranges) > self.limits.max_ranges:
            raise _violation(f"a payload of {len(payload.ranges)} ranges")
        if payload.all_skip:
            self.finished = True
            return None
        topics = self.own.meet(payload.pubsub_topics, payload.content_topics)
        if topics is None:
            self.finished = True
            return END_PAYLOAD
        reply = respond(
            self._index(topics),
            self._within_window(payload),
            self.differences,
            threshold=self.threshold,
            partitions=self.partitions,
        )
        if len(self.differences.wanted) > self.limits.max_wanted:
            raise _violation(f"more than {self.limits.max_wanted} items wanted in one exchange")
        self.finished = reply.all_skip
        return END_PAYLOAD if reply.all_skip else encode_ranges(self._signed(reply))

    def _signed(self, data: RangesData) -> RangesData:
        """``data`` naming our own topics, as nwaku's replies do."""
        return RangesData(
            data.ranges, tuple(sorted(self.own.pubsub)), tuple(sorted(self.own.content))
        )

    def _index(self, topics: Topics) -> SyncIndex:
        index = self._indexes.get(topics)
        if index is None:
            index = self._indexes[topics] = self.rows.restricted(topics.pubsub, topics.content)
        return index

    def _within_window(self, payload: RangesData) -> RangesData:
        low, high = self.window
        ranges = tuple(
            r
            if r.upper.time >= low and r.lower.time <= high
            else Range(r.lower, r.upper, RangeType.SKIP)
            for r in payload.ranges
        )
        return RangesData(ranges, payload.pubsub_topics, payload.content_topics)


def respond(
    index: SyncIndex,
    payload: RangesData,
    differences: Differences,
    *,
    threshold: int = THRESHOLD,
    partitions: int = PARTITIONS,
) -> RangesData:
    """Our reply to ``payload`` over ``index``, adding what it shows to ``differences``
    (see the module); the reply names no topics (the caller adds its own)."""
    out: list[Range] = []
    for item in payload.ranges:
        if item.type is RangeType.FINGERPRINT:
            out += _fingerprint_range(index, item, threshold, partitions)
        elif item.type is RangeType.ITEM_SET:
            out.append(_item_set_range(index, item, differences))
        else:
            out.append(item)
    merged = _merge_skips(out)
    return (
        RangesData() if all(r.type is RangeType.SKIP for r in merged) else RangesData(tuple(merged))
    )


def _fingerprint_range(
    index: SyncIndex, item: Range, threshold: int, partitions: int
) -> list[Range]:
    start, end = index.span(item.lower, item.upper)
    if index.fingerprint(start, end) == item.fingerprint:
        return [Range(item.lower, item.upper, RangeType.SKIP)]
    parts = _partitions(item.lower.time, item.upper.time, partitions)
    if end - start <= threshold or not parts:
        return [_items(index, item.lower, item.upper, start, end)]
    out = []
    for lower, upper in parts:
        start, end = index.span(lower, upper)
        if end - start <= threshold:
            out.append(_items(index, lower, upper, start, end))
        else:
            out.append(
                Range(
                    lower, upper, RangeType.FINGERPRINT, fingerprint=index.fingerprint(start, end)
                )
            )
    return out


def _items(index: SyncIndex, lower: SyncId, upper: SyncId, start: int, end: int) -> Range:
    """Our items ``[start, end)`` as an item set, not reconciled: even an empty one, so
    that the peer answers with its items and we learn what we lack (see the module)."""
    items = ItemSet(tuple(index.ids(start, end)), reconciled=False)
    return Range(lower, upper, RangeType.ITEM_SET, items=items)


def _partitions(low: int, high: int, count: int) -> list[tuple[SyncId, SyncId]]:
    """``[low, high]`` in ``count`` parts of equal time, the remainder spread over the
    first ones (nwaku's ``equalPartitioning``); none if it is narrower than ``count`` ns."""
    span = high - low
    if span < count:
        return []
    size, extra = divmod(span, count)
    zero = bytes(HASH_SIZE)
    bounds, lower = [], low
    for part in range(count):
        upper = lower + size + (1 if part < extra else 0)
        bounds.append((SyncId(lower, zero), SyncId(upper, zero)))
        lower = upper
    return bounds


def _item_set_range(index: SyncIndex, item: Range, differences: Differences) -> Range:
    assert item.items is not None
    start, end = index.span(item.lower, item.upper)
    ours = index.ids(start, end)
    theirs = [e for e in item.items.elements if item.lower <= e <= item.upper]
    mine = set(ours)
    held = set(theirs)
    for element in ours:
        if element not in held:
            differences.to_send[element.hash] = None
    for element in theirs:
        if element not in mine:
            differences.wanted[element.hash] = element.time
    if item.items.reconciled:
        return Range(item.lower, item.upper, RangeType.SKIP)
    return Range(item.lower, item.upper, RangeType.ITEM_SET, items=ItemSet(tuple(ours), True))


def _merge_skips(ranges: list[Range]) -> list[Range]:
    merged: list[Range] = []
    for item in ranges:
        last = merged[-1] if merged else None
        if last is not None and last.type is RangeType.SKIP and item.type is RangeType.SKIP:
            merged[-1] = Range(last.lower, item.upper, RangeType.SKIP)
        else:
            merged.append(item)
    return merged


def _violation(detail: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"Waku Sync: {detail}", reason=RejectReason.MALFORMED_RPC)
