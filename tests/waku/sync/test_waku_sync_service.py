"""Waku Sync on store nodes, end to end on MemoryWakuNodes: rounds bring each archive what
the other holds, only on the topics both sync; hostile peers get typed refusals, counted,
and leave the node syncing with honest ones.

Every node runs at the clock ``NOW``, at which a round's window is ``[T0, T0 + HOUR]``;
messages are put into one archive directly (``StoreNode.ingest``), so that only Waku Sync
can bring them to another.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest

from sdsync.errors import ProtocolNotSupportedError
from sdsync.store import NodeConfig, StoredMessage, StoreNode, open_archive
from sdsync.testing.memory import MemoryNetwork
from sdsync.testing.memory_waku import MemoryWakuNode
from sdsync.waku.sync import (
    RECONCILIATION_PROTOCOL,
    TRANSFER_PROTOCOL,
    ItemSet,
    Range,
    RangesData,
    RangeType,
    SyncId,
    WakuMessageAndTopic,
    WakuSyncConfig,
    decode_ranges,
    encode_ranges,
)
from sdsync.wire.waku import WakuMessage

SHARD = "/waku/2/rs/1/7"
OTHER_SHARD = "/waku/2/rs/1/3"
CONTENT = "/sds/1/sync/proto"
SECOND = 10**9
T0 = 1_700_000_000 * SECOND
HOUR = 3600 * SECOND
NOW = T0 + HOUR + 20 * SECOND  # the default window: [NOW - 20 s - 1 h, NOW - 20 s]
WINDOW = (T0, T0 + HOUR)
PATIENCE_S = 30.0  # a liveness bound, not a timing
Z = bytes(32)


def messages(
    seed: int, count: int, *, topic: str = SHARD, start: int = T0, span: int = HOUR
) -> list[StoredMessage]:
    rng = random.Random(seed)
    return [
        StoredMessage.of(
            topic, WakuMessage(rng.randbytes(12), CONTENT, timestamp=start + rng.randrange(span))
        )
        for _ in range(count)
    ]


def hashes(stored: Iterable[StoredMessage]) -> set[bytes]:
    return {m.message_hash for m in stored}


def held(node: StoreNode) -> set[bytes]:
    rows = node.archive.sync_rows(0, 2**63 - 1, 10**6)
    return {bytes(row) for row in rows.hashes}


@contextlib.asynccontextmanager
async def sync_node(
    net: MemoryNetwork,
    name: str,
    tmp: Path,
    *,
    topics: tuple[str, ...] = (SHARD,),
    holding: Iterable[StoredMessage] = (),
    **settings: Any,
) -> AsyncIterator[tuple[StoreNode, MemoryWakuNode]]:
    """A store node named ``name`` syncing ``topics`` (no rounds of its own), its archive
    holding ``holding``."""
    (tmp / name).mkdir()
    waku = net.waku_node(name)
    config = NodeConfig(
        data_dir=tmp / name,
        port=0,
        token="t",
        retention=(),
        relay_topics=topics,
        waku_sync=WakuSyncConfig(pubsub_topics=topics, interval_s=0, **settings),
    )
    archive = open_archive(str(tmp / name / "store.sqlite3"))
    node = StoreNode(archive, config, clock_ns=lambda: NOW, waku=waku)
    await node.start()
    try:
        await node.ingest(list(holding), source="test")
        yield node, waku
    finally:
        await node.stop()


async def until(condition: Any) -> None:
    async with asyncio.timeout(PATIENCE_S):
        while not condition():
            await asyncio.sleep(0.01)


async def settle() -> None:
    """Let pushes already sent run through the inbox (nothing should arrive)."""
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)


def sync_of(node: StoreNode) -> Any:
    assert node.waku_sync is not None
    return node.waku_sync


class Scripted:
    """A hostile initiator's side of a conversation: ``replies`` in turn (None: wait for
    ``release`` first, then end with the empty payload)."""

    def __init__(self, replies: list[bytes | None], release: asyncio.Event | None = None) -> None:
        self.replies = replies
        self.release = release
        self.received: list[bytes] = []
        self.finished = False

    async def receive(self, frame: bytes) -> bytes | None:
        self.received.append(frame)
        reply = self.replies.pop(0) if self.replies else b"\x00"
        if reply is None:
            assert self.release is not None
            await self.release.wait()
            reply = b"\x00"
        self.finished = reply == b"\x00"
        return reply


def opening(lower: int, upper: int, fingerprint: bytes = b"\x01" * 32) -> bytes:
    first = Range(SyncId(lower, Z), SyncId(upper, Z), RangeType.FINGERPRINT, fingerprint)
    return encode_ranges(RangesData((first,), (SHARD,)))


# -- honest rounds


def test_a_round_brings_both_archives_the_union(tmp_path: Path) -> None:
    shared = messages(1, 300)
    only_a = messages(2, 150, start=T0 + HOUR // 2, span=HOUR // 64)  # where B holds little
    only_b = messages(3, 40)
    net = MemoryNetwork()

    async def scenario() -> None:
        async with (
            sync_node(net, "a", tmp_path, holding=shared + only_a) as (a, waku_a),
            sync_node(net, "b", tmp_path, holding=shared + only_b) as (b, waku_b),
        ):
            await waku_a.connect(waku_b.listen_addrs[0])
            report = await sync_of(a).round()
            assert report is not None and report.outcome == "ok"
            assert (report.peer, report.role) == (waku_b.peer_id, "initiator")
            assert (report.pushed, report.expected) == (150, 40)
            assert report.differences == 190 and report.items == 450
            union = hashes(shared + only_a + only_b)
            await until(lambda: held(a) == union and held(b) == union)
            # Counted once the archive's insert has returned, a moment after it is visible.
            await until(lambda: sync_of(a).archived + sync_of(b).archived >= 190)
            assert (sync_of(a).archived, sync_of(b).archived) == (40, 150)
            assert sync_of(a).refused == sync_of(b).refused == Counter()
            (answered,) = sync_of(b).recent
            assert answered["role"] == "responder" and answered["peer"] == waku_a.peer_id
            assert (answered["pushed"], answered["expected"]) == (40, 150)
            # Nothing left to find: one fingerprint each way.
            again = await sync_of(b).round()
            assert again is not None
            assert (again.differences, again.round_trips) == (0, 1)
            assert sync_of(a).info()["sessions"] == sync_of(b).info()["sessions"] == 0

    asyncio.run(scenario())


def test_an_empty_node_receives_everything_in_the_window(tmp_path: Path) -> None:
    inside = messages(4, 900)  # splits: more than nwaku's item-set threshold of 100
    before = messages(5, 20, start=T0 - 2 * HOUR)  # not in the window: stays put
    net = MemoryNetwork()

    async def scenario(initiator: str) -> None:
        async with (
            sync_node(net, f"full-{initiator}", tmp_path, holding=inside + before) as (
                full,
                waku_full,
            ),
            sync_node(net, f"empty-{initiator}", tmp_path) as (empty, waku_empty),
        ):
            await waku_empty.connect(waku_full.listen_addrs[0])
            report = await sync_of(full if initiator == "full" else empty).round()
            assert report is not None and report.differences == 900
            await until(lambda: held(empty) == hashes(inside))
            await settle()
            assert held(empty) == hashes(inside)
            assert held(full) == hashes(inside + before)
            assert sync_of(empty).refused == Counter()

    asyncio.run(scenario("full"))
    asyncio.run(scenario("empty"))


def test_a_node_without_waku_sync_is_not_picked(tmp_path: Path) -> None:
    net = MemoryNetwork()

    async def scenario() -> None:
        async with sync_node(net, "a", tmp_path, holding=messages(6, 5)) as (a, waku_a):
            plain, half = net.waku_node("plain"), net.waku_node("half")
            await half.serve_conversations(RECONCILIATION_PROTOCOL, _never_opened)
            for other in (plain, half):
                await waku_a.connect(other.listen_addrs[0])
            assert await sync_of(a).round() is None
            assert sync_of(a).failures == 1
            assert "no connected peer announces Waku Sync" in sync_of(a).recent[-1]["outcome"]
            # Named, it is tried, fails, and leaves no session behind: it can be tried again.
            for _ in range(2):
                assert await sync_of(a).round(plain.listen_addrs[0]) is None
                outcome = sync_of(a).recent[-1]["outcome"]
                assert outcome.startswith(f"failed: {ProtocolNotSupportedError.__name__}")
            assert sync_of(a).failures == 3 and sync_of(a).info()["sessions"] == 0

    asyncio.run(scenario())


async def _never_opened(peer: str) -> Any:
    raise AssertionError("a peer that does not announce Waku Sync was asked")


def test_only_the_topics_both_sync_are_reconciled(tmp_path: Path) -> None:
    ours, other = messages(7, 30), messages(8, 30, topic=OTHER_SHARD)
    theirs, their_other = messages(9, 30), messages(10, 30, topic=OTHER_SHARD)
    net = MemoryNetwork()

    async def scenario() -> None:
        async with (
            sync_node(net, "a", tmp_path, holding=ours + other) as (a, waku_a),
            sync_node(net, "c", tmp_path, topics=(OTHER_SHARD,), holding=their_other + theirs) as (
                c,
                waku_c,
            ),
            sync_node(
                net, "d", tmp_path, topics=(SHARD, OTHER_SHARD), holding=theirs + their_other
            ) as (d, _),
        ):
            # c syncs no topic a syncs: the exchange ends at once, nothing moves.
            report = await sync_of(a).round(waku_c.listen_addrs[0])
            assert report is not None
            assert (report.round_trips, report.differences) == (1, 0)
            # d syncs a's topic and another: only a's topic moves, both ways.
            report = await sync_of(d).round(waku_a.listen_addrs[0])
            assert report is not None and report.differences == 60
            await until(
                lambda: (
                    held(a) == hashes(ours + other + theirs)
                    and held(d) == hashes(theirs + their_other + ours)
                )
            )
            await settle()
            assert held(c) == hashes(their_other + theirs)
            assert held(a) == hashes(ours + other + theirs)
            assert held(d) == hashes(theirs + their_other + ours)
            for node in (a, c, d):
                assert sync_of(node).refused == Counter()

    asyncio.run(scenario())


# -- hostile peers


def test_a_garbage_reconciliation_frame_resets_the_stream_and_the_node_syncs_on(
    tmp_path: Path,
) -> None:
    mine, honest = messages(11, 20), messages(12, 20)
    net = MemoryNetwork()

    async def scenario() -> None:
        async with (
            sync_node(net, "a", tmp_path, holding=mine) as (a, waku_a),
            sync_node(net, "b", tmp_path, holding=honest) as (b, waku_b),
        ):
            hostile = net.waku_node("hostile")
            target = waku_a.listen_addrs[0]
            for first, then in (
                (b"\x00\x00\x05\x01\x03", []),  # range type 3
                (b"\x01\x09abc", []),  # a topic past the end
                (opening(*WINDOW), [b"\x00\x00\x05\x00\x21" + Z + Z]),  # a bad second frame
            ):
                conversation = Scripted(list(then))
                with pytest.raises(ConnectionError, match="reset"):
                    await hostile.converse(target, RECONCILIATION_PROTOCOL, first, conversation)
            assert waku_a.rejected["malformed Waku RPC"] == 3
            assert sync_of(a).info()["sessions"] == 0
            assert held(a) == hashes(mine)
            # The node still syncs with an honest peer, either way round.
            await waku_b.connect(target)
            assert await sync_of(a).round(waku_b.peer_id) is not None
            await until(lambda: held(a) == held(b) == hashes(mine + honest))

    asyncio.run(scenario())


def test_a_session_flood_is_refused_and_counted(tmp_path: Path) -> None:
    net = MemoryNetwork()

    async def scenario() -> None:
        async with (
            sync_node(
                net,
                "a",
                tmp_path,
                holding=messages(13, 10),
                max_sessions=2,
                session_burst=2,
                sessions_per_minute=1,
            ) as (a, waku_a),
            sync_node(net, "b", tmp_path, holding=messages(14, 10)) as (b, waku_b),
        ):
            target = waku_a.listen_addrs[0]
            release = asyncio.Event()
            holders = [net.waku_node(f"holder-{n}") for n in range(3)]
            held_open = [
                asyncio.create_task(
                    h.converse(
                        target, RECONCILIATION_PROTOCOL, opening(*WINDOW), Scripted([None], release)
                    )
                )
                for h in holders[:2]
            ]
            await until(lambda: sync_of(a).info()["sessions"] == 2)
            for refused_peer in (holders[2], holders[0]):  # too many; one running already
                with pytest.raises(ConnectionError, match="reset"):
                    await refused_peer.converse(
                        target, RECONCILIATION_PROTOCOL, opening(*WINDOW), Scripted([])
                    )
            release.set()
            await asyncio.gather(*held_open)
            assert sync_of(a).info()["sessions"] == 0
            # One peer opening sessions faster than its rate: the burst, then refused.
            quick = net.waku_node("quick")
            for _ in range(2):
                await quick.converse(
                    target, RECONCILIATION_PROTOCOL, opening(*WINDOW), Scripted([])
                )
            with pytest.raises(ConnectionError, match="reset"):
                await quick.converse(
                    target, RECONCILIATION_PROTOCOL, opening(*WINDOW), Scripted([])
                )
            assert sync_of(a).refused == Counter(
                {"too_many_sessions": 1, "session_running": 1, "session_rate": 1}
            )
            assert waku_a.stream_failures[RECONCILIATION_PROTOCOL] == 3
            # An honest peer is still served.
            await waku_b.connect(target)
            report = await sync_of(b).round(waku_a.peer_id)
            assert report is not None and report.differences == 20

    asyncio.run(scenario())


def test_unsolicited_pushes_are_refused_and_not_archived(tmp_path: Path) -> None:
    net = MemoryNetwork()
    recent = WakuMessage(b"unsolicited", CONTENT, timestamp=T0 + HOUR // 2)

    async def scenario() -> None:
        async with sync_node(net, "a", tmp_path, holding=messages(15, 10)) as (a, waku_a):
            before = held(a)
            hostile = net.waku_node("hostile")
            target = waku_a.listen_addrs[0]
            pushes = [
                WakuMessageAndTopic(SHARD, recent).to_bytes(),
                WakuMessageAndTopic(OTHER_SHARD, recent).to_bytes(),
                WakuMessageAndTopic(
                    SHARD, WakuMessage(b"e", CONTENT, timestamp=T0, ephemeral=True)
                ).to_bytes(),
                WakuMessageAndTopic(
                    SHARD, WakuMessage(b"f", CONTENT, timestamp=NOW + HOUR)
                ).to_bytes(),
                b"\xff\xff\xff",
            ]
            for frame in pushes:
                await hostile.push(target, TRANSFER_PROTOCOL, frame)  # unbeknown to it
            await settle()
            assert held(a) == before
            assert sync_of(a).refused == Counter(
                {
                    "not_expected": 1,
                    "topic_not_synced": 1,
                    "ephemeral": 1,
                    "timestamp in future": 1,
                    "malformed Waku RPC": 1,
                }
            )
            assert waku_a.rejected["malformed Waku RPC"] == 1  # that one reset the lane
            assert sync_of(a).archived == 0

            # A reconciliation makes a message expected: then, and only it, is archived.
            claimed = SyncId(recent.timestamp or 0, recent.hash(SHARD))
            items = ItemSet((claimed,), reconciled=True)
            claim = encode_ranges(
                RangesData(
                    (
                        Range(
                            SyncId(WINDOW[0], Z),
                            SyncId(WINDOW[1], Z),
                            RangeType.ITEM_SET,
                            items=items,
                        ),
                    ),
                    (SHARD,),
                )
            )
            await hostile.converse(target, RECONCILIATION_PROTOCOL, claim, Scripted([]))
            stranger = WakuMessage(b"stranger", CONTENT, timestamp=T0 + HOUR // 3)
            for message in (stranger, recent):
                await hostile.push(
                    target, TRANSFER_PROTOCOL, WakuMessageAndTopic(SHARD, message).to_bytes()
                )
            await until(lambda: recent.hash(SHARD) in held(a))
            await settle()
            assert held(a) == before | {recent.hash(SHARD)}
            assert sync_of(a).refused["not_expected"] == 2

    asyncio.run(scenario())


def test_a_huge_claimed_window_is_clamped_to_the_served_one(tmp_path: Path) -> None:
    inside = messages(16, 30)
    old = messages(17, 50, start=T0 - 3 * HOUR)  # before the served window (margin: 300 s)
    net = MemoryNetwork()

    async def scenario() -> None:
        async with sync_node(net, "a", tmp_path, holding=inside + old, max_items=40) as (
            a,
            waku_a,
        ):
            hostile = net.waku_node("hostile")
            target = waku_a.listen_addrs[0]
            conversation = Scripted([])
            await hostile.converse(
                target, RECONCILIATION_PROTOCOL, opening(0, 2**64 - 1), conversation
            )
            (answered,) = sync_of(a).recent
            assert answered["role"] == "responder" and answered["items"] == 30
            assert sync_of(a).refused == Counter()
            # Its answer covers the claimed range, with our items of the served window only.
            reply = decode_ranges(conversation.received[0])
            assert [r.type for r in reply.ranges] == [RangeType.ITEM_SET]
            assert reply.ranges[0].items is not None
            assert {i.hash for i in reply.ranges[0].items.elements} == hashes(inside)
            # A window wholly past the served one loads nothing (and fails nothing).
            for lower in (NOW + HOUR, 2**63 + 5):
                later = Scripted([])
                await hostile.converse(
                    target, RECONCILIATION_PROTOCOL, opening(lower, lower + HOUR), later
                )
                assert sync_of(a).recent[-1]["items"] == 0
            assert sync_of(a).refused == Counter()
            # A served window that holds more than max_items is refused, and counted.
            await a.ingest(messages(18, 20, start=T0 - 100 * SECOND, span=SECOND), source="test")
            with pytest.raises(ConnectionError, match="reset"):
                await hostile.converse(
                    target, RECONCILIATION_PROTOCOL, opening(0, 2**64 - 1), Scripted([])
                )
            assert sync_of(a).refused == Counter({"snapshot_too_large": 1})

    asyncio.run(scenario())
