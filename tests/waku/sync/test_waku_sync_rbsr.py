"""Between two sdsync nodes, Waku Sync's rounds run RBSR (unforgeable fingerprints) over
``/sdsync/store-sync/rbsr/1.0.0``; the transfer and its checks are Waku Sync's. Nodes on
MemoryWakuNodes at the clock ``NOW`` of the service tests."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_waku_sync_service import (
    NOW,
    OTHER_SHARD,
    SHARD,
    T0,
    hashes,
    held,
    messages,
    settle,
    sync_node,
    sync_of,
    until,
)

from sdsync.testing.memory import MemoryNetwork
from sdsync.waku.sync import RBSR_PROTOCOL, ItemRows, RbsrReconciler, SyncId, Topics
from sdsync.waku.sync import waku_sync_pb2 as pb

HOUR = 3600 * 10**9


def sample(node: Any, name: str, **labels: str) -> float:
    """The value of ``name`` with ``labels`` on ``node``'s registry (0 if absent)."""
    for family in text_string_to_metric_families(generate_latest(node.metrics.registry).decode()):
        for found in family.samples:
            if found.name == name and labels.items() <= found.labels.items():
                return float(found.value)
    return 0.0


def test_two_sdsync_nodes_reconcile_by_rbsr(tmp_path: Path) -> None:
    shared = messages(1, 500)
    only_a, only_b = messages(2, 60), messages(3, 35)
    net = MemoryNetwork()

    async def scenario() -> None:
        async with (
            sync_node(net, "a", tmp_path, holding=shared + only_a) as (a, waku_a),
            sync_node(net, "b", tmp_path, holding=shared + only_b) as (b, waku_b),
        ):
            await waku_a.connect(waku_b.listen_addrs[0])
            report = await sync_of(a).round()
            assert report is not None and report.method == "rbsr"
            assert (report.pushed, report.expected) == (60, 35)
            union = hashes(shared + only_a + only_b)
            await until(lambda: held(a) == union and held(b) == union)
            assert sync_of(a).refused == sync_of(b).refused == Counter()
            assert sync_of(b).recent[0]["method"] == "rbsr"
            await until(lambda: sync_of(a).archived == 35)
            assert sample(a, "sdsync_store_waku_sync_sessions_total", role="initiator") == 1
            assert sample(b, "sdsync_store_waku_sync_sessions_total", method="rbsr") == 1
            assert sample(a, "sdsync_store_waku_sync_messages_total", direction="archived") == 35
            assert sample(a, "sdsync_store_waku_sync_messages_total", direction="pushed") == 60

    asyncio.run(scenario())


def test_rbsr_pushes_nothing_on_topics_the_peer_does_not_sync(tmp_path: Path) -> None:
    shared = messages(1, 200)
    elsewhere = messages(4, 30, topic=OTHER_SHARD)
    net = MemoryNetwork()

    async def scenario() -> None:
        async with (
            sync_node(
                net, "a", tmp_path, topics=(SHARD, OTHER_SHARD), holding=shared + elsewhere
            ) as (a, waku_a),
            sync_node(net, "b", tmp_path, holding=shared) as (b, waku_b),
        ):
            await waku_a.connect(waku_b.listen_addrs[0])
            report = await sync_of(a).round()
            assert report is not None and report.method == "rbsr"
            assert report.pushed == 0
            await settle()
            assert held(b) == hashes(shared)
            assert sync_of(b).refused == Counter()

    asyncio.run(scenario())


def test_identical_archives_end_after_one_exchange(tmp_path: Path) -> None:
    shared = messages(1, 300)
    net = MemoryNetwork()

    async def scenario() -> None:
        async with (
            sync_node(net, "a", tmp_path, holding=shared) as (a, waku_a),
            sync_node(net, "b", tmp_path, holding=shared) as (_, waku_b),
        ):
            await waku_a.connect(waku_b.listen_addrs[0])
            report = await sync_of(a).round()
            assert report is not None and report.outcome == "ok"
            assert (report.differences, report.round_trips) == (0, 1)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "opening",
    [
        b"\xff\xff garbage",
        pb.RbsrOpening(start=T0 - 10 * HOUR, end=T0, pubsub_topics=[SHARD]).SerializeToString(),
        pb.RbsrOpening(start=T0, end=NOW + 10 * HOUR, pubsub_topics=[SHARD]).SerializeToString(),
        pb.RbsrOpening(start=T0, end=T0 + 1, frame=b"\x07junk").SerializeToString(),
    ],
    ids=["garbage", "window-too-old", "window-in-future", "bad-rbsr-frame"],
)
def test_a_hostile_opening_is_refused_and_the_node_syncs_on(tmp_path: Path, opening: bytes) -> None:
    only_a = messages(2, 10)
    net = MemoryNetwork()

    async def scenario() -> None:
        async with (
            sync_node(net, "a", tmp_path, holding=only_a) as (a, waku_a),
            sync_node(net, "b", tmp_path) as (b, waku_b),
        ):
            hostile = net.waku_node("mallory")
            answered: list[bytes] = []

            class Once:
                finished = False

                async def receive(self, frame: bytes) -> bytes | None:
                    answered.append(frame)
                    self.finished = True
                    return None

            with pytest.raises(ConnectionError):
                await hostile.converse(waku_b.listen_addrs[0], RBSR_PROTOCOL, opening, Once())
            assert answered == []
            assert sum(waku_b.rejected.values()) == 1
            await waku_a.connect(waku_b.listen_addrs[0])
            assert await sync_of(a).round() is not None
            await until(lambda: held(b) == hashes(only_a))

    asyncio.run(scenario())


def test_rbsr_reconcilers_find_both_directions() -> None:
    rows_a = ItemRows.of([(SyncId(T0 + i, bytes([i]) * 32), SHARD, "c") for i in range(1, 200)])
    rows_b = ItemRows.of([(SyncId(T0 + i, bytes([i]) * 32), SHARD, "c") for i in range(5, 210)])
    window = (T0, T0 + HOUR)
    topics = Topics(frozenset({SHARD}))
    a = RbsrReconciler(rows_a, topics, window, initiator=True)
    b = RbsrReconciler(rows_b, topics, window, initiator=False)
    frame: bytes | None = a.first_payload()
    sides = [b, a]
    turn = 0
    while frame is not None:
        frame = sides[turn % 2].receive(frame)
        turn += 1
    assert a.finished and b.finished
    assert {h[0] for h in a.differences.to_send} == set(range(1, 5))
    assert {h[0] for h in a.differences.wanted} == set(range(200, 210))
    assert {h[0] for h in b.differences.to_send} == set(range(200, 210))
