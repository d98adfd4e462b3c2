"""The initiator: one Store Sync round with a peer, over its HTTP API.

Theory of operation
-------------------
:func:`sync_with_peer` loads a snapshot of the window, opens a session on the peer with
its first frame (``POST /sync/v1/{method}?start=&end=``), and posts every further frame to
the session until a ``receive`` has nothing left to send (an empty response body stands
for the peer's ``None``). Both sides then know both directions of the difference.

Transfer follows, in the same session: the side that holds a message sends it. We push
what we hold and the peer lacks, in batches read from our archive; then we pull what the
peer holds and we lack, batch by batch, accepting only messages whose recomputed hash is
one the session found we need. Last, the session is closed (also after a failure, as a
courtesy; a session abandoned because we were cancelled expires on the peer).

A streaming method (RIBLT) takes one request per turn instead: the first posts ``OPEN``
and reads the peer's coded symbols as they stream, feeding them to the session until it
has decoded, then hangs up; the second posts our whole answer (``DONE``) as a frame
stream and reads the peer's (``TAILS``). So the reconciliation is two HTTP round trips.

Failures say what to do next: a peer that does not speak Store Sync v1 or this method
(404, 405, or no session in its answer) raises :class:`SyncUnsupportedError`, and
periodic sync stops asking it; a peer that cannot be reached, is busy or fails (429,
5xx) raises :class:`~sdsync.store.client.StoreUnavailableError`; one that answers
nonsense raises :class:`~sdsync.errors.RemoteProtocolError`. What was archived before a
failure stays archived, so the next round only has less to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from sdsync.errors import RemoteProtocolError
from sdsync.reconcile import Method, ReconcileSession, session_class
from sdsync.reconcile.codec import MAX_VARINT_BYTES
from sdsync.reconcile.riblt import UndecodedError
from sdsync.store.served import ArchiveNode
from sdsync.store.sync.snapshot import SOURCE, read_batch, snapshot
from sdsync.store.sync.wire import (
    BASE_METHOD,
    BATCH_TYPE,
    FRAME_TYPE,
    FRAMES_TYPE,
    MAX_FRAMES_BODY,
    NEXT_HEADER,
    SESSION_HEADER,
    VERSION,
    decode_batch,
    encode_frames,
    messages_path,
    open_path,
    session_path,
)
from sdsync.waku.store.client import StoreUnavailableError

DEFAULT_TIMEOUT_S = 60.0
"""Per request; a responder loads its snapshot before answering the first frame."""


class SyncUnsupportedError(RemoteProtocolError):
    """The peer does not speak Store Sync v1, or not the method asked for."""


logger = logging.getLogger("sdsync.store.sync")


@dataclass
class SyncReport:
    """What one round exchanged. Bytes are HTTP bodies (frames, message batches)."""

    peer: str
    method: Method
    window: tuple[int, int]
    items: int = 0
    """Our items in the window."""
    have: int = 0
    """Differences: items we held and the peer lacked."""
    need: int = 0
    """Differences: items the peer held and we lacked."""
    sent: int = 0
    """Messages pushed to the peer."""
    peer_stored: int = 0
    """Of those, how many were new to the peer."""
    received: int = 0
    """Messages pulled from the peer."""
    stored: int = 0
    """Of those, how many were new to us."""
    round_trips: int = 0
    """HTTP exchanges of the reconciliation (one per frame we sent)."""
    requests: int = 0
    """All HTTP requests of the round, transfer and closing included."""
    frame_bytes_sent: int = 0
    frame_bytes_received: int = 0
    transfer_bytes_sent: int = 0
    transfer_bytes_received: int = 0
    seconds: float = 0.0

    @property
    def bytes_sent(self) -> int:
        return self.frame_bytes_sent + self.transfer_bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.frame_bytes_received + self.transfer_bytes_received

    def as_dict(self) -> dict[str, Any]:
        return {
            **vars(self),
            "window": list(self.window),
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
        }


async def sync_with_peer(
    node: ArchiveNode,
    peer: str,
    window: tuple[int, int],
    *,
    method: Method = BASE_METHOD,
    session: aiohttp.ClientSession | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    token: str | None = None,
) -> SyncReport:
    """Reconcile ``window`` of our archive with ``peer`` (a base URL), then transfer.

    ``token`` is the federation's sync token, for peers that require one. ``method``: a
    name in :data:`~sdsync.reconcile.METHODS` (LocalProtocolError otherwise). A RIBLT round
    whose difference does not decode within the symbols the peer streams (it sizes them
    from its own items, not from our count, which it cannot check) is run again by
    :data:`~sdsync.store.sync.wire.BASE_METHOD`."""
    try:
        return await _round(node, peer, window, method, session, timeout_s, token)
    except UndecodedError:
        logger.info("RIBLT with %s did not decode; reconciling by %s", peer, BASE_METHOD)
        return await _round(node, peer, window, BASE_METHOD, session, timeout_s, token)


async def _round(
    node: ArchiveNode,
    peer: str,
    window: tuple[int, int],
    method: Method,
    session: aiohttp.ClientSession | None,
    timeout_s: float,
    token: str | None,
) -> SyncReport:
    started = time.perf_counter()
    kind = session_class(method)
    report = SyncReport(peer.rstrip("/"), method, window)
    store = await snapshot(node, window, method)
    report.items = len(store)
    reconcile: ReconcileSession = kind(store, initiator=True, window=window)
    async with _http(session, timeout_s) as client:
        api = _Peer(client, report, token)
        try:
            streamed = kind.streaming
            opening = _open_streamed if streamed else _open
            session_id, reply = await opening(api, reconcile, report)
            try:
                if streamed:
                    await _reconcile_streamed(api, session_id, reconcile, reply, report)
                else:
                    await _reconcile(api, session_id, reconcile, reply or b"", report)
                await _push(node, api, session_id, reconcile, report)
                await _pull(node, api, session_id, reconcile, report)
            except Exception:
                await api.close(session_id)
                raise
            # Not when cancelled (the node is stopping): the peer's idle expiry will do.
            await api.close(session_id)
        finally:
            _count(node, report)
    report.seconds = time.perf_counter() - started
    node.metrics.sync_rounds.labels(role="initiator").inc()
    node.metrics.sync_differences.labels(side="we_lacked").inc(report.need)
    node.metrics.sync_differences.labels(side="peer_lacked").inc(report.have)
    return report


async def _open(peer: _Peer, reconcile: ReconcileSession, report: SyncReport) -> tuple[str, bytes]:
    """Open a session on the peer with our first frame; its id and the peer's reply."""
    start, end = report.window
    frame = reconcile.initiate()
    try:
        reply, headers = await peer.call(
            "POST", open_path(report.method), body=frame, params={"start": start, "end": end}
        )
    except _NotFoundError:
        raise SyncUnsupportedError(
            f"{report.peer} does not speak Store Sync {VERSION} ({report.method})"
        ) from None
    session_id = headers.get(SESSION_HEADER)
    if not session_id:
        raise SyncUnsupportedError(f"{report.peer} opened no Store Sync session")
    _exchanged(report, frame, reply)
    return session_id, reply


async def _reconcile(
    peer: _Peer, session_id: str, reconcile: ReconcileSession, reply: bytes, report: SyncReport
) -> None:
    """Answer the peer's replies until neither side has anything left to say."""
    while reply and (frame := await asyncio.to_thread(reconcile.receive, reply)) is not None:
        reply, _ = await peer.call("POST", session_path(session_id), body=frame)
        _exchanged(report, frame, reply)
    if not reconcile.done:
        raise RemoteProtocolError(f"{report.peer} stopped answering before the sync was done")
    report.have, report.need = len(reconcile.have), len(reconcile.need)


async def _open_streamed(
    peer: _Peer, reconcile: ReconcileSession, report: SyncReport
) -> tuple[str, bytes | None]:
    """Open a session with our first frame and take the peer's streamed turn: the session's
    id and our answer to it."""
    start, end = report.window
    params = {"start": start, "end": end}
    try:
        session_id, reply = await _turn(
            peer, open_path(report.method), [reconcile.initiate()], reconcile, params
        )
    except _NotFoundError:
        raise SyncUnsupportedError(
            f"{report.peer} does not speak Store Sync {VERSION} ({report.method})"
        ) from None
    if not session_id:
        raise SyncUnsupportedError(f"{report.peer} opened no Store Sync session")
    return session_id, reply


async def _reconcile_streamed(
    peer: _Peer,
    session_id: str,
    reconcile: ReconcileSession,
    reply: bytes | None,
    report: SyncReport,
) -> None:
    """Post our turns (an answer and what our session streams after it) until done."""
    while reply is not None or not reconcile.done:
        turn = [] if reply is None else [reply]
        while (more := reconcile.stream()) is not None:
            turn.append(more)
        if not turn:
            raise RemoteProtocolError(f"{report.peer} stopped answering before the sync was done")
        _, reply = await _turn(peer, session_path(session_id), turn, reconcile)
    report.have, report.need = len(reconcile.have), len(reconcile.need)


async def _turn(
    peer: _Peer,
    path: str,
    frames: list[bytes],
    reconcile: ReconcileSession,
    params: Mapping[str, int] | None = None,
) -> tuple[str | None, bytes | None]:
    """Post one turn as frame streams (split when long); feed the peer's streamed answer to
    ``reconcile`` until it answers or is done, then hang up. The session named, and our
    answer."""
    bodies = _bodies(frames)
    for body in bodies[:-1]:
        await peer.call("POST", path, body=body, content_type=FRAMES_TYPE, params=params)
        peer.report.frame_bytes_sent += len(body)
        peer.report.round_trips += 1
    async with peer.stream("POST", path, bodies[-1], params) as (headers, content):
        peer.report.frame_bytes_sent += len(bodies[-1])
        peer.report.round_trips += 1
        reply: bytes | None = None
        try:
            while reply is None and not reconcile.done:
                frame = await _read_frame(content, reconcile.max_frame_size)
                if frame is None:
                    break
                peer.report.frame_bytes_received += len(frame)
                reply = await asyncio.to_thread(reconcile.receive, frame)
        except UndecodedError:
            # An opening turn names its session only here: close it before another round.
            if session_id := headers.get(SESSION_HEADER):
                await peer.close(session_id)
            raise
    return headers.get(SESSION_HEADER), reply


def _bodies(frames: list[bytes]) -> list[bytes]:
    bodies: list[list[bytes]] = [[]]
    size = 0
    for frame in frames:
        if bodies[-1] and size + len(frame) + MAX_VARINT_BYTES > MAX_FRAMES_BODY:
            bodies.append([])
            size = 0
        bodies[-1].append(frame)
        size += len(frame) + MAX_VARINT_BYTES
    return [encode_frames(body) for body in bodies]


async def _read_frame(content: aiohttp.StreamReader, limit: int) -> bytes | None:
    """The next frame of a frame stream; None at its end."""
    try:
        length = 0
        for position in range(MAX_VARINT_BYTES):
            chunk = await content.read(1)
            if not chunk:
                if position:
                    raise RemoteProtocolError("a frame stream ends inside a length")
                return None
            length = (length << 7) | (chunk[0] & 0x7F)
            if not chunk[0] & 0x80:
                break
        else:
            raise RemoteProtocolError("a frame length longer than 10 bytes")
        if length > limit:
            raise RemoteProtocolError(f"a streamed frame of {length} bytes exceeds {limit}")
        return await content.readexactly(length)
    except asyncio.IncompleteReadError:
        raise RemoteProtocolError("a frame stream ends inside a frame") from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise StoreUnavailableError(f"the frame stream broke: {exc or type(exc).__name__}") from exc


def _exchanged(report: SyncReport, frame: bytes, reply: bytes) -> None:
    report.round_trips += 1
    report.frame_bytes_sent += len(frame)
    report.frame_bytes_received += len(reply)


async def _push(
    node: ArchiveNode, peer: _Peer, session_id: str, reconcile: ReconcileSession, report: SyncReport
) -> None:
    """Send the peer, in batches, what we hold and it lacks."""
    hashes = [h for _, h in sorted(reconcile.have)]
    position = 0
    while position < len(hashes):
        batch, count, position = await read_batch(node, hashes, position)
        if not count:
            continue
        answer, _ = await peer.call(
            "POST", messages_path(session_id), body=batch, content_type=BATCH_TYPE
        )
        report.transfer_bytes_sent += len(batch)
        report.sent += count
        report.peer_stored += _stored(answer, report.peer)


async def _pull(
    node: ArchiveNode, peer: _Peer, session_id: str, reconcile: ReconcileSession, report: SyncReport
) -> None:
    """Fetch, in batches, what the peer holds and we lack."""
    need = frozenset(h for _, h in reconcile.need)
    position: int | None = 0 if need else None
    while position is not None:
        batch, headers = await peer.call(
            "GET", messages_path(session_id), params={"from": position}
        )
        messages = await asyncio.to_thread(decode_batch, batch, need)
        report.transfer_bytes_received += len(batch)
        report.received += len(messages)
        report.stored += await node.ingest(messages, source=SOURCE)
        position = _next(headers.get(NEXT_HEADER), position, report.peer)


def _next(value: str | None, position: int, peer: str) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or int(value) <= position:
        raise RemoteProtocolError(f"{peer} named a bad next position {value!r}")
    return int(value)


def _stored(answer: bytes, peer: str) -> int:
    try:
        stored = json.loads(answer)["stored"]
    except (ValueError, KeyError, TypeError):
        raise RemoteProtocolError(f"{peer} answered a push with {answer[:200]!r}") from None
    if not isinstance(stored, int):
        raise RemoteProtocolError(f"{peer} answered a push with {answer[:200]!r}")
    return stored


def _count(node: ArchiveNode, report: SyncReport) -> None:
    node.metrics.sync_bytes.labels(direction="sent").inc(report.bytes_sent)
    node.metrics.sync_bytes.labels(direction="received").inc(report.bytes_received)


# -- HTTP


class _NotFoundError(RemoteProtocolError):
    """404 or 405: the route is not there."""


@contextlib.asynccontextmanager
async def _http(
    session: aiohttp.ClientSession | None, timeout_s: float
) -> AsyncIterator[aiohttp.ClientSession]:
    if session is not None:
        yield session
        return
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as owned:
        yield owned


class _Peer:
    """A peer's HTTP API, counting requests into the round's report."""

    def __init__(
        self, client: aiohttp.ClientSession, report: SyncReport, token: str | None
    ) -> None:
        self.client = client
        self.report = report
        self.auth = {"Authorization": f"Bearer {token}"} if token is not None else {}

    async def close(self, session_id: str) -> None:
        """End a session, as a courtesy: failing to changes nothing for us."""
        with contextlib.suppress(StoreUnavailableError, RemoteProtocolError):
            await self.call("DELETE", session_path(session_id))

    @contextlib.asynccontextmanager
    async def _request(
        self,
        method: str,
        path: str,
        body: bytes,
        content_type: str,
        params: Mapping[str, int] | None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One counted request to the peer; a connection failure, even while the answer
        is being read, is the peer being unavailable."""
        self.report.requests += 1
        try:
            async with self.client.request(
                method,
                self.report.peer + path,
                data=body,
                params={k: str(v) for k, v in (params or {}).items()},
                headers={"Content-Type": content_type, **self.auth},
            ) as response:
                yield response
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise StoreUnavailableError(f"{self.report.peer}: {exc or type(exc).__name__}") from exc

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, path: str, body: bytes, params: Mapping[str, int] | None = None
    ) -> AsyncIterator[tuple[Mapping[str, str], aiohttp.StreamReader]]:
        """A frame-stream request: the headers and body of a 2xx answer as it arrives (the
        connection is closed on leaving, whatever is left unread), else the error it means."""
        async with self._request(method, path, body, FRAMES_TYPE, params) as response:
            if not 200 <= response.status < 300:
                self._fail(response.status, await response.read(), path)
            try:
                yield response.headers, response.content
            finally:
                response.close()

    def _fail(self, status: int, answer: bytes, path: str) -> None:
        text = answer[:200].decode(errors="replace").strip()
        if status == 429 or status >= 500:
            raise StoreUnavailableError(f"{self.report.peer}: HTTP {status}: {text}")
        error = _NotFoundError if status in (404, 405) else RemoteProtocolError
        raise error(f"{self.report.peer}{path}: HTTP {status}: {text}")

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        content_type: str = FRAME_TYPE,
        params: Mapping[str, int] | None = None,
    ) -> tuple[bytes, Mapping[str, str]]:
        """The response body and headers of a 2xx answer, else the error it means."""
        async with self._request(method, path, body, content_type, params) as response:
            answer = await response.read()
        if not 200 <= response.status < 300:
            self._fail(response.status, answer, path)
        return answer, response.headers
