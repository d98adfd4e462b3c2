"""Filter under attack (issue 27, row 13): fresh identities cost nothing.

An attacker subscribes from one host (or a few) under a new peer id each time.  The
table used to count peer ids only: 1,000 of them filled it and every honest SUBSCRIBE
was answered 503 until the attackers' subscriptions expired, 300 s after they left.
Now a host holds at most ``max_peers_per_host`` subscriptions, a full table makes room
for a smaller host, and subscribers whose connection is gone are dropped within
``disconnect_grace_s`` plus one ``liveness_interval_s``.  Each refusal and drop is
counted.  The node is a real StoreNode on an in-memory Waku node (MemoryWakuNode); each
subscriber is a node of its own, on the IP it is given, connected until it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from storetest import running

from sdsync.store import SqlArchive
from sdsync.store.light_clients import LightClientConfig
from sdsync.store.node import StoreNode
from sdsync.testing.memory import MemoryNetwork
from sdsync.testing.memory_waku import MemoryWakuNode, memory_peer_id
from sdsync.waku.filter.rpc import (
    FILTER_SUBSCRIBE_PROTOCOL,
    FilterSubscribeRequest,
    FilterSubscribeResponse,
    FilterSubscribeType,
)
from sdsync.waku.filter.service import FilterLimits
from sdsync.waku.lightpush.service import ServedTopics

SHARD = "/waku/2/rs/1/7"
TOPIC = "/app/1/x/proto"
ATTACKERS = 1000  # nwaku's max_peers: enough to fill the table of the unfixed node
PATIENCE_S = 30.0  # a liveness bound, not a timing
SUBSCRIBE = FilterSubscribeRequest("id", FilterSubscribeType.SUBSCRIBE, SHARD, (TOPIC,)).to_bytes()


class HostileNet(MemoryNetwork):
    """A network with a store node and, as they come, subscribers on the hosts they say."""

    def __init__(self) -> None:
        super().__init__()
        self.store = self.waku_node("store")
        self.subscribers: dict[str, MemoryWakuNode] = {}

    async def subscribe(self, peer: str, ip: str) -> int:
        """``peer`` (a node made at its first call) subscribes from ``ip``; the status it
        is answered."""
        if peer not in self.subscribers:
            self.subscribers[peer] = self.waku_node(peer, ip=ip)
        address = self.store.listen_addrs[0]
        answer = await self.subscribers[peer].request(address, FILTER_SUBSCRIBE_PROTOCOL, SUBSCRIBE)
        return FilterSubscribeResponse.from_bytes(answer).status_code

    def serving(
        self, archive: SqlArchive, tmp: Path, config: LightClientConfig
    ) -> contextlib.AbstractAsyncContextManager[StoreNode]:
        """The store node, serving light clients on ``store``."""
        return running(archive, tmp, waku=self.store, serve_light=True, light_clients=config)


def sample(node: StoreNode, name: str, labels: dict[str, str]) -> float:
    return node.metrics.registry.get_sample_value(name, labels) or 0.0


def refused(node: StoreNode, reason: str) -> float:
    labels = {"route": FILTER_SUBSCRIBE_PROTOCOL, "reason": reason}
    return sample(node, "sdsync_store_refused_total", labels)


def dropped(node: StoreNode, reason: str) -> float:
    return sample(node, "sdsync_store_filter_subscriptions_dropped_total", {"reason": reason})


def light(**limits: float) -> LightClientConfig:
    return LightClientConfig(
        served=ServedTopics(((SHARD, None),)),
        filter=FilterLimits(**limits),  # type: ignore[arg-type]
        liveness_interval_s=0.2,
    )


def test_fresh_identities_from_one_host_do_not_lock_out_an_honest_subscriber(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    net = HostileNet()

    async def scenario() -> None:
        async with running(
            sqlite_archive, tmp_path, waku=net.store, serve_light=True, light_clients=light()
        ) as node:
            answers = [await net.subscribe(f"evil-{i}", "10.6.6.6") for i in range(ATTACKERS)]
            assert answers.count(200) == 100  # max_peers_per_host
            assert refused(node, "too_many_subscribers_per_host") == ATTACKERS - 100
            assert await net.subscribe("honest", "192.0.2.7") == 200
            assert node.light_clients is not None and len(node.light_clients.filters) == 101

    asyncio.run(scenario())


def test_a_full_table_makes_room_for_a_new_host(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    net = HostileNet()

    async def scenario() -> None:
        async with running(
            sqlite_archive, tmp_path, waku=net.store, serve_light=True, light_clients=light()
        ) as node:
            # Ten attacking hosts, a hundred identities each: the table is full.
            for i in range(ATTACKERS):
                assert await net.subscribe(f"evil-{i}", f"10.6.6.{i % 10}") == 200
            assert await net.subscribe("honest", "192.0.2.7") == 200
            assert dropped(node, "fair_share") == 1
            assert (
                node.light_clients is not None
                and memory_peer_id("honest") in node.light_clients.filters
            )
            # The stalest of the largest host made room.
            assert memory_peer_id("evil-0") not in node.light_clients.filters

    asyncio.run(scenario())


def test_an_honest_subscriber_on_the_attackers_host_gets_in_once_they_left(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    """The loopback case: attackers and the honest peer share one address."""
    net = HostileNet()
    grace_s = 0.5

    async def scenario() -> None:
        config = light(disconnect_grace_s=grace_s)
        async with running(
            sqlite_archive, tmp_path, waku=net.store, serve_light=True, light_clients=config
        ) as node:
            for i in range(ATTACKERS):
                await net.subscribe(f"evil-{i}", "127.0.0.1")
            assert await net.subscribe("honest", "127.0.0.1") == 503
            for i in range(ATTACKERS):
                await net.subscribers[f"evil-{i}"].close()
            left = time.monotonic()
            async with asyncio.timeout(PATIENCE_S):  # bound: grace + one interval
                while await net.subscribe("honest", "127.0.0.1") != 200:
                    await asyncio.sleep(0.05)
            assert time.monotonic() - left >= grace_s  # not before the grace
            assert dropped(node, "disconnected") == 100
            assert refused(node, "too_many_subscribers_per_host") >= ATTACKERS - 100 + 1
            assert node.light_clients is not None and len(node.light_clients.filters) == 1

    asyncio.run(scenario())
