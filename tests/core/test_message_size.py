"""MessageChannel.send and the wire's size limit (``WireLimits.max_message_bytes``).

Attacks the promise that we never send what peers refuse to decode: a payload whose
message would be over the limit is refused with MessageTooLargeError and changes nothing
(Lamport timestamp, log, bloom filter, buffers, statistics: a twin channel that never tried
sends byte-identical messages afterwards); one just under the limit is sent and decoded
by a peer with the same limits; and due SDS-R repair requests ride along only when they
fit, never pushing a message over the limit and never being lost.
"""

from __future__ import annotations

import copy

import pytest

from sdsync.core import (
    BloomParams,
    ChannelConfig,
    MessageChannel,
    MessageDelivered,
    MessageSent,
    RepairConfig,
    RepairRequestSent,
)
from sdsync.errors import LocalProtocolError, MessageTooLargeError, RemoteProtocolError
from sdsync.wire import WireLimits, decode

LIMIT = 600
REPAIR = RepairConfig(t_min_ms=1_000, t_max_ms=5_000)
CONFIG = ChannelConfig(
    bloom=BloomParams(100, 0.01),
    causal_history_size=3,
    repair=REPAIR,
    limits=WireLimits(max_message_bytes=LIMIT),
)
NOW = 10_000  # past the repair request's due time in with_a_due_request()


def chan(pid: str) -> MessageChannel:
    return MessageChannel("c", pid, now_ms=0, config=CONFIG)


def state(c: MessageChannel) -> tuple[object, ...]:
    return (
        c.lamport_timestamp,
        c.log_ids(),
        c.bloom_bytes(),
        c.outgoing_ids(),
        c.incoming_ids(),
        c.missing_ids(),
        c.next_repair_request_due(),
        copy.deepcopy(c.stats),  # a copy: the live object would always equal itself
    )


def with_history() -> MessageChannel:
    """b has a log (causal history and bloom filter are not empty) and nothing missing."""
    a, b = chan("a"), chan("b")
    for i in range(3):
        b.receive(a.send(f"a{i}".encode(), 1 + i).data, 5)
        b.send(f"b{i}".encode(), 6 + i)
    return b


def with_a_due_request() -> tuple[MessageChannel, str]:
    """b lacks a message of a's that a later one names: a repair request is due by NOW."""
    a, b = chan("a"), chan("b")
    lost = a.send(b"lost", 1)
    b.receive(a.send(b"later", 2).data, 3)
    due = b.next_repair_request_due()
    assert due is not None and due <= NOW
    return b, lost.message_id


def largest() -> int:
    """The largest payload a fresh ``with_history()`` channel sends at NOW."""

    def fits(size: int) -> bool:
        try:
            with_history().send(b"x" * size, NOW)
        except MessageTooLargeError:
            return False
        return True

    low, high = 1, LIMIT
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def test_an_oversize_payload_is_refused_and_changes_nothing() -> None:
    fits = largest()
    b, twin = with_history(), with_history()
    before = state(b)
    assert before == state(twin)
    for size in (fits + 1, LIMIT, 10 * LIMIT):
        with pytest.raises(MessageTooLargeError, match="max_message_bytes"):
            b.send(b"x" * size, NOW)
        assert state(b) == before
    with pytest.raises(MessageTooLargeError):
        b.send(b"x" * LIMIT, NOW, message_id="chosen")
    assert isinstance(MessageTooLargeError("x"), LocalProtocolError)
    # As if it never tried: the next messages are byte for byte the twin's, and the id of
    # the refused message is free.
    for channel in (b, twin):
        channel.receive(chan("c").send(b"from c", NOW).data, NOW)
    assert b.send(b"ok", NOW + 1).data == twin.send(b"ok", NOW + 1).data
    assert (
        b.send(b"y", NOW + 2, message_id="chosen").data
        == twin.send(b"y", NOW + 2, message_id="chosen").data
    )
    assert state(b) == state(twin)


def test_the_largest_payload_that_fits_is_sent_and_accepted() -> None:
    fits = largest()
    b = with_history()
    out = b.send(b"z" * fits, NOW)
    assert LIMIT - 2 <= len(out.data) <= LIMIT  # one more byte would be over
    assert [type(e) for e in out.events] == [MessageSent]
    peer = chan("p")
    assert decode(out.data, CONFIG.limits).content == b"z" * fits
    events = peer.receive(out.data, NOW)
    delivered = [e for e in events if isinstance(e, MessageDelivered)]
    assert not delivered or delivered[-1].content == b"z" * fits
    assert out.message_id in peer.incoming_ids() or out.message_id in peer.log_ids()
    # What the limit protects: a peer refuses anything larger.
    tight = ChannelConfig(limits=WireLimits(max_message_bytes=len(out.data) - 1))
    with pytest.raises(RemoteProtocolError):
        MessageChannel("c", "q", now_ms=0, config=tight).receive(out.data, NOW)


def test_due_repair_requests_ride_only_when_they_fit_and_are_not_lost() -> None:
    def send(size: int) -> tuple[MessageChannel, str, object]:
        b, lost = with_a_due_request()
        try:
            return b, lost, b.send(b"x" * size, NOW)
        except MessageTooLargeError:
            return b, lost, None

    sizes = [size for size in range(1, LIMIT) if send(size)[2] is not None]
    fits_alone = max(sizes)
    carrying = [size for size in sizes if send(size)[2].message.repair_request]  # type: ignore[union-attr]
    assert carrying and max(carrying) < fits_alone  # the requests take room of their own

    b, lost, out = send(fits_alone)
    assert out is not None
    assert len(out.data) <= LIMIT  # type: ignore[attr-defined]
    assert out.message.repair_request == ()  # type: ignore[attr-defined]
    assert not [e for e in out.events if isinstance(e, RepairRequestSent)]  # type: ignore[attr-defined]
    assert lost in b.missing_ids()
    # Not lost: a later message asks for it (at the latest one T_max later).
    later = b.send(b"small", NOW + REPAIR.t_max_ms)
    assert [e.message_id for e in later.message.repair_request] == [lost]
    assert [e.message_id for e in later.events if isinstance(e, RepairRequestSent)] == [lost]

    b, lost, out = send(max(carrying))  # room for them: they ride along as always
    assert [e.message_id for e in out.message.repair_request] == [lost]  # type: ignore[union-attr]


def test_repair_requests_that_did_not_fit_stay_due_for_the_next_message() -> None:
    b, lost = with_a_due_request()
    due = b.next_repair_request_due()
    size = LIMIT
    while True:  # the largest payload that fits: no room left for the request
        try:
            b.send(b"x" * size, NOW)
            break
        except MessageTooLargeError:
            size -= 1
    after = b.next_repair_request_due()
    assert due is not None and after is not None and after <= NOW  # still due
    following = b.send_sync(NOW)
    assert following is not None
    assert [e.message_id for e in following.message.repair_request] == [lost]
