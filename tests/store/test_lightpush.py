"""LightPush, the service side: what check_push accepts and refuses with which status,
the answer bytes of both protocol versions, and LightClientServices (relay, archive, Filter) on
an in-memory Waku node."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from storetest import running

from sdsync.store import SqlArchive, open_archive
from sdsync.store.light_clients import LightClientConfig
from sdsync.testing.memory import MemoryNetwork
from sdsync.testing.memory_waku import MemoryWakuNode, memory_peer_id
from sdsync.waku.filter.rpc import (
    FILTER_PUSH_PROTOCOL,
    FILTER_SUBSCRIBE_PROTOCOL,
    FilterSubscribeRequest,
    FilterSubscribeResponse,
    FilterSubscribeType,
    MessagePush,
)
from sdsync.waku.lightpush.rpc import (
    LIGHTPUSH_PROTOCOL,
    LightPushRequestV3,
    LightPushResponseV3,
    PushRequest,
    PushRpc,
)
from sdsync.waku.lightpush.service import (
    LightPushRefused,
    LightPushStatus,
    Push,
    ServedTopics,
    answer_lightpush,
    answer_lightpush_v2,
    check_push,
)
from sdsync.wire.waku import MAX_WAKU_MESSAGE_BYTES, WakuMessage

NOW = 1_700_000_000 * 10**9
SECOND = 10**9
SHARD = "/waku/2/rs/1/7"
SDS = "/sds/1/chan/proto"  # autosharded to SHARD on cluster 1
SERVED = ServedTopics(((SHARD, None), ("/waku/2/rs/1/2", "/only/1/this/proto")))


def message(**fields: object) -> WakuMessage:
    values: dict[str, object] = {"payload": b"p", "content_topic": SDS, "timestamp": NOW}
    return WakuMessage(**(values | fields))  # type: ignore[arg-type]


def refused(pubsub_topic: str | None, msg: WakuMessage | None) -> tuple[int, str]:
    with pytest.raises(LightPushRefused) as caught:
        check_push(pubsub_topic, msg, SERVED, NOW, 20 * SECOND)
    return caught.value.status, caught.value.reason


def test_check_push_accepts_served_topics_and_autoshards() -> None:
    assert check_push(SHARD, message(), SERVED, NOW, 20 * SECOND) == Push(SHARD, message())
    assert check_push(None, message(), SERVED, NOW, 20 * SECOND).pubsub_topic == SHARD
    old = message(timestamp=NOW - 3_600 * SECOND)  # old is fine, as for relay
    assert check_push(SHARD, old, SERVED, NOW, 20 * SECOND).message == old
    only = message(content_topic="/only/1/this/proto")
    assert check_push("/waku/2/rs/1/2", only, SERVED, NOW, 20 * SECOND).message == only


def test_check_push_refuses_with_nwaku_status_codes() -> None:
    assert refused(SHARD, None) == (400, "no_message")
    assert refused(SHARD, message(timestamp=None)) == (420, "no_timestamp")
    assert refused(SHARD, message(timestamp=NOW + 21 * SECOND)) == (420, "timestamp_in_future")
    assert refused(SHARD, message(timestamp=0)) == (420, "timestamp_not_positive")
    assert refused(SHARD, message(content_topic="no-slashes")) == (420, "malformed_content_topic")
    long_topic = "/app/1/" + "n" * 2000 + "/proto"
    assert refused(SHARD, message(content_topic=long_topic)) == (420, "bad_topic")
    assert refused("/waku/2/rs/1/3", message()) == (421, "unsupported_topic")
    # A content-topic-only entry serves that content topic only.
    assert refused("/waku/2/rs/1/2", message()) == (421, "unsupported_topic")
    # Autosharded to shard 0 of cluster 1? Not served either.
    elsewhere = message(content_topic="/elsewhere/2/x/proto")
    assert SERVED.pubsub_topic(elsewhere.content_topic) != SHARD
    assert refused(None, elsewhere) == (421, "unsupported_topic")


@dataclass
class Service:
    """A PushService that accepts everything (or refuses as told)."""

    outcome: int | LightPushRefused = 2
    accepted: list[Push] = field(default_factory=list)
    refusals: list[tuple[str, str]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    served: ServedTopics = SERVED
    max_future_ns: int = 20 * SECOND

    def now_ns(self) -> int:
        return NOW

    def refuse(self, route: str, reason: str) -> None:
        self.refusals.append((route, reason))

    def answered(self, status: LightPushStatus) -> None:
        self.statuses.append(int(status))

    async def admit(self, peer: str) -> str | None:
        return None

    async def accept(self, push: Push) -> int:
        if isinstance(self.outcome, LightPushRefused):
            raise self.outcome
        self.accepted.append(push)
        return self.outcome


def test_answers_of_v3() -> None:
    service = Service()
    good = LightPushRequestV3("r1", SHARD, message()).to_bytes()
    answer = asyncio.run(answer_lightpush(service, LIGHTPUSH_PROTOCOL, good, peer="p"))
    assert LightPushResponseV3.from_bytes(answer) == LightPushResponseV3("r1", 200, "OK", 2)
    assert service.accepted == [Push(SHARD, message())]
    bad = asyncio.run(answer_lightpush(service, LIGHTPUSH_PROTOCOL, b"\xff\xff\xff", peer="p"))
    assert LightPushResponseV3.from_bytes(bad).status_code == 400
    huge = WakuMessage(b"x" * MAX_WAKU_MESSAGE_BYTES, SDS, timestamp=NOW)
    big = asyncio.run(
        answer_lightpush(
            service, LIGHTPUSH_PROTOCOL, LightPushRequestV3("r2", SHARD, huge).to_bytes(), peer="p"
        )
    )
    assert LightPushResponseV3.from_bytes(big).status_code == 413
    service.outcome = LightPushRefused(LightPushStatus.NO_PEERS, "no_peers", "nobody")
    lonely = asyncio.run(answer_lightpush(service, LIGHTPUSH_PROTOCOL, good, peer="p"))
    assert LightPushResponseV3.from_bytes(lonely).status_code == 505
    assert service.refusals == [
        (LIGHTPUSH_PROTOCOL, "malformed_rpc"),
        (LIGHTPUSH_PROTOCOL, "oversized"),
        (LIGHTPUSH_PROTOCOL, "no_peers"),
    ]
    assert service.statuses == [200, 400, 413, 505]


def test_answers_of_v2() -> None:
    service = Service()
    good = PushRpc("r1", request=PushRequest("", message())).to_bytes()  # "": autoshard
    answer = PushRpc.from_bytes(asyncio.run(answer_lightpush_v2(service, "v2", good, peer="p")))
    assert answer.request_id == "r1"
    assert answer.response is not None and answer.response.is_success
    assert answer.response.relay_peer_count == 2
    assert service.accepted == [Push(SHARD, message())]
    empty = PushRpc("r2").to_bytes()
    answer = PushRpc.from_bytes(asyncio.run(answer_lightpush_v2(service, "v2", empty, peer="p")))
    assert answer.response is not None and not answer.response.is_success
    assert answer.response.status_code == 400 and answer.response.info


async def lightpush(
    pusher: MemoryWakuNode, store: MemoryWakuNode, request: LightPushRequestV3
) -> LightPushResponseV3:
    """The LightPush (3.0.0) answer of ``store`` to ``request`` from ``pusher``."""
    answer = await pusher.request(store.listen_addrs[0], LIGHTPUSH_PROTOCOL, request.to_bytes())
    return LightPushResponseV3.from_bytes(answer)


async def filter_subscriber(
    net: MemoryNetwork, name: str, store: MemoryWakuNode
) -> list[MessagePush]:
    """A node named ``name`` subscribed at ``store`` to SDS on SHARD: the pushes it gets."""
    node, pushed = net.waku_node(name), []

    async def take(peer: str, frame: bytes) -> None:
        pushed.append(MessagePush.from_bytes(frame))

    await node.serve_pushes(FILTER_PUSH_PROTOCOL, take)
    subscribe = FilterSubscribeRequest("s", FilterSubscribeType.SUBSCRIBE, SHARD, (SDS,))
    answer = await node.request(
        store.listen_addrs[0], FILTER_SUBSCRIBE_PROTOCOL, subscribe.to_bytes()
    )
    assert FilterSubscribeResponse.from_bytes(answer).status_code == 200
    return pushed


def test_light_services_relay_archive_and_push_to_filter_subscribers(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    net = MemoryNetwork()
    store, pusher, relay = net.waku_node("store"), net.waku_node("pusher"), net.waku_node("relay")
    config = LightClientConfig(served=SERVED)

    async def scenario() -> None:
        async with running(
            sqlite_archive,
            tmp_path,
            clock_ns=lambda: NOW,
            waku=store,
            serve_light=True,
            light_clients=config,
        ) as node:
            sub = await filter_subscriber(net, "sub", store)
            await filter_subscriber(net, "gone", store)
            gone = memory_peer_id("gone")
            store.disconnect(gone)  # its pushes fail from now on
            relayed = relay.subscribe_envelopes(SHARD)
            for i in range(3):
                push = LightPushRequestV3(f"p{i}", SHARD, message(payload=bytes([i])))
                answer = await lightpush(pusher, store, push)
                assert (answer.status_code, answer.relay_peer_count) == (200, 1)
            assert node.light_clients is not None
            async with asyncio.timeout(10):
                while len(sub) < 3 or node.light_clients.filters.criteria(gone):
                    await asyncio.sleep(0.01)
            assert [p.waku_message.payload for p in sub] == [b"\0", b"\1", b"\2"]  # type: ignore[union-attr]
            assert [(await anext(relayed)).message.payload for _ in range(3)] == [
                b"\0",
                b"\1",
                b"\2",
            ]
            assert sqlite_archive.count() == 3
            # An ephemeral message no relay peer or subscriber takes: 505.
            await relay.close()
            lonely = LightPushRequestV3(
                "e", SHARD, message(content_topic="/other/1/x/proto", ephemeral=True)
            )
            assert (await lightpush(pusher, store, lonely)).status_code == 505
            net.waku_node("relay-peer").subscribe_envelopes(SHARD)
            assert (await lightpush(pusher, store, lonely)).relay_peer_count == 1
            assert sqlite_archive.count() == 3  # ephemeral: relayed, not archived
            sample = node.metrics.registry.get_sample_value
            assert sample("sdsync_store_ingested_messages_total", {"source": "lightpush"}) == 3
            assert sample("sdsync_store_filter_pushes_total", {"outcome": "sent"}) == 3
            assert sample("sdsync_store_filter_pushes_total", {"outcome": "failed"}) == 3
            assert sample("sdsync_store_lightpush_total", {"status": "505"}) == 1

    asyncio.run(scenario())


def test_a_push_the_archive_fails_is_503_even_when_relay_peers_took_it(tmp_path: Path) -> None:
    """A store node's 200 says the message is kept: with the archive failing, relay peers
    taking the message do not make it a 200, and no Filter subscriber is pushed a message
    whose sender will push it again."""
    archive = open_archive(str(tmp_path / "store.sqlite3"))
    net = MemoryNetwork()
    store, pusher, relay = net.waku_node("store"), net.waku_node("pusher"), net.waku_node("relay")
    relay.subscribe_envelopes(SHARD)

    async def scenario() -> None:
        async with running(
            archive,
            tmp_path,
            clock_ns=lambda: NOW,
            waku=store,
            serve_light=True,
            light_clients=LightClientConfig(served=SERVED),
        ) as node:
            sub = await filter_subscriber(net, "sub", store)
            assert (
                await lightpush(pusher, store, LightPushRequestV3("ok", SHARD, message()))
            ).status_code == 200
            with sqlite3.connect(tmp_path / "store.sqlite3") as conn:
                conn.execute("DROP TABLE messages")  # the database fails from now on
            failed = LightPushRequestV3("lost", SHARD, message(payload=b"q"))
            answer = await lightpush(pusher, store, failed)
            assert (answer.status_code, answer.status_desc) == (
                503,
                "the archive failed; try again",
            )
            assert len(sub) == 1  # only the message that was kept
            sample = node.metrics.registry.get_sample_value
            assert sample("sdsync_store_lightpush_total", {"status": "503"}) == 1

    asyncio.run(scenario())
