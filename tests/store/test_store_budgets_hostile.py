"""Hostile peers against the store's per-peer budgets (issue 27 rows 4, 5 and the disk):
store-query answers nobody reads, a LightPush flood, an archive a flood would fill.

Each test fails on the code before the budgets: every answer was built and held, every
push accepted, and a size policy ran only every retention interval."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from storetest import PUBSUB, T0, running
from test_lightpush import NOW, SERVED, SHARD, lightpush, message

from sdsync.store import SqlArchive, StoredMessage
from sdsync.store.light_clients import LightClientConfig
from sdsync.store.retention import ByteBudget, RetentionPolicy
from sdsync.testing.hostile import process_rss
from sdsync.testing.memory import MemoryNetwork
from sdsync.testing.memory_waku import MemoryWakuNode
from sdsync.waku.lightpush.rpc import LIGHTPUSH_PROTOCOL, LightPushRequestV3
from sdsync.waku.ratelimit import RateLimit
from sdsync.waku.store.rpc import (
    MAX_STORE_RESPONSE_BYTES,
    STORE_QUERY_PROTOCOL,
    StoreQueryRequest,
    StoreQueryResponse,
)
from sdsync.waku.store.service import AnswerLimits
from sdsync.wire import WakuMessage

BIG = 140_000
PAGE = 20  # messages of BIG bytes a page: ~2.8 MB an answer
HONEST_WITHIN_S = 30.0  # liveness bound, not a benchmark


async def store_query(
    asker: MemoryWakuNode, store: MemoryWakuNode, request: StoreQueryRequest
) -> bytes:
    """``store``'s answer to ``request`` from ``asker``."""
    return await asker.request(
        store.listen_addrs[0],
        STORE_QUERY_PROTOCOL,
        request.to_bytes(),
        max_response_bytes=MAX_STORE_RESPONSE_BYTES,
    )


def big_messages(n: int) -> list[StoredMessage]:
    return [
        StoredMessage.of(
            PUBSUB,
            WakuMessage(bytes([i]) * BIG, "/app/1/chat/proto", timestamp=T0 + i),
        )
        for i in range(n)
    ]


def test_unread_store_answers_are_bounded_per_peer_and_in_all(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    """60 full-page queries from 10 peers, answers kept as an unread stream keeps them:
    at most twice the 32 MiB budget is ever held (RSS grows < 150 MB; before: 168 MB of
    answers), the rest refused 429/503 and counted, an honest query answered."""
    sqlite_archive.insert(big_messages(PAGE))
    limits = AnswerLimits(per_peer_bytes=8 * 2**20, total_bytes=32 * 2**20, hold_s=10.0)
    net = MemoryNetwork()
    store, honest = net.waku_node("store"), net.waku_node("honest")
    attackers = [net.waku_node(f"attacker-{p}") for p in range(10)]
    query = StoreQueryRequest("q", include_data=True, pubsub_topic=PUBSUB, pagination_limit=PAGE)

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path, waku=store, store_answers=limits) as node:
            before = process_rss(os.getpid())
            held = [
                await store_query(attacker, store, query)
                for _ in range(6)
                for attacker in attackers
            ]
            grown = process_rss(os.getpid()) - before
            answered = [StoreQueryResponse.from_bytes(a) for a in held]
            statuses = [a.status_code for a in answered]
            held_bytes = sum(len(a) for a in held)
            assert held_bytes <= 2 * limits.total_bytes, held_bytes
            assert grown < 150 * 2**20, grown
            assert statuses.count(200) < 30
            assert set(statuses) <= {200, 429, 503}
            sample = node.metrics.registry.get_sample_value
            refused = sum(
                sample("sdsync_store_refused_total", {"route": STORE_QUERY_PROTOCOL, "reason": r})
                or 0
                for r in ("answer_budget_peer", "answer_budget_ip", "answer_budget_total")
            )
            assert refused == len(held) - statuses.count(200)
            asked = StoreQueryRequest("h", pubsub_topic=PUBSUB, pagination_limit=PAGE)
            started = time.monotonic()
            while True:
                answer = StoreQueryResponse.from_bytes(await store_query(honest, store, asked))
                if answer.status_code == 200:
                    break
                assert time.monotonic() - started < HONEST_WITHIN_S, answer
                await asyncio.sleep(0.2)
            assert len(answer.messages) == PAGE

    asyncio.run(scenario())


def test_a_lightpush_flood_from_one_peer_is_answered_429_and_counted(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    """64 pushes at once from one peer: 5 (nwaku's lightpush:5/1s) archived, the rest
    429 and counted; another peer's push is still accepted."""
    net = MemoryNetwork()
    store, flooder, honest = (net.waku_node(n) for n in ("store", "flooder", "honest"))
    config = LightClientConfig(served=SERVED, lightpush_rate=RateLimit(5, 1.0))

    async def push(pusher: MemoryWakuNode, i: int) -> int:
        request = LightPushRequestV3(f"p{i}", SHARD, message(payload=i.to_bytes(2, "big")))
        return (await lightpush(pusher, store, request)).status_code

    async def scenario() -> None:
        async with running(
            sqlite_archive,
            tmp_path,
            clock_ns=lambda: NOW,
            waku=store,
            serve_light=True,
            light_clients=config,
        ) as node:
            statuses = await asyncio.gather(*(push(flooder, i) for i in range(64)))
            assert statuses.count(200) <= 6  # 5, and what refilled meanwhile
            assert statuses.count(429) == 64 - statuses.count(200)
            assert await push(honest, 1000) == 200
            assert sqlite_archive.count() == statuses.count(200) + 1
            sample = node.metrics.registry.get_sample_value
            assert sample("sdsync_store_lightpush_total", {"status": "429"}) == statuses.count(429)
            assert sample(
                "sdsync_store_refused_total",
                {"route": LIGHTPUSH_PROTOCOL, "reason": "rate_limited"},
            ) == statuses.count(429)

    asyncio.run(scenario())


def test_a_size_policy_holds_as_the_archive_grows(sqlite_archive: SqlArchive) -> None:
    """A flood of 40 MB into an archive with size:8MB: it never grows much past the
    limit between retention runs; the oldest go first, counted."""
    budget = ByteBudget(RetentionPolicy.parse("size:8MB"))
    sqlite_archive.size_watch = budget
    largest = 0
    for batch in range(30):
        sqlite_archive.insert(
            StoredMessage.of(
                PUBSUB, WakuMessage(os.urandom(BIG), "/app/1/chat/proto", timestamp=T0 + n)
            )
            for n in range(batch * 10, batch * 10 + 10)
        )
        largest = max(largest, sqlite_archive.size_bytes())
    assert largest < 8_000_000 + 2 * 10 * BIG + budget.check_bytes, largest
    assert budget.deleted > 0
    assert sqlite_archive.count() == 300 - budget.deleted
    oldest = next(iter(sqlite_archive.messages()))
    assert oldest.message.timestamp == T0 + budget.deleted
