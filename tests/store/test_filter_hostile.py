"""Filter under attack (issue 27, row 13): fresh identities cost nothing.

An attacker subscribes from one host (or a few) under a new peer id each time.  The
table used to count peer ids only: 1,000 of them filled it and every honest SUBSCRIBE
was answered 503 until the attackers' subscriptions expired, 300 s after they left.
Now a host holds at most ``max_peers_per_host`` subscriptions, a full table makes room
for a smaller host, and subscribers whose connection is gone are dropped within
``disconnect_grace_s`` plus one ``liveness_interval_s``.  Each refusal and drop is
counted.  The node is a real StoreNode; the libp2p host is a fake that says which IP
each peer connects from and who is connected.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from storetest import running

from sdsync.store import SqlArchive
from sdsync.store.filter import FilterLimits
from sdsync.store.light import LightConfig
from sdsync.store.lightpush import ServedTopics
from sdsync.store.node import StoreNode
from sdsync.wire.waku import WakuMessage
from sdsync.wire.waku_protocols import (
    FILTER_SUBSCRIBE_PROTOCOL,
    FilterSubscribeRequest,
    FilterSubscribeResponse,
    FilterSubscribeType,
)

SHARD = "/waku/2/rs/1/7"
TOPIC = "/app/1/x/proto"
ATTACKERS = 1000  # nwaku's max_peers: enough to fill the table of the unfixed node
PATIENCE_S = 30.0  # a liveness bound, not a timing
SUBSCRIBE = FilterSubscribeRequest("id", FilterSubscribeType.SUBSCRIBE, SHARD, (TOPIC,)).to_bytes()


@dataclass
class HostileNet:
    """A LightHost: each peer's IP is in ``hosts``; ``connected`` says who is."""

    hosts: dict[str, str] = field(default_factory=dict)
    connected: set[str] = field(default_factory=set)
    handlers: dict[str, object] = field(default_factory=dict)

    async def serve(self, protocol_id: str, handler: object, **options: object) -> None:
        self.handlers[protocol_id] = handler

    async def push(self, peer: str, protocol_id: str, payload: bytes, *, timeout_s: float) -> None:
        pass

    async def publish_message(self, pubsub_topic: str, message: WakuMessage) -> bytes:
        return message.hash(pubsub_topic)

    async def mesh_peers(self, topic: str) -> list[str]:
        return []

    async def connected_peers(self) -> list[str]:
        return sorted(self.connected)

    async def peer_host(self, peer: str) -> str | None:
        return self.hosts.get(peer) if peer in self.connected else None

    async def subscribe(self, peer: str, ip: str) -> int:
        """``peer`` connects from ``ip`` and subscribes; the status it is answered."""
        self.hosts[peer] = ip
        self.connected.add(peer)
        handler = self.handlers[FILTER_SUBSCRIBE_PROTOCOL]
        answer = await handler(peer, SUBSCRIBE)  # type: ignore[operator]
        return FilterSubscribeResponse.from_bytes(answer).status_code


def sample(node: StoreNode, name: str, labels: dict[str, str]) -> float:
    return node.metrics.registry.get_sample_value(name, labels) or 0.0


def refused(node: StoreNode, reason: str) -> float:
    labels = {"route": FILTER_SUBSCRIBE_PROTOCOL, "reason": reason}
    return sample(node, "sdsync_store_refused_total", labels)


def dropped(node: StoreNode, reason: str) -> float:
    return sample(node, "sdsync_store_filter_subscriptions_dropped_total", {"reason": reason})


def light(**limits: float) -> LightConfig:
    return LightConfig(
        served=ServedTopics(((SHARD, None),)),
        filter=FilterLimits(**limits),  # type: ignore[arg-type]
        liveness_interval_s=0.2,
    )


def test_fresh_identities_from_one_host_do_not_lock_out_an_honest_subscriber(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    net = HostileNet()

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path, light_host=net, light=light()) as node:
            answers = [await net.subscribe(f"evil-{i}", "10.6.6.6") for i in range(ATTACKERS)]
            assert answers.count(200) == 100  # max_peers_per_host
            assert refused(node, "too_many_subscribers_per_host") == ATTACKERS - 100
            assert await net.subscribe("honest", "192.0.2.7") == 200
            assert node.light is not None and len(node.light.filters) == 101

    asyncio.run(scenario())


def test_a_full_table_makes_room_for_a_new_host(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    net = HostileNet()

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path, light_host=net, light=light()) as node:
            # Ten attacking hosts, a hundred identities each: the table is full.
            for i in range(ATTACKERS):
                assert await net.subscribe(f"evil-{i}", f"10.6.6.{i % 10}") == 200
            assert await net.subscribe("honest", "192.0.2.7") == 200
            assert dropped(node, "fair_share") == 1
            assert node.light is not None and "honest" in node.light.filters
            assert "evil-0" not in node.light.filters  # the stalest of the largest host

    asyncio.run(scenario())


def test_an_honest_subscriber_on_the_attackers_host_gets_in_once_they_left(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    """The loopback case: attackers and the honest peer share one address."""
    net = HostileNet()
    grace_s = 0.5

    async def scenario() -> None:
        config = light(disconnect_grace_s=grace_s)
        async with running(sqlite_archive, tmp_path, light_host=net, light=config) as node:
            for i in range(ATTACKERS):
                await net.subscribe(f"evil-{i}", "127.0.0.1")
            assert await net.subscribe("honest", "127.0.0.1") == 503
            net.connected -= {f"evil-{i}" for i in range(ATTACKERS)}
            left = time.monotonic()
            async with asyncio.timeout(PATIENCE_S):  # bound: grace + one interval
                while await net.subscribe("honest", "127.0.0.1") != 200:
                    await asyncio.sleep(0.05)
            assert time.monotonic() - left >= grace_s  # not before the grace
            assert dropped(node, "disconnected") == 100
            assert refused(node, "too_many_subscribers_per_host") >= ATTACKERS - 100 + 1
            assert node.light is not None and len(node.light.filters) == 1

    asyncio.run(scenario())
