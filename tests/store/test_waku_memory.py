"""The store's Waku protocols end to end through the Waku node contract, in memory.

A StoreNode runs on a MemoryWakuNode (sdsync.testing.memory_waku) and its peers are
nodes of the same MemoryNetwork: store query asked by WakuStoreClient, Filter subscribe,
push, ping and unsubscribe, and the light client (WakuLightTransport, its host a memory
node) publishing by LightPush, hearing by Filter and reading the store. No py-libp2p, no
sockets but the node's HTTP API: each runs in a fraction of a second. The same paths
over py-libp2p: test_waku_store.py, tests/transport/test_waku_light.py; against js-waku
and go-waku: tests/interop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from storetest import PUBSUB, in_order, make_messages, running

from sdsync.errors import LocalProtocolError
from sdsync.store import (
    NodeConfig,
    SqlArchive,
    StoreNode,
    StoreQuery,
    StoreUnavailableError,
    WakuStoreClient,
)
from sdsync.store.light_clients import LightClientConfig
from sdsync.testing.memory import MemoryNetwork
from sdsync.testing.memory_waku import MemoryWakuNode
from sdsync.transport.waku_light import WakuLightTransport
from sdsync.waku.filter.rpc import (
    FILTER_PUSH_PROTOCOL,
    FILTER_SUBSCRIBE_PROTOCOL,
    FilterSubscribeRequest,
    FilterSubscribeResponse,
    FilterSubscribeType,
    MessagePush,
)
from sdsync.waku.lightpush.service import ServedTopics
from sdsync.waku.node import Received
from sdsync.wire.waku import WakuMessage

SHARD = "/waku/2/rs/1/7"  # where /sds/1/chan/proto autoshards on cluster 1
CHANNEL = "/sds/1/chan"
CONTENT = CHANNEL + "/proto"
PATIENCE_S = 30.0  # a liveness bound, not a timing


@contextlib.asynccontextmanager
async def store_on(
    net: MemoryNetwork, archive: SqlArchive, tmp: Path, *, light: bool = False
) -> AsyncIterator[tuple[StoreNode, MemoryWakuNode]]:
    """A store node on the memory node "store", relaying and serving SHARD."""
    waku = net.waku_node("store")
    config = LightClientConfig(served=ServedTopics(((SHARD, None),)))
    async with running(
        archive, tmp, waku=waku, serve_light=light, relay_topics=(SHARD,), light_clients=config
    ) as node:
        yield node, waku


async def until_archived(archive: SqlArchive, count: int) -> None:
    async with asyncio.timeout(PATIENCE_S):
        while archive.count() < count:
            await asyncio.sleep(0.005)


def test_store_query_pages_fetches_and_refuses_through_the_contract(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    messages = in_order(make_messages(45, seed=9))
    sqlite_archive.insert(messages)
    net = MemoryNetwork()

    async def scenario() -> None:
        async with store_on(net, sqlite_archive, tmp_path) as (_, store):
            asker = net.waku_node("asker")
            client = WakuStoreClient.over(asker, store.listen_addrs[0])
            query = StoreQuery(pubsub_topic=PUBSUB, include_data=True, pagination_limit=20)
            pages = [page async for page in client.pages(query)]
            assert [len(p.messages) for p in pages] == [20, 20, 5]
            assert [m for p in pages for m in p.messages] == messages
            wanted = [messages[3].message_hash, messages[40].message_hash]
            page = await client.query(StoreQuery(message_hashes=wanted, include_data=True))
            assert sorted(m.message_hash for m in page.messages) == sorted(wanted)
            # A peer that serves no store, and one that is gone: unavailable, not a crash.
            other = WakuStoreClient.over(asker, net.waku_node("no-store").listen_addrs[0])
            with pytest.raises(StoreUnavailableError, match="does not speak"):
                await other.query(query)
            await asker.close()
            with pytest.raises(LocalProtocolError, match="closed"):  # our misuse
                await client.query(query)

    asyncio.run(scenario())


def test_filter_subscribe_push_ping_and_unsubscribe(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    net = MemoryNetwork()
    pushed: asyncio.Queue[MessagePush] = asyncio.Queue()

    async def take(peer: str, frame: bytes) -> None:
        pushed.put_nowait(MessagePush.from_bytes(frame))

    async def scenario() -> None:
        async with store_on(net, sqlite_archive, tmp_path, light=True) as (_, store):
            subscriber, relay = net.waku_node("subscriber"), net.waku_node("relay")
            await subscriber.serve_pushes(FILTER_PUSH_PROTOCOL, take)

            async def ask(kind: FilterSubscribeType, *topics: str) -> int:
                request = FilterSubscribeRequest("r", kind, SHARD if topics else None, topics)
                answer = await subscriber.request(
                    store.listen_addrs[0], FILTER_SUBSCRIBE_PROTOCOL, request.to_bytes()
                )
                return FilterSubscribeResponse.from_bytes(answer).status_code

            assert await ask(FilterSubscribeType.SUBSCRIBER_PING) == 404  # not yet
            assert await ask(FilterSubscribeType.SUBSCRIBE, CONTENT) == 200
            assert await ask(FilterSubscribeType.SUBSCRIBER_PING) == 200
            first = WakuMessage(b"first", CONTENT, timestamp=1)
            await relay.publish_message(SHARD, WakuMessage(b"other", "/x/1/y/proto", timestamp=1))
            await relay.publish_message(SHARD, first)
            async with asyncio.timeout(PATIENCE_S):
                push = await pushed.get()
            assert push == MessagePush(waku_message=first, pubsub_topic=SHARD)
            assert await ask(FilterSubscribeType.UNSUBSCRIBE, CONTENT) == 200
            await relay.publish_message(SHARD, WakuMessage(b"after", CONTENT, timestamp=2))
            await until_archived(sqlite_archive, 3)  # heard, archived, not pushed
            assert pushed.empty()
            assert await ask(FilterSubscribeType.SUBSCRIBER_PING) == 404

    asyncio.run(scenario())


def test_a_light_client_publishes_hears_and_reads_the_store_through_its_service(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    net = MemoryNetwork()

    async def scenario() -> None:
        async with store_on(net, sqlite_archive, tmp_path, light=True) as (_, store):
            relay = net.waku_node("relay")
            relayed = relay.subscribe(CHANNEL)
            light = WakuLightTransport(
                [store.listen_addrs[0]], host=net.waku_node("light", relay=False)
            )
            async with light:
                heard = light.subscribe(CHANNEL)
                assert await light.wait_for_mesh(CHANNEL, 1, PATIENCE_S)
                # Published by LightPush: relayed and archived by the service.
                hint = await light.lightpush(CHANNEL, b"from the light client")
                async with asyncio.timeout(PATIENCE_S):
                    assert await anext(relayed) == Received(b"from the light client", hint)
                await until_archived(sqlite_archive, 1)
                # Published on relay: pushed to the light client by Filter.
                other = await relay.publish(CHANNEL, b"from relay")
                async with asyncio.timeout(PATIENCE_S):
                    assert await anext(heard) == Received(b"from relay", other)
                # And the service's store, asked over the light client's host.
                client = WakuStoreClient.over(light, store.listen_addrs[0])
                await until_archived(sqlite_archive, 2)
                page = await client.query(StoreQuery(content_topics=(CONTENT,)))
                assert sorted(page.hashes) == sorted([hint, other])
            assert light.duplicates == 1  # its own publication, pushed back once

    asyncio.run(scenario())


def test_light_services_need_a_waku_node(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    with pytest.raises(LocalProtocolError, match="Waku node"):
        StoreNode(sqlite_archive, NodeConfig(data_dir=tmp_path), light_clients=True)
