"""Store Resume: the window since last online, from a random peer, with retries."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from storetest import HOUR, T0, in_order, make_messages, running

from sdsync.store import SqlArchive, StoredMessage, open_archive
from sdsync.store.resume import MAX_RESUME_NS, LastOnline, resume, resume_window
from sdsync.testing.pgcluster import free_port

PATIENCE_S = 30.0  # a liveness bound; resuming 300 messages normally takes well under a second


def test_window_starts_at_last_online_but_at_most_six_hours_back() -> None:
    now = T0 + 10 * HOUR
    assert resume_window(now - HOUR, now) == (now - HOUR, now)
    assert resume_window(now - 9 * HOUR, now) == (now - MAX_RESUME_NS, now)
    assert resume_window(None, now) == (now - 6 * HOUR, now)


def test_last_online_survives_a_restart_and_ignores_garbage(tmp_path: Path) -> None:
    path = tmp_path / "state" / "last_online"
    assert LastOnline(path).read() is None
    LastOnline(path).write(T0)
    assert LastOnline(path).read() == T0
    path.write_text("not a number")
    assert LastOnline(path).read() is None


def test_a_restarted_node_recovers_what_it_missed(archive: SqlArchive, tmp_path: Path) -> None:
    now = T0 + 8 * HOUR
    messages = in_order(make_messages(400, span=8 * HOUR))  # older than 6 h: out of reach
    archive.insert(messages)
    last_online = now - 7 * HOUR
    LastOnline(tmp_path / "b" / "last_online").write(last_online)
    expected = [m for m in messages if now - 6 * HOUR <= m.timestamp <= now]

    async def scenario() -> None:
        async with running(archive, tmp_path / "a") as peer:
            restarted = open_archive(str(tmp_path / "b" / "store.sqlite3"))
            async with running(
                restarted, tmp_path / "b", peers=(peer.url,), clock_ns=lambda: now
            ) as node:
                async with asyncio.timeout(PATIENCE_S):
                    while node.resume_report is None:
                        await asyncio.sleep(0.01)
                report = node.resume_report
                assert list(restarted.messages()) == expected
        assert report.complete and report.peer == peer.url
        assert report.received == report.stored == len(expected)
        assert report.pages == -(-len(expected) // 100)

    asyncio.run(scenario())


def test_dead_peers_are_retried_with_another_one(archive: SqlArchive, tmp_path: Path) -> None:
    messages = make_messages(30)
    archive.insert(messages)
    got: list[StoredMessage] = []

    async def keep(batch: list[StoredMessage]) -> int:
        got.extend(batch)
        return len(batch)

    async def scenario() -> None:
        dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
        async with running(archive, tmp_path) as peer:
            report = await resume(
                [*dead, peer.url], (T0, T0 + 3 * HOUR), keep, rng=random.Random(1)
            )
        assert report.complete and report.peer == peer.url
        assert report.attempts == 3  # this seed tries both dead peers first
        assert sorted(m.message_hash for m in got) == sorted(m.message_hash for m in messages)
        failed = await resume(dead, (T0, T0 + HOUR), keep, rng=random.Random(1))
        assert not failed.complete and failed.attempts == 3 and failed.error

    asyncio.run(scenario())
