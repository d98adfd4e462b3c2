"""Fuzzing the wire decoder and the receive path with hypothesis.

Untrusted bytes may only ever raise :class:`~sdsync.errors.RemoteProtocolError`, and when
they do the channel is exactly as it was. Valid but hostile messages (mis-sized or saturated
bloom filters, absurd timestamps, self-references, our own sender id, a foreign channel,
colliding or empty ids) must never raise at all, must not be taken as acknowledgements when
the evidence is worthless, and must leave the channel working.

Inputs come from four sources: arbitrary bytes; real encodings from a small network of
channels; those encodings mutated (bit flips, truncation, insertion, deletion, duplication);
and protobuf written field by field with wrong wire types, overlong varints, wrong or huge
lengths, nested groups and invalid UTF-8. Decoding is also checked differentially against
the plain ``SdsMessage`` schema parsed by the stock protobuf runtime.

This is the CI slice (2,000 examples per decoder target, fewer for the costlier channel
targets); ``bench/fuzz_decoders.py`` runs the same properties for as long as you like.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from sdsync.core.bloom import BloomParams
from sdsync.core.channel import MessageChannel
from sdsync.core.config import ChannelConfig, RepairConfig
from sdsync.core.events import (
    Event,
    MessageAcknowledged,
    MessageDelivered,
    MessageDropped,
    MessagePossiblyAcknowledged,
)
from sdsync.errors import RemoteProtocolError
from sdsync.testing.oracle import (
    ENTRY_FIELDS,
    INVALID_UTF8,
    SDS_FIELDS,
    key,
    reference_decode,
    reference_encode,
    varint,
)
from sdsync.wire import (
    DEFAULT_LIMITS,
    HistoryEntry,
    Message,
    MessageKind,
    classify,
    decode,
    encode,
)
from sdsync.wire import sds_message_pb2 as pb

FUZZ = settings(
    max_examples=2_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Targets that build a channel scene or draw several inputs per example.
HEAVY = settings(FUZZ, max_examples=500)
HEAVIER = settings(FUZZ, max_examples=250)

CHANNEL = "fuzz-channel"
ME = "me"
NOW = 1_700_000_000_000
# A small filter keeps generated correct-size blooms and mutations of real messages cheap;
# the default-size case is covered separately below.
SMALL_BLOOM = BloomParams(capacity=64, error_rate=0.001)
SMALL = ChannelConfig(
    causal_history_size=3,
    bloom=SMALL_BLOOM,
    repair=RepairConfig(t_min_ms=1_000, t_max_ms=5_000),
)
DEFAULT = ChannelConfig()


def decode_outcome(data: bytes) -> Message | None:
    """``decode``, with RemoteProtocolError as None; any other exception propagates."""
    try:
        return decode(data)
    except RemoteProtocolError:
        return None


# ----------------------------------------------------------------------------- messages

utf8_text = st.text(st.characters(codec="utf-8"), max_size=12)
short_ids = st.text("abcdef0123456789", min_size=1, max_size=8)
ids = short_ids | st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
maybe_bytes = st.none() | st.binary(max_size=24)

history_entries = st.builds(
    HistoryEntry, message_id=ids, retrieval_hint=maybe_bytes, sender_id=st.none() | utf8_text
)


@st.composite
def valid_messages(draw: st.DrawFn, max_history: int = 4) -> Message:
    """Any message ``decode`` must accept."""
    kind = draw(st.sampled_from(MessageKind))
    lamport = (
        None
        if kind is MessageKind.EPHEMERAL
        else draw(st.integers(0, 2**32) | st.integers(0, DEFAULT_LIMITS.max_lamport_timestamp))
    )
    if kind is MessageKind.SYNC:
        content = draw(st.none() | st.just(b""))
    else:
        content = draw(st.binary(min_size=1, max_size=32))
    return Message(
        sender_id=draw(utf8_text),
        message_id=draw(ids),
        channel_id=draw(utf8_text),
        lamport_timestamp=lamport,
        causal_history=tuple(draw(st.lists(history_entries, max_size=max_history))),
        bloom_filter=draw(maybe_bytes),
        content=content,
        repair_request=tuple(draw(st.lists(history_entries, max_size=3))),
    )


def _real_corpus() -> list[bytes]:
    """Encodings produced by real channels: content, sync, repair requests, history."""
    a = MessageChannel(CHANNEL, "alice", now_ms=NOW, config=SMALL)
    b = MessageChannel(CHANNEL, "bob", now_ms=NOW, config=SMALL)
    c = MessageChannel(CHANNEL, "carol", now_ms=NOW, config=SMALL)
    out: list[bytes] = []
    first = a.send(b"first", NOW + 1)
    b.receive(first.data, NOW + 2)
    second = b.send(b"second", NOW + 3)
    c.receive(second.data, NOW + 4)  # carol misses "first": it is asked for by SDS-R
    sync = c.send_sync(NOW + 10_000)
    assert sync is not None and sync.message.repair_request
    out += [first.data, second.data, sync.data]
    b.receive(sync.data, NOW + 10_001)
    third = b.send(b"third " * 8, NOW + 10_002)
    out.append(third.data)
    out.append(a.send_ephemeral(b"ephemeral").data)
    default = MessageChannel(CHANNEL, "dave", now_ms=NOW)
    out.append(default.send(b"default-size bloom", NOW + 1).data)
    return out


def _random_message(rng: random.Random) -> Message:
    """A valid message from a seeded generator (cheap corpus for mutation)."""

    def text() -> str:
        return "".join(rng.choice("abcdef0123456789-é\u4e2d") for _ in range(rng.randrange(12)))

    def entry() -> HistoryEntry:
        hint = rng.randbytes(rng.randrange(40)) if rng.random() < 0.5 else None
        return HistoryEntry(text() or "x", hint, text() if rng.random() < 0.5 else None)

    kind = rng.choice(list(MessageKind))
    lamport = None if kind is MessageKind.EPHEMERAL else rng.choice([0, NOW, 2**63 - 1])
    content = (
        rng.choice([None, b""])
        if kind is MessageKind.SYNC
        else rng.randbytes(1 + rng.randrange(40))
    )
    return Message(
        sender_id=text(),
        message_id=text() or "m",
        channel_id=rng.choice([CHANNEL, text()]),
        lamport_timestamp=lamport,
        causal_history=tuple(entry() for _ in range(rng.randrange(6))),
        bloom_filter=rng.choice([None, b"", rng.randbytes(rng.randrange(1, 200))]),
        content=content,
        repair_request=tuple(entry() for _ in range(rng.choice([0, 0, 1, 3]))),
    )


_rng = random.Random(0)
CORPUS = _real_corpus() + [encode(_random_message(_rng)) for _ in range(200)]
valid_encodings = st.sampled_from(CORPUS)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid encoding with 1-4 byte-level mutations."""
    data = bytearray(draw(valid_encodings))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "dup"]))
        if not data:
            data += draw(st.binary(min_size=1, max_size=8))
            continue
        # Mutations bunch near the header half the time: the bloom filter is most of a
        # real message, and flipping its bits only ever yields another valid message.
        limit = len(data) if draw(st.booleans()) else min(len(data), 48)
        at = draw(st.integers(0, limit - 1))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[at] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]) | st.integers(0, 255))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=12))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        else:
            end = min(len(data), at + draw(st.integers(1, 16)))
            data[at:at] = data[at:end]
    return bytes(data)


# Strategies are built once: constructing them per draw dominates generation time.
_ANY_FIELD_NUMBER = st.integers(0, (1 << 29) - 1)
_WIRE_TYPES = st.sampled_from([0, 2, 2, 2, 0, 1, 5, 3, 4, 6, 7])
_VARINT_VALUES = st.integers(0, 2**64 - 1) | st.integers(2**64, 2**80) | st.sampled_from([0, 2**63])
_OVERLONG = st.integers(0, 9)
_FIXED64 = st.binary(min_size=8, max_size=8)
_FIXED32 = st.binary(min_size=4, max_size=4)
_PAYLOADS = (
    st.binary(max_size=40)
    | utf8_text.map(str.encode)
    | st.sampled_from(INVALID_UTF8)
    | st.builds(bytes.__mul__, st.binary(min_size=1, max_size=2), st.integers(64, 300))
)
_HUGE_LENGTHS = st.sampled_from([2**31, 2**32 + 1, 2**63, 2**64 - 1])
_GROUP_ENDS = st.sampled_from(["match", "other", "none"])
_TAIL = st.binary(max_size=4)


@st.composite
def _raw_field(draw: st.DrawFn, fields: tuple[int, ...], depth: int) -> bytes:
    """One protobuf field, frequently malformed."""
    number = draw(_FIELD_NUMBERS[fields])
    wire_type = draw(_WIRE_TYPES)
    head = key(number, wire_type)
    if wire_type == 0:
        body = varint(draw(_VARINT_VALUES))
        if draw(_OVERLONG) == 0:  # overlong: redundant continuation bytes
            body = body[:-1] + bytes([body[-1] | 0x80]) + b"\x80" * draw(_OVERLONG) + b"\0"
        return head + body
    if wire_type == 1:
        return head + draw(_FIXED64)
    if wire_type == 5:
        return head + draw(_FIXED32)
    if wire_type == 2:
        if depth < 2 and number in (11, 13):
            payload = draw(raw_message(ENTRY_FIELDS, depth + 1))
        else:
            payload = draw(_PAYLOADS)
        length = draw(st.sampled_from([len(payload)] * 6 + [len(payload) + 1, 0]) | _HUGE_LENGTHS)
        if length == len(payload) + 1 and payload:
            length = len(payload) - 1
        return head + varint(length) + payload
    if wire_type == 3:  # start group: nested fields, then (maybe) the matching end
        inner = draw(raw_message(fields, depth + 1)) if depth < 3 else b""
        end = draw(_GROUP_ENDS)
        if end == "match":
            return head + inner + key(number, 4)
        if end == "other":
            return head + inner + key(number + 1, 4)
        return head + inner
    return head + draw(_TAIL)  # stray end group, or wire types 6 and 7


_FIELD_NUMBERS = {
    fields: st.sampled_from(fields) | _ANY_FIELD_NUMBER for fields in (SDS_FIELDS, ENTRY_FIELDS)
}
_RAW_MESSAGES: dict[tuple[tuple[int, ...], int], st.SearchStrategy[bytes]] = {}


@st.composite
def _truncated(draw: st.DrawFn, inner: st.SearchStrategy[bytes]) -> bytes:
    data = draw(inner)
    if data and draw(_OVERLONG) == 0:
        data = data[: draw(st.integers(0, len(data) - 1))]
    return data


def raw_message(fields: tuple[int, ...] = SDS_FIELDS, depth: int = 0) -> st.SearchStrategy[bytes]:
    """Protobuf written field by field (top level: sometimes truncated)."""
    cached = _RAW_MESSAGES.get((fields, depth))
    if cached is None:
        parts = st.lists(_raw_field(fields, depth), max_size=6 if depth == 0 else 2)
        cached = parts.map(b"".join)
        if depth == 0:
            cached = _truncated(cached)
        _RAW_MESSAGES[fields, depth] = cached
    return cached


_DEPTHS = st.integers(1, 150) | st.sampled_from([63, 64, 65, 99, 100, 101])
_GROUP_NUMBERS = st.sampled_from([1, 4, 11, 99])


@st.composite
def deep_groups(draw: st.DrawFn) -> bytes:
    """Nested unknown groups near the parser's depth limits: around a valid message, or
    inside one of its history entries."""
    depth = draw(_DEPTHS)
    number = draw(_GROUP_NUMBERS)
    groups = key(number, 3) * depth + key(number, 4) * depth
    valid = draw(valid_encodings)
    where = draw(_GROUP_PLACES)
    if where == "entry":
        entry = key(1, 2) + varint(1) + b"h" + groups
        return valid + key(11, 2) + varint(len(entry)) + entry
    return groups + valid if where == "before" else valid + groups


_GROUP_PLACES = st.sampled_from(["before", "after", "entry"])


hostile_bytes = (
    st.binary(max_size=512)
    | mutated()
    | raw_message()
    | deep_groups()
    | valid_encodings
    | valid_messages().map(encode)
)


# ------------------------------------------------------------------- (a) the decoder


def check_decode(data: bytes) -> None:
    """Only RemoteProtocolError, and the same verdict as the plain schema."""
    got = decode_outcome(data)
    assert got == reference_decode(data)
    if got is not None:
        # Whatever we accept we can write back, and it reads back the same.
        assert decode(encode(got)) == got
        assert decode(bytearray(data)) == got
        assert decode(memoryview(data)) == got


@FUZZ
@given(data=st.binary(max_size=1024))
def test_decode_arbitrary_bytes(data: bytes) -> None:
    check_decode(data)


@FUZZ
@given(data=mutated())
def test_decode_mutated_encodings(data: bytes) -> None:
    check_decode(data)


@FUZZ
@given(data=raw_message())
@example(b"\x5a\xff\xff\xff\xff\x0f")  # bloom filter claiming 4 GiB
@example(key(11, 2) + varint(2) + key(1, 2) + b"\x00")  # entry id of declared length 0
@example(key(1, 2) + varint(1) + b"\xff" + key(10, 0) + varint(1))  # invalid UTF-8 id
def test_decode_field_level_protobuf(data: bytes) -> None:
    check_decode(data)


@FUZZ
@given(data=deep_groups())
def test_decode_nested_groups(data: bytes) -> None:
    check_decode(data)


@pytest.mark.parametrize("depth", [98, 99, 100, 101])
def test_decode_nesting_depth_inside_history_entries(depth: int) -> None:
    """Pins the one known divergence from the plain schema: sdsync parses history entries
    on their own, so one more level of unknown groups fits inside an entry. Harmless (no
    encoder writes groups) and still bounded; RemoteProtocolError beyond it."""
    groups = key(5, 3) * depth + key(5, 4) * depth
    entry = key(1, 2) + varint(1) + b"h" + groups
    data = encode(Message("s", "m", CHANNEL, 1)) + key(11, 2) + varint(len(entry)) + entry
    plain = pb.SdsMessage()
    try:
        plain.ParseFromString(data)
        plain_ok = True
    except DecodeError:
        plain_ok = False
    ours = decode_outcome(data)
    assert plain_ok == (depth <= 99)
    assert (ours is not None) == (depth <= 100)
    if ours is not None:
        assert ours.causal_history == (HistoryEntry("h"),)


def test_decode_oversized_frames() -> None:
    limits = DEFAULT_LIMITS
    big = encode(Message("s", "m", "c", 1, content=b"x" * limits.max_message_bytes))
    with pytest.raises(RemoteProtocolError):
        decode(big)
    for data in (
        encode(Message("s", "m", "c", 1, content=b"x", bloom_filter=b"\0" * (1 << 19 | 1))),
        encode(Message("s" * 257, "m", "c", 1, content=b"x")),
        encode(Message("s", "m", "c", 1 << 63, content=b"x")),
        encode(Message("s", "m", "c", 1, causal_history=(HistoryEntry("h" * 257),))),
        encode(Message("s", "m", "c", 1, causal_history=(HistoryEntry("h"),) * 4097)),
        encode(Message("s", "m", "c", 1, repair_request=(HistoryEntry("h"),) * 65)),
        encode(Message("s", "m", "c", 1, causal_history=(HistoryEntry("h", b"x" * 257),))),
    ):
        assert reference_decode(data) is None
        with pytest.raises(RemoteProtocolError):
            decode(data)


# ----------------------------------------------------------------- (d) round trip


@settings(FUZZ, max_examples=1_000)
@given(message=valid_messages())
def test_round_trip(message: Message) -> None:
    data = encode(message)
    assert data == reference_encode(message)  # byte-identical to the plain schema
    assert decode(data) == message
    assert encode(decode(data)) == data


@HEAVIER
@given(message=valid_messages(max_history=0), history=st.lists(history_entries, max_size=4))
def test_round_trip_with_recurring_entries(message: Message, history: list[HistoryEntry]) -> None:
    """Entries recur across messages (the codec caches them); each decode stays exact."""
    first = Message(
        message.sender_id,
        message.message_id,
        message.channel_id,
        message.lamport_timestamp,
        tuple(history),
        message.bloom_filter,
        message.content,
    )
    second = Message(
        message.sender_id,
        message.message_id + "x",
        message.channel_id,
        message.lamport_timestamp,
        tuple(reversed(history)),
        message.bloom_filter,
        message.content,
        repair_request=tuple(history[:3]),
    )
    for m in (first, second, first):
        assert decode(encode(m)) == m
        assert encode(m) == reference_encode(m)


# ----------------------------------------------------------------- channels under test


@dataclass
class Scene:
    """A channel with something in every buffer, and the ids a hostile peer might use."""

    chan: MessageChannel
    own_ids: list[str]  # our messages, in the log and unacknowledged
    peer_ids: list[str]  # delivered from peers
    waiting_id: str  # buffered in the incoming buffer
    missing_id: str  # what it waits for

    @property
    def known_ids(self) -> list[str]:
        return [*self.own_ids, *self.peer_ids, self.waiting_id, self.missing_id]


def make_scene(config: ChannelConfig = SMALL) -> Scene:
    chan = MessageChannel(CHANNEL, ME, now_ms=NOW, config=config)
    alice = MessageChannel(CHANNEL, "alice", now_ms=NOW, config=config)
    bob = MessageChannel(CHANNEL, "bob", now_ms=NOW, config=config)
    a1 = alice.send(b"alice one", NOW + 1)
    chan.receive(a1.data, NOW + 2)
    own = [chan.send(b"mine one", NOW + 3), chan.send(b"mine two", NOW + 4)]
    b1 = bob.send(b"bob one", NOW + 5)  # never reaches us
    bob.receive(a1.data, NOW + 6)
    b2 = bob.send(b"bob two", NOW + 7)  # depends on b1: waits in our incoming buffer
    chan.receive(b2.data, NOW + 8)
    assert chan.incoming_ids() == [b2.message_id]
    assert chan.outgoing_ids() == [o.message_id for o in own]
    return Scene(chan, [o.message_id for o in own], [a1.message_id], b2.message_id, b1.message_id)


def snapshot(chan: MessageChannel) -> tuple[Any, ...]:
    outgoing = {
        mid: (entry.attempts, frozenset(entry.possible_ackers))
        for mid in chan.outgoing_ids()
        if (entry := chan.outgoing_entry(mid)) is not None
    }
    return (
        chan.lamport_timestamp,
        chan.log_ids(),
        chan.incoming_ids(),
        chan.outgoing_ids(),
        chan.bloom_bytes(),
        chan.missing_ids(),
        chan.next_repair_request_due(),
        chan.next_repair_response_due(),
        outgoing,
    )


def check_log(chan: MessageChannel) -> None:
    keys = [(e.lamport_timestamp, e.message_id) for e in chan.log]
    assert all(a < b for a, b in itertools.pairwise(keys))
    assert len({mid for _, mid in keys}) == len(keys)
    assert set(chan.log_ids()).isdisjoint(chan.incoming_ids())


def still_works(scene: Scene, now_ms: int) -> None:
    """A peer we never heard from is delivered, and we can still send."""
    chan = scene.chan
    honest = MessageChannel(CHANNEL, "honest peer", now_ms=now_ms, config=chan.config)
    out = honest.send(b"honest", now_ms, message_id="honest!message")
    events = chan.receive(out.data, now_ms + 1)
    assert any(
        isinstance(e, MessageDelivered) and e.message_id == "honest!message" for e in events
    ), events
    assert "honest!message" in chan.log_ids()
    ours = chan.send(b"still sending", now_ms + 2, message_id="ours!after")
    assert ours.message.lamport_timestamp is not None
    check_log(chan)


# ------------------------------------------------------------ (b) receive, untrusted


def check_receive(scene: Scene, data: bytes) -> list[Event] | None:
    before = snapshot(scene.chan)
    try:
        events = scene.chan.receive(data, NOW + 100)
    except RemoteProtocolError:
        assert snapshot(scene.chan) == before, "a rejected message changed the channel"
        assert decode_outcome(data) is None
        return None
    assert decode_outcome(data) is not None
    check_log(scene.chan)
    return events


@FUZZ
@given(data=hostile_bytes)
def test_receive_untrusted_bytes(data: bytes) -> None:
    scene = make_scene()
    check_receive(scene, data)
    scene.chan.sweep_incoming(NOW + 200)
    scene.chan.sweep_repair(NOW + 200_000)
    scene.chan.sweep_outgoing()
    check_log(scene.chan)


@HEAVIER
@given(batch=st.lists(hostile_bytes, min_size=2, max_size=4))
def test_receive_untrusted_sequences(batch: list[bytes]) -> None:
    scene = make_scene()
    for data in batch:
        check_receive(scene, data)
    assert scene.chan.lamport_timestamp >= NOW


# ------------------------------------------------------------ (c) valid but hostile

HOSTILITIES = [
    "wrong-size bloom",
    "saturated bloom",
    "huge lamport",
    "self reference",
    "own sender",
    "wrong channel",
    "duplicate id",
    "duplicate history",
    "empty ids",
    "repair requests",
    "history cycle",
    "anything",
]


@dataclass
class Hostile:
    kind: str
    message: Message
    bloom_is_worthless: bool


@st.composite
def hostile_messages(draw: st.DrawFn, scene: Scene, config: ChannelConfig = SMALL) -> Hostile:
    n_bytes = config.bloom.n_bytes
    known = scene.known_ids
    kind = draw(st.sampled_from(HOSTILITIES))
    any_id = st.sampled_from(known) | short_ids
    message_id = draw(short_ids)
    sender = draw(st.sampled_from(["mallory", "alice", "bob", ""]))
    channel = CHANNEL
    lamport: int | None = draw(st.integers(0, NOW + 10**6))
    content: bytes | None = draw(st.binary(min_size=1, max_size=16))
    if draw(st.integers(0, 4)) == 0:
        content = draw(st.none() | st.just(b""))  # a sync message
    # Random history never names our own messages by default: those are genuine acks.
    others = [mid for mid in known if mid not in scene.own_ids]
    history_ids = draw(st.lists(st.sampled_from(others) | short_ids, max_size=4))
    if draw(st.booleans()):
        history_ids += draw(st.lists(st.sampled_from(scene.own_ids), max_size=2))
    bloom: bytes | None = draw(
        st.none() | st.binary(min_size=n_bytes, max_size=n_bytes).filter(_sparse(config))
    )
    repairs: list[HistoryEntry] = []
    worthless = False
    if kind == "wrong-size bloom":
        size = draw(st.integers(0, 2 * n_bytes).filter(lambda s: s != n_bytes))
        bloom = draw(st.sampled_from([b"\xff" * size, b"\0" * size, bytes(range(256)) * 2]))
        bloom = bloom[:size] if len(bloom) >= size else bloom + b"\xff" * (size - len(bloom))
        worthless = True
    elif kind == "saturated bloom":
        fill = draw(st.sampled_from([b"\xff", b"\xfe", b"\x7f\xff", b"\xff\xff\xef"]))
        bloom = (fill * n_bytes)[:n_bytes]
        worthless = True
    elif kind == "huge lamport":
        lamport = draw(
            st.integers(
                DEFAULT_LIMITS.max_lamport_timestamp - 1000, DEFAULT_LIMITS.max_lamport_timestamp
            )
            | st.integers(2**40, 2**62)
        )
    elif kind == "self reference":
        history_ids.append(message_id)
    elif kind == "own sender":
        sender = ME
    elif kind == "wrong channel":
        channel = draw(st.sampled_from(["", "other", CHANNEL + " ", CHANNEL.upper()]))
    elif kind == "duplicate id":
        message_id = draw(st.sampled_from(known))
    elif kind == "duplicate history":
        history_ids = history_ids * 2 + [draw(any_id)] * 3
    elif kind == "empty ids":
        sender = ""
        channel = draw(st.sampled_from(["", CHANNEL]))
    elif kind == "repair requests":
        repairs = [
            HistoryEntry(mid, None, draw(st.sampled_from([None, "", ME, "alice", "bob"])))
            for mid in draw(st.lists(any_id, min_size=1, max_size=5))
        ]
    elif kind == "history cycle":
        # Claims to depend on the message that is waiting for us, and vice versa.
        message_id = scene.missing_id
        history_ids = [scene.waiting_id]
    if draw(st.booleans()) and content:
        lamport = None if draw(st.integers(0, 5)) == 0 else lamport  # ephemeral now and then
    history = tuple(
        HistoryEntry(mid, draw(maybe_bytes), draw(st.none() | st.sampled_from(["", "alice"])))
        for mid in history_ids
    )
    message = Message(
        sender_id=sender,
        message_id=message_id,
        channel_id=channel,
        lamport_timestamp=lamport,
        causal_history=history,
        bloom_filter=bloom,
        content=content,
        repair_request=tuple(repairs),
    )
    assume(classify(lamport, content) is not None)
    return Hostile(kind, message, worthless)


def _sparse(config: ChannelConfig) -> Callable[[bytes], bool]:
    limit = config.max_bloom_false_positive_rate
    return lambda bloom: config.bloom.false_positive_rate(bloom) <= limit


SCENE_TEMPLATE = make_scene()


def check_hostile(scene: Scene, hostile: Hostile) -> None:
    message = hostile.message
    chan = scene.chan
    data = encode(message)
    assert decode(data) == message  # valid wire data
    before = snapshot(chan)
    events = chan.receive(data, NOW + 1_000)  # must not raise
    check_log(chan)
    names_ours = any(e.message_id in scene.own_ids for e in message.causal_history)
    if hostile.bloom_is_worthless and not names_ours:
        assert chan.outgoing_ids() == before[3], f"acknowledged from a {hostile.kind}"
        assert not any(
            isinstance(e, MessageAcknowledged | MessagePossiblyAcknowledged) for e in events
        )
    if message.sender_id == ME or message.channel_id != CHANNEL:
        assert snapshot(chan) == before
        assert [type(e) for e in events] == [MessageDropped]
    duplicate = message.kind is MessageKind.CONTENT and message.message_id in scene.known_ids
    if duplicate and message.message_id != scene.missing_id:
        assert snapshot(chan) == before, "a duplicate changed the channel"
    chan.sweep_incoming(NOW + 2_000)
    for raw in chan.sweep_repair(NOW + 10**7).data:
        assert decode(raw).message_id in chan.log_ids()
    still_works(scene, NOW + 3_000)


@HEAVY
@given(st.data())
def test_hostile_valid_messages(data: st.DataObject) -> None:
    hostile = data.draw(hostile_messages(SCENE_TEMPLATE))
    check_hostile(make_scene(), hostile)


@HEAVIER
@given(st.data())
def test_hostile_message_sequences(data: st.DataObject) -> None:
    scene = make_scene()
    for _ in range(data.draw(st.integers(2, 5))):
        hostile = data.draw(hostile_messages(SCENE_TEMPLATE))
        names_ours = any(e.message_id in scene.own_ids for e in hostile.message.causal_history)
        before = scene.chan.outgoing_ids()
        events = scene.chan.receive(encode(hostile.message), NOW + 1_000)
        check_log(scene.chan)
        if hostile.bloom_is_worthless and not names_ours:
            assert scene.chan.outgoing_ids() == before
            assert not any(isinstance(e, MessageAcknowledged) for e in events)
    still_works(scene, NOW + 3_000)


@pytest.mark.parametrize("kind", ["wrong-size bloom", "saturated bloom"])
@pytest.mark.parametrize("sender", ["alice", "bob", "carol", "dave"])
def test_worthless_default_size_filters_never_acknowledge(kind: str, sender: str) -> None:
    """At the default geometry too, from any number of distinct peers."""
    scene = make_scene(DEFAULT)
    chan = scene.chan
    n_bytes = DEFAULT.bloom.n_bytes
    bloom = b"\xff" * (n_bytes - 8) if kind == "wrong-size bloom" else b"\xff" * n_bytes
    for i, peer in enumerate(["alice", "bob", "carol", "dave", sender]):
        message = Message(peer, f"sync-{i}", CHANNEL, NOW + 10 + i, bloom_filter=bloom)
        events = chan.receive(encode(message), NOW + 20)
        assert not any(
            isinstance(e, MessageAcknowledged | MessagePossiblyAcknowledged) for e in events
        )
    assert chan.outgoing_ids() == scene.own_ids
    assert chan.stats.bloom_ignored
    still_works(scene, NOW + 3_000)


def test_hostile_max_lamport_does_not_mute_us() -> None:
    """A peer's maximal Lamport timestamp must not make our own messages undecodable.

    Regression: ``decode`` accepts a timestamp equal to ``WireLimits.max_lamport_timestamp``
    (2**63 - 1); delivering it set our clock there, so our next message carried 2**63, which
    every peer with the same limits rejects with RemoteProtocolError -- forever, since our
    clock never goes back: one hostile message silenced every honest participant that
    delivered it. Whether the fix drops such a message, clamps it or widens the limit, what
    we send afterwards must stay decodable.
    """
    scene = make_scene()
    limit = DEFAULT_LIMITS.max_lamport_timestamp
    evil = Message("mallory", "evil", CHANNEL, limit, content=b"boom")
    scene.chan.receive(encode(evil), NOW + 1)
    peer = MessageChannel(CHANNEL, "alice", now_ms=NOW, config=SMALL)
    for i in range(3):
        ours = scene.chan.send(b"after the poison %d" % i, NOW + 2 + i)
        decode(ours.data)  # RemoteProtocolError: our message exceeds the peers' limit
        events = peer.receive(ours.data, NOW + 10)  # received (buffered: alice lacks deps)
        assert not any(isinstance(e, MessageDropped) for e in events)
