"""The responder: answers other nodes' Store Sync sessions over HTTP.

Theory of operation
-------------------
The initiator is the HTTP client; the responder keeps the state of each session between
requests in a :class:`SessionTable`. Routes, relative to the node (``/sync/`` is where
:func:`responder_app` is mounted):

* ``POST /sync/v1/{rbsr|prolly}?start=NS&end=NS`` with the first frame opens a session:
  the responder loads a snapshot of ``[start, end)``, answers the frame, and names the
  session in the ``Sdsync-Session`` header.
* ``POST /sync/v1/sessions/{id}`` with a frame: the answer frame (an empty body: nothing
  to say). A malformed frame answers 400 and ends the session.
* Once reconciliation is done, the transfer. ``POST …/{id}/messages`` pushes a batch of
  messages the responder lacks; it accepts only hashes the session found it needs, inside
  the session's window, and recomputes each hash. ``GET …/{id}/messages?from=N`` pulls a
  batch of what the initiator lacks, from position ``N`` of the list the session found;
  ``Sdsync-Next`` names the next position while more remain.
* ``DELETE /sync/v1/sessions/{id}`` ends the session.

No token is needed: what a session can write is what its reconciliation found missing,
in the window its snapshot covers, each message checked against its hash.

Resources are bounded: at most ``max_sessions`` sessions (more answer 503 with
``Retry-After``), at most ``max_items`` items in all their snapshots together (a window
larger than the whole budget answers 413), and a session idle for ``idle_timeout_s`` is
dropped (unknown sessions answer 404). Frames are evaluated on a worker thread, one at a
time per session, so a large window does not stall the node's other requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field

from aiohttp import web

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.reconcile import (
    DEFAULT_MAX_FRAME_SIZE,
    MemoryItemStore,
    Method,
    ProllySession,
    RbsrSession,
    ReconcileSession,
)
from sdsync.store.server import DATABASE_ERRORS, NODE
from sdsync.store.sync.config import SyncConfig
from sdsync.store.sync.host import SOURCE, SyncHost, read_batch, snapshot
from sdsync.store.sync.wire import (
    BATCH_TYPE,
    FRAME_TYPE,
    MAX_BATCH_BYTES,
    METHODS,
    NEXT_HEADER,
    SESSION_HEADER,
    VERSION,
    decode_batch,
)

RETRY_AFTER_S = 5
_MAX_INT64 = (1 << 63) - 1


@dataclass(eq=False)
class Session:
    """One open session: the reconciliation, its window and snapshot size, what it found."""

    reconcile: ReconcileSession
    window: tuple[int, int]
    items: int
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wanted: frozenset[bytes] = frozenset()
    """Hashes the initiator may push: we lack them, and they are inside the window."""
    offered: list[bytes] = field(default_factory=list)
    """Hashes of the messages the initiator lacks, in archive order, for pulls."""

    def finish(self) -> None:
        start, end = self.window
        need = self.reconcile.need
        self.wanted = frozenset(h for ts, h in need if start <= ts < end)
        self.offered = [h for _, h in sorted(self.reconcile.have)]


class SessionTable:
    """Open sessions by id, within the configured bounds."""

    def __init__(self, config: SyncConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._opening = 0

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def items(self) -> int:
        """Items in the snapshots of all open sessions."""
        return sum(s.items for s in self._sessions.values())

    @contextlib.contextmanager
    def opening(self) -> Iterator[None]:
        """Hold a place for a session while its snapshot loads; 503 when none is free."""
        self.expire()
        if len(self._sessions) + self._opening >= self.config.max_sessions:
            raise _busy("too many sync sessions open")
        self._opening += 1
        try:
            yield
        finally:
            self._opening -= 1

    def add(self, reconcile: ReconcileSession, window: tuple[int, int], items: int) -> str:
        budget = self.config.max_items
        if items > budget:
            raise web.HTTPRequestEntityTooLarge(
                max_size=budget, actual_size=items, text=f"the window holds over {budget} items\n"
            )
        if self.items + items > budget:
            raise _busy("the sync sessions' item budget is in use")
        session_id = secrets.token_urlsafe(16)
        self._sessions[session_id] = Session(reconcile, window, items, self._clock())
        return session_id

    def get(self, session_id: str) -> Session:
        self.expire()
        session = self._sessions.get(session_id)
        if session is None:
            raise web.HTTPNotFound(text="no such sync session (ended or expired)\n")
        session.last_used = self._clock()
        return session

    def drop(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def expire(self) -> int:
        """Drop the sessions idle for too long (not one busy with a request); how many."""
        oldest = self._clock() - self.config.idle_timeout_s
        idle = [
            key for key, s in self._sessions.items() if s.last_used < oldest and not s.lock.locked()
        ]
        for key in idle:
            del self._sessions[key]
        return len(idle)


TABLE: web.AppKey[SessionTable] = web.AppKey("sync_sessions")


def responder_app(
    config: SyncConfig, *, clock: Callable[[], float] = time.monotonic
) -> web.Application:
    """The Store Sync routes, to mount under ``/sync/`` of a store node."""
    app = web.Application(middlewares=[_archive_errors])
    app[TABLE] = SessionTable(config, clock)
    methods = "|".join(METHODS)
    session = f"/{VERSION}/sessions/{{session_id}}"
    app.add_routes(
        [
            web.post(f"/{VERSION}/{{method:{methods}}}", open_session),
            web.post(session, next_frame),
            web.delete(session, close_session),
            web.post(f"{session}/messages", push_messages),
            web.get(f"{session}/messages", pull_messages),
        ]
    )
    app.cleanup_ctx.append(_sweeper)
    return app


# -- reconciliation


async def open_session(request: web.Request) -> web.Response:
    node, table = request.app[NODE], request.app[TABLE]
    method: Method = "rbsr" if request.match_info["method"] == "rbsr" else "prolly"
    window = _window(request.query)
    frame = await _body(request, DEFAULT_MAX_FRAME_SIZE)
    with table.opening():
        store = await snapshot(node, window)
        session_id = table.add(_responder(method, store), window, len(store))
    return await _answer(node, table, session_id, frame)


async def next_frame(request: web.Request) -> web.Response:
    node, table = request.app[NODE], request.app[TABLE]
    session_id = request.match_info["session_id"]
    table.get(session_id)  # 404 before reading a body for nothing
    return await _answer(node, table, session_id, await _body(request, DEFAULT_MAX_FRAME_SIZE))


async def _answer(
    node: SyncHost, table: SessionTable, session_id: str, frame: bytes
) -> web.Response:
    session = table.get(session_id)
    async with session.lock:
        try:
            reply = await asyncio.to_thread(session.reconcile.receive, frame)
        except RemoteProtocolError as exc:
            table.drop(session_id)
            raise web.HTTPBadRequest(text=f"bad sync frame, session ended: {exc}\n") from None
        except LocalProtocolError as exc:  # a frame after the end
            raise web.HTTPConflict(text=f"{exc}\n") from None
        _count_bytes(node, received=len(frame), sent=len(reply or b""))
        if session.reconcile.done:
            session.finish()
            node.metrics.sync_rounds.labels(role="responder").inc()
            _count_differences(node, session.reconcile)
    return web.Response(
        body=reply or b"", content_type=FRAME_TYPE, headers={SESSION_HEADER: session_id}
    )


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
        messages = await asyncio.to_thread(decode_batch, body, session.wanted)
    except RemoteProtocolError as exc:
        node.metrics.rejected.labels(source=SOURCE).inc()
        table.drop(session_id)
        raise web.HTTPBadRequest(text=f"rejected, nothing stored, session ended: {exc}\n") from None
    new = await node.ingest(messages, source=SOURCE)
    _count_bytes(node, received=len(body), sent=0)
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
    headers = {NEXT_HEADER: str(after)} if after < len(session.offered) else {}
    return web.Response(body=body, content_type=BATCH_TYPE, headers=headers)


def _finished(table: SessionTable, session_id: str) -> Session:
    session = table.get(session_id)
    if not session.reconcile.done:
        raise web.HTTPConflict(text="the session has not finished reconciling\n")
    return session


# -- helpers


def _responder(method: Method, store: MemoryItemStore) -> ReconcileSession:
    if method == "rbsr":
        return RbsrSession.responder(store)
    return ProllySession.responder(store)


def _window(query: Mapping[str, str]) -> tuple[int, int]:
    try:
        start, end = int(query["start"]), int(query["end"])
    except (KeyError, ValueError):
        raise web.HTTPBadRequest(text="'start' and 'end' (Unix ns) are required\n") from None
    if not 0 <= start < end <= _MAX_INT64:
        raise web.HTTPBadRequest(text="the window must satisfy 0 <= start < end < 2**63\n")
    return start, end


async def _body(request: web.Request, limit: int) -> bytes:
    body = await request.read()
    if len(body) > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
    return body


def _busy(reason: str) -> web.HTTPServiceUnavailable:
    return web.HTTPServiceUnavailable(
        text=f"{reason}; try again later\n", headers={"Retry-After": str(RETRY_AFTER_S)}
    )


def _count_bytes(node: SyncHost, *, received: int, sent: int) -> None:
    node.metrics.sync_bytes.labels(direction="received").inc(received)
    node.metrics.sync_bytes.labels(direction="sent").inc(sent)


def _count_differences(node: SyncHost, reconcile: ReconcileSession) -> None:
    node.metrics.sync_differences.labels(side="we_lacked").inc(len(reconcile.need))
    node.metrics.sync_differences.labels(side="peer_lacked").inc(len(reconcile.have))


@web.middleware
async def _archive_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except DATABASE_ERRORS as exc:
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
