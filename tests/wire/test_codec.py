from __future__ import annotations

import pytest

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.wire import (
    HistoryEntry,
    Message,
    MessageKind,
    WireLimits,
    decode,
    encode,
    message_id_for,
)
from sdsync.wire import sds_message_pb2 as pb

HELLO_ID = message_id_for(b"hello")
# What @waku/sds 0.0.8 sent for participant "a", channel "0", clock 1000, payload "hello",
# bloom filter sized 4 / 0.1 (8 bytes), captured from the Node driver.
JS_HELLO = bytes.fromhex(
    "0a0161124032636632346462613566623061333065323665383362326163356239653239653162"
    "3136316535633166613734323565373330343333363239333862393832341a013050e907620800"
    "00000000000000a2010568656c6c6f"
)


def test_encode_matches_bytes_captured_from_waku_sds() -> None:
    message = Message("a", HELLO_ID, "0", 1001, (), bytes(8), b"hello")
    assert encode(message) == JS_HELLO
    assert decode(JS_HELLO) == message


def test_bulk_view_encoding_equals_the_plain_schema() -> None:
    history = tuple(
        HistoryEntry(f"{i:064x}", bytes([i]) * 32 if i % 2 else None, "s" if i % 3 else None)
        for i in range(50)
    )
    repairs = (HistoryEntry("r1", None, "orig"), HistoryEntry("r2", b"", ""))
    message = Message("snd", "mid", "chan", 2**40, history, b"\x01" * 16, b"body", repairs)
    plain = pb.SdsMessage(sender_id="snd", message_id="mid", channel_id="chan")
    plain.lamport_timestamp = 2**40
    plain.bloom_filter = b"\x01" * 16
    plain.content = b"body"
    for target, entries in ((plain.causal_history, history), (plain.repair_request, repairs)):
        for e in entries:
            item = target.add(message_id=e.message_id)
            if e.retrieval_hint is not None:
                item.retrieval_hint = e.retrieval_hint
            if e.sender_id is not None:
                item.sender_id = e.sender_id
    assert encode(message) == plain.SerializeToString()
    assert decode(encode(message)) == message


@pytest.mark.parametrize(
    ("lamport", "content", "kind"),
    [
        (5, b"x", MessageKind.CONTENT),
        (5, None, MessageKind.SYNC),
        (5, b"", MessageKind.SYNC),
        (None, b"x", MessageKind.EPHEMERAL),
    ],
)
def test_kind_follows_field_presence(
    lamport: int | None, content: bytes | None, kind: MessageKind
) -> None:
    message = Message("s", "m", "c", lamport, content=content)
    decoded = decode(encode(message))
    assert decoded.kind is kind
    assert decoded.content == content  # absent and empty stay distinguishable


def test_message_without_lamport_or_content_is_rejected_both_ways() -> None:
    with pytest.raises(LocalProtocolError):
        encode(Message("s", "m", "c"))
    raw = pb.SdsMessage(sender_id="s", message_id="m", channel_id="c").SerializeToString()
    with pytest.raises(RemoteProtocolError, match="neither content"):
        decode(raw)
    empty_ephemeral = pb.SdsMessage(message_id="m", content=b"").SerializeToString()
    with pytest.raises(RemoteProtocolError):
        decode(empty_ephemeral)


def test_size_limit_is_enforced_before_parsing() -> None:
    limits = WireLimits(max_message_bytes=100)
    big = encode(Message("s", "m", "c", 1, content=b"x" * 200))
    with pytest.raises(RemoteProtocolError, match="exceeds the limit of 100"):
        decode(big, limits)
    # Garbage of the same size fails on size, not on parsing.
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        decode(b"\xff" * 101, limits)


@pytest.mark.parametrize(
    "message",
    [
        Message("s" * 300, "m", "c", 1, content=b"x"),
        Message("s", "m" * 300, "c", 1, content=b"x"),
        Message("s", "m", "c", 1, (HistoryEntry("h" * 300),), content=b"x"),
        Message("s", "m", "c", 1, (HistoryEntry("h", b"\0" * 300),), content=b"x"),
        Message("s", "m", "c", 1, (HistoryEntry("h", None, "z" * 300),), content=b"x"),
        Message("s", "m", "c", 1, tuple(HistoryEntry(f"h{i}") for i in range(5000)), content=b"x"),
        Message("s", "m", "c", 1, repair_request=tuple(HistoryEntry(f"r{i}") for i in range(65))),
        Message("s", "m", "c", 2**63, content=b"x"),
        Message("s", "", "c", 1, content=b"x"),
        Message("s", "m", "c", 1, (HistoryEntry(""),), content=b"x"),
    ],
    ids=[
        "sender",
        "message-id",
        "history-id",
        "hint",
        "history-sender",
        "history-count",
        "repair-count",
        "lamport",
        "empty-id",
        "empty-history-id",
    ],
)
def test_wrong_field_sizes_are_remote_errors(message: Message) -> None:
    with pytest.raises(RemoteProtocolError):
        decode(encode(message))


@pytest.mark.parametrize(
    "data",
    [b"\xff", b"\x0a\x05ab", b"\x0a\x02\xff\xfe", b"\x52\x03\x0a\x80\x80", b"\x08" * 20],
    ids=["bad-tag", "truncated", "invalid-utf8", "bad-entry", "wrong-wire-type"],
)
def test_malformed_bytes_are_remote_errors(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        decode(data)


def test_decoding_a_non_bytes_value_is_our_callers_fault() -> None:
    with pytest.raises(LocalProtocolError):
        decode("not bytes")  # type: ignore[arg-type]


def test_default_message_id_is_sha256_hex_of_payload() -> None:
    assert message_id_for(b"hello") == (
        "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    )
