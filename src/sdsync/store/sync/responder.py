"""The responder: answers other nodes' Store Sync sessions over HTTP.

Theory of operation
-------------------
The initiator is the HTTP client; the responder keeps the state of each session between
requests in a :class:`SessionTable`. Routes, relative to the node (``/sync/`` is where
:func:`responder_app` is mounted):

* ``POST /sync/v1/{method}?start=NS&end=NS`` with the first frame opens a session of a
  method of :data:`~sdsync.reconcile.METHODS`: the responder loads a snapshot of
  ``[start, end)``, answers the frame, and names the session in the ``Sdsync-Session``
  header. Another method answers 404 (counted as ``sync_method``), which tells the
  initiator that this node does not speak it.
* ``POST /sync/v1/sessions/{id}`` with a frame: the answer frame (an empty body: nothing
  to say). A malformed frame answers 400 and ends the session.
* A streaming method (RIBLT; ``streaming``) sends and answers whole turns as frame streams
  (:mod:`.wire`): the answer to its first frame is the stream of coded symbols, written
  batch after batch until the initiator hangs up or posts its next turn (which stops
  the stream), or the stream's end.
* Once reconciliation is done, the transfer. ``POST …/{id}/messages`` pushes a batch of
  messages the responder lacks; it accepts only hashes the session found it needs, inside
  the session's window, and recomputes each hash. ``GET …/{id}/messages?from=N`` pulls a
  batch of what the initiator lacks, from position ``N`` of the list the session found;
  ``Sdsync-Next`` names the next position while more remain.
* ``DELETE /sync/v1/sessions/{id}`` ends the session.

No token is needed unless the node sets a sync token: what a session can write is
bounded by :mod:`.policy` — a recent window only (403 otherwise), and only messages its
reconciliation found missing, with the timestamps claimed for them, on topics the node
archives, each once, within a byte budget (a refused batch answers 403, stores nothing and
ends the session).

Resources are bounded, and one client cannot hold them all: at most ``max_sessions``
sessions, ``max_sessions_per_client`` per remote address (more answer 503 with
``Retry-After``); each address opens at most ``session_burst`` sessions at once and
``sessions_per_minute`` on average (a token bucket: more answer 429 with ``Retry-After``,
counted as ``session_rate``, before anything is read), so opening and closing sessions in
a loop loads few snapshots; at most ``max_items`` items in all their snapshots together
(a window larger than the whole budget answers 413 before anything is loaded); a session
that made no progress — a frame answered, a batch stored or served — for
``idle_timeout_s`` is dropped, and one whose transfer is complete is closed by the
responder (unknown sessions answer 404). A streamed turn is written with the same
deadline, and a session that ends (dropped, expired, closed) cancels the write it is
blocked in and closes that connection: a peer that does not read cannot keep a
snapshot alive past its session. Frames are evaluated on a worker thread, one at a time
per session, so a large window does not stall the node's other requests. A malformed frame
is counted as ``bad_frame``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.reconcile import (
    DEFAULT_MAX_FRAME_SIZE,
    METHODS,
    ReconcileSession,
    varint,
)
from sdsync.reconcile.session import MethodSession
from sdsync.store.archive import ArchiveUnavailable
from sdsync.store.served import ArchiveNode
from sdsync.store.server import NODE, bearer_matches, refuse
from sdsync.store.sync.config import SyncConfig
from sdsync.store.sync.policy import SyncRefused, check_pushed, check_window
from sdsync.store.sync.snapshot import SOURCE, read_batch, snapshot
from sdsync.store.sync.wire import (
    BATCH_TYPE,
    FRAME_TYPE,
    FRAMES_TYPE,
    MAX_BATCH_BYTES,
    MAX_FRAMES_BODY,
    NEXT_HEADER,
    SESSION_HEADER,
    VERSION,
    decode_batch,
    decode_frames,
)
from sdsync.waku.messages import StoredMessage
from sdsync.waku.ratelimit import PeerBuckets, RateLimit
from sdsync.waku.store.model import INT64_MAX, StoreQuery

RETRY_AFTER_S = 5


@dataclass(eq=False)
class Session:
    """One open session: the reconciliation, its window and snapshot size, what it found."""

    reconcile: ReconcileSession
    window: tuple[int, int]
    items: int
    client: str
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wanted: dict[bytes, int] = field(default_factory=dict)
    """Hashes the initiator may still push (we lack them, inside the window), with the
    timestamps it claimed for them."""
    offered: list[bytes] = field(default_factory=list)
    """Hashes of the messages the initiator lacks, in archive order, for pulls."""
    pulled: bool = False
    """The last batch of ``offered`` has been served."""
    pushed_bytes: int = 0
    archived_topics: dict[str, bool] = field(default_factory=dict)
    streams: bool = False
    """Turns travel as frame streams (RIBLT)."""
    settled: bool = False
    """:meth:`finish` has run."""
    turn: int = 0
    """Requests answered: a stream goes on only while no later request came."""
    ended: bool = False
    """Dropped before its end (expired, closed, refused): its streams stop writing."""
    writes: set[asyncio.Timeout] = field(default_factory=set)
    """The deadlines of the writes its streams are in."""

    def cut_writes(self) -> None:
        """Cut short the writes the session's streams are in (they raise TimeoutError)."""
        for deadline in self.writes:
            if not deadline.expired():
                deadline.reschedule(0)  # due at once

    def end(self) -> None:
        self.ended = True
        self.cut_writes()

    def finish(self) -> None:
        self.settled = True
        start, end = self.window
        self.wanted = {h: ts for ts, h in self.reconcile.need if start <= ts < end}
        self.offered = [h for _, h in sorted(self.reconcile.have)]
        self.pulled = not self.offered

    @property
    def complete(self) -> bool:
        """Reconciled, everything pushed that was found missing, everything pulled."""
        return self.reconcile.done and not self.wanted and self.pulled


class SessionTable:
    """Open sessions by id, within the configured bounds."""

    def __init__(self, config: SyncConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._opening: Counter[str] = Counter()
        # session_burst opens at once, sessions_per_minute on average
        self._opens = PeerBuckets(
            RateLimit(config.session_burst, config.session_burst * 60 / config.sessions_per_minute)
        )

    def __len__(self) -> int:
        return len(self._sessions)

    def take_open(self, client: str) -> float:
        """0 and one session open spent from ``client``'s bucket, or the seconds until
        it may open one."""
        now = self._clock()
        return 0.0 if self._opens.take(client, now) else self._opens.wait_s(client, now)

    @property
    def items(self) -> int:
        """Items in the snapshots of all open sessions."""
        return sum(s.items for s in self._sessions.values())

    @contextlib.contextmanager
    def opening(self, client: str) -> Iterator[None]:
        """Hold a place for ``client``'s session while it loads; 503 when none is free."""
        self.expire()
        if len(self._sessions) + self._opening.total() >= self.config.max_sessions:
            raise _busy("too many sync sessions open")
        held = sum(s.client == client for s in self._sessions.values()) + self._opening[client]
        if held >= self.config.max_sessions_per_client:
            raise _busy(f"{held} sync sessions of this client are open")
        self._opening[client] += 1
        try:
            yield
        finally:
            self._opening[client] -= 1
            if not self._opening[client]:
                del self._opening[client]

    def check_budget(self, items: int) -> None:
        """413 for a window larger than the whole budget, 503 while others use it."""
        budget = self.config.max_items
        if items > budget:
            raise web.HTTPRequestEntityTooLarge(
                max_size=budget, actual_size=items, text=f"the window holds over {budget} items\n"
            )
        if self.items + items > budget:
            raise _busy("the sync sessions' item budget is in use")

    def add(
        self,
        reconcile: ReconcileSession,
        window: tuple[int, int],
        items: int,
        client: str,
        *,
        streams: bool = False,
    ) -> str:
        self.check_budget(items)
        session_id = secrets.token_urlsafe(16)
        self._sessions[session_id] = Session(
            reconcile, window, items, client, self._clock(), streams=streams
        )
        return session_id

    def get(self, session_id: str) -> Session:
        """An open session; requests that make no progress do not keep it alive."""
        self.expire()
        session = self._sessions.get(session_id)
        if session is None:
            raise web.HTTPNotFound(text="no such sync session (ended or expired)\n")
        return session

    def progress(self, session_id: str, session: Session) -> None:
        """The session moved on; it is closed once its transfer is complete (what it
        still streams is sent whole)."""
        session.last_used = self._clock()
        if session.complete:
            self._sessions.pop(session_id, None)

    def drop(self, session_id: str) -> None:
        """End a session before its end: what it streams is cut short."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.end()

    def expire(self) -> int:
        """Drop the sessions idle for too long (not one busy with a request); how many."""
        oldest = self._clock() - self.config.idle_timeout_s
        idle = [
            key for key, s in self._sessions.items() if s.last_used < oldest and not s.lock.locked()
        ]
        for key in idle:
            self._sessions.pop(key).end()
        return len(idle)


TABLE: web.AppKey[SessionTable] = web.AppKey("sync_sessions")
WALL_CLOCK: web.AppKey[Callable[[], int]] = web.AppKey("sync_wall_clock_ns")


def responder_app(
    config: SyncConfig,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall_clock_ns: Callable[[], int] = time.time_ns,
) -> web.Application:
    """The Store Sync routes, to mount under ``/sync/`` of a store node."""
    app = web.Application(middlewares=[_guard, _archive_errors])
    app[TABLE] = SessionTable(config, clock)
    app[WALL_CLOCK] = wall_clock_ns
    session = f"/{VERSION}/sessions/{{session_id}}"
    app.add_routes(
        [
            web.post(f"/{VERSION}/{{method}}", open_session),
            web.post(session, next_frame),
            web.delete(session, close_session),
            web.post(f"{session}/messages", push_messages),
            web.get(f"{session}/messages", pull_messages),
        ]
    )
    app.cleanup_ctx.append(_sweeper)
    return app


# -- reconciliation


async def open_session(request: web.Request) -> web.StreamResponse:
    node, table = request.app[NODE], request.app[TABLE]
    method = _method(request)
    client = request.remote or "unknown"
    wait_s = table.take_open(client)
    if wait_s:
        raise refuse(
            request,
            web.HTTPTooManyRequests,
            "session_rate",
            f"this address opens sync sessions too often ({table.config.sessions_per_minute:g}"
            f" a minute, {table.config.session_burst} at once)",
            headers={"Retry-After": str(math.ceil(wait_s))},
        )
    window = _window(request.query)
    check_window(table.config, window, request.app[WALL_CLOCK]())
    frames = await _frames(request)
    with table.opening(client):
        # Counted first: a window over the budget is refused before it is read.
        table.check_budget(await node.in_archive(node.archive.count_items, *window))
        store = await snapshot(node, window, method.name)
        reconcile = method.responder(store)
        session_id = table.add(reconcile, window, len(store), client, streams=method.streaming)
    return await _answer(request, table, session_id, frames)


async def next_frame(request: web.Request) -> web.StreamResponse:
    table = request.app[TABLE]
    session_id = request.match_info["session_id"]
    table.get(session_id)  # 404 before reading a body for nothing
    return await _answer(request, table, session_id, await _frames(request))


async def _answer(
    request: web.Request, table: SessionTable, session_id: str, frames: list[bytes]
) -> web.StreamResponse:
    node = request.app[NODE]
    session = table.get(session_id)
    async with session.lock:
        session.turn += 1
        session.cut_writes()  # the stream of the turn before, if its peer stopped reading
        turn = session.turn
        reply = await _receive(request, table, session_id, session, frames)
        _settle(node, table, session_id, session)
    if session.streams:
        return await _stream(request, table, session_id, session, reply, turn)
    return web.Response(
        body=reply or b"", content_type=FRAME_TYPE, headers={SESSION_HEADER: session_id}
    )


async def _receive(
    request: web.Request,
    table: SessionTable,
    session_id: str,
    session: Session,
    frames: list[bytes],
) -> bytes | None:
    """Feed a turn's frames to the session; its answer (only the last frame may have one)."""
    node = request.app[NODE]
    reply: bytes | None = None
    for position, frame in enumerate(frames):
        try:
            if reply is not None:
                raise RemoteProtocolError("frames sent after one that needed an answer")
            reply = await asyncio.to_thread(session.reconcile.receive, frame)
        except RemoteProtocolError as exc:
            table.drop(session_id)
            raise refuse(
                request, web.HTTPBadRequest, "bad_frame", f"bad sync frame, session ended: {exc}"
            ) from None
        except LocalProtocolError as exc:  # a frame after the end
            raise web.HTTPConflict(text=f"{exc}\n") from None
        _count_bytes(node, received=len(frame), sent=len(reply or b""))
        if position < len(frames) - 1 and session.reconcile.done:
            raise web.HTTPConflict(text="frames sent after the session ended\n")
    return reply


def _settle(node: ArchiveNode, table: SessionTable, session_id: str, session: Session) -> None:
    """Once reconciled, what the transfer may move; the session moved on."""
    if session.reconcile.done and not session.settled:
        session.finish()
        node.metrics.sync_rounds.labels(role="responder").inc()
        _count_differences(node, session.reconcile)
    table.progress(session_id, session)


async def _stream(
    request: web.Request,
    table: SessionTable,
    session_id: str,
    session: Session,
    reply: bytes | None,
    turn: int,
) -> web.StreamResponse:
    """Our turn as a frame stream: the reply, then what the session streams after it, until
    the turn ends, the peer's next request stops it, or the peer hangs up."""
    node = request.app[NODE]
    response = web.StreamResponse(headers={SESSION_HEADER: session_id})
    response.content_type = FRAMES_TYPE
    await response.prepare(request)
    frame = reply
    limit_s = table.config.idle_timeout_s
    try:
        while frame is not None:
            await _send(response, session, limit_s, varint(len(frame)) + frame)
            async with session.lock:
                if session.turn != turn:  # a later request answers from here on
                    break
                frame = await asyncio.to_thread(session.reconcile.stream)
                _count_bytes(node, received=0, sent=len(frame or b""))
                _settle(node, table, session_id, session)
        await _send(response, session, limit_s, None)
    except ConnectionError as exc:
        # aiohttp's drain future holds the error, and the error the frames it went
        # through, which hold the session: a cycle that kept the snapshot until a full
        # garbage collection, minutes later on a quiet node. Freed now.
        traceback.clear_frames(exc.__traceback__)
    except TimeoutError:
        # Not read for a whole idle period (no progress: the session goes, and its
        # snapshot with it), or the session ended or moved to a later turn meanwhile.
        # The response cannot be finished: its connection goes.
        if session.turn == turn:
            table.drop(session_id)
        if request.transport is not None:
            request.transport.abort()
    return response


async def _send(
    response: web.StreamResponse, session: Session, limit_s: float, data: bytes | None
) -> None:
    """Write ``data`` (None: the response's end) within ``limit_s``, and not past the
    session's end or turn (TimeoutError)."""
    if session.ended:
        raise TimeoutError
    async with asyncio.timeout(limit_s) as deadline:
        session.writes.add(deadline)
        try:
            await (response.write_eof() if data is None else response.write(data))
        finally:
            session.writes.discard(deadline)


async def close_session(request: web.Request) -> web.Response:
    request.app[TABLE].drop(request.match_info["session_id"])
    return web.Response(status=204)


# -- transfer


async def push_messages(request: web.Request) -> web.Response:
    node, table = request.app[NODE], request.app[TABLE]
    session_id = request.match_info["session_id"]
    session = _finished(table, session_id)
    body = await _body(request, MAX_BATCH_BYTES)
    try:
        if session.pushed_bytes + len(body) > table.config.max_transfer_bytes:
            raise SyncRefused("transfer_budget", "the session's transfer budget is used up")
        messages = await asyncio.to_thread(decode_batch, body, session.wanted)
        await _learn_topics(node, table.config, session, messages)
        check_pushed(
            messages,
            session.wanted,
            session.window,
            session.archived_topics,
            configured=bool(table.config.pubsub_topics),
        )
    except (RemoteProtocolError, SyncRefused) as exc:
        node.metrics.rejected.labels(source=SOURCE).inc()
        table.drop(session_id)
        if isinstance(exc, SyncRefused):  # a 403 with its reason, from the guard
            raise SyncRefused(exc.reason, f"{exc}; nothing stored, session ended") from None
        raise web.HTTPBadRequest(text=f"rejected, nothing stored, session ended: {exc}\n") from None
    session.pushed_bytes += len(body)
    for message in messages:
        del session.wanted[message.message_hash]
    new = await node.ingest(messages, source=SOURCE)
    _count_bytes(node, received=len(body), sent=0)
    table.progress(session_id, session)
    return web.json_response({"received": len(messages), "stored": new})


async def pull_messages(request: web.Request) -> web.Response:
    node, table = request.app[NODE], request.app[TABLE]
    session = _finished(table, request.match_info["session_id"])
    try:
        start = int(request.query.get("from", "0"))
    except ValueError:
        raise web.HTTPBadRequest(text="'from' must be an integer\n") from None
    if not 0 <= start <= len(session.offered):
        raise web.HTTPBadRequest(text=f"'from' must lie in [0, {len(session.offered)}]\n")
    body, _, after = await read_batch(node, session.offered, start)
    _count_bytes(node, received=0, sent=len(body))
    more = after < len(session.offered)
    session.pulled = session.pulled or not more
    table.progress(request.match_info["session_id"], session)
    headers = {NEXT_HEADER: str(after)} if more else {}
    return web.Response(body=body, content_type=BATCH_TYPE, headers=headers)


def _finished(table: SessionTable, session_id: str) -> Session:
    session = table.get(session_id)
    if not session.reconcile.done:
        raise web.HTTPConflict(text="the session has not finished reconciling\n")
    return session


# -- helpers


async def _learn_topics(
    node: ArchiveNode, config: SyncConfig, session: Session, messages: list[StoredMessage]
) -> None:
    """Whether this node archives each new pubsub topic of a batch (see :mod:`.policy`)."""
    for topic in {m.pubsub_topic for m in messages} - session.archived_topics.keys():
        if config.pubsub_topics:
            session.archived_topics[topic] = topic in config.pubsub_topics
        else:
            probe = StoreQuery(pubsub_topic=topic, pagination_limit=1)
            page = await node.in_archive(node.archive.query, probe)
            session.archived_topics[topic] = bool(page.hashes)


def _method(request: web.Request) -> type[MethodSession[Any]]:
    """The session class of the method the request names; 404 for one this node lacks
    (the initiator's sign to use another), before anything else is spent on it."""
    name = request.match_info["method"]
    method = METHODS.get(name)
    if method is None:
        raise refuse(
            request,
            web.HTTPNotFound,
            "sync_method",
            f"this node does not reconcile by {name!r} (it speaks {', '.join(METHODS)})",
        )
    return method


def _window(query: Mapping[str, str]) -> tuple[int, int]:
    try:
        start, end = int(query["start"]), int(query["end"])
    except (KeyError, ValueError):
        raise web.HTTPBadRequest(text="'start' and 'end' (Unix ns) are required\n") from None
    if not 0 <= start < end <= INT64_MAX:
        raise web.HTTPBadRequest(text="the window must satisfy 0 <= start < end < 2**63\n")
    return start, end


async def _frames(request: web.Request) -> list[bytes]:
    """A request's frames: one, or a frame stream's."""
    if request.content_type != FRAMES_TYPE:
        return [await _body(request, DEFAULT_MAX_FRAME_SIZE)]
    try:
        return decode_frames(await _body(request, MAX_FRAMES_BODY), DEFAULT_MAX_FRAME_SIZE)
    except RemoteProtocolError as exc:
        raise web.HTTPBadRequest(text=f"bad frame stream: {exc}\n") from None


async def _body(request: web.Request, limit: int) -> bytes:
    body = await request.read()
    if len(body) > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
    return body


def _busy(reason: str) -> web.HTTPServiceUnavailable:
    return web.HTTPServiceUnavailable(
        text=f"{reason}; try again later\n", headers={"Retry-After": str(RETRY_AFTER_S)}
    )


def _count_bytes(node: ArchiveNode, *, received: int, sent: int) -> None:
    node.metrics.sync_bytes.labels(direction="received").inc(received)
    node.metrics.sync_bytes.labels(direction="sent").inc(sent)


def _count_differences(node: ArchiveNode, reconcile: ReconcileSession) -> None:
    node.metrics.sync_differences.labels(side="we_lacked").inc(len(reconcile.need))
    node.metrics.sync_differences.labels(side="peer_lacked").inc(len(reconcile.have))


@web.middleware
async def _guard(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The sync token, when the node has one; policy refusals as 403 with their reason."""
    token = request.app[TABLE].config.token
    if token is not None and not bearer_matches(request, token):
        raise refuse(
            request,
            web.HTTPUnauthorized,
            "sync_token",
            "Store Sync on this node needs 'Authorization: Bearer <sync token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    try:
        return await handler(request)
    except SyncRefused as exc:
        raise refuse(request, web.HTTPForbidden, exc.reason, str(exc)) from None


@web.middleware
async def _archive_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ArchiveUnavailable as exc:
        raise web.HTTPServiceUnavailable(text=f"archive unavailable: {exc}\n") from None


async def _sweeper(app: web.Application) -> AsyncIterator[None]:
    """Drop idle sessions while the node serves, so their snapshots do not linger."""
    table = app[TABLE]

    async def sweep() -> None:
        while True:
            await asyncio.sleep(table.config.idle_timeout_s / 2)
            table.expire()

    task = asyncio.create_task(sweep(), name="store-sync-sweeper")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
