"""Hostile peers against Waku Sync over real libp2p (py-libp2p hosts in this process):
garbage frames, a session flood from one peer, a peer that opens a session and then says
nothing, a peer that never reads what we push. Each must cost the attacker's own slot
only: an honest store node syncs with the victim meanwhile and ends with its messages."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from storetest import running
from testdeps import require

from sdsync.errors import RemoteProtocolError
from sdsync.store import StoredMessage, StoreNode, open_archive
from sdsync.waku.sync import (
    RECONCILIATION_PROTOCOL,
    Range,
    RangesData,
    RangeType,
    SyncId,
    WakuSyncConfig,
    encode_ranges,
)
from sdsync.wire.waku import WakuMessage

libp2p = require("sdsync.transport.libp2p", "needs the 'p2p' extra")

pytestmark = pytest.mark.xdist_group("many-processes")

SHARD = "/waku/2/rs/1/7"
SECOND = 10**9
PATIENCE_S = 60.0  # a liveness bound, not a timing
SESSION_S = 3.0  # the victim's session deadline, short for the test


def recent(count: int, seed: int, size: int = 32) -> list[StoredMessage]:
    """``count`` messages of the last ten minutes but the newest 30 s (inside every
    round's window, which leaves out the relay jitter's 20 s)."""
    rng = random.Random(seed)
    now = time.time_ns()
    return [
        StoredMessage.of(
            SHARD,
            WakuMessage(
                rng.randbytes(size),
                "/sds/1/h/proto",
                timestamp=now - 30 * SECOND - rng.randrange(570 * SECOND),
            ),
        )
        for _ in range(count)
    ]


@contextlib.asynccontextmanager
async def sync_node(
    tmp: Path, name: str, holding: list[StoredMessage], **settings: Any
) -> AsyncIterator[tuple[StoreNode, Any]]:
    (tmp / name).mkdir()
    config = WakuSyncConfig(
        pubsub_topics=(SHARD,), interval_s=0, session_timeout_s=SESSION_S, **settings
    )
    archive = open_archive(str(tmp / name / "store.sqlite3"))
    async with (
        libp2p.Libp2pTransport() as host,
        running(archive, tmp / name, waku=host, relay_topics=(SHARD,), waku_sync=config) as node,
    ):
        await node.ingest(holding, source="test")
        yield node, host


def held(node: StoreNode) -> set[bytes]:
    return {bytes(h) for h in node.archive.sync_rows(0, 2**63 - 1, 10**6).hashes}


async def until(condition: Any) -> None:
    async with asyncio.timeout(PATIENCE_S):
        while not condition():
            await asyncio.sleep(0.05)


def opening() -> bytes:
    """A whole-window fingerprint that matches nothing: the victim answers and waits."""
    now = time.time_ns()
    zero = bytes(32)
    first = Range(
        SyncId(now - 3600 * SECOND, zero), SyncId(now, zero), RangeType.FINGERPRINT, b"\x01" * 32
    )
    return encode_ranges(RangesData((first,), (SHARD,)))


class Silent:
    """An initiator's side that, once answered, never says anything again."""

    finished = False

    def __init__(self) -> None:
        self.answered = asyncio.Event()

    async def receive(self, frame: bytes) -> bytes | None:
        self.answered.set()
        await asyncio.Event().wait()
        return None


async def honest_round(victim: Any, honest: StoreNode, honest_host: Any, want: set[bytes]) -> None:
    await honest_host.connect(victim.listen_addrs[0])
    assert honest.waku_sync is not None
    report = await honest.waku_sync.round(victim.listen_addrs[0])
    assert report is not None, honest.waku_sync.recent
    try:
        await until(lambda: want <= held(honest))
    except TimeoutError:
        pytest.fail(f"{len(want - held(honest))} of {len(want)} missing: {honest.waku_sync.info()}")


def test_garbage_and_a_flood_from_one_peer_cost_that_peer_only(tmp_path: Path) -> None:
    victims_own = recent(30, 1)

    async def scenario() -> None:
        async with (
            sync_node(tmp_path, "victim", victims_own) as (victim, victim_host),
            sync_node(tmp_path, "honest", []) as (honest, honest_host),
            libp2p.Libp2pTransport(relay=False) as attacker,
        ):
            address = victim_host.listen_addrs[0]
            with pytest.raises((ConnectionError, RemoteProtocolError)):
                await attacker.converse(
                    address, RECONCILIATION_PROTOCOL, b"\xff" * 64, Silent(), timeout_s=10
                )
            await until(lambda: victim_host.rejected.get("malformed Waku RPC", 0) >= 1)
            # Ten sessions at once from one peer: one is held, nine are refused.
            silent = [Silent() for _ in range(10)]
            flood = [
                asyncio.create_task(
                    attacker.converse(address, RECONCILIATION_PROTOCOL, opening(), s, timeout_s=10)
                )
                for s in silent
            ]
            assert victim.waku_sync is not None
            await until(lambda: victim.waku_sync.refused["session_running"] == 9)
            await honest_round(
                victim_host, honest, honest_host, {m.message_hash for m in victims_own}
            )
            results = await asyncio.gather(*flood, return_exceptions=True)
            assert all(
                isinstance(r, (ConnectionError, RemoteProtocolError, TimeoutError)) for r in results
            )
            assert sum(s.answered.is_set() for s in silent) == 1
            # The silent session ended at the victim's deadline: the slot is free again.
            assert victim_host.stream_timeouts.get(RECONCILIATION_PROTOCOL, 0) == 1
            again = Silent()
            task = asyncio.create_task(
                attacker.converse(address, RECONCILIATION_PROTOCOL, opening(), again, timeout_s=10)
            )
            await asyncio.wait_for(again.answered.wait(), PATIENCE_S)
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    asyncio.run(scenario())


def test_a_peer_that_never_reads_our_pushes_holds_up_no_one_else(tmp_path: Path) -> None:
    victims_own = recent(400, 2, size=4096)  # ~1.6 MB to push: more than a stream's window

    async def scenario() -> None:
        async with (
            sync_node(tmp_path, "victim", victims_own, transfer_timeout_s=2.0) as (
                victim,
                victim_host,
            ),
            sync_node(tmp_path, "reader", []) as (honest, honest_host),
            sync_node(tmp_path, "sink", []) as (sink, sink_host),
        ):
            assert sink.waku_sync is not None and victim.waku_sync is not None
            stuck = asyncio.Event()

            async def never_reads(peer: str, frame: bytes) -> None:
                stuck.set()
                await asyncio.Event().wait()

            # The sink takes one frame, then reads no more: its stream fills up.
            await sink_host.serve_pushes(
                "/vac/waku/transfer/1.0.0", never_reads, max_frame_bytes=1 << 20
            )
            await sink_host.connect(victim_host.listen_addrs[0])
            assert await sink.waku_sync.round(victim_host.listen_addrs[0]) is not None
            await asyncio.wait_for(stuck.wait(), PATIENCE_S)
            await honest_round(
                victim_host, honest, honest_host, {m.message_hash for m in victims_own}
            )
            # The push to the sink gave up at its deadline; nothing of it lingers.
            await until(lambda: sink_host.peer_id not in victim.waku_sync._outbound)

    asyncio.run(scenario())
