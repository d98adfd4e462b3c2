"""ChannelDriver: sync status reporting and the durable resend schedule."""

from __future__ import annotations

import random

from sdsync.core import BloomParams, ChannelConfig, ChannelSnapshot, MessageChannel, SyncStatus
from sdsync.runtime import ChannelDriver, RuntimeConfig, Step, Transmit

START = 1_700_000_000_000
CONFIG = ChannelConfig(bloom=BloomParams(50, 0.01), causal_history_size=3)


def driver(name: str) -> ChannelDriver:
    channel = MessageChannel("c", name, now_ms=START, config=CONFIG)
    return ChannelDriver(channel, RuntimeConfig(), random.Random(name), START)


def test_driver_reports_sync_status_changes() -> None:
    a, b = driver("a"), driver("b")

    def status(events: list[object]) -> SyncStatus | None:
        found = [e for e in events if isinstance(e, SyncStatus)]
        return found[-1] if found else None

    first = a.publish(b"1", START)
    sent = status(first.step.events)
    assert sent is not None and (sent.outstanding, sent.synced) == (1, False)
    second = a.publish(b"2", START + 1)
    assert status(second.step.events) == SyncStatus("", 0, 0, 2)
    got = b.receive(second.transmit.data, START)
    assert status(got.events) == SyncStatus("", 1, 1, 0)  # one missing, one waiting
    got = b.receive(first.transmit.data, START)
    back = status(got.events)
    assert back is not None and back.synced
    reply = b.publish(b"3", START + 2)
    acked = status(a.receive(reply.transmit.data, START).events)
    assert acked == SyncStatus("", 0, 0, 0)
    assert a.receive(reply.transmit.data, START).events[-1].type == "message_dropped"


def test_resend_schedule_is_recorded_and_restored() -> None:
    a = driver("a")
    a.start_journal()
    step = a.publish(b"x", START)
    mid = step.message_id
    due = a.resend_at(mid)
    assert due is not None and a.take_rescheduled() == {mid}
    assert a.take_rescheduled() == set()
    restored = driver("a")
    restored.channel.restore(
        ChannelSnapshot(
            lamport_timestamp=a.channel.lamport_timestamp,
            outgoing=[a.channel.stored_outgoing(mid)],
        )
    )
    restored.restore_resends({mid: due})
    assert restored.next_due() <= due

    def resends(step: Step) -> list[str]:
        return [
            a.message_id for a in step.actions if isinstance(a, Transmit) and a.kind == "resend"
        ]

    assert resends(restored.tick(due - 1)) == []
    assert resends(restored.tick(due)) == [mid]
    assert restored.channel.outgoing_entry(mid).attempts == 2  # type: ignore[union-attr]
