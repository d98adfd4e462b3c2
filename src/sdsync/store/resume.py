"""Store Resume: after being offline, fetch what was missed from another store.

Theory of operation
-------------------
While online the node writes its *last-online* time to a file every minute
(:class:`LastOnline`; written to a temporary file, fsynced, renamed, so a crash leaves
the old value, never a torn one).  At start it asks a random peer store for every
message in ``[max(last_online, now - 6 h), now]`` over the v3 REST API, page by page,
and archives each page as it arrives — no message is rejected for being old, that is
the point.  A failed attempt (peer unreachable, busy, or answering nonsense) is retried
with another random peer, up to three attempts in all; a retry starts again at the
timestamp of the newest message already received, because a pagination cursor means
nothing to a different peer.  Re-receiving messages at that timestamp is harmless:
inserts are idempotent.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sdsync.errors import RemoteProtocolError
from sdsync.files import write_whole
from sdsync.store.client import HttpStoreClient
from sdsync.waku.messages import StoredMessage
from sdsync.waku.store.client import StoreUnavailableError
from sdsync.waku.store.model import MAX_PAGE_SIZE, StoreQuery

logger = logging.getLogger("sdsync.store.resume")
MAX_RESUME_NS = 6 * 3_600 * 10**9
ATTEMPTS = 3


class LastOnline:
    """The last time the node was known to be online, kept in a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> int | None:
        try:
            return int(self.path.read_text().strip())
        except (OSError, ValueError):
            return None

    def write(self, now_ns: int) -> None:
        write_whole(self.path, f"{now_ns}\n")


def resume_window(last_online: int | None, now_ns: int) -> tuple[int, int]:
    """The interval to recover: since we were last online, at most six hours back."""
    oldest = now_ns - MAX_RESUME_NS
    return (oldest if last_online is None else max(last_online, oldest)), now_ns


@dataclass
class ResumeReport:
    start: int
    end: int
    peer: str | None = None
    attempts: int = 0
    pages: int = 0
    received: int = 0
    stored: int = 0
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.error is None and self.peer is not None


async def resume(
    peers: Sequence[str],
    window: tuple[int, int],
    archive: Callable[[list[StoredMessage]], Awaitable[int]],
    *,
    rng: random.Random | None = None,
    attempts: int = ATTEMPTS,
    client: Callable[[str], HttpStoreClient] = HttpStoreClient,
) -> ResumeReport:
    """Fetch ``window`` from random ``peers`` and hand every page to ``archive``."""
    rng = rng or random.Random()
    report = ResumeReport(*window)
    if not peers:
        report.error = "no store peers configured"
        return report
    start = window[0]
    untried = list(peers)
    for _ in range(attempts):
        peer = untried.pop(rng.randrange(len(untried))) if untried else rng.choice(peers)
        report.attempts += 1
        report.peer = peer
        query = StoreQuery(
            include_data=True, time_start=start, time_end=window[1], pagination_limit=MAX_PAGE_SIZE
        )
        try:
            async with client(peer) as store:
                async for page in store.pages(query):
                    report.pages += 1
                    report.received += len(page.messages)
                    report.stored += await archive(page.messages)
                    if page.messages:
                        start = max(start, page.messages[-1].timestamp)
        except (StoreUnavailableError, RemoteProtocolError) as exc:
            report.error = f"{peer}: {exc}"
            logger.warning("store resume attempt %d failed: %s", report.attempts, report.error)
            continue
        report.error = None
        return report
    return report
