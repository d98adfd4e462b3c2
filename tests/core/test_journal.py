"""The durable-state interface of the core: journal, snapshot and restore, early delivery."""

from __future__ import annotations

import pytest

from sdsync.core import (
    BloomParams,
    ChannelConfig,
    ChannelSnapshot,
    MessageChannel,
    MessageDelivered,
    MessageDeliveredEarly,
    RollingBloomFilter,
    StoredIncoming,
    StoredOutgoing,
)
from sdsync.errors import LocalProtocolError

START = 1_700_000_000_000
CONFIG = ChannelConfig(bloom=BloomParams(50, 0.01), causal_history_size=3)


@pytest.mark.parametrize("rollover", [True, False])
@pytest.mark.parametrize("inserted", [0, 1, 49, 50, 51, 75, 76, 77, 200, 1_001])
def test_rolling_bloom_restores_exactly_from_its_newest_ids(rollover: bool, inserted: int) -> None:
    params = BloomParams(50, 0.01)
    ids = [f"id-{i}" for i in range(inserted)]
    original = RollingBloomFilter(params, rollover=rollover)
    for item in ids:
        original.insert(item)
    restored = RollingBloomFilter(params, rollover=rollover)
    restored.restore(ids[-params.capacity :] if rollover else ids, inserted)
    assert restored.to_bytes() == original.to_bytes()
    for item in ("next-1", "next-2", *[f"more-{i}" for i in range(60)]):
        original.insert(item)  # and it keeps rolling over at the same moments
        restored.insert(item)
        assert restored.to_bytes() == original.to_bytes()


def test_rolling_bloom_restore_refuses_too_few_ids() -> None:
    bloom = RollingBloomFilter(BloomParams(50, 0.01))
    with pytest.raises(LocalProtocolError):
        bloom.restore(["a"], 10)


def test_journal_records_keys_touched_by_a_step() -> None:
    a = MessageChannel("c", "a", now_ms=START, config=CONFIG)
    b = MessageChannel("c", "b", now_ms=START, config=CONFIG)
    journal = b.start_journal()
    first, second = a.send(b"1", START), a.send(b"2", START + 1)
    b.receive(second.data, START)  # waits for first
    assert journal.incoming == {second.message_id}
    assert journal.bloom == [second.message_id]
    assert journal.log == []
    journal.clear()
    b.receive(first.data, START)
    assert [e.message_id for e, _ in journal.log] == [first.message_id, second.message_id]
    assert [content for _, content in journal.log] == [b"1", b"2"]
    assert journal.incoming == {second.message_id}  # touched again: it left the buffer
    assert b.stored_incoming(second.message_id) is None
    own = b.send(b"3", START + 2)
    assert own.message_id in journal.outgoing
    assert b.stored_outgoing(own.message_id) == StoredOutgoing(own.data, START + 2, START + 2, 1)
    assert not journal.is_empty()
    journal.clear()
    assert journal.is_empty()


def test_restore_rebuilds_buffers_and_dependency_index() -> None:
    a = MessageChannel("c", "a", now_ms=START, config=CONFIG)
    first, second = a.send(b"1", START), a.send(b"2", START + 1)
    own = MessageChannel("c", "b", now_ms=START, config=CONFIG).send(b"mine", START)
    b = MessageChannel("c", "b", now_ms=START, config=CONFIG)
    b.restore(
        ChannelSnapshot(
            lamport_timestamp=START + 5,
            incoming=[StoredIncoming(second.data, None, START)],
            outgoing=[StoredOutgoing(own.data, START, START + 3, 4, frozenset({"x"}), b"hint")],
        )
    )
    assert b.lamport_timestamp == START + 5
    assert b.unmet_dependencies(second.message_id) == [first.message_id]
    assert b.missing_ids() == [first.message_id]
    entry = b.outgoing_entry(own.message_id)
    assert entry is not None and (entry.attempts, entry.possible_ackers) == (4, {"x"})
    assert entry.retrieval_hint == b"hint" and b.resend(own.message_id, START) == own.data
    events = b.receive(first.data, START)  # the restored waiter is released
    assert [e.message_id for e in events if isinstance(e, MessageDelivered)] == [
        first.message_id,
        second.message_id,
    ]
    with pytest.raises(LocalProtocolError, match="fresh"):
        b.restore(ChannelSnapshot(lamport_timestamp=START))


def test_deliver_early_then_delivered_each_once() -> None:
    config = ChannelConfig(bloom=CONFIG.bloom, causal_history_size=3, deliver_early=True)
    a = MessageChannel("c", "a", now_ms=START, config=config)
    b = MessageChannel("c", "b", now_ms=START, config=config)
    first, second, third = (a.send(f"{i}".encode(), START + i) for i in range(3))
    early = [e for e in b.receive(third.data, START) if isinstance(e, MessageDeliveredEarly)]
    assert [(e.message_id, e.content, e.missing_dependencies) for e in early] == [
        (third.message_id, b"2", 2)
    ]
    assert b.receive(third.data, START)[0].type == "message_dropped"  # no second early event
    events = b.receive(first.data, START)  # delivered at once: never "early"
    assert not any(isinstance(e, MessageDeliveredEarly) for e in events)
    events = b.receive(second.data, START)
    delivered = [e.message_id for e in events if isinstance(e, MessageDelivered)]
    assert delivered == [second.message_id, third.message_id]
