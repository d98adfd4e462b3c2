"""The causal history a channel quotes is reused between sends, never stale.

:class:`~sdsync.core.history.HistoryWindow` builds each send's causal history (and its
encoding) from the previous one. These tests drive a channel through everything that can
change the tail of its log between two sends — its own sends, messages arriving in and out
of Lamport order, retrieval hints set on quoted entries, eviction from a small window, a
restore — and check every message sent against a history and an encoding built from
scratch. The hand-written encoder is checked against the generated protobuf class.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sdsync.core import ChannelConfig, MessageChannel
from sdsync.core.bloom import BloomParams
from sdsync.core.history import HistoryWindow
from sdsync.core.log import LocalLog, LogEntry
from sdsync.testing.oracle import reference_encode
from sdsync.wire import HistoryEntry, Message, encode
from sdsync.wire.codec import EncodedHistory

CONFIG = ChannelConfig(bloom=BloomParams(200, 0.01), causal_history_size=4, max_log_entries=12)


def expected_history(channel: MessageChannel) -> tuple[HistoryEntry, ...]:
    tail = channel.log.tail(channel.config.causal_history_size)
    return tuple(HistoryEntry(e.message_id, e.retrieval_hint, e.sender_id) for e in tail)


def check_sent(quoted: tuple[HistoryEntry, ...], message: Message, data: bytes) -> None:
    """``message`` quotes ``quoted`` (the tail before the send), encoded from scratch."""
    assert message.causal_history == quoted
    fresh = Message(
        message.sender_id,
        message.message_id,
        message.channel_id,
        message.lamport_timestamp,
        quoted,
        message.bloom_filter,
        message.content,
        message.repair_request,
    )
    assert data == reference_encode(fresh)


# (operation, peer, lamport offset): send, receive from a peer at an offset from our own
# clock (negative: the message lands inside the quoted tail), hint our newest or an older
# message, send a sync.
OPS = st.lists(
    st.tuples(
        st.sampled_from(["send", "receive", "hint_newest", "hint_older", "sync"]),
        st.sampled_from(["p", "q"]),
        st.integers(-6, 3),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_every_send_quotes_the_current_tail_with_its_exact_bytes(
    ops: list[tuple[str, str, int]],
) -> None:
    me = MessageChannel("c", "me", now_ms=1000, config=CONFIG)
    peers = {p: MessageChannel("c", p, now_ms=1000, config=CONFIG) for p in "pq"}
    mine: list[str] = []
    now = 1000
    for i, (op, peer, offset) in enumerate(ops):
        now += 1
        quoted = expected_history(me)
        if op == "send":
            out = me.send(f"m{i}".encode(), now)
            check_sent(quoted, out.message, out.data)
            mine.append(out.message_id)
        elif op == "receive":
            sender = peers[peer]
            sender.lamport_timestamp = me.lamport_timestamp + offset - 1
            me.receive(sender.send(f"{peer}{i}".encode(), now).data, now)
        elif op.startswith("hint") and mine:
            target = mine[-1] if op == "hint_newest" else mine[len(mine) // 2]
            if target in me.log.window or me.outgoing_entry(target) is not None:
                me.set_retrieval_hint(target, bytes([i % 256]) * 32)
        elif op == "sync":
            sync = me.send_sync(now)
            if sync is not None:
                check_sent(quoted, sync.message, sync.data)


def test_a_restored_log_is_quoted_afresh() -> None:
    log = LocalLog(100)
    window = HistoryWindow(3)
    for t in range(5):
        log.insert(LogEntry(f"a{t}", t, "a"))
    assert [e.message_id for e in window.quote(log).entries] == ["a2", "a3", "a4"]
    log.restore([LogEntry(f"b{t}", t, "b") for t in range(4)], 4)
    quoted = window.quote(log)
    assert [e.message_id for e in quoted.entries] == ["b1", "b2", "b3"]
    assert quoted.frames == EncodedHistory.of(quoted.entries).frames


def test_hand_written_encoder_matches_protobuf() -> None:
    rng = random.Random(7)

    def text() -> str:
        return rng.choice(["", "a", "é" * rng.randrange(80), "x" * rng.randrange(100, 300)])

    def entry() -> HistoryEntry:
        hint = rng.choice([None, b"", bytes(rng.randrange(300))])
        return HistoryEntry("id" + text(), hint, rng.choice([None, "", text()]))

    for _ in range(500):
        lamport = rng.choice([None, 0, 127, 128, 2**63, 2**64 - 1, rng.randrange(2**50)])
        content = rng.choice([None, b"", b"x", bytes(rng.randrange(20_000))])
        if lamport is None and not content:
            content = b"c"
        message = Message(
            text(),
            text(),
            text(),
            lamport,
            tuple(entry() for _ in range(rng.randrange(4))),
            rng.choice([None, b"", bytes(rng.randrange(20_000))]),
            content,
            tuple(entry() for _ in range(rng.randrange(3))),
        )
        expected = reference_encode(message)
        assert encode(message) == expected
        assert encode(message, EncodedHistory.of(message.causal_history)) == expected
        # A history object for another tuple is ignored, not trusted.
        assert encode(message, EncodedHistory.of((entry(),))) == expected
