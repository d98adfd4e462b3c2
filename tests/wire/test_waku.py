"""WakuMessage envelope and deterministic message hash (14/WAKU2-MESSAGE)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.wire.waku import WakuMessage, decode_waku_message, message_hash

VECTOR = WakuMessage(
    payload=bytes.fromhex("010203045445535405060708"),
    content_topic="/waku/2/default-content/proto",
    meta=bytes.fromhex("73757065722d736563726574"),
    timestamp=0x175789BFA23F8400,
)


def test_reference_hash_vector() -> None:
    assert (
        VECTOR.hash("/waku/2/default-waku/proto").hex()
        == "64cce733fed134e83da02b02c6f689814872b1a0ac97ea56b76095c3c72bfe05"
    )


def test_hash_ignores_version_and_ephemeral_but_not_topic() -> None:
    base = VECTOR.hash("/waku/2/default-waku/proto")
    twin = WakuMessage(
        payload=VECTOR.payload,
        content_topic=VECTOR.content_topic,
        meta=VECTOR.meta,
        timestamp=VECTOR.timestamp,
        version=1,
        ephemeral=True,
    )
    assert twin.hash("/waku/2/default-waku/proto") == base
    assert VECTOR.hash("/waku/2/rs/0/0") != base


def test_missing_timestamp_hashes_without_it() -> None:
    no_ts = message_hash("/t", b"p", "/c", b"", None)
    zero_ts = message_hash("/t", b"p", "/c", b"", 0)
    assert no_ts != zero_ts and len(no_ts) == 32


timestamps = st.none() | st.integers(-(1 << 63), (1 << 63) - 1)
messages = st.builds(
    WakuMessage,
    payload=st.binary(max_size=200),
    content_topic=st.text(min_size=1, max_size=40),
    timestamp=timestamps,
    meta=st.binary(max_size=64),
    version=st.integers(0, (1 << 32) - 1),
    ephemeral=st.booleans(),
)


@given(messages)
def test_round_trip(message: WakuMessage) -> None:
    assert decode_waku_message(message.to_bytes()) == message


@pytest.mark.parametrize(
    "data", [b"\xff\xff\xff", b"\x0a\x05ab", b"\x12\x02\xc3\x28", b"\x0a\x01x"]
)
def test_garbage_is_remote_error(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        decode_waku_message(data)


def test_oversized_is_remote_error() -> None:
    big = WakuMessage(payload=b"x" * 300_000, content_topic="/c").to_bytes()
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        decode_waku_message(big)


def test_caller_misuse_is_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        WakuMessage(payload=b"x", content_topic="")
    with pytest.raises(LocalProtocolError):
        WakuMessage(payload=b"x", content_topic="/c", timestamp=1 << 63)
