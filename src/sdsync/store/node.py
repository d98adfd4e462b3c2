"""The store node: archive, HTTP API and the periodic work around them.

Theory of operation
-------------------
A :class:`StoreNode` owns an archive, a thread pool that runs the (blocking) archive
calls (it is an :class:`~sdsync.store.served.ArchiveKeeper`), the aiohttp server and its
background tasks:

* the *heartbeat* writes the last-online time every minute (Store Resume needs it);
* *retention* applies every configured policy every ``retention_interval_s``;
* every ``memory_check_s`` it gives the memory a load freed back to the system: the
  archive's caches, malloc's free pages (:mod:`~sdsync.store.memory`; glibc only);
* *resume* runs once at start, when store peers are configured, while the API is
  already serving;
* *Store Sync* (:mod:`sdsync.store.sync`) answers peers' sync sessions under ``/sync/``
  and, when store peers are configured, runs a round with a random one every
  ``sync.interval_s`` (the first one interval after start: resume covers the start);
* when it runs on a Waku node (``waku``: a
  :class:`~sdsync.waku.node.WakuNode`, such as the
  :class:`~sdsync.transport.libp2p.Libp2pTransport` ``sdsync store serve`` starts, or a
  :class:`~sdsync.testing.memory_waku.MemoryWakuNode` in tests):

  - every message heard on a configured relay topic is archived *before* the node
    forwards it: whoever hears it from us may acknowledge it (an SDS peer names it in
    its bloom filter, and its sender stops resending), so our archive must hold it
    first.  The Waku node hands each to :meth:`StoreNode._admit_relay` before
    gossipsub delivers or forwards it (``admit_before_relay``,
    :class:`AdmitsRelay`); the messages that arrive while the archive writes share its
    next transaction (:class:`~sdsync.store.ingest.GroupCommit`), and each is relayed,
    and offered to Filter, once its transaction is committed.  If the archive fails, the
    message is relayed all the same, counted in ``sdsync_store_refused_total{route=
    "relay", reason="archive_unavailable"}`` and logged once per transaction: a store
    whose database is down must not silence the relay, and Store Sync repairs the
    archive later.  The transport relays a message whose admission takes over 10 s too,
    for the same reason.  Once the node stops, it forwards nothing more.  A Waku node
    that cannot wait (the one in memory) hands messages over once delivered, and one
    *relay* task per topic archives them;
  - the node answers ``/vac/waku/store-query/3.0.0`` on it
    (:func:`~sdsync.waku.store.service.answer_store_query`: the query engine of the REST
    API) and exports the node's counters (refused connections, rejected frames, stream
    timeouts...) on ``/metrics`` (:class:`~sdsync.store.metrics.Libp2pCollector`);
  - with ``config.waku_sync``, it speaks Waku Sync (:mod:`sdsync.waku.sync`) with
    nwaku and other store nodes over libp2p: rounds with a random peer that announces
    it, sessions answered for peers, messages pushed both ways (source ``waku-sync``);
  - with ``light``, it is a service node for light clients
    (:class:`~sdsync.store.light_clients.LightClientServices`): LightPush publishes on the relay and
    archives, Filter pushes every message the relay or LightPush brings.

Every path that adds messages — HTTP ingestion, Store Resume, a relay subscription,
LightPush and Store Sync — goes through
:meth:`~sdsync.store.served.ArchiveKeeper.ingest`, which counts what was new per source.
Before that, each checks its messages with
:meth:`StoreNode.check_ingestible` (:func:`~sdsync.waku.messages.check_ingestible` at the
node's clock): a timestamp that is not positive or more than ``timestamp_variance_s``
(20 s) ahead of the clock is refused, old ones are fine.  HTTP refuses the whole
request, the relay and Store Resume drop the message; each refusal is counted in
``sdsync_store_refused_total{route, reason}``.

The node admits at most ``max_concurrent_queries`` v3 queries at a time
(:meth:`StoreNode.query`; one more raises :class:`~sdsync.store.served.QueriesBusy`, which
the API answers with 429) and gives each ``query_timeout_s``.  The HTTP API sees the
node only as a :class:`~sdsync.store.served.ServedNode`.

:func:`serve` runs a node until SIGINT or SIGTERM and then stops it cleanly: the server
stops accepting, tasks are cancelled, the last-online time is written a final time, the
archive is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import signal
import socket
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from aiohttp import web

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.store.archive import Archive
from sdsync.store.ingest import GroupCommit
from sdsync.store.light_clients import LightClientConfig, LightClientServices
from sdsync.store.memory import CHECK_S, MemoryReturn, UnsupportedAllocatorError, allocator
from sdsync.store.resume import LastOnline, ResumeReport, resume, resume_window
from sdsync.store.retention import DEFAULT_POLICY, RetentionPolicy
from sdsync.store.served import ArchiveKeeper, NodeQueries, QueriesBusy
from sdsync.store.server import HttpLimits, HttpServer, create_app
from sdsync.store.sync import PREFIX as SYNC_PREFIX
from sdsync.store.sync import PeriodicSync, SyncConfig, responder_app
from sdsync.waku.messages import InvalidMessageError, StoredMessage, check_ingestible
from sdsync.waku.node import Envelope, WakuNode
from sdsync.waku.store.model import Page, StoreQuery
from sdsync.waku.store.rpc import STORE_QUERY_PROTOCOL
from sdsync.waku.store.service import AnswerBudget, AnswerLimits, answer_store_query
from sdsync.waku.sync import TRANSFER_PROTOCOL, ItemRows, WakuSync, WakuSyncConfig
from sdsync.wire.waku import DEFAULT_TIMESTAMP_VARIANCE_S

logger = logging.getLogger("sdsync.store")


@dataclass(frozen=True)
class NodeConfig:
    data_dir: Path
    listen_host: str = "127.0.0.1"
    port: int = 8645
    token: str | None = None
    retention: tuple[RetentionPolicy, ...] = (RetentionPolicy.parse(DEFAULT_POLICY),)
    retention_interval_s: float = 30 * 60.0
    heartbeat_interval_s: float = 60.0
    peers: tuple[str, ...] = ()
    """Base URLs of other store nodes, for Store Resume and Store Sync."""
    query_timeout_s: float = 5.0
    max_concurrent_queries: int = 64
    threads: int = 8
    mounts: Mapping[str, web.Application] = field(default_factory=dict)
    """Sub-applications to serve under a path prefix (one at ``/sync/`` replaces Store Sync's)."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    relay_topics: tuple[str, ...] = ()
    """Pubsub topics to archive from the relay, when the node runs on a Waku node."""
    timestamp_variance_s: float = DEFAULT_TIMESTAMP_VARIANCE_S
    """How far ahead of the node's clock an ingested message's timestamp may be."""
    light_clients: LightClientConfig = field(default_factory=LightClientConfig)
    """What LightPush and Filter serve, when the node serves light clients."""
    http: HttpLimits = field(default_factory=HttpLimits)
    """Time bounds of the HTTP API's connections."""
    store_answers: AnswerLimits = field(default_factory=AnswerLimits)
    """Bytes of store-query answers in flight over libp2p, per peer and in all."""
    waku_sync: WakuSyncConfig | None = None
    """Waku Sync over libp2p with nwaku and other store nodes, when the node runs on a
    Waku node (None: not mounted)."""
    memory_check_s: float | None = CHECK_S
    """How often the node looks whether to give memory back to the system
    (:mod:`~sdsync.store.memory`; None: never)."""


class StoreNode(ArchiveKeeper):
    def __init__(
        self,
        archive: Archive,
        config: NodeConfig,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        rng: random.Random | None = None,
        waku: WakuNode | None = None,
        light_clients: bool = False,
    ) -> None:
        """A node on ``archive``; on ``waku`` it also archives relay, answers store query
        and exports the node's counters, and with ``light_clients`` serves light clients there
        (``config.light_clients``)."""
        if light_clients and waku is None:
            raise LocalProtocolError("light-client services need a Waku node to run on")
        self._executor = ThreadPoolExecutor(config.threads, thread_name_prefix="archive")
        super().__init__(archive, executor=self._executor)
        self.waku = waku
        if waku is not None:
            self.metrics.export_libp2p(waku)
        self.light_clients = (
            LightClientServices(self, waku, config.light_clients)
            if waku is not None and light_clients
            else None
        )
        self.store_answers = AnswerBudget(config.store_answers)
        self.queries = NodeQueries(self)
        self.config = config
        self.last_online = LastOnline(config.data_dir / "last_online")
        self.resume_report: ResumeReport | None = None
        self.queries_in_flight = 0
        self._clock_ns = clock_ns
        self._rng = rng or random.Random()
        self._http: HttpServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.port = config.port
        self._retention_lock = asyncio.Lock()
        self._relay_commits = GroupCommit(functools.partial(self.ingest, source="relay"))
        self._relay_closed = False
        self.waku_sync = (
            WakuSync(
                waku,
                _SyncArchive(self),
                config.waku_sync,
                clock_ns=clock_ns,
                rng=self._rng,
                max_future_ns=self.max_future_ns,
            )
            if waku is not None and config.waku_sync is not None
            else None
        )
        if self.waku_sync is not None:
            self.metrics.export_waku_sync(self.waku_sync)
        self.memory = self._memory_return() if config.memory_check_s is not None else None
        self.sync: PeriodicSync | None = None
        if config.peers and config.sync.interval_s is not None:
            self.sync = PeriodicSync(
                self, config.peers, config.sync, clock_ns=clock_ns, rng=self._rng
            )

    @property
    def url(self) -> str:
        return f"http://{self.config.listen_host}:{self.port}"

    # -- lifecycle

    async def start(self) -> None:
        """Serve the API and start the background tasks (resume first reads last-online)."""
        config = self.config
        window = resume_window(self.last_online.read(), self._clock_ns())
        mounts = dict(config.mounts)
        if config.sync.serve:
            mounts.setdefault(SYNC_PREFIX, responder_app(config.sync, wall_clock_ns=self._clock_ns))
        # Bound here, not by aiohttp, so that port 0 tells us which port we got.
        sock = socket.create_server((config.listen_host, config.port))
        self.port = int(sock.getsockname()[1])
        self._http = await HttpServer.start(create_app(self, mounts=mounts, http=config.http), sock)
        self._tasks = [
            self._spawn(self._every(config.heartbeat_interval_s, self.heartbeat), "heartbeat"),
            self._spawn(
                self._every(config.retention_interval_s, self.apply_retention), "retention"
            ),
        ]
        if config.peers:
            self._tasks.append(self._spawn(self.resume(window), "resume"))
        if self.sync is not None and config.sync.interval_s is not None:
            rounds = self._every(config.sync.interval_s, self.sync.round, wait_first=True)
            self._tasks.append(self._spawn(rounds, "sync"))
        if self.memory is not None and config.memory_check_s is not None:
            check = functools.partial(self.in_archive, self.memory.check)
            checks = self._every(config.memory_check_s, check, wait_first=True)
            self._tasks.append(self._spawn(checks, "memory"))
        if self.waku is not None:
            for topic in config.relay_topics:
                if isinstance(self.waku, AdmitsRelay):
                    await self.waku.admit_before_relay(topic, self._admit_relay)
                else:
                    envelopes = self.waku.subscribe_envelopes(topic)
                    archiving = self._archive_relay(envelopes)
                    self._tasks.append(self._spawn(archiving, f"relay {topic}"))
            # The answer budget refills over the longest an answer can be held: the
            # stream's deadline is that same span.
            await self.waku.serve(
                STORE_QUERY_PROTOCOL,
                self._answer_store_query,
                timeout_s=self.store_answers.limits.hold_s,
            )
        if self.light_clients is not None:
            await self.light_clients.start()
        if self.waku_sync is not None:
            await self.waku_sync.start()

    async def stop(self) -> None:
        self._relay_closed = True
        if self._http is not None:
            await self._http.stop()
            self._http = None
        if self.waku_sync is not None:
            await self.waku_sync.close()
        if self.light_clients is not None:
            await self.light_clients.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.summary.close()
        await self._relay_commits.close()
        await self.heartbeat()
        self._executor.shutdown(wait=True)
        self.archive.close()

    def _memory_return(self) -> MemoryReturn | None:
        try:
            malloc = allocator()
        except UnsupportedAllocatorError as exc:
            logger.info("memory a load freed stays the process's: %s", exc)
            return None
        return MemoryReturn(
            malloc, self.archive.release_memory, counted=self.metrics.returned_memory
        )

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return asyncio.create_task(work, name=f"store-{name}")

    async def _every(
        self,
        interval_s: float,
        work: Callable[[], Coroutine[Any, Any, Any]],
        *,
        wait_first: bool = False,
    ) -> None:
        if wait_first:
            await asyncio.sleep(interval_s)
        while True:
            try:
                await work()
            except Exception:  # a failing round must not end the loop; the next may work
                logger.exception("periodic %s failed", getattr(work, "__name__", work))
            await asyncio.sleep(interval_s)

    # -- the archive (run off the event loop by ArchiveKeeper): what goes in, what comes out

    def now_ns(self) -> int:
        """The node's clock (Unix ns)."""
        return self._clock_ns()

    @property
    def max_future_ns(self) -> int:
        return int(self.config.timestamp_variance_s * 1e9)

    def check_ingestible(self, message: StoredMessage) -> None:
        """Refuse ``message`` if no ingestion path may archive it now: an implausible
        timestamp, or a topic or size a backend cannot take (raises
        :class:`~sdsync.waku.messages.InvalidMessageError`, with its ``reason``)."""
        check_ingestible(message, self._clock_ns(), self.max_future_ns)

    def plausible(self, messages: Iterable[StoredMessage], *, route: str) -> list[StoredMessage]:
        """``messages`` without those :meth:`check_ingestible` refuses, each counted in
        ``sdsync_store_refused_total{route, reason}`` (for paths that drop, not refuse)."""
        now, future = self._clock_ns(), self.max_future_ns
        kept = []
        for message in messages:
            try:
                check_ingestible(message, now, future)
            except InvalidMessageError as exc:
                self.metrics.refuse(route, exc.reason)
                logger.debug("%s message not archived: %s", route, exc)
            else:
                kept.append(message)
        return kept

    async def query(self, query: StoreQuery) -> Page:
        """One page of ``query``, if the node runs fewer than ``max_concurrent_queries``
        (else :class:`~sdsync.store.served.QueriesBusy`), within ``query_timeout_s`` (else
        ``TimeoutError``)."""
        if self.queries_in_flight >= self.config.max_concurrent_queries:
            raise QueriesBusy("too many queries in flight")
        self.queries_in_flight += 1
        try:
            return await asyncio.wait_for(
                self.in_archive(self.archive.query, query), self.config.query_timeout_s
            )
        finally:
            self.queries_in_flight -= 1

    async def apply_retention(self) -> dict[str, int]:
        deleted: dict[str, int] = {}
        # One run at a time: two capacity runs that counted the same archive would each
        # delete the whole excess (the periodic run and POST /admin/v1/retention can meet).
        async with self._retention_lock:
            for policy in self.config.retention:
                count = await self.in_archive(policy.apply, self.archive, self._clock_ns())
                self.metrics.retention_deleted.labels(policy=policy.kind).inc(count)
                deleted[str(policy)] = count
        return deleted

    async def heartbeat(self) -> None:
        now = self._clock_ns()
        await asyncio.get_running_loop().run_in_executor(None, self.last_online.write, now)

    async def _admit_relay(self, envelope: Envelope) -> bool:
        """A relay message from a peer, archived before the host delivers or forwards
        it; whether the host may relay it (see the module)."""
        if self._relay_closed:
            return False  # what the node forwards it keeps, and it keeps no more
        try:
            stored = StoredMessage.of(envelope.pubsub_topic, envelope.message)
            self.check_ingestible(stored)
        except RemoteProtocolError as exc:  # no timestamp, ephemeral, implausible...
            self.metrics.rejected.labels(source="relay").inc()
            reason = exc.reason if isinstance(exc, InvalidMessageError) else "malformed"
            self.metrics.refuse("relay", reason)
            logger.debug("relay message not archived: %s", exc)
        else:
            if not await self._relay_commits.submit(stored):  # logged by the group commit
                self.metrics.refuse("relay", "archive_unavailable")
        if self.light_clients is not None:  # Filter pushes ephemeral messages too
            self.light_clients.offer(envelope.pubsub_topic, envelope.message)
        return True

    async def _archive_relay(self, envelopes: AsyncIterator[Envelope]) -> None:
        """Relay messages of a Waku node that cannot wait for their admission (one in
        memory), archived once delivered."""
        async for envelope in envelopes:
            await self._admit_relay(envelope)

    async def _answer_store_query(self, peer: str, request: bytes) -> bytes:
        address = await self.waku.peer_ip(peer) if self.waku is not None else None
        return await answer_store_query(
            self.queries, request, peer=peer, address=address, budget=self.store_answers
        )

    async def resume(self, window: tuple[int, int]) -> None:
        async def archive(messages: list[StoredMessage]) -> int:
            # Old messages are what resume is for; only implausible ones are dropped.
            return await self.ingest(self.plausible(messages, route="resume"), source="resume")

        report = await resume(self.config.peers, window, archive, rng=self._rng)
        self.resume_report = report
        logger.info(
            "store resume from %s: %d messages, %d new, %s",
            report.peer,
            report.received,
            report.stored,
            report.error or "complete",
        )

    async def refresh_gauges(self) -> None:
        summary = await self.archive_summary()
        self.metrics.messages.set(summary.messages)
        self.metrics.archive_bytes.set(summary.bytes)
        self.metrics.filter_subscribers.set(
            len(self.light_clients.filters) if self.light_clients else 0
        )

    async def info(self) -> dict[str, Any]:
        return {
            "backend": self.archive.backend,
            "schema_version": self.archive.schema_version,
            "messages": await self.in_archive(self.archive.count),
            "archive_bytes": await self.in_archive(self.archive.size_bytes),
            "retention": [str(p) for p in self.config.retention],
            "last_online_ns": self.last_online.read(),
            "peers": list(self.config.peers),
            "resume": vars(self.resume_report) if self.resume_report else None,
            "sync": self.sync.info() if self.sync else None,
            "waku_sync": self.waku_sync.info() if self.waku_sync else None,
        }


@runtime_checkable
class AdmitsRelay(Protocol):
    """A Waku node that lets its user admit each relay message before it forwards it
    (:meth:`~sdsync.transport.libp2p.Libp2pNode.admit_before_relay`)."""

    async def admit_before_relay(
        self, topic: str, admit: Callable[[Envelope], Awaitable[bool] | bool]
    ) -> None: ...


class _SyncArchive:
    """The node's archive as Waku Sync reaches it (:class:`~sdsync.waku.sync.SyncArchive`)."""

    def __init__(self, node: StoreNode) -> None:
        self._node = node

    async def rows(self, start: int, end: int, max_items: int) -> ItemRows:
        return await self._node.in_archive(self._node.archive.sync_rows, start, end, max_items)

    async def messages(self, hashes: Sequence[bytes]) -> list[Envelope]:
        stored = await self._node.in_archive(self._node.archive.get, hashes)
        return [Envelope(m.pubsub_topic, m.message, m.message_hash) for m in stored]

    async def archive(self, envelopes: Sequence[Envelope]) -> int:
        node = self._node
        stored = [StoredMessage.of(e.pubsub_topic, e.message) for e in envelopes]
        return await node.ingest(
            node.plausible(stored, route=TRANSFER_PROTOCOL), source="waku-sync"
        )


async def serve(
    node: StoreNode,
    *,
    on_ready: Callable[[StoreNode], None] | None = None,
    before_stop: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> None:
    """Run ``node`` until SIGINT or SIGTERM, then stop it cleanly; ``before_stop`` runs
    first, while the node still serves (its Waku host's drain: the exchanges in
    progress need the archive)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await node.start()
    try:
        if on_ready is not None:
            on_ready(node)
        await stop.wait()
        if before_stop is not None:
            await before_stop()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await node.stop()
