"""ReliableChannel over the in-memory network: real event loop, real timers, lossy links."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random

import pytest

from sdsync.core import (
    BloomParams,
    ChannelConfig,
    DropReason,
    MessageChannel,
    MessageDelivered,
    MessageEvicted,
    RepairConfig,
    SendFailed,
)
from sdsync.errors import RejectReason
from sdsync.runtime import ReliableChannel, RuntimeConfig
from sdsync.runtime.clock import system_clock_ms
from sdsync.testing.memory import Faults, MemoryNetwork
from sdsync.testing.memory_store import MemoryStore
from sdsync.wire import HistoryEntry, Message, encode

FAST = RuntimeConfig(
    sync_interval_ms=200,
    resend_interval_ms=150,
    resend_possibly_acknowledged_ms=400,
    max_resend_interval_ms=1_000,
    incoming_sweep_ms=50,
    store_query_ms=100,
)
CONFIG = ChannelConfig(
    bloom=BloomParams(1_000, 0.01),
    causal_history_size=10,
    repair=RepairConfig(t_min_ms=100, t_max_ms=500),  # SDS-R at test speed
)
# A liveness bound, not a performance assertion: convergence normally takes ~1-2 s.
PATIENCE_S = 60


async def converged(channels: list[ReliableChannel], expected: int) -> None:
    while True:
        logs = [c.channel.log_ids() for c in channels]
        pending = sum(len(c.channel.outgoing_ids()) for c in channels)
        if len(logs[0]) == expected and all(log == logs[0] for log in logs) and not pending:
            return
        await asyncio.sleep(0.05)


def group(net: MemoryNetwork, n: int, store: MemoryStore | None = None) -> list[ReliableChannel]:
    return [
        ReliableChannel(
            net.transport(f"p{i}"),
            "chat",
            f"p{i}",
            config=CONFIG,
            runtime=FAST,
            store=store,
            rng=random.Random(i),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("with_store", [False, True])
def test_three_participants_converge_over_a_lossy_network(with_store: bool) -> None:
    async def scenario() -> None:
        net = MemoryNetwork(Faults(loss=0.3, latency_ms=5, jitter_ms=3, duplicate=0.1), seed=7)
        store = MemoryStore(net.transport("store"), ["/sds/1/chat"]) if with_store else None
        if store is not None:
            await store.start()
        members = group(net, 3, store)
        for m in members:
            await m.start()
        for i in range(30):
            await members[i % 3].send(f"line {i}".encode())
            await asyncio.sleep(0.005)
        await asyncio.wait_for(converged(members, 30), PATIENCE_S)
        delivered = [
            [e.message_id for e in m.pending_events() if isinstance(e, MessageDelivered)]
            for m in members
        ]
        for m, ids in zip(members, delivered, strict=True):
            assert len(ids) == len(set(ids)) == 20  # everything from the other two, once
            assert set(ids) <= set(m.channel.log_ids())
        assert net.dropped > 0
        for m in members:
            await m.stop()
        if store is not None:
            await store.stop()

    asyncio.run(scenario())


def test_bad_frames_are_counted_and_the_channel_keeps_working(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        net = MemoryNetwork(seed=1)
        a, b = group(net, 2)
        await a.start()
        await b.start()
        rogue = net.transport("rogue")
        other = MessageChannel("another-channel", "rogue", now_ms=system_clock_ms())
        future = MessageChannel("chat", "rogue", now_ms=system_clock_ms() + 10 * 86_400_000)
        for frame in (
            b"\xff\xfe garbage",
            b"\x0a" * 2_000_000,  # oversized
            b"\x0a\x05ab",  # truncated
            other.send(b"not for chat", system_clock_ms()).data,  # wrong channel
            future.send(b"from the future", future.lamport_timestamp).data,
            encode(Message("rogue", "x", "chat", 1 << 63, content=b"beyond any clock")),
        ):
            await rogue.publish("/sds/1/chat", frame)
        await a.send(b"still fine")
        await asyncio.wait_for(converged([a, b], 1), PATIENCE_S)
        assert b.rejected == {
            "malformed SDS message": 2,
            "message of N bytes exceeds the limit of N": 1,
            "wrong channel": 1,
            "lamport timestamp too far in the future": 1,
            "lamport timestamp beyond any plausible clock": 1,
        }
        # Counted by the reasons themselves, not by text cut out of the errors.
        assert {type(reason) for reason in b.rejected} == {RejectReason, DropReason}
        assert b.channel.log_ids() == a.channel.log_ids()  # nothing bad got in
        await a.stop()
        await b.stop()

    with caplog.at_level(logging.DEBUG, logger="sdsync.runtime"):
        asyncio.run(scenario())
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "p1" in r.message]
    # Each reason once at WARNING, repeats only at DEBUG.
    assert len(warned) == 5
    assert any("wrong channel" in r.message for r in warned)


def test_gives_up_after_max_attempts_and_reports_send_failed() -> None:
    async def scenario() -> None:
        net = MemoryNetwork(Faults(loss=1.0), seed=1)
        runtime = RuntimeConfig(
            sync_interval_ms=10_000,
            resend_interval_ms=20,
            resend_backoff=1.0,
            resend_jitter=0.0,
            max_attempts=3,
        )
        lonely = ReliableChannel(net.transport("a"), "chat", "a", runtime=runtime, config=CONFIG)
        async with lonely:
            mid = await lonely.send(b"anyone?")
            events = lonely.events()
            while True:
                event = await asyncio.wait_for(anext(events), PATIENCE_S)
                if isinstance(event, SendFailed):
                    break
            assert event.message_id == mid
            assert lonely.channel.outgoing_ids() == []
            assert net.copies == 0  # nobody else subscribed: nothing was ever carried

    asyncio.run(scenario())


def test_partition_heals_and_logs_merge() -> None:
    async def scenario() -> None:
        net = MemoryNetwork(Faults(latency_ms=2), seed=3)
        members = group(net, 4)
        for m in members:
            await m.start()
        net.partition(["p0", "p1"], ["p2", "p3"])
        for i, m in enumerate(members):
            await m.send(f"during split {i}".encode())
        await asyncio.sleep(0.3)
        assert members[0].channel.log_ids() != members[2].channel.log_ids()
        net.heal()
        await asyncio.wait_for(converged(members, 4), PATIENCE_S)
        for m in members:
            await m.stop()

    asyncio.run(scenario())


def test_forged_histories_are_evicted_under_the_byte_budget_and_the_app_hears_it() -> None:
    """Issue 27 row 18: a peer's messages naming thousands of never-sent ids give way to an
    honest one under the byte budget; the application sees each eviction."""
    budget = dataclasses.replace(CONFIG, max_incoming_buffer_bytes=8 << 20)  # 2 forgeries

    async def scenario() -> None:
        net = MemoryNetwork(seed=1)
        (b,) = [ReliableChannel(net.transport("b"), "chat", "b", config=budget, runtime=FAST)]
        await b.start()
        rogue = net.transport("rogue")
        now = system_clock_ms()
        for i in range(4):
            history = tuple(HistoryEntry(f"never-{i}-{j}", None, None) for j in range(4_096))
            forged = Message("rogue", f"forged-{i}", "chat", now, history, None, b"x" * 100_000)
            await rogue.publish("/sds/1/chat", encode(forged))
        gap = HistoryEntry("gap", None, "rogue")
        await rogue.publish(
            "/sds/1/chat", encode(Message("rogue", "h", "chat", now, (gap,), None, b"hi"))
        )
        evicted: list[str] = []
        async with asyncio.timeout(PATIENCE_S):
            async for event in b.events():
                if isinstance(event, MessageEvicted):
                    assert event.reason == DropReason.INCOMING_BUFFER_BYTES
                    evicted.append(event.message_id)
                if "h" in b.channel.incoming_ids() and len(evicted) == 2:
                    break
        assert evicted == ["forged-0", "forged-1"]
        assert b.channel.incoming_bytes() <= budget.max_incoming_buffer_bytes
        await b.stop()

    asyncio.run(scenario())
