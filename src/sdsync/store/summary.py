"""The archive's figures the public pages show, measured in the background.

Theory of operation
-------------------
``GET /status`` and ``GET /metrics`` are for anyone, and measuring the archive is not
free: counting its messages and its largest topics scans an index, 280–380 ms of the
node's CPU on a million messages.  Measured per request, a loop of requests from one
address took 65 % of a core and pushed honest queries past their deadline.

A :class:`SummaryCache` keeps the last :class:`ArchiveSummary` and measures again only
when it is older than its interval, in a task of its own: a request never waits for a
measurement (but the first), at most one runs at a time, and the interval grows with
what a measurement costs (``cost_share``: at most a twentieth of the time by default),
so the archive pays the same whatever the request rate and however large it grows.  The
page says how old its figures are.  Anything more exact reads the archive itself and
needs the node's token (``GET /admin/v1/info``).

The clock is passed in, so tests drive it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sdsync.store.archive import TopicCount

logger = logging.getLogger("sdsync.store.summary")

__all__ = ["SUMMARY_TOPICS", "ArchiveSummary", "SummaryCache"]

SUMMARY_TOPICS = 50
"""The largest topics a summary lists (the status page's table)."""


@dataclass(frozen=True)
class ArchiveSummary:
    """What the archive held when it was measured."""

    messages: int
    bytes: int
    topics: tuple[TopicCount, ...]
    measured_at: float
    """The clock's time of the measurement's end (for its age)."""
    measured_ns: int
    """The same moment, Unix ns (for the page)."""
    cost_s: float
    """How long the measurement took."""


Measure = Callable[[], Awaitable[tuple[int, int, tuple[TopicCount, ...]]]]
"""Messages, bytes and the largest topics, read from the archive."""


class SummaryCache:
    """The last summary, measured again in the background once it is ``interval_s``
    old, or ``cost_s / cost_share`` if a measurement costs more (see the module)."""

    def __init__(
        self,
        measure: Measure,
        *,
        interval_s: float = 15.0,
        cost_share: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._measure = measure
        self._wall_ns = wall_ns
        self.interval_s = interval_s
        self.cost_share = cost_share
        self._clock = clock
        self._last: ArchiveSummary | None = None
        self._task: asyncio.Task[ArchiveSummary] | None = None
        self.measurements = 0

    async def get(self) -> ArchiveSummary:
        """The last summary; the first call waits for the first measurement."""
        if self._last is None:
            return await asyncio.shield(self._refresh())
        if self._clock() - self._last.measured_at >= self._max_age_s(self._last):
            self._refresh()
        return self._last

    def _max_age_s(self, last: ArchiveSummary) -> float:
        return max(self.interval_s, last.cost_s / self.cost_share)

    def _refresh(self) -> asyncio.Task[ArchiveSummary]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._measured(), name="archive-summary")
        return self._task

    async def _measured(self) -> ArchiveSummary:
        started = self._clock()
        try:
            messages, size, topics = await self._measure()
        except Exception:
            if self._last is None:
                raise
            logger.warning("measuring the archive for the status page failed", exc_info=True)
            return self._last
        self.measurements += 1
        ended = self._clock()
        self._last = ArchiveSummary(messages, size, topics, ended, self._wall_ns(), ended - started)
        return self._last

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
