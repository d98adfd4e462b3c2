"""Waku Sync's wire format: nwaku's bytes, by hand; round trips; hostile payloads.

The vectors are derived from nwaku's ``waku/waku_store_sync/codec.nim`` (``deltaEncode``,
``deltaDecode``): LEB128 topic counts and strings, the first lower timestamp, then per
range the upper timestamp's difference to the previous upper one, a hash prefix only when
that difference is 0 (up to and including the first byte that differs from the *first*
lower bound's hash), the type byte and its body; an item set's element times are deltas
from 0, then its reconciled byte. (This file is not named ``test_codec.py``: the test
folders have no ``__init__.py``, and tests/wire holds a module of that name.)
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError
from sdsync.waku.sync import (
    ItemSet,
    Range,
    RangesData,
    RangeType,
    SyncId,
    WakuMessageAndTopic,
    decode_ranges,
    encode_ranges,
)
from sdsync.waku.sync import waku_sync_pb2 as pb
from sdsync.wire.waku import WakuMessage

Z = bytes(32)
H1, H2, H3, H4 = (bytes([n]) * 32 for n in (1, 2, 3, 4))
TOPIC = "/waku/2/rs/1/0"
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def skip(lower: SyncId, upper: SyncId) -> Range:
    return Range(lower, upper, RangeType.SKIP)


def malformed(data: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match) as caught:
        decode_ranges(data)
    assert caught.value.reason is RejectReason.MALFORMED_RPC


# -- hand-computed vectors


def test_the_empty_payload_is_one_zero_byte_and_any_single_byte_reads_as_empty() -> None:
    assert encode_ranges(RangesData()) == b"\x00"
    # Topics alone do not make a payload: nwaku writes @[0] whenever there is no range.
    assert encode_ranges(RangesData((), (TOPIC,), ("/a/1/b/proto",))) == b"\x00"
    for data in (b"", b"\x00", b"\x07", b"\xff"):
        assert decode_ranges(data) == RangesData()
    assert RangesData().all_skip


def test_topics_then_first_timestamp_then_a_skip() -> None:
    data = RangesData(
        (skip(SyncId(5, Z), SyncId(300, Z)),),
        (TOPIC,),
        ("/a/1/b/proto", "/c/1/d/proto"),
    )
    wire = (
        b"\x01"  # one pubsub topic
        + b"\x0e/waku/2/rs/1/0"  # its length (14), its bytes
        + b"\x02"  # two content topics
        + b"\x0c/a/1/b/proto"
        + b"\x0c/c/1/d/proto"
        + b"\x05"  # first (lower) timestamp: 5
        + b"\xa7\x02"  # 300 - 5 = 295 = 0b10_0100111: 0x27|0x80, 0x02
        + b"\x00"  # skip
    )
    assert encode_ranges(data) == wire
    assert decode_ranges(wire) == data
    assert decode_ranges(wire).all_skip


def test_multi_byte_timestamps() -> None:
    first = 2**35 + 1  # LEB128: bit 0 and bit 35 (group 5): 0x81 0x80 0x80 0x80 0x80 0x01
    data = RangesData((skip(SyncId(first, Z), SyncId(first + 128, Z)),))
    wire = b"\x00\x00" + b"\x81\x80\x80\x80\x80\x01" + b"\x80\x01" + b"\x00"
    assert encode_ranges(data) == wire
    assert decode_ranges(wire) == data
    # The largest timestamp: ten bytes, the last one 0x01.
    top = 2**64 - 1
    wire = b"\x00\x00" + b"\xff" * 9 + b"\x01" + b"\x00\x00" + b"\x00"
    assert decode_ranges(wire).ranges == (skip(SyncId(top, Z), SyncId(top, Z)),)
    assert encode_ranges(RangesData((skip(SyncId(top, Z), SyncId(top, Z)),))) == (
        b"\x00\x00" + b"\xff" * 9 + b"\x01" + b"\x00" + b"\x20" + Z + b"\x00"
    )  # an equal upper hash travels whole: no byte differs, so all 32 are the prefix


def test_a_fingerprint_range() -> None:
    fingerprint = bytes(range(32))
    data = RangesData(
        (Range(SyncId(300, Z), SyncId(1000, Z), RangeType.FINGERPRINT, fingerprint=fingerprint),)
    )
    wire = b"\x00\x00" + b"\xac\x02" + b"\xbc\x05" + b"\x01" + fingerprint  # 300; 700; type 1
    assert encode_ranges(data) == wire
    assert decode_ranges(wire) == data
    assert not data.all_skip


def test_item_sets_delta_encode_their_times_from_zero_and_end_with_the_reconciled_byte() -> None:
    first = ItemSet((SyncId(3, H1), SyncId(3, H2), SyncId(7, H3)), reconciled=True)
    second = ItemSet((SyncId(15, H4),), reconciled=False)
    data = RangesData(
        (
            Range(SyncId(0, Z), SyncId(10, Z), RangeType.ITEM_SET, items=first),
            Range(SyncId(10, Z), SyncId(20, Z), RangeType.ITEM_SET, items=second),
        )
    )
    wire = (
        b"\x00\x00\x00"  # no topics, first timestamp 0
        + b"\x0a\x02\x03"  # upper 10, item set, 3 elements
        + b"\x03"
        + H1  # 3 - 0
        + b"\x00"
        + H2  # 3 - 3: an equal time
        + b"\x04"
        + H3  # 7 - 3
        + b"\x01"  # reconciled
        + b"\x0a\x02\x01"  # upper 20, item set, 1 element
        + b"\x0f"
        + H4  # 15 - 0: each set's deltas start from 0 again, not from its bound
        + b"\x00"  # not reconciled
    )
    assert encode_ranges(data) == wire
    assert decode_ranges(wire) == data


def test_an_equal_timestamp_carries_a_hash_prefix_up_to_the_first_differing_byte() -> None:
    upper1 = b"\x00\x00\xab" + b"\xcd" * 29
    upper2 = b"\x00\x07" + b"\x11" * 30
    fingerprint = b"\xee" * 32
    data = RangesData(
        (
            skip(SyncId(50, Z), SyncId(50, upper1)),
            Range(SyncId(50, upper1), SyncId(50, upper2), RangeType.FINGERPRINT, fingerprint),
            skip(SyncId(50, upper2), SyncId(60, b"\x99" * 32)),
        )
    )
    wire = (
        b"\x00\x00\x32"  # first timestamp 50
        + b"\x00\x03\x00\x00\xab"  # diff 0: 3 bytes, through the first non-zero one
        + b"\x00"
        + b"\x00\x02\x00\x07"  # diff 0 again: compared with the first lower hash, not upper1
        + b"\x01"
        + fingerprint
        + b"\x0a"  # diff 10: no hash travels
        + b"\x00"
    )
    assert encode_ranges(data) == wire
    decoded = decode_ranges(wire)
    # As nwaku decodes: the rest of a prefix is zeros, every lower bound has a zero hash.
    assert decoded.ranges == (
        skip(SyncId(50, Z), SyncId(50, b"\x00\x00\xab" + bytes(29))),
        Range(
            SyncId(50, Z), SyncId(50, b"\x00\x07" + bytes(30)), RangeType.FINGERPRINT, fingerprint
        ),
        skip(SyncId(50, Z), SyncId(60, Z)),
    )


def test_the_prefix_is_relative_to_the_first_lower_hash() -> None:
    lower = b"\x11\x22\x33" + bytes(29)
    upper = b"\x11\x22\x44" + b"\xff" * 29
    wire = encode_ranges(RangesData((skip(SyncId(9, lower), SyncId(9, upper)),)))
    assert wire == b"\x00\x00\x09\x00\x03\x11\x22\x44\x00"
    assert decode_ranges(wire).ranges == (
        skip(SyncId(9, Z), SyncId(9, b"\x11\x22\x44" + bytes(29))),
    )


def test_the_encoder_refuses_what_nwaku_could_not_decode() -> None:
    backwards = RangesData((skip(SyncId(5, Z), SyncId(9, Z)), skip(SyncId(9, Z), SyncId(8, Z))))
    with pytest.raises(LocalProtocolError, match="in order"):
        encode_ranges(backwards)
    unordered = ItemSet((SyncId(9, H1), SyncId(8, H2)), reconciled=False)
    with pytest.raises(LocalProtocolError, match="in order"):
        encode_ranges(
            RangesData((Range(SyncId(0, Z), SyncId(9, Z), RangeType.ITEM_SET, items=unordered),))
        )
    with pytest.raises(LocalProtocolError):
        SyncId(2**64, Z)
    with pytest.raises(LocalProtocolError):
        SyncId(1, b"short")
    with pytest.raises(LocalProtocolError):
        Range(SyncId(0, Z), SyncId(1, Z), RangeType.FINGERPRINT)
    with pytest.raises(LocalProtocolError):
        Range(SyncId(0, Z), SyncId(1, Z), RangeType.SKIP, items=ItemSet((), True))


# -- round trips

hashes = st.binary(min_size=32, max_size=32)
# Hashes that share leading bytes (zeros, or the same first bytes), so prefixes vary.
near_hashes = st.builds(
    lambda head, n, tail: (head * n + tail)[:32].ljust(32, b"\x00"),
    st.sampled_from([b"\x00", b"\x5a"]),
    st.integers(0, 32),
    hashes,
)
topics = st.lists(st.text(max_size=12), max_size=3).map(tuple)


@st.composite
def item_sets(draw: st.DrawFn) -> ItemSet:
    times = sorted(draw(st.lists(st.integers(0, 2**64 - 1), max_size=4)))
    if draw(st.booleans()):  # equal times too
        times = [t // 2**40 * 2**40 for t in times]
    return ItemSet(tuple(SyncId(t, draw(hashes)) for t in times), draw(st.booleans()))


@st.composite
def payloads(draw: st.DrawFn) -> RangesData:
    """Ordered ranges whose bounds are anything (decoding normalizes them)."""
    time = draw(st.integers(0, 2**64 - 1))
    lower = SyncId(time, draw(near_hashes))
    ranges = []
    for _ in range(draw(st.integers(1, 6))):
        diff = draw(st.sampled_from([0, 0, 1, 127, 128, 2**40]))
        time = min(time + diff, 2**64 - 1)
        upper = SyncId(time, draw(near_hashes))
        kind = draw(st.sampled_from(RangeType))
        if kind is RangeType.FINGERPRINT:
            ranges.append(Range(lower, upper, kind, fingerprint=draw(hashes)))
        elif kind is RangeType.ITEM_SET:
            ranges.append(Range(lower, upper, kind, items=draw(item_sets())))
        else:
            ranges.append(Range(lower, upper, kind))
        lower = upper
    return RangesData(tuple(ranges), draw(topics), draw(topics))


def as_decoded(data: RangesData) -> RangesData:
    """What nwaku's decoder makes of ``encode_ranges(data)``, computed independently."""
    reference = data.ranges[0].lower.hash
    previous = data.ranges[0].lower.time
    out = []
    for item in data.ranges:
        upper_hash = Z
        if item.upper.time == previous:
            same = next(
                (
                    i + 1
                    for i, (a, b) in enumerate(zip(reference, item.upper.hash, strict=True))
                    if a != b
                ),
                32,
            )
            upper_hash = item.upper.hash[:same] + bytes(32 - same)
        out.append(
            Range(
                SyncId(previous, Z),
                SyncId(item.upper.time, upper_hash),
                item.type,
                item.fingerprint,
                item.items,
            )
        )
        previous = item.upper.time
    return RangesData(tuple(out), data.pubsub_topics, data.content_topics)


@FUZZ
@given(data=payloads())
def test_round_trip_gives_the_bounds_as_decoded(data: RangesData) -> None:
    wire = encode_ranges(data)
    decoded = decode_ranges(wire)
    assert decoded == as_decoded(data)
    if data.ranges[0].lower.hash == Z:  # as our Reconciler's are: the bytes are a fixed point
        assert encode_ranges(decoded) == wire


@settings(FUZZ, max_examples=60)
@given(data=payloads())
def test_truncated_at_every_offset_fails_unless_cut_between_ranges(data: RangesData) -> None:
    wire = encode_ranges(data)
    full = decode_ranges(wire)
    header = sum(len(topic_bytes(t)) for t in topics_of(data)) + len(
        leb128(data.ranges[0].lower.time)
    )
    ends = {
        len(encode_ranges(RangesData(data.ranges[:k], *topics_of(data)))): k
        for k in range(1, len(data.ranges))
    }
    ends.setdefault(header, 0)  # the topics and the first timestamp, no range: empty
    for cut in range(len(wire)):
        if cut <= 1:
            assert decode_ranges(wire[:cut]) == RangesData()
        elif cut in ends:
            assert decode_ranges(wire[:cut]).ranges == full.ranges[: ends[cut]]
        else:
            with pytest.raises(RemoteProtocolError) as caught:
                decode_ranges(wire[:cut])
            assert caught.value.reason is RejectReason.MALFORMED_RPC


def leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def topic_bytes(names: tuple[str, ...]) -> bytes:
    return leb128(len(names)) + b"".join(leb128(len(n.encode())) + n.encode() for n in names)


def topics_of(data: RangesData) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return data.pubsub_topics, data.content_topics


def test_truncation_of_a_rich_payload_fails_at_every_offset_inside_a_range() -> None:
    rng = random.Random(7)
    items = ItemSet(tuple(SyncId(10 + i, rng.randbytes(32)) for i in range(3)), False)
    data = RangesData(
        (
            skip(SyncId(2**40, Z), SyncId(2**40, b"\x00\x01" + bytes(30))),
            Range(SyncId(0, Z), SyncId(2**41, Z), RangeType.FINGERPRINT, rng.randbytes(32)),
            Range(SyncId(0, Z), SyncId(2**42, Z), RangeType.ITEM_SET, items=items),
        ),
        (TOPIC, "/waku/2/rs/1/1"),
        ("/a/1/b/proto",),
    )
    wire = encode_ranges(data)
    ends = {len(encode_ranges(RangesData(data.ranges[:k], *topics_of(data)))) for k in (1, 2)}
    header = 1 + 15 + 15 + 1 + 13 + 6  # topics, then 2**40 as six LEB128 bytes
    failures = 0
    for cut in range(2, len(wire)):
        if cut in ends or cut == header:
            decode_ranges(wire[:cut])
            continue
        with pytest.raises(RemoteProtocolError):
            decode_ranges(wire[:cut])
        failures += 1
    assert failures == len(wire) - 2 - 3


# -- hostile payloads


def test_overlong_varints() -> None:
    malformed(b"\x80" * 10 + b"\x01", "longer than 10 bytes")  # a topic count of 11 bytes
    malformed(b"\x00\x00" + b"\xff" * 10 + b"\x01", "longer than 10 bytes")
    malformed(b"\x00\x00" + b"\xff" * 9 + b"\x02" + b"\x00\x00\x00", "above 2\\*\\*64")
    malformed(b"\x00\x00\x00" + b"\x80" * 3, "ends inside a varint")


def test_range_type_and_reconciled_byte_out_of_range() -> None:
    malformed(b"\x00\x00\x05\x01\x03", "range type 3")
    malformed(b"\x00\x00\x05\x01\xff", "range type 255")
    malformed(b"\x00\x00\x05\x01\x02\x00\x02", "reconciled byte 2")


def test_a_hash_prefix_longer_than_a_hash() -> None:
    malformed(b"\x00\x00\x05\x00\x21" + b"\x01" * 33 + b"\x00", "prefix of 33 bytes")
    # 32 is the longest, and fine.
    assert decode_ranges(b"\x00\x00\x05\x00\x20" + b"\x01" * 32 + b"\x00").ranges == (
        skip(SyncId(5, Z), SyncId(5, b"\x01" * 32)),
    )


def test_counts_past_the_end() -> None:
    malformed(b"\x05\x00", "count of 5")  # five topics in one byte
    malformed(b"\x01\x09abc", "count of 9")  # a 9-byte topic in three
    malformed(b"\x00\x01\x7f", "count of 127")
    element = b"\x01" + H1
    malformed(b"\x00\x00\x00\x05\x02\x02" + element + b"\x00", "count of 2")
    malformed(b"\x00\x00\x00\x05\x02" + b"\xff" * 9 + b"\x01" + element, "count of")
    malformed(b"\x00\x00\x00\x05\x01" + b"\x00" * 31, "32 bytes runs past")  # fingerprint


def test_timestamps_past_2_64() -> None:
    top = b"\xff" * 9 + b"\x01"  # 2**64 - 1
    malformed(b"\x00\x00" + top + b"\x01\x00", "timestamp past 2\\*\\*64")
    element = top + H1
    malformed(b"\x00\x00\x00\x05\x02\x02" + element + b"\x01" + H2 + b"\x00", "past 2\\*\\*64")
    # At the limit itself, both decode.
    assert decode_ranges(b"\x00\x00" + top + b"\x00\x00\x00").ranges[0].upper.time == 2**64 - 1
    decoded = decode_ranges(b"\x00\x00\x00\x05\x02\x01" + element + b"\x00")
    assert decoded.ranges[0].items == ItemSet((SyncId(2**64 - 1, H1),), False)


def test_topics_that_are_not_utf8() -> None:
    malformed(b"\x01\x02\xff\xfe\x00\x00\x05\x00", "not UTF-8")
    malformed(b"\x00\x01\x01\x80\x00\x05\x00", "not UTF-8")


def test_trailing_bytes() -> None:
    wire = encode_ranges(RangesData((skip(SyncId(5, Z), SyncId(9, Z)),), (TOPIC,)))
    malformed(wire + b"\x01", "runs past the end")
    malformed(wire + b"\x01\x07", "range type 7")
    malformed(wire + b"\x00", "runs past the end")  # diff 0 wants a prefix length


def decode_or_refuse(data: bytes) -> RangesData | None:
    try:
        return decode_ranges(data)
    except RemoteProtocolError as exc:
        assert exc.reason is RejectReason.MALFORMED_RPC
        return None


def check_decoded(decoded: RangesData | None) -> None:
    """A payload that decodes is well formed: in order, and encodable again to itself."""
    if decoded is None or not decoded.ranges:
        return
    for before, after in zip(decoded.ranges, decoded.ranges[1:], strict=False):
        assert after.lower == SyncId(before.upper.time, Z)
    again = decode_ranges(encode_ranges(decoded))
    assert [(r.upper.time, r.type, r.fingerprint, r.items) for r in again.ranges] == [
        (r.upper.time, r.type, r.fingerprint, r.items) for r in decoded.ranges
    ]
    assert topics_of(again) == topics_of(decoded)


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes_decode_or_raise_remote_protocol_error(data: bytes) -> None:
    check_decoded(decode_or_refuse(data))


@FUZZ
@given(data=payloads(), edits=st.lists(st.tuples(st.integers(0), st.integers(0, 255)), max_size=4))
def test_mutated_payloads_decode_or_raise_remote_protocol_error(
    data: RangesData, edits: list[tuple[int, int]]
) -> None:
    wire = bytearray(encode_ranges(data))
    for position, value in edits:
        index = position % (len(wire) + 1)
        match value % 3:
            case 0:
                wire[index : index + 1] = bytes([value])  # replace, or append at the end
            case 1:
                wire.insert(index, value)
            case _:
                del wire[index : index + 1]
    check_decoded(decode_or_refuse(bytes(wire)))


# -- the transfer frame

MESSAGE = WakuMessage(b"hello", "/a/1/b/proto", timestamp=1_700_000_000 * 10**9, meta=b"m")


def test_transfer_frame_is_topic_then_message_bytes() -> None:
    frame = WakuMessageAndTopic(TOPIC, MESSAGE).to_bytes()
    body = MESSAGE.to_bytes()
    assert len(body) < 128
    # nwaku's encode: write3(1, pubsub), write3(2, message.encode()): length-delimited.
    assert frame == b"\x0a\x0e" + TOPIC.encode() + b"\x12" + bytes([len(body)]) + body
    assert WakuMessageAndTopic.from_bytes(frame) == WakuMessageAndTopic(TOPIC, MESSAGE)


@FUZZ
@given(
    topic=st.text(min_size=1, max_size=40),
    payload=st.binary(max_size=200),
    timestamp=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    ephemeral=st.booleans(),
)
def test_transfer_frame_round_trip(
    topic: str, payload: bytes, timestamp: int | None, ephemeral: bool
) -> None:
    message = WakuMessage(payload, "/a/1/b/proto", timestamp=timestamp, ephemeral=ephemeral)
    pushed = WakuMessageAndTopic(topic, message)
    assert WakuMessageAndTopic.from_bytes(pushed.to_bytes()) == pushed


def refused(frame: bytes, reason: RejectReason, *, max_message_bytes: int = 10**6) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        WakuMessageAndTopic.from_bytes(frame, max_message_bytes=max_message_bytes)
    assert caught.value.reason is reason


def test_malformed_and_oversized_transfer_frames() -> None:
    body = MESSAGE.to_bytes()
    refused(b"", RejectReason.MALFORMED_RPC)  # neither field
    refused(
        pb.WakuMessageAndTopic(pubsub_topic=TOPIC).SerializeToString(), RejectReason.MALFORMED_RPC
    )
    refused(pb.WakuMessageAndTopic(message=body).SerializeToString(), RejectReason.MALFORMED_RPC)
    refused(b"\xff\xff\xff\xff", RejectReason.MALFORMED_RPC)  # not a protobuf
    refused(b"\x0a\x05/wa", RejectReason.MALFORMED_RPC)  # truncated
    refused(b"\x0a\x02\xff\xfe\x12" + bytes([len(body)]) + body, RejectReason.MALFORMED_RPC)
    garbage = pb.WakuMessageAndTopic(pubsub_topic=TOPIC, message=b"\xff\xff\xff")
    refused(garbage.SerializeToString(), RejectReason.NOT_WAKU_MESSAGE)
    no_content = pb.WakuMessageAndTopic(pubsub_topic=TOPIC, message=b"\x0a\x01x")
    refused(no_content.SerializeToString(), RejectReason.NOT_WAKU_MESSAGE)
    frame = WakuMessageAndTopic(TOPIC, MESSAGE).to_bytes()
    refused(frame, RejectReason.OVERSIZED, max_message_bytes=len(body) - 1)
    assert WakuMessageAndTopic.from_bytes(frame, max_message_bytes=len(body)).message == MESSAGE


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_transfer_frames_decode_or_raise_remote_protocol_error(data: bytes) -> None:
    try:
        pushed = WakuMessageAndTopic.from_bytes(data)
    except RemoteProtocolError:
        return
    assert pushed.pubsub_topic
    assert pushed.message.content_topic
