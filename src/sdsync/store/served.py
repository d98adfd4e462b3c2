"""The store node as the protocols on top of it see it.

Theory of operation
-------------------
The HTTP API (:mod:`~sdsync.store.server`) and Store Sync (:mod:`~sdsync.store.sync`)
do not import the :class:`~sdsync.store.node.StoreNode` that runs them; each is written
against what it needs of it:

* :class:`ArchiveNode` — an archive, the blocking archive calls run off the event loop
  (:meth:`~ArchiveNode.in_archive`), ingestion, the metrics, the RIBLT symbol cache;
* :class:`ServedNode` — that, and what the HTTP routes add: the write token, the node's
  clock, v3 queries under the node's admission and time limits, retention, its info.

:class:`ArchiveKeeper` is the part of the node both need: the archive, its threads and the
one :meth:`~ArchiveKeeper.ingest` through which every path that adds messages (HTTP,
relay, Store Resume, Store Sync) archives them, counted per source.  A
:class:`~sdsync.store.node.StoreNode` is an ArchiveKeeper; the one-shot
``sdsync store sync``, which serves nothing, uses a bare one.

What fails is said with our own errors, so that no code above the archive knows its
database driver: a failing database raises
:class:`~sdsync.store.archive.ArchiveUnavailable` (HTTP 503), a node already running
``max_concurrent_queries`` queries :class:`QueriesBusy` (HTTP 429).

Both ways a v3 query arrives, REST (:mod:`~sdsync.store.server`) and libp2p
(:mod:`~sdsync.waku.store.service`), answer it with :func:`answer_query`: a page, or a
:class:`QueryFailure` with the v3 status to answer, each counted alike in the node's
metrics (queries by status, refusals by route and reason).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, ParamSpec, Protocol, TypeVar

from sdsync.errors import ServiceUnavailable
from sdsync.reconcile import SymbolCache
from sdsync.store.archive import Archive, ArchiveUnavailable, TopicCount
from sdsync.store.metrics import StoreMetrics
from sdsync.store.summary import SUMMARY_TOPICS, ArchiveSummary, SummaryCache
from sdsync.waku.messages import StoredMessage
from sdsync.waku.store.model import Page, QueryError, QueryFailure, StatusCode, StoreQuery

P = ParamSpec("P")
T = TypeVar("T")


class QueriesBusy(ServiceUnavailable):
    """The node runs as many queries as it may (``max_concurrent_queries``); this one
    was not started.

    Nobody's fault, like :class:`~sdsync.store.archive.ArchiveUnavailable`, and not an
    :class:`~sdsync.errors.SdsError`: retry later.  The HTTP API answers it with 429.
    """


class ArchiveNode(Protocol):
    """What a sync session needs from the node it runs in."""

    @property
    def archive(self) -> Archive: ...

    @property
    def metrics(self) -> StoreMetrics: ...

    @property
    def riblt_symbols(self) -> SymbolCache:
        """The RIBLT bucket rows this node's snapshots share (:mod:`~sdsync.store.sync`)."""
        ...

    async def in_archive(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T: ...

    async def ingest(self, messages: Sequence[StoredMessage], *, source: str) -> int: ...


class ServedConfig(Protocol):
    """What the HTTP routes read of the node's configuration."""

    @property
    def token(self) -> str | None:
        """The bearer token of writes and admin routes; None: writes are disabled."""
        ...


class ServedNode(ArchiveNode, Protocol):
    """The node the HTTP routes (and the sub-applications mounted beside them) serve."""

    @property
    def config(self) -> ServedConfig: ...

    def now_ns(self) -> int:
        """The node's clock (Unix ns)."""
        ...

    @property
    def max_future_ns(self) -> int:
        """How far ahead of :meth:`now_ns` an ingested message's timestamp may be."""
        ...

    async def query(self, query: StoreQuery) -> Page:
        """One page of ``query``: :class:`QueriesBusy` when the node runs as many queries
        as it may, ``TimeoutError`` past its query timeout."""
        ...

    async def apply_retention(self) -> dict[str, int]:
        """Apply every retention policy now; messages deleted, by policy."""
        ...

    async def info(self) -> dict[str, Any]:
        """The node's state, as ``GET /admin/v1/info`` shows it."""
        ...

    async def refresh_gauges(self) -> None:
        """Set the gauges ``GET /metrics`` exports, the archive's from its summary."""
        ...

    async def archive_summary(self) -> ArchiveSummary:
        """The archive's figures as last measured in the background
        (:mod:`~sdsync.store.summary`): what anyone may see without costing a scan."""
        ...


class ArchiveKeeper:
    """An archive whose calls run off the event loop, and the one way into it."""

    def __init__(self, archive: Archive, *, executor: Executor | None = None) -> None:
        """``executor`` runs the archive calls (None: the event loop's default one)."""
        self.archive = archive
        self.metrics = StoreMetrics()
        self.riblt_symbols = SymbolCache()
        self._archive_executor = executor
        self.summary = SummaryCache(self._measure)

    async def archive_summary(self) -> ArchiveSummary:
        return await self.summary.get()

    async def _measure(self) -> tuple[int, int, tuple[TopicCount, ...]]:
        count = await self.in_archive(self.archive.count)
        size = await self.in_archive(self.archive.size_bytes)
        topics = await self.in_archive(self.archive.topic_counts, SUMMARY_TOPICS)
        return count, size, tuple(topics)

    async def in_archive(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on one of the archive's threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._archive_executor, functools.partial(fn, *args, **kwargs)
        )

    async def ingest(self, messages: Sequence[StoredMessage], *, source: str) -> int:
        """Archive ``messages`` heard from ``source``; returns how many were new.

        Every ingestion path checks its messages first, in its own way (see
        :mod:`~sdsync.store.node`); inserting is idempotent, so a message already held
        counts as a duplicate of ``source``.
        """
        new = await self.in_archive(self.archive.insert, messages)
        self.metrics.ingested.labels(source=source).inc(new)
        if new:
            self.metrics.traffic.add(source, new)
        self.metrics.duplicates.labels(source=source).inc(len(messages) - new)
        return new


# -- answering v3 queries

MAX_REASON_CHARS = 300


def one_line(text: str) -> str:
    """``text`` on one line and at most :data:`MAX_REASON_CHARS` long."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_REASON_CHARS else flat[: MAX_REASON_CHARS - 3] + "..."


def refuse_query(
    node: ArchiveNode,
    route: str,
    reason: str,
    description: str,
    status: StatusCode = StatusCode.BAD_REQUEST,
) -> QueryFailure:
    """A query refused at ``route`` (a request that is no valid query), counted under
    ``reason``."""
    node.metrics.refuse(route, reason)
    return _failed(node, status, description)


async def answer_query(node: ServedNode, query: StoreQuery, route: str) -> Page | QueryFailure:
    """One page of ``query`` from ``node``, or why not: 400 for a query the archive
    refuses (an unknown cursor), 429 when the node is busy, 503 when its archive fails, 504
    past its query timeout."""
    started = time.perf_counter()
    try:
        page = await node.query(query)
    except QueryError as exc:
        return refuse_query(node, route, exc.reason, exc.description, exc.status)
    except QueriesBusy as exc:
        return refuse_query(node, route, "too_many_queries", str(exc), StatusCode.TOO_MANY_REQUESTS)
    except TimeoutError:
        return _failed(node, StatusCode.GATEWAY_TIMEOUT, "query timed out")
    except ArchiveUnavailable as exc:
        return _failed(node, StatusCode.SERVICE_UNAVAILABLE, f"archive unavailable: {exc}")
    node.metrics.queries.labels(status=str(int(StatusCode.OK))).inc()
    node.metrics.query_seconds.observe(time.perf_counter() - started)
    return page


def _failed(node: ArchiveNode, status: StatusCode, description: str) -> QueryFailure:
    node.metrics.queries.labels(status=str(int(status))).inc()
    return QueryFailure(status, one_line(description))


class NodeQueries:
    """``node``'s one query engine as the Waku store-query service asks it
    (:class:`~sdsync.waku.store.service.QueryEngine`): the REST API's admission, timeouts
    and counters."""

    def __init__(self, node: ServedNode) -> None:
        self._node = node

    async def answer(self, query: StoreQuery, route: str) -> Page | QueryFailure:
        return await answer_query(self._node, query, route)

    def refuse(
        self,
        route: str,
        reason: str,
        description: str,
        status: StatusCode = StatusCode.BAD_REQUEST,
    ) -> QueryFailure:
        return refuse_query(self._node, route, reason, description, status)
