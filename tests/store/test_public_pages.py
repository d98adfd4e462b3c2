"""Read-only pages that cost nothing (issue 38, attack 3): ``/status`` and ``/metrics``
are for anyone, so a loop of them from one address must neither make the node scan its
archive per request nor go on without bound. The archive is measured in the background
(at most once per interval, whatever the request rate), and each address is held to the
pages' rate (429 past it, with Retry-After); the token's holder is not counted, nor is
another address."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from storetest import TOKEN, make_messages, running

from sdsync.store import SqlArchive
from sdsync.store.server import HttpLimits
from sdsync.waku.ratelimit import RateLimit

AUTH = {"Authorization": f"Bearer {TOKEN}"}
PACE = RateLimit(30, 10.0)  # 30 at once, 3 a second


class Counting:
    """Counts the archive's scans the pages could cost."""

    def __init__(self, archive: SqlArchive) -> None:
        self.calls: dict[str, int] = {}
        for name in ("count", "size_bytes", "topic_counts"):
            original = getattr(archive, name)

            def counted(*args: Any, _name: str = name, _fn: Any = original) -> Any:
                self.calls[_name] = self.calls.get(_name, 0) + 1
                return _fn(*args)

            setattr(archive, name, counted)


async def statuses(url: str, paths: list[str], **session: Any) -> list[int]:
    async with aiohttp.ClientSession(**session) as http:
        codes = []
        for path in paths:
            async with http.get(url + path) as response:
                await response.read()
                codes.append(response.status)
        return codes


def test_a_storm_of_page_requests_scans_the_archive_once_and_is_paced(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def scenario() -> None:
        sqlite_archive.insert(make_messages(200))
        scans = Counting(sqlite_archive)
        http = HttpLimits(pages_rate=PACE)
        async with running(sqlite_archive, tmp_path, http=http) as node:
            storm = await statuses(node.url, ["/status", "/metrics"] * 100)
            assert storm[:30] == [200] * 30  # the burst
            assert storm.count(429) >= 150  # then 3 a second, and the storm takes < 10 s
            # However many were answered, the archive was measured once (a page older
            # than the interval would ask for one more, in the background).
            assert scans.calls.get("topic_counts", 0) <= 2, scans.calls
            assert scans.calls.get("count", 0) <= 2, scans.calls
            async with (
                aiohttp.ClientSession() as session,
                session.get(node.url + "/status") as refused,
            ):
                assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
                assert "pages_rate_limited" in await refused.text()
            # The operator, with the token, is not counted; nor is another address.
            assert await statuses(node.url, ["/status"] * 5, headers=AUTH) == [200] * 5
            other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
            assert await statuses(node.url, ["/metrics"] * 5, connector=other) == [200] * 5
            body = await statuses(node.url, ["/health"])  # not a paced page
            assert body == [200]
            refusals = node.metrics.registry.get_sample_value(
                "sdsync_store_refused_total",
                {"route": "GET /status", "reason": "pages_rate_limited"},
            )
            assert refusals is not None and refusals >= 75

    asyncio.run(scenario())


def test_the_page_shows_the_archive_as_measured_in_the_background(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def scenario() -> None:
        sqlite_archive.insert(make_messages(12))
        async with running(sqlite_archive, tmp_path) as node:
            async with aiohttp.ClientSession() as http, http.get(node.url + "/status") as page:
                text = await page.text()
            assert "were measured at" in text
            summary = await node.archive_summary()
            assert summary.messages == 12 and sum(t.messages for t in summary.topics) == 12
            sqlite_archive.insert(make_messages(5, seed=2))
            assert (await node.archive_summary()).messages == 12  # not measured per request

    asyncio.run(scenario())
