"""What a message pushed over ``/vac/waku/transfer/1.0.0`` must be to be archived:
``admit`` and the ``Expected`` table it consults."""

from __future__ import annotations

import pytest

from sdsync.errors import RejectReason, RemoteProtocolError
from sdsync.waku.node import Envelope
from sdsync.waku.sync import WakuMessageAndTopic
from sdsync.waku.sync.transfer import Expected, TransferRefused, admit
from sdsync.wire.waku import WakuMessage

NOW = 1_700_000_000 * 10**9
SECOND = 10**9
TOPIC = "/waku/2/rs/1/0"
OTHER_TOPIC = "/waku/2/rs/1/1"
CONTENT = "/app/1/chat/proto"
PEER, OTHER_PEER = "16Uiu2peer", "16Uiu2other"
TTL = 600 * SECOND
SKEW = 20 * SECOND


def message(
    timestamp: int | None = NOW - 60 * SECOND,
    *,
    content_topic: str = CONTENT,
    ephemeral: bool = False,
) -> WakuMessage:
    return WakuMessage(b"pushed", content_topic, timestamp, ephemeral=ephemeral)


def frame(msg: WakuMessage, topic: str = TOPIC) -> bytes:
    return WakuMessageAndTopic(topic, msg).to_bytes()


def expecting(msg: WakuMessage, peer: str = PEER, topic: str = TOPIC) -> Expected:
    table = Expected(TTL, 100)
    assert msg.timestamp is not None
    table.add(peer, {msg.hash(topic): msg.timestamp}, NOW)
    return table


def push(
    data: bytes,
    expected: Expected,
    *,
    peer: str = PEER,
    window: tuple[int, int] | None = None,
    now: int = NOW,
    max_message_bytes: int = 150 * 1024,
) -> Envelope:
    return admit(
        data,
        peer,
        topics={TOPIC},
        expected=expected,
        running_window=window,
        now_ns=now,
        max_future_ns=SKEW,
        max_message_bytes=max_message_bytes,
    )


def refused(
    label: str,
    data: bytes,
    expected: Expected,
    *,
    window: tuple[int, int] | None = None,
    now: int = NOW,
) -> None:
    before = len(expected)
    with pytest.raises(TransferRefused) as caught:
        push(data, expected, window=window, now=now)
    assert caught.value.reason == label
    assert isinstance(caught.value, RemoteProtocolError)
    if label not in ("timestamp_mismatch", "not_expected"):
        assert len(expected) == before  # refused before the table was consulted


# -- accepted


def test_an_expected_message_is_admitted_once_with_its_hash_computed_here() -> None:
    msg = message()
    table = expecting(msg)
    envelope = push(frame(msg), table)
    assert envelope == Envelope(TOPIC, msg, msg.hash(TOPIC))
    assert len(table) == 0  # taken
    refused("not_expected", frame(msg), table)  # not twice


def test_a_message_inside_a_running_reconciliation_window_is_admitted() -> None:
    msg = message(NOW - 60 * SECOND)
    window = (NOW - 3600 * SECOND, NOW - 20 * SECOND)
    assert push(frame(msg), Expected(TTL, 10), window=window).message_hash == msg.hash(TOPIC)
    # Its edges are inclusive; outside them, refused.
    for stamp in window:
        assert push(frame(message(stamp)), Expected(TTL, 10), window=window).message == message(
            stamp
        )
    for stamp in (window[0] - 1, window[1] + 1):
        refused("not_expected", frame(message(stamp)), Expected(TTL, 10), window=window)


# -- refused, by label


def test_ephemeral_messages_are_never_archived() -> None:
    msg = message(ephemeral=True)
    refused("ephemeral", frame(msg), expecting(msg))


def test_a_topic_this_node_does_not_sync() -> None:
    msg = message()
    refused("topic_not_synced", frame(msg, OTHER_TOPIC), expecting(msg, topic=OTHER_TOPIC))


def test_a_message_nobody_found_missing() -> None:
    msg = message()
    refused("not_expected", frame(msg), Expected(TTL, 10))
    # Expected from another peer is not expected from this one.
    table = expecting(msg, peer=OTHER_PEER)
    refused("not_expected", frame(msg), table)
    assert push(frame(msg), table, peer=OTHER_PEER).message == msg


def test_a_timestamp_other_than_the_one_claimed() -> None:
    msg = message()
    table = Expected(TTL, 10)
    assert msg.timestamp is not None
    table.add(PEER, {msg.hash(TOPIC): msg.timestamp - 1}, NOW)
    refused("timestamp_mismatch", frame(msg), table)


def test_an_expired_expectation() -> None:
    msg = message()
    table = expecting(msg)
    refused("not_expected", frame(msg), table, now=NOW + TTL + 1)
    table = expecting(msg)
    assert push(frame(msg), table, now=NOW + TTL).message == msg  # the last moment


def test_relay_rules_future_and_missing_timestamps() -> None:
    cases = [
        (message(NOW + SKEW + 1), RejectReason.TIMESTAMP_IN_FUTURE),
        (message(None), RejectReason.NO_TIMESTAMP),
        (message(0), RejectReason.TIMESTAMP_NOT_POSITIVE),
        (message(content_topic="/bad\x00/1/x/proto"), RejectReason.BAD_TOPIC),
    ]
    for msg, reason in cases:
        table = Expected(TTL, 10)
        if msg.timestamp is not None:
            table.add(PEER, {msg.hash(TOPIC): msg.timestamp}, NOW)
        with pytest.raises(RemoteProtocolError) as caught:
            push(frame(msg), table)
        assert caught.value.reason is reason
        assert not isinstance(caught.value, TransferRefused)
        assert len(table) == (msg.timestamp is not None)  # the expectation stays
    assert push(frame(message(NOW + SKEW)), expecting(message(NOW + SKEW))).message.timestamp


def test_malformed_and_oversized_frames() -> None:
    table = expecting(message())
    for data, reason in (
        (b"\xff\xff\xff", RejectReason.MALFORMED_RPC),
        (b"", RejectReason.MALFORMED_RPC),
        (frame(message())[:-3], RejectReason.MALFORMED_RPC),
    ):
        with pytest.raises(RemoteProtocolError) as caught:
            push(data, table)
        assert caught.value.reason is reason
        assert not isinstance(caught.value, TransferRefused)
    big = WakuMessage(b"x" * 2000, CONTENT, NOW - SECOND)
    table.add(PEER, {big.hash(TOPIC): NOW - SECOND}, NOW)
    with pytest.raises(RemoteProtocolError) as caught:
        push(frame(big), table, max_message_bytes=1000)
    assert caught.value.reason is RejectReason.OVERSIZED
    assert len(table) == 2  # nothing taken


# -- Expected


def test_expected_keeps_at_most_max_per_peer_forgetting_the_oldest() -> None:
    table = Expected(TTL, 3)
    hashes = [bytes([n]) * 32 for n in range(5)]
    table.add(PEER, {h: n for n, h in enumerate(hashes[:2])}, NOW)
    table.add(PEER, {hashes[0]: 0}, NOW)  # found again: the newest now
    table.add(PEER, {h: n for n, h in enumerate(hashes) if n >= 2}, NOW)
    table.add(OTHER_PEER, {hashes[1]: 1}, NOW)  # per peer
    assert len(table) == 4
    assert table.take(PEER, hashes[0], NOW) is None  # re-found, but then pushed out
    assert table.take(PEER, hashes[1], NOW) is None
    assert [table.take(PEER, h, NOW) for h in hashes[2:]] == [2, 3, 4]
    assert table.take(OTHER_PEER, hashes[1], NOW) == 1
    assert len(table) == 0


def test_expected_refreshes_re_found_entries() -> None:
    table = Expected(TTL, 3)
    hashes = [bytes([n]) * 32 for n in range(4)]
    table.add(PEER, {hashes[0]: 0, hashes[1]: 1, hashes[2]: 2}, NOW)
    table.add(PEER, {hashes[0]: 0}, NOW + 5)  # moves to the end, lives longer
    table.add(PEER, {hashes[3]: 3}, NOW + 5)  # evicts the oldest: hashes[1]
    assert table.take(PEER, hashes[1], NOW) is None
    assert table.take(PEER, hashes[0], NOW + TTL + 5) == 0


def test_expected_entries_expire_after_their_ttl() -> None:
    table = Expected(10, 100)
    table.add(PEER, {b"\x01" * 32: 1}, NOW)
    table.add(PEER, {b"\x02" * 32: 2}, NOW + 5)
    table.add(OTHER_PEER, {b"\x03" * 32: 3}, NOW)
    table.prune(NOW + 10)  # until is inclusive
    assert len(table) == 3
    table.prune(NOW + 11)
    assert len(table) == 1
    assert table.take(PEER, b"\x01" * 32, NOW) is None
    assert table.take(OTHER_PEER, b"\x03" * 32, NOW) is None
    assert table.take(PEER, b"\x02" * 32, NOW + 16) is None  # expired when taken: gone too
    assert len(table) == 0
