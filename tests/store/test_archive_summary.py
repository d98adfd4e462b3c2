"""The public pages' archive figures cost the same whatever the request rate (issue 38,
attack 3): measured at most once per interval, one at a time, in the background, and
less often when a measurement costs more."""

from __future__ import annotations

import asyncio

import pytest

from sdsync.store.archive import TopicCount
from sdsync.store.summary import SummaryCache


class Archive:
    """A measurement that takes ``cost_s`` of the fake clock, and can be held."""

    def __init__(self, clock: list[float], cost_s: float = 0.1) -> None:
        self.clock = clock
        self.cost_s = cost_s
        self.calls = 0
        self.messages = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False

    async def measure(self) -> tuple[int, int, tuple[TopicCount, ...]]:
        self.calls += 1
        await self.gate.wait()
        self.clock[0] += self.cost_s
        if self.fail:
            raise OSError("database gone")
        return self.messages, 4096, ()


def cache(clock: list[float], archive: Archive, **options: float) -> SummaryCache:
    return SummaryCache(archive.measure, clock=lambda: clock[0], **options)


def test_a_storm_of_requests_costs_one_measurement_per_interval() -> None:
    async def scenario() -> None:
        clock = [0.0]
        archive = Archive(clock)
        summaries = cache(clock, archive, interval_s=15.0)
        first = await asyncio.gather(*(summaries.get() for _ in range(100)))
        assert archive.calls == 1 and {s.messages for s in first} == {0}
        archive.messages = 7
        for _ in range(1100):  # 1,100 requests over 33 s
            clock[0] += 0.03
            await summaries.get()
            await asyncio.sleep(0)
        assert archive.calls == 3, archive.calls  # at 0, then about 15 s and 30 s later
        assert (await summaries.get()).messages == 7

    asyncio.run(scenario())


def test_a_request_never_waits_for_a_measurement_but_the_first() -> None:
    async def scenario() -> None:
        clock = [0.0]
        archive = Archive(clock)
        summaries = cache(clock, archive, interval_s=1.0)
        await summaries.get()
        archive.gate.clear()  # the next measurement hangs
        clock[0] += 5.0
        archive.messages = 9
        stale = await asyncio.wait_for(summaries.get(), 1.0)
        assert stale.messages == 0 and archive.calls == 2
        for _ in range(50):
            await summaries.get()  # one measurement at a time
        assert archive.calls == 2
        archive.gate.set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert (await summaries.get()).messages == 9
        await summaries.close()

    asyncio.run(scenario())


def test_a_costly_measurement_is_made_less_often() -> None:
    async def scenario() -> None:
        clock = [0.0]
        archive = Archive(clock, cost_s=3.0)  # a large archive: 3 s a measurement
        summaries = cache(clock, archive, interval_s=15.0, cost_share=0.05)
        await summaries.get()
        clock[0] += 59.0
        await summaries.get()
        assert archive.calls == 1  # 3 s is 5 % of 60 s: not before a minute
        clock[0] += 1.0
        await summaries.get()
        await asyncio.sleep(0)  # the measurement's task starts
        assert archive.calls == 2

    asyncio.run(scenario())


def test_a_failed_measurement_keeps_the_last_summary() -> None:
    async def scenario() -> None:
        clock = [0.0]
        archive = Archive(clock)
        summaries = cache(clock, archive, interval_s=1.0)
        await summaries.get()
        archive.fail, archive.messages = True, 5
        clock[0] += 2.0
        await summaries.get()
        await asyncio.sleep(0)
        assert (await summaries.get()).messages == 0

    asyncio.run(scenario())


def test_a_failed_first_measurement_is_the_callers_error_and_tried_again() -> None:
    async def scenario() -> None:
        clock = [0.0]
        archive = Archive(clock)
        archive.fail = True
        summaries = cache(clock, archive)
        with pytest.raises(OSError):
            await summaries.get()
        archive.fail = False
        assert (await summaries.get()).bytes == 4096

    asyncio.run(scenario())
