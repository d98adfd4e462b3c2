"""A store node archiving what it hears over the libp2p relay (real gossipsub on loopback)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from storetest import running
from testdeps import require

from sdsync.store import SqlArchive

libp2p = require("sdsync.transport.libp2p", "needs the 'p2p' extra")

TOPIC = "/sds/1/store-test"
PATIENCE_S = 30.0  # a liveness bound; this normally takes a second or two


def test_messages_heard_on_the_relay_are_archived_under_their_hash(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def scenario() -> None:
        publisher = libp2p.Libp2pTransport()
        await publisher.start()
        relay = libp2p.Libp2pTransport(peers=publisher.listen_addrs)
        await relay.start()
        publisher.subscribe(TOPIC)  # join the topic so that a mesh forms
        try:
            async with running(
                sqlite_archive, tmp_path, relay=relay, relay_topics=(TOPIC,)
            ) as node:
                assert await publisher.wait_for_mesh(TOPIC, 1, PATIENCE_S)
                hints = [await publisher.publish(TOPIC, f"sds {i}".encode()) for i in range(5)]
                async with asyncio.timeout(PATIENCE_S):
                    while sqlite_archive.count() < 5:
                        await asyncio.sleep(0.02)
                stored = sqlite_archive.get(hints)
                assert [m.message.payload for m in stored] == [
                    f"sds {i}".encode() for i in range(5)
                ]
                assert all(m.pubsub_topic == TOPIC for m in stored)
                ingested = node.metrics.registry.get_sample_value(
                    "sdsync_store_ingested_messages_total", {"source": "relay"}
                )
                assert ingested == 5
        finally:
            await relay.close()
            await publisher.close()

    asyncio.run(scenario())
