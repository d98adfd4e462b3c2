"""GroupCommit: messages that arrive during a write share the next transaction, and each
caller learns once its own message is committed (or that the archive failed)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from storetest import make_messages

from sdsync.store import ArchiveUnavailable
from sdsync.store.ingest import GroupCommit
from sdsync.waku.messages import StoredMessage


class SlowArchive:
    """An ingest that holds each write until released, and records what each one got."""

    def __init__(self, *, failing: int | None = None) -> None:
        self.writes: list[list[StoredMessage]] = []
        self.release = asyncio.Event()
        self.failing = failing  # the write (by index) that raises ArchiveUnavailable

    async def ingest(self, messages: Sequence[StoredMessage]) -> int:
        self.writes.append(list(messages))
        await self.release.wait()
        self.release.clear()
        if len(self.writes) - 1 == self.failing:
            raise ArchiveUnavailable("disk full")
        return len(messages)


async def _until(check: object) -> None:
    async with asyncio.timeout(30):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0)


def test_messages_that_arrive_during_a_write_share_the_next_one() -> None:
    asyncio.run(_messages_that_arrive_during_a_write_share_the_next_one())


async def _messages_that_arrive_during_a_write_share_the_next_one() -> None:
    archive = SlowArchive()
    group = GroupCommit(archive.ingest, max_batch=3)
    first, *rest = make_messages(6)
    alone = group.submit(first)
    await _until(lambda: len(archive.writes) == 1)
    assert archive.writes[0] == [first]  # an idle archive does not wait for company
    later = [group.submit(message) for message in rest]
    assert not alone.done()
    archive.release.set()
    assert await alone is True
    await _until(lambda: len(archive.writes) == 2)
    assert archive.writes[1] == rest[:3]  # max_batch bounds a transaction
    assert not any(future.done() for future in later)  # none is answered before its commit
    archive.release.set()
    await _until(lambda: len(archive.writes) == 3)
    assert [future.done() for future in later] == [True, True, True, False, False]
    archive.release.set()
    assert await asyncio.gather(*later) == [True] * 5
    assert archive.writes[2] == rest[3:]


def test_a_failed_write_fails_its_messages_only_and_close_waits_for_the_rest() -> None:
    asyncio.run(_a_failed_write_fails_its_messages_only_and_close_waits_for_the_rest())


async def _a_failed_write_fails_its_messages_only_and_close_waits_for_the_rest() -> None:
    archive = SlowArchive(failing=0)
    group = GroupCommit(archive.ingest)
    first, second = make_messages(2)
    failed = group.submit(first)
    await _until(lambda: len(archive.writes) == 1)
    committed = group.submit(second)
    archive.release.set()
    assert await failed is False
    closing = asyncio.create_task(group.close())
    await _until(lambda: len(archive.writes) == 2)
    assert not closing.done()
    archive.release.set()
    await closing
    assert committed.result() is True


def test_a_cancelled_caller_does_not_stop_the_others() -> None:
    asyncio.run(_a_cancelled_caller_does_not_stop_the_others())


async def _a_cancelled_caller_does_not_stop_the_others() -> None:
    archive = SlowArchive()
    group = GroupCommit(archive.ingest)
    first, second = make_messages(2)
    group.submit(first)
    await _until(lambda: len(archive.writes) == 1)
    gone, kept = group.submit(first), group.submit(second)
    gone.cancel()
    archive.release.set()
    await _until(lambda: len(archive.writes) == 2)
    archive.release.set()
    assert await kept is True
