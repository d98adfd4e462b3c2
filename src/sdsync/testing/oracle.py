"""A reference decoder and raw protobuf writer: the oracle for fuzzing the wire codec.

Theory of operation
-------------------
:func:`sdsync.wire.decode` is fast because it parses history entries as ``bytes`` through a
second schema. This module decodes the same bytes the plain way, with the stock protobuf
runtime and the ``SdsMessage`` schema that @waku/sds uses, and applies the same limits.
Differential fuzzing (``tests/wire/test_fuzz.py``, ``bench/fuzz_decoders.py``) checks that
both agree on every input: same verdict, same message.

The one known divergence is nesting depth: the plain schema parses a history entry one
level deeper than sdsync, which parses entries on their own, so an entry wrapping exactly
100 nested unknown groups is rejected by the first and accepted by the second. The oracle
accepts such inputs the way sdsync does.

The raw writer helpers (:func:`varint`, :func:`key`) build protobuf field by field, so
fuzzers can write what no encoder would: wrong wire types, overlong varints, bad lengths.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import DecodeError

from sdsync.wire import sds_message_pb2 as pb
from sdsync.wire.codec import (
    DEFAULT_LIMITS,
    HistoryEntry,
    Message,
    WireLimits,
    classify,
)

#: Field numbers of ``SdsMessage`` and of ``HistoryEntry``.
SDS_FIELDS = (1, 2, 3, 10, 11, 12, 13, 20)
ENTRY_FIELDS = (1, 2, 3)
#: Byte strings that are not UTF-8 (overlong, surrogate, out of range, truncated).
INVALID_UTF8 = (b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"a\xe2\x82")


def varint(value: int) -> bytes:
    """Base-128 varint of a non-negative integer (any size, unlike protobuf's 64 bits)."""
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def key(field_number: int, wire_type: int) -> bytes:
    """A protobuf field key."""
    return varint((field_number << 3) | wire_type)


def reference_decode(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> Message | None:
    """What ``decode`` must return, via the plain schema; None where it must reject."""
    if len(data) > limits.max_message_bytes:
        return None
    try:
        parsed = _parse_plain(data)
    except DecodeError:
        return None
    lamport = parsed.lamport_timestamp if parsed.HasField("lamport_timestamp") else None
    content = parsed.content if parsed.HasField("content") else None
    bloom = parsed.bloom_filter if parsed.HasField("bloom_filter") else None
    causal_history = _entries(parsed.causal_history, limits)
    repair_request = _entries(parsed.repair_request, limits)
    if causal_history is None or repair_request is None:
        return None
    ok = (
        classify(lamport, content) is not None
        and (lamport is None or lamport <= limits.max_lamport_timestamp)
        and bool(parsed.message_id)
        and all(
            len(s) <= limits.max_id_length
            for s in (parsed.sender_id, parsed.message_id, parsed.channel_id)
        )
        and (bloom is None or len(bloom) <= limits.max_bloom_bytes)
        and len(causal_history) <= limits.max_causal_history
        and len(repair_request) <= limits.max_repair_requests
    )
    if not ok:
        return None
    return Message(
        sender_id=parsed.sender_id,
        message_id=parsed.message_id,
        channel_id=parsed.channel_id,
        lamport_timestamp=lamport,
        causal_history=causal_history,
        bloom_filter=bloom,
        content=content,
        repair_request=repair_request,
    )


def reference_encode(message: Message) -> bytes:
    """The plain schema's serialisation (what @waku/sds writes)."""
    out = pb.SdsMessage(
        sender_id=message.sender_id,
        message_id=message.message_id,
        channel_id=message.channel_id,
        causal_history=[_plain_entry(e) for e in message.causal_history],
        repair_request=[_plain_entry(e) for e in message.repair_request],
    )
    if message.lamport_timestamp is not None:
        out.lamport_timestamp = message.lamport_timestamp
    if message.bloom_filter is not None:
        out.bloom_filter = message.bloom_filter
    if message.content is not None:
        out.content = message.content
    return out.SerializeToString()


def _parse_plain(data: bytes) -> pb.SdsMessage:
    parsed = pb.SdsMessage()
    try:
        parsed.ParseFromString(data)
    except DecodeError:
        # Only the nesting-depth divergence may rescue it; this raises DecodeError otherwise.
        return _parse_entries_alone(data)
    return parsed


def _parse_entries_alone(data: bytes) -> pb.SdsMessage:
    view = pb.SdsMessageView()
    view.ParseFromString(data)
    out = pb.SdsMessage()
    for name in ("sender_id", "message_id", "channel_id"):
        setattr(out, name, getattr(view, name))
    if view.HasField("lamport_timestamp"):
        out.lamport_timestamp = view.lamport_timestamp
    if view.HasField("bloom_filter"):
        out.bloom_filter = view.bloom_filter
    if view.HasField("content"):
        out.content = view.content
    for raw in view.causal_history:
        out.causal_history.add().ParseFromString(raw)
    for raw in view.repair_request:
        out.repair_request.add().ParseFromString(raw)
    return out


def _entries(
    raw_entries: Iterable[pb.HistoryEntry], limits: WireLimits
) -> tuple[HistoryEntry, ...] | None:
    out = []
    for raw in raw_entries:
        entry = HistoryEntry(
            raw.message_id,
            raw.retrieval_hint if raw.HasField("retrieval_hint") else None,
            raw.sender_id if raw.HasField("sender_id") else None,
        )
        if not entry.message_id or len(entry.message_id) > limits.max_id_length:
            return None
        if entry.sender_id is not None and len(entry.sender_id) > limits.max_id_length:
            return None
        hint = entry.retrieval_hint
        if hint is not None and len(hint) > limits.max_retrieval_hint_bytes:
            return None
        out.append(entry)
    return tuple(out)


def _plain_entry(entry: HistoryEntry) -> pb.HistoryEntry:
    out = pb.HistoryEntry(message_id=entry.message_id)
    if entry.retrieval_hint is not None:
        out.retrieval_hint = entry.retrieval_hint
    if entry.sender_id is not None:
        out.sender_id = entry.sender_id
    return out
