"""A store node on a Waku relay (real gossipsub on loopback): it archives every message on
its shard under the real pubsub topic, and answers ``/vac/waku/store-query/3.0.0`` on the
same host."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

from storetest import running
from testdeps import require

from sdsync.store import SqlArchive, StoreQuery, WakuStoreClient
from sdsync.waku.metadata.rpc import WakuMetadata
from sdsync.waku.relay.topics import default_content_topic
from sdsync.waku.store.rpc import MAX_STORE_RESPONSE_BYTES

libp2p = require("sdsync.transport.libp2p", "needs the 'p2p' extra")

CHANNEL = "/sds/1/store-test"  # content topic /sds/1/store-test/proto
SHARD = "/waku/2/rs/1/7"  # every /sds/1/... content topic, autosharded on cluster 1
OTHER_CONTENT = "/other/1/x/proto"  # another application on the same shard
PATIENCE_S = 30.0  # a liveness bound; this normally takes a second or two


def other_application(topic: str) -> str:
    return OTHER_CONTENT if topic == SHARD else default_content_topic(topic)


def test_a_waku_store_archives_its_shard_and_answers_store_queries(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def scenario() -> None:
        waku = libp2p.WakuRelayConfig()
        publisher = libp2p.Libp2pTransport(waku=waku, content_topic=other_application)
        await publisher.start()
        relay = libp2p.Libp2pTransport(waku=waku, peers=publisher.listen_addrs)
        await relay.start()
        publisher.subscribe(CHANNEL)  # join the shard so that a mesh forms
        try:
            async with running(sqlite_archive, tmp_path, waku=relay, relay_topics=(SHARD,)) as node:
                assert await publisher.wait_for_mesh(CHANNEL, 1, PATIENCE_S)
                hints = [await publisher.publish(CHANNEL, f"sds {i}".encode()) for i in range(5)]
                hints.append(await publisher.publish(SHARD, b"another application"))
                async with asyncio.timeout(PATIENCE_S):
                    while sqlite_archive.count() < 6:
                        await asyncio.sleep(0.02)
                stored = sqlite_archive.get(hints)
                assert [m.message.payload for m in stored] == [
                    *(f"sds {i}".encode() for i in range(5)),
                    b"another application",
                ]
                assert {m.pubsub_topic for m in stored} == {SHARD}
                ingested = node.metrics.registry.get_sample_value(
                    "sdsync_store_ingested_messages_total", {"source": "relay"}
                )
                assert ingested == 6
                # The host announces the shard (js-waku picks store peers by it) and
                # answers store queries from the archive.
                assert await relay.metadata() == WakuMetadata(cluster_id=1, shards=(7,))
                request = functools.partial(
                    publisher.request,
                    relay.listen_addrs[0],
                    max_response_bytes=MAX_STORE_RESPONSE_BYTES,
                )
                client = WakuStoreClient(request)
                page = await client.query(
                    StoreQuery(
                        pubsub_topic=SHARD,
                        content_topics=("/sds/1/store-test/proto",),
                        include_data=True,
                    )
                )
                assert sorted(page.hashes) == sorted(hints[:5])
                assert page.cursor is None
        finally:
            await relay.close()
            await publisher.close()

    asyncio.run(scenario())
