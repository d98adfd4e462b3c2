"""End to end: a ReliableChannel fills a gap from a real store node, through its REST API
(HttpStoreClient) or over libp2p (WakuStoreClient, /vac/waku/store-query/3.0.0).

Bob misses alice's first message; the store has it. Her second message names it in its
causal history with its retrieval hint, the Waku message hash. Bob has no other way to
get it — resends are minutes away and SDS-R is off — so delivering it proves the runtime
asked the store.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from storetest import TOKEN, running
from testdeps import require

from sdsync.core import ChannelConfig, MessageDelivered, RepairConfig
from sdsync.runtime import ReliableChannel, RuntimeConfig
from sdsync.store import HttpStoreClient, SqlArchive, StoredMessage, WakuStoreClient
from sdsync.testing.memory import MemoryNetwork
from sdsync.waku.node import Received, Transport
from sdsync.wire import decode
from sdsync.wire.waku import WakuMessage

RUNTIME = RuntimeConfig(
    sync_interval_ms=600_000,
    resend_interval_ms=600_000,
    resend_possibly_acknowledged_ms=600_000,
    incoming_sweep_ms=50,
    store_query_ms=100,
)
CONFIG = ChannelConfig(causal_history_size=5, repair=RepairConfig(enabled=False))
# A liveness bound, not a performance assertion.
PATIENCE_S = 60
SHARD = "/waku/2/rs/1/7"  # where every /sds/1/... content topic autoshards on cluster 1


class WakuPublisher:
    """Publishes SDS bytes as a Waku relay would: the hint is the Waku message hash, and
    a store hears every message. ``silent`` publishes reach the store only."""

    def __init__(self, inner: Transport, store: HttpStoreClient) -> None:
        self.inner = inner
        self.store = store
        self.silent = False

    async def publish(self, topic: str, data: bytes) -> bytes | None:
        waku = WakuMessage(data, f"{topic}/proto", timestamp=time.time_ns())
        stored = StoredMessage.of(topic, waku)
        await self.store.post([stored])
        if not self.silent:
            await self.inner.publish(topic, data)
        return stored.message_hash

    def subscribe(self, topic: str) -> AsyncIterator[Received]:
        return self.inner.subscribe(topic)

    async def close(self) -> None:
        await self.inner.close()


async def deliveries(channel: ReliableChannel, count: int) -> list[str]:
    """The ids of the first ``count`` messages ``channel`` delivers."""
    delivered: list[str] = []
    async for event in channel.events():
        if isinstance(event, MessageDelivered):
            delivered.append(event.message_id)
            if len(delivered) == count:
                break
    return delivered


@asynccontextmanager
async def alice_to_bob_via_store(
    archive: SqlArchive,
    tmp_path: Path,
    config: ChannelConfig,
    bob_runtime: RuntimeConfig,
    bob_state_dir: Path | None = None,
) -> AsyncIterator[tuple[WakuPublisher, ReliableChannel, ReliableChannel]]:
    """Alice and bob, started, on a memory network; alice's publisher posts to a store
    node through its REST API and bob reads it from there."""
    net = MemoryNetwork(seed=1)
    async with (
        running(archive, tmp_path) as node,
        HttpStoreClient(node.url, token=TOKEN) as writer,
        HttpStoreClient(node.url) as reader,
    ):
        publisher = WakuPublisher(net.transport("alice"), writer)
        alice = ReliableChannel(
            publisher, "chat", "alice", config=config, runtime=RUNTIME, rng=random.Random(1)
        )
        bob = ReliableChannel(
            net.transport("bob"),
            "chat",
            "bob",
            config=config,
            runtime=bob_runtime,
            store=reader,
            rng=random.Random(2),
            state_dir=bob_state_dir,
        )
        await alice.start()
        await bob.start()
        yield publisher, alice, bob


def test_a_missing_dependency_is_fetched_from_the_store(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with alice_to_bob_via_store(sqlite_archive, tmp_path, CONFIG, RUNTIME) as (
            publisher,
            alice,
            bob,
        ):
            publisher.silent = True
            first = await alice.send(b"only the store has this")
            publisher.silent = False
            second = await alice.send(b"this names the first")
            delivered = await asyncio.wait_for(deliveries(bob, 2), PATIENCE_S)
            assert delivered == [first, second]
            assert bob.channel.log_ids() == [first, second]
            await bob.stop()
            await alice.stop()

    asyncio.run(scenario())


class MissesTheFirst:
    """Bob's side of a Waku relay whose first frame his application never gets (as
    ``--drop-rate`` would drop it); relaying is the transport's and goes on."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.missed: list[Received] = []

    async def publish(self, topic: str, data: bytes) -> bytes | None:
        return await self.inner.publish(topic, data)

    async def subscribe(self, topic: str) -> AsyncIterator[Received]:
        async for frame in self.inner.subscribe(topic):
            if not self.missed:
                self.missed.append(frame)
                continue
            yield frame


def test_a_missing_dependency_is_fetched_from_a_waku_store_peer(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    libp2p = require("sdsync.transport.libp2p", "needs the 'p2p' extra")

    async def scenario() -> None:
        waku = libp2p.WakuRelayConfig()
        alice_host = libp2p.Libp2pTransport(waku=waku)
        await alice_host.start()
        bob_host = libp2p.Libp2pTransport(waku=waku, peers=alice_host.listen_addrs)
        await bob_host.start()
        relay = libp2p.Libp2pTransport(
            waku=waku, peers=[*alice_host.listen_addrs, *bob_host.listen_addrs]
        )
        await relay.start()
        bob_side = MissesTheFirst(bob_host)
        alice = ReliableChannel(
            alice_host, "chat", "alice", config=CONFIG, runtime=RUNTIME, rng=random.Random(1)
        )
        bob = ReliableChannel(
            bob_side,
            "chat",
            "bob",
            config=CONFIG,
            runtime=RUNTIME,
            store=WakuStoreClient.over(bob_host, relay.listen_addrs[0]),
            rng=random.Random(2),
        )
        try:
            async with running(sqlite_archive, tmp_path, waku=relay, relay_topics=(SHARD,)):
                await alice.start()
                await bob.start()
                # Bob and the store are in alice's mesh before she sends.
                assert await alice_host.wait_for_mesh(alice.topic, 2, PATIENCE_S)
                first = await alice.send(b"bob misses this one")
                second = await alice.send(b"this names the first")
                delivered = await asyncio.wait_for(deliveries(bob, 2), PATIENCE_S)
                # What bob missed is alice's first message, and only the store gave it.
                (missed,) = bob_side.missed
                assert decode(missed.data).message_id == first
                assert missed.retrieval_hint is not None
                assert [m.message_hash for m in sqlite_archive.get([missed.retrieval_hint])] == [
                    missed.retrieval_hint
                ]
                # Once: nothing more is delivered, however often the store is asked.
                await asyncio.sleep(0.5)
                assert delivered == [first, second]
                assert bob.channel.log_ids() == [first, second]
                assert not [e for e in bob.pending_events() if isinstance(e, MessageDelivered)]
        finally:
            await bob.close()
            await alice.close()
            await relay.close()
            await bob_host.close()
            await alice_host.close()

    asyncio.run(scenario())


CATCHING_UP = RuntimeConfig(
    sync_interval_ms=600_000,  # nothing but the store can tell bob anything
    resend_interval_ms=600_000,
    resend_possibly_acknowledged_ms=600_000,
    incoming_sweep_ms=50,
    store_query_ms=100,
    store_catchup_interval_ms=200,
    store_catchup_page_size=2,  # three messages: two pages
)


def test_a_message_nothing_names_is_caught_up_from_the_store(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    """Bob misses three messages and every message naming them, so he never learns their
    ids (by-hint retrieval has nothing to ask for); the periodic catch-up finds them,
    delivered once each, in causal order, whatever the catch-ups after it find again."""

    async def scenario() -> None:
        history2 = ChannelConfig(causal_history_size=2, repair=RepairConfig(enabled=False))
        async with alice_to_bob_via_store(
            sqlite_archive, tmp_path, history2, CATCHING_UP, tmp_path / "bob"
        ) as (publisher, alice, bob):
            publisher.silent = True
            missed = [await alice.send(f"only the store has #{i}".encode()) for i in range(3)]
            publisher.silent = False
            delivered = await asyncio.wait_for(deliveries(bob, 3), PATIENCE_S)
            assert delivered == missed
            assert bob.catch_ups >= 1 and bob.caught_up_messages == 3
            # Later catch-ups overlap the first: nothing is delivered twice.
            live = await alice.send(b"heard live, names the last two")
            assert await asyncio.wait_for(deliveries(bob, 1), PATIENCE_S) == [live]
            done = bob.catch_ups
            while bob.catch_ups < done + 2:
                await asyncio.sleep(0.05)
            assert not [e for e in bob.pending_events() if isinstance(e, MessageDelivered)]
            assert bob.channel.log_ids() == [*missed, live]
            assert bob.caught_up_messages == 3
            await bob.close()
            await alice.close()

    asyncio.run(scenario())
