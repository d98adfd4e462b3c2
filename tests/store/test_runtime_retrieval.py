"""End to end: a ReliableChannel fills a gap from a real store node through HttpStoreClient.

Alice's first message never reaches the network; only the store archives it (as a Waku
relay would have). Her second message names it in its causal history with its retrieval
hint, the Waku message hash. Bob has no other way to get it — resends are minutes away
and SDS-R is off — so delivering it proves the runtime asked the store's REST API.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

from storetest import TOKEN, running

from sdsync.core import ChannelConfig, MessageDelivered, RepairConfig
from sdsync.runtime import ReliableChannel, RuntimeConfig
from sdsync.store import HttpStoreClient, SqlArchive, StoredMessage
from sdsync.transport import MemoryNetwork
from sdsync.transport.base import Received, Transport
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


def test_a_missing_dependency_is_fetched_from_the_store(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def scenario() -> None:
        net = MemoryNetwork(seed=1)
        async with (
            running(sqlite_archive, tmp_path) as node,
            HttpStoreClient(node.url, token=TOKEN) as writer,
            HttpStoreClient(node.url) as reader,
        ):
            publisher = WakuPublisher(net.transport("alice"), writer)
            alice = ReliableChannel(
                publisher, "chat", "alice", config=CONFIG, runtime=RUNTIME, rng=random.Random(1)
            )
            bob = ReliableChannel(
                net.transport("bob"),
                "chat",
                "bob",
                config=CONFIG,
                runtime=RUNTIME,
                store=reader,
                rng=random.Random(2),
            )
            await alice.start()
            await bob.start()
            publisher.silent = True
            first = await alice.send(b"only the store has this")
            publisher.silent = False
            second = await alice.send(b"this names the first")
            delivered: list[str] = []

            async def watch() -> None:
                async for event in bob.events():
                    if isinstance(event, MessageDelivered):
                        delivered.append(event.message_id)
                        if len(delivered) == 2:
                            return

            await asyncio.wait_for(watch(), PATIENCE_S)
            assert delivered == [first, second]
            assert bob.channel.log_ids() == [first, second]
            await bob.stop()
            await alice.stop()

    asyncio.run(scenario())
