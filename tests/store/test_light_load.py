"""Our store node serves 100 Python light clients at once, each receiving every push.

One store node (a Libp2pTransport as relay and light host, in process) and 100
WakuLightTransports, each its own libp2p host subscribed by Filter to the same content
topic; one of them LightPushes 20 messages. Every other client gets all 20, each once
and in order, and the node drops no push for a full queue. Deadlines are liveness
bounds only; the time taken is printed, not asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

from storetest import running
from testdeps import require

from sdsync.store import SqlArchive
from sdsync.store.light_clients import LightClientConfig
from sdsync.transport.settings import ConnectionLimits
from sdsync.waku.lightpush.service import ServedTopics
from sdsync.waku.node import Received

require("sdsync.transport.libp2p", "needs the 'p2p' extra")

from sdsync.transport.libp2p import Libp2pTransport  # noqa: E402
from sdsync.transport.waku_light import LightTiming, WakuLightTransport  # noqa: E402

SHARD = "/waku/2/rs/1/7"
TOPIC = "/sds/1/load"
CLIENTS = 100
MESSAGES = 20
PATIENCE_S = 180.0  # liveness bound for the whole run
# No pings during the run: the load is the pushes.
TIMING = LightTiming(ping_interval_s=600.0, request_timeout_s=60.0, retry_min_s=0.5)
#: The clients all dial from this machine: its address is not held to 5 connections.
LOCAL_CLIENTS = ConnectionLimits(exempt_ips=frozenset({"127.0.0.1"}))


@contextlib.asynccontextmanager
async def clients(address: str, count: int) -> AsyncIterator[list[WakuLightTransport]]:
    started: list[WakuLightTransport] = []
    try:
        for _ in range(count):
            light = WakuLightTransport([address], topics=[TOPIC], timing=TIMING)
            started.append(light)
            await light.start()
        yield started
    finally:
        await asyncio.gather(*(light.close() for light in started))


async def collect(frames: AsyncIterator[Received], count: int) -> list[bytes]:
    return [(await anext(frames)).data for _ in range(count)]


def test_a_store_node_pushes_every_message_to_100_light_clients(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    # A hundred hosts connecting at once: py-libp2p's churn is not the news here.
    logging.getLogger("libp2p").setLevel(logging.ERROR)
    light = LightClientConfig(served=ServedTopics(((SHARD, None),)))
    pushes: dict[str, float | None] = {}

    async def scenario() -> None:
        async with (
            Libp2pTransport(limits=LOCAL_CLIENTS) as host,
            running(
                sqlite_archive,
                tmp_path,
                waku=host,
                serve_light=True,
                relay_topics=(SHARD,),
                light_clients=light,
            ) as node,
            clients(host.listen_addrs[0], CLIENTS) as group,
        ):
            async with asyncio.timeout(PATIENCE_S):
                frames = [c.subscribe(TOPIC) for c in group]
                for client in group:
                    assert await client.wait_for_mesh(TOPIC, 1, PATIENCE_S)
                assert node.light_clients is not None and len(node.light_clients.filters) == CLIENTS
                sender = group[0]
                started = time.monotonic()
                payloads = [f"message {i}".encode() for i in range(MESSAGES)]
                for payload in payloads:
                    await sender.lightpush(TOPIC, payload)
                received = await asyncio.gather(
                    *(collect(f, MESSAGES) for f in frames[1:]),
                )
                taken = time.monotonic() - started
            # Each once and in order: a push the node wrote again on a fresh stream (its
            # first write failing, though it may have arrived) is dropped as a duplicate.
            assert all(got == payloads for got in received)
            assert all(c.received == MESSAGES for c in group[1:])
            sample = node.metrics.registry.get_sample_value
            for outcome in ("sent", "failed", "dropped"):
                pushes[outcome] = sample("sdsync_store_filter_pushes_total", {"outcome": outcome})
            assert not pushes["dropped"]
            duplicates = sum(c.duplicates for c in group[1:])
            print(
                f"\n{CLIENTS} light clients x {MESSAGES} messages: "
                f"{(CLIENTS - 1) * MESSAGES} deliveries in {taken:.1f} s from the first push "
                f"to the last delivery; Filter pushes {pushes}, duplicates {duplicates}"
            )

    asyncio.run(scenario())
