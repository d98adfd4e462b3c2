"""Waku Sync's wire format, byte for byte as nwaku writes and reads it.

Theory of operation
-------------------
Waku Sync (nwaku's ``waku_store_sync``) speaks two libp2p protocols, each a stream of
uvarint-length-prefixed frames:

* ``/vac/waku/reconciliation/1.0.0`` carries :class:`RangesData` payloads back and forth:
  the topics the sender syncs, then a run of contiguous *ranges* of the item order
  (timestamp, message hash), each a skip, a fingerprint (XOR of the hashes in it) or an
  item set (the ids in it, and whether the sender has already reconciled it);
* ``/vac/waku/transfer/1.0.0`` carries :class:`WakuMessageAndTopic` protobufs, one per
  message the other side lacks.

A payload is delta-encoded (:func:`encode_ranges`), not protobuf: LEB128 counts and
topic strings, the first range's lower timestamp, then per range the *difference* of
its upper timestamp to the previous one, its type byte and its body. Only the upper
bounds travel; a range's lower bound is the previous range's upper bound. A bound's hash
travels only when its timestamp equals the previous bound's, and then only as a prefix
(up to and including the first byte that differs from the first lower bound's hash);
the rest of the hash, and the hash of every other bound, decodes as zeros. nwaku
decodes every lower bound with a zero hash, too. Both sides therefore compute on the
bounds *as decoded* — :func:`decode_ranges` (ours) returns exactly what nwaku's decoder
makes of the same bytes — and an initiator starts from zero-hash bounds so that its
first fingerprint covers what the responder's does. An empty payload (no ranges) is
the single byte ``0``.

Decoding treats the bytes as hostile: a truncated or overlong varint, a type byte above
2, a prefix longer than a hash, timestamps past 2**64, counts beyond the frame, trailing
bytes: each is a :class:`~sdsync.errors.RemoteProtocolError` (``MALFORMED_RPC``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError
from sdsync.waku.sync import waku_sync_pb2 as pb
from sdsync.wire.codec import uvarint
from sdsync.wire.untrusted import parse_untrusted
from sdsync.wire.waku import HASH_SIZE, MAX_WAKU_MESSAGE_BYTES, WakuMessage, decode_waku_message

RECONCILIATION_PROTOCOL = "/vac/waku/reconciliation/1.0.0"
TRANSFER_PROTOCOL = "/vac/waku/transfer/1.0.0"
ZERO_HASH = bytes(HASH_SIZE)
FULL_HASH = b"\xff" * HASH_SIZE
UINT64_LIMIT = 1 << 64
_MAX_VARINT_BYTES = 10


class RangeType(enum.IntEnum):
    SKIP = 0
    FINGERPRINT = 1
    ITEM_SET = 2


@dataclass(frozen=True, order=True, slots=True)
class SyncId:
    """An item: a message's timestamp (ns) and its deterministic hash, ordered so."""

    time: int
    hash: bytes

    def __post_init__(self) -> None:
        if len(self.hash) != HASH_SIZE:
            raise LocalProtocolError(
                f"a sync id's hash has {HASH_SIZE} bytes, not {len(self.hash)}"
            )
        if not 0 <= self.time < UINT64_LIMIT:
            raise LocalProtocolError(f"a sync id's time {self.time} is outside 0..2**64")


MIN_ID = SyncId(0, ZERO_HASH)


@dataclass(frozen=True, slots=True)
class ItemSet:
    elements: tuple[SyncId, ...]
    reconciled: bool


@dataclass(frozen=True, slots=True)
class Range:
    """The items ``lower <= id <= upper`` (both bounds inclusive, as nwaku compares),
    and what the sender says of them."""

    lower: SyncId
    upper: SyncId
    type: RangeType
    fingerprint: bytes = b""
    items: ItemSet | None = None

    def __post_init__(self) -> None:
        if (self.type is RangeType.FINGERPRINT) != (len(self.fingerprint) == HASH_SIZE):
            raise LocalProtocolError("a fingerprint range, and only one, has a 32-byte fingerprint")
        if (self.type is RangeType.ITEM_SET) != (self.items is not None):
            raise LocalProtocolError("an item-set range, and only one, has an item set")


@dataclass(frozen=True, slots=True)
class RangesData:
    """One reconciliation payload."""

    ranges: tuple[Range, ...] = ()
    pubsub_topics: tuple[str, ...] = ()
    """The pubsub topics the sender syncs; none: all."""
    content_topics: tuple[str, ...] = ()
    """The content topics the sender syncs; none: all."""

    @property
    def all_skip(self) -> bool:
        """Nothing left to reconcile: no ranges, or skips only (the exchange ends)."""
        return all(r.type is RangeType.SKIP for r in self.ranges)


# -- encoding


def encode_ranges(data: RangesData) -> bytes:
    """``data`` delta-encoded as nwaku's ``deltaEncode``; the ranges must be in order."""
    if not data.ranges:
        return b"\x00"
    out = bytearray()
    for topics in (data.pubsub_topics, data.content_topics):
        out += uvarint(len(topics))
        for topic in topics:
            raw = topic.encode()
            out += uvarint(len(raw)) + raw
    first = data.ranges[0].lower
    out += uvarint(first.time)
    last_time = first.time
    for item in data.ranges:
        upper = item.upper
        if upper.time < last_time:
            raise LocalProtocolError("ranges must be in order: an upper bound went back in time")
        diff = upper.time - last_time
        last_time = upper.time
        out += uvarint(diff)
        if diff == 0:
            prefix = _prefix_length(first.hash, upper.hash)
            out.append(prefix)
            out += upper.hash[:prefix]
        out.append(item.type)
        if item.type is RangeType.FINGERPRINT:
            out += item.fingerprint
        elif item.items is not None:
            out += uvarint(len(item.items.elements))
            out += encode_item_set(item.items)
    return bytes(out)


def _prefix_length(reference: bytes, hash_: bytes) -> int:
    """Bytes of ``hash_`` that travel: up to and including the first that differs from
    ``reference`` (all of them when none does)."""
    for index, (a, b) in enumerate(zip(reference, hash_, strict=True)):
        if a != b:
            return index + 1
    return HASH_SIZE


def encode_item_set(items: ItemSet) -> bytes:
    """An item set's elements (time deltas and hashes) and its reconciled byte."""
    out = bytearray()
    last = 0
    for element in items.elements:
        if element.time < last:
            raise LocalProtocolError("an item set's elements must be in order")
        out += uvarint(element.time - last)
        out += element.hash
        last = element.time
    out.append(1 if items.reconciled else 0)
    return bytes(out)


# -- decoding


def decode_ranges(data: bytes) -> RangesData:
    """A peer's payload; raises only :class:`RemoteProtocolError`."""
    if len(data) <= 1:  # nwaku's empty payload is b"\x00"; it reads any single byte so
        return RangesData()
    reader = _Reader(data)
    pubsub_topics = reader.topics()
    content_topics = reader.topics()
    last_time = reader.varint()
    ranges: list[Range] = []
    while not reader.done():
        lower = SyncId(last_time, ZERO_HASH)
        diff = reader.varint()
        upper_hash = reader.hash_prefix() if diff == 0 else ZERO_HASH
        last_time = reader.time(last_time + diff)
        upper = SyncId(last_time, upper_hash)
        kind = reader.range_type()
        if kind is RangeType.FINGERPRINT:
            ranges.append(Range(lower, upper, kind, fingerprint=reader.take(HASH_SIZE)))
        elif kind is RangeType.ITEM_SET:
            ranges.append(Range(lower, upper, kind, items=reader.item_set()))
        else:
            ranges.append(Range(lower, upper, kind))
    return RangesData(tuple(ranges), tuple(pubsub_topics), tuple(content_topics))


class _Reader:
    __slots__ = ("data", "position")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.position = 0

    def done(self) -> bool:
        return self.position >= len(self.data)

    def take(self, count: int) -> bytes:
        end = self.position + count
        if end > len(self.data):
            raise _malformed(f"a field of {count} bytes runs past the end of the payload")
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def varint(self) -> int:
        value = 0
        for index in range(_MAX_VARINT_BYTES):
            if self.position >= len(self.data):
                raise _malformed("the payload ends inside a varint")
            byte = self.data[self.position]
            self.position += 1
            value |= (byte & 0x7F) << (7 * index)
            if not byte & 0x80:
                if value >= UINT64_LIMIT:
                    raise _malformed("a varint above 2**64")
                return value
        raise _malformed(f"a varint longer than {_MAX_VARINT_BYTES} bytes")

    def count(self, element_bytes: int) -> int:
        """A count of elements of at least ``element_bytes`` each that fit the payload."""
        value = self.varint()
        if value * element_bytes > len(self.data) - self.position:
            raise _malformed(f"a count of {value} runs past the end of the payload")
        return value

    def time(self, value: int) -> int:
        if value >= UINT64_LIMIT:
            raise _malformed("a timestamp past 2**64")
        return value

    def topics(self) -> list[str]:
        topics = []
        for _ in range(self.count(1)):
            raw = self.take(self.count(1))
            try:
                topics.append(raw.decode())
            except UnicodeDecodeError:
                raise _malformed("a topic that is not UTF-8") from None
        return topics

    def hash_prefix(self) -> bytes:
        length = self.take(1)[0]
        if length > HASH_SIZE:
            raise _malformed(f"a hash prefix of {length} bytes")
        return self.take(length) + bytes(HASH_SIZE - length)

    def range_type(self) -> RangeType:
        value = self.take(1)[0]
        if value > RangeType.ITEM_SET:
            raise _malformed(f"range type {value}")
        return RangeType(value)

    def item_set(self) -> ItemSet:
        elements = []
        last = 0
        for _ in range(self.count(HASH_SIZE + 1)):
            last = self.time(last + self.varint())
            elements.append(SyncId(last, self.take(HASH_SIZE)))
        reconciled = self.take(1)[0]
        if reconciled > 1:
            raise _malformed(f"reconciled byte {reconciled}")
        return ItemSet(tuple(elements), bool(reconciled))


def _malformed(detail: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"malformed Waku Sync payload: {detail}", reason=RejectReason.MALFORMED_RPC
    )


# -- transfer


MAX_TRANSFER_BYTES = MAX_WAKU_MESSAGE_BYTES + 2 * 1024
"""The largest transfer frame we read: a message and its topic."""


@dataclass(frozen=True, slots=True)
class WakuMessageAndTopic:
    pubsub_topic: str
    message: WakuMessage

    def to_bytes(self) -> bytes:
        return pb.WakuMessageAndTopic(
            pubsub_topic=self.pubsub_topic, message=self.message.to_bytes()
        ).SerializeToString()

    @classmethod
    def from_bytes(
        cls, data: bytes, *, max_message_bytes: int = MAX_WAKU_MESSAGE_BYTES
    ) -> WakuMessageAndTopic:
        """A peer's transfer frame; raises only :class:`RemoteProtocolError`."""
        parsed = parse_untrusted(
            pb.WakuMessageAndTopic, data, "WakuMessageAndTopic", RejectReason.MALFORMED_RPC
        )
        if not parsed.pubsub_topic or not parsed.message:
            raise RemoteProtocolError(
                "a transfer frame without its pubsub topic or message",
                reason=RejectReason.MALFORMED_RPC,
            )
        message = decode_waku_message(parsed.message, max_bytes=max_message_bytes)
        return cls(parsed.pubsub_topic, message)
