"""Every rejection by the wire decoders carries the RejectReason it is counted under."""

from __future__ import annotations

from typing import Any

import pytest

from sdsync.errors import RejectReason, RemoteProtocolError
from sdsync.wire import DEFAULT_LIMITS, Message, WireLimits, decode, decode_waku_message, encode
from sdsync.wire import sds_message_pb2 as pb
from sdsync.wire import waku_message_pb2 as waku_pb
from sdsync.wire.waku import MAX_WAKU_MESSAGE_BYTES

R = RejectReason
LONG = "x" * (DEFAULT_LIMITS.max_id_length + 1)


def sds(*, history: tuple[bytes, ...] = (), **fields: Any) -> bytes:
    """A content message as a hostile peer may write it: ``fields`` override or add to it,
    ``history`` is its causal history as raw entries."""
    view = pb.SdsMessageView(
        **{"sender_id": "a", "message_id": "m", "channel_id": "c", "lamport_timestamp": 1}
        | {"content": b"hi"}
        | fields
    )
    view.causal_history.extend(history)
    return view.SerializeToString()


def entry(**fields: Any) -> bytes:
    return pb.HistoryEntry(**{"message_id": "h"} | fields).SerializeToString()


def waku(**fields: Any) -> bytes:
    return waku_pb.WakuMessage(**fields).SerializeToString()


def case(name: str, data: bytes, reason: RejectReason, **limits: int) -> Any:
    return pytest.param(data, WireLimits(**limits), reason, id=name)


VALID = encode(Message("a", "m", "c", 1, content=b"hi"))
TWO = (entry(), entry(message_id="i"))
LONG_HINT = entry(retrieval_hint=bytes(DEFAULT_LIMITS.max_retrieval_hint_bytes + 1))

SDS_CASES = [
    case("too large", VALID, R.MESSAGE_TOO_LARGE, max_message_bytes=len(VALID) - 1),
    case("garbage", b"\xff\xfe garbage", R.MALFORMED),
    case("truncated", b"\x0a\x05ab", R.MALFORMED),
    case("history entry does not parse", sds(history=(b"\xff\xff",)), R.MALFORMED),
    case("no lamport and no content", sds(lamport_timestamp=None, content=None), R.NO_KIND),
    case("lamport beyond any clock", sds(lamport_timestamp=1 << 63), R.IMPLAUSIBLE_LAMPORT),
    case("empty message_id", sds(message_id=""), R.EMPTY_MESSAGE_ID),
    case("history entry without id", sds(history=(entry(message_id=""),)), R.EMPTY_MESSAGE_ID),
    case("repair request without id", sds(repair_request=[b""]), R.EMPTY_MESSAGE_ID),
    case("long sender_id", sds(sender_id=LONG), R.FIELD_TOO_LARGE),
    case("long message_id", sds(message_id=LONG), R.FIELD_TOO_LARGE),
    case("long channel_id", sds(channel_id=LONG), R.FIELD_TOO_LARGE),
    case("long history id", sds(history=(entry(message_id=LONG),)), R.FIELD_TOO_LARGE),
    case("long history sender", sds(history=(entry(sender_id=LONG),)), R.FIELD_TOO_LARGE),
    case("long retrieval hint", sds(history=(LONG_HINT,)), R.FIELD_TOO_LARGE),
    case("large bloom filter", sds(bloom_filter=bytes(5)), R.FIELD_TOO_LARGE, max_bloom_bytes=4),
    case("long causal history", sds(history=TWO), R.FIELD_TOO_LARGE, max_causal_history=1),
    case("many repair requests", sds(repair_request=TWO), R.FIELD_TOO_LARGE, max_repair_requests=1),
]


@pytest.mark.parametrize(("data", "limits", "reason"), SDS_CASES)
def test_each_sds_rejection_has_its_reason(
    data: bytes, limits: WireLimits, reason: RejectReason
) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        decode(data, limits)
    assert caught.value.reason is reason


WAKU_CASES = [
    pytest.param(waku(payload=bytes(8), content_topic="/t"), 8, R.OVERSIZED, id="too large"),
    pytest.param(b"\xff\xff", MAX_WAKU_MESSAGE_BYTES, R.NOT_WAKU_MESSAGE, id="garbage"),
    pytest.param(b"", MAX_WAKU_MESSAGE_BYTES, R.NOT_WAKU_MESSAGE, id="empty"),
    pytest.param(waku(payload=b"x"), MAX_WAKU_MESSAGE_BYTES, R.NOT_WAKU_MESSAGE, id="no topic"),
]


@pytest.mark.parametrize(("data", "max_bytes", "reason"), WAKU_CASES)
def test_each_waku_rejection_has_its_reason(
    data: bytes, max_bytes: int, reason: RejectReason
) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        decode_waku_message(data, max_bytes=max_bytes)
    assert caught.value.reason is reason


def test_every_reason_has_a_case_here_or_in_the_transport_tests() -> None:
    given = {p.values[-1] for p in SDS_CASES + WAKU_CASES}
    elsewhere = {R.WRONG_CONTENT_TOPIC, R.PROTOCOL_VIOLATION}  # the transport, the default
    elsewhere |= {R.MALFORMED_RPC, R.TRUNCATED_FRAME, R.MALFORMED_CONTENT_TOPIC}  # Waku RPCs
    elsewhere |= {R.NO_TIMESTAMP, R.SIGNED_RELAY_MESSAGE}  # the transport's Waku mode
    # check_relayable: tests/store/test_relay_hostile.py
    elsewhere |= {R.BAD_TOPIC, R.TIMESTAMP_NOT_POSITIVE, R.TIMESTAMP_IN_FUTURE}
    assert given | elsewhere == set(RejectReason)


def test_a_rejection_without_a_category_is_a_protocol_violation() -> None:
    error = RemoteProtocolError("the peer said something odd")
    assert error.reason is R.PROTOCOL_VIOLATION == "protocol violation"
