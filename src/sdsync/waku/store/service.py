"""13/WAKU2-STORE v3 over libp2p (``/vac/waku/store-query/3.0.0``), the serving side:
a request's bytes in, its answer's bytes out.

Theory of operation
-------------------
A peer opens a stream, writes one uvarint-length-prefixed StoreQueryRequest and reads one
StoreQueryResponse back. Nothing here touches a socket: the host hands the request's
bytes to :func:`answer_store_query` and sends back the bytes it returns, or hands a
whole stream's ``read``/``write`` to :func:`serve_store_stream`, which adds the framing.

The answer comes from the node's one query engine (:class:`QueryEngine`), the same as
its REST API's: the request *is* a :class:`~sdsync.waku.store.model.StoreQuery` once the
store's defaults are applied (:func:`store_query`: an absent or zero
``pagination_limit`` is 20, a larger one than 100 is 100), and the engine admits and
times it.  So the status codes are the REST API's: 200, 400 for a request we cannot
answer (malformed bytes, exclusive filters, an unknown cursor), 429 when the node runs as
many queries as it may, 503 when its archive fails, 504 past its query timeout;
``request_id`` is echoed (``""`` when the request did not parse).  A page is in
chronological order whichever the direction, and its ``pagination_cursor`` is the hash
of its last entry in the direction of travel (the first of the page going backward),
absent on the last page.  js-waku's client pages on with the hash of the page's last
message (its first, backward) until a page is empty; our cursor rule is the same, so it
reads every message once.

Hostile input never escapes as an exception: a request that does not parse (or is
longer than :data:`~sdsync.waku.rpc.MAX_RPC_BYTES`) is answered with 400, and every
refusal goes to the engine's :meth:`~QueryEngine.refuse`, which counts it in
``sdsync_store_refused_total{route, reason}`` with ``route`` the protocol id and
``reason`` a fixed word (``malformed_rpc``, ``oversized``, or the query's own, e.g.
``hashes_with_filter``).

Answers in flight are bounded in bytes (:class:`AnswerBudget`), per peer and in all.
The host holds an answer until the peer has read it or the stream's deadline
(``hold_s``, the served protocol's 10 s) resets it; a peer that asks for full pages of
140 kB messages and never reads them would otherwise hold ~20 MB per 41-byte request.
So every answer's bytes are charged to two token buckets that refill over ``hold_s``:
its peer's (``per_peer_bytes``) and the node's (``total_bytes``).  An answer that finds
its peer's bucket empty is not sent: 429 (``answer_budget_peer``); one that finds the
node's empty, 503 (``answer_budget_total``) — both counted like any refusal.  Whatever
the peers do, answers produced within any ``hold_s`` — all the host can still hold —
are at most twice ``total_bytes``; a peer that reads its answers at once is limited to
``per_peer_bytes`` per ``hold_s`` (a full page of the largest messages is 15 MB).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from typing import Protocol

from sdsync.errors import RemoteProtocolError
from sdsync.waku.ratelimit import PeerBuckets, RateLimit, TokenBucket
from sdsync.waku.rpc import MAX_RPC_BYTES, encode_frame, read_frame, refusal_reason
from sdsync.waku.store.model import (
    DEFAULT_PAGE_SIZE,
    Page,
    QueryError,
    QueryFailure,
    StatusCode,
    StoreQuery,
)
from sdsync.waku.store.rpc import (
    STORE_QUERY_PROTOCOL,
    StoreQueryRequest,
    StoreQueryResponse,
    WakuMessageKeyValue,
)

ROUTE = STORE_QUERY_PROTOCOL
"""The ``route`` label of this protocol's refusals and queries."""


class QueryEngine(Protocol):
    """What answers the queries: the node's one query engine, which admits, times and
    counts them (the store node's :class:`~sdsync.store.served.NodeQueries`)."""

    async def answer(self, query: StoreQuery, route: str) -> Page | QueryFailure:
        """One page of ``query`` asked at ``route``, or why not."""
        ...

    def refuse(
        self,
        route: str,
        reason: str,
        description: str,
        status: StatusCode = StatusCode.BAD_REQUEST,
    ) -> QueryFailure:
        """A request refused at ``route`` before it became a query, counted under
        ``reason``."""
        ...


@dataclass(frozen=True, slots=True)
class AnswerLimits:
    """Bytes of answers a peer, and all peers, may have in flight (see the module)."""

    per_peer_bytes: int = 64 * 2**20
    per_ip_bytes: int | None = 128 * 2**20
    """All the peers seen from one IP address (one IPv6 /64) together: two peers' worth
    (None: no such bound)."""
    total_bytes: int = 256 * 2**20
    hold_s: float = 10.0
    """The longest the host holds an unread answer: the served stream's deadline."""


class AnswerBudget:
    """The byte budget of answers in flight, per peer and in all (sans-I/O: ``clock``
    is only read by :meth:`charge`)."""

    def __init__(
        self, limits: AnswerLimits, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits
        self._clock = clock
        per_ip = limits.per_ip_bytes
        self._peers = PeerBuckets(
            RateLimit(limits.per_peer_bytes, limits.hold_s),
            per_address=None if per_ip is None else RateLimit(per_ip, limits.hold_s),
        )
        self._total = TokenBucket(RateLimit(limits.total_bytes, limits.hold_s), clock())

    def charge(
        self, peer: str, size: int, address: str | None = None
    ) -> tuple[StatusCode, str] | None:
        """Charge an answer of ``size`` bytes to ``peer`` (and its IP ``address``); if it
        may not be sent, the status to answer instead and the reason to count."""
        now = self._clock()
        if self._total.tokens(now) < min(size, self.limits.total_bytes):
            return StatusCode.SERVICE_UNAVAILABLE, "answer_budget_total"
        refusal = self._peers.refusal(peer, now, size, address=address)
        if refusal == "address":
            return StatusCode.TOO_MANY_REQUESTS, "answer_budget_ip"
        if refusal is not None:
            return StatusCode.TOO_MANY_REQUESTS, "answer_budget_peer"
        self._total.take(now, size)
        return None


def store_query(request: StoreQueryRequest) -> StoreQuery:
    """The query ``request`` asks, with the store's defaults: QueryError (400) if the store
    cannot answer it.  An empty pubsub topic is none, as an empty ``pubsubTopic`` is in
    REST."""
    asked = {f.name: getattr(request, f.name) for f in fields(request)}
    asked["pubsub_topic"] = request.pubsub_topic or None
    asked["pagination_limit"] = request.pagination_limit or DEFAULT_PAGE_SIZE
    return StoreQuery(**asked)


async def answer_store_query(
    queries: QueryEngine,
    request: bytes,
    *,
    peer: str = "",
    address: str | None = None,
    budget: AnswerBudget | None = None,
) -> bytes:
    """The StoreQueryResponse bytes that answer the StoreQueryRequest bytes ``request``
    from ``peer`` (connected from IP ``address``), charged to ``budget`` if given."""
    if len(request) > MAX_RPC_BYTES:
        return _refused(queries, "", "oversized", f"a request of {len(request)} bytes is too large")
    try:
        parsed = StoreQueryRequest.from_bytes(request)
    except RemoteProtocolError as exc:
        return _refused(queries, "", refusal_reason(exc), str(exc))
    try:
        query = store_query(parsed)
    except QueryError as exc:
        return _refused(queries, parsed.request_id, exc.reason, exc.description)
    outcome = await queries.answer(query, ROUTE)
    if isinstance(outcome, QueryFailure):
        return _failure(parsed.request_id, outcome)
    answer = StoreQueryResponse(
        request_id=parsed.request_id,
        status_code=int(StatusCode.OK),
        status_desc="OK",
        messages=_entries(outcome, query.include_data),
        pagination_cursor=outcome.cursor,
    ).to_bytes()
    over = None if budget is None else budget.charge(peer, len(answer), address)
    if over is None:
        return answer
    status, reason = over
    description = f"an answer of {len(answer)} bytes is over the budget of answers in flight"
    return _failure(parsed.request_id, queries.refuse(ROUTE, reason, description, status))


def _entries(page: Page, include_data: bool) -> tuple[WakuMessageKeyValue, ...]:
    if not include_data:
        return tuple(WakuMessageKeyValue(message_hash=h) for h in page.hashes)
    return tuple(
        WakuMessageKeyValue(m.message_hash, m.message, m.pubsub_topic) for m in page.messages
    )


def _refused(queries: QueryEngine, request_id: str, reason: str, description: str) -> bytes:
    return _failure(request_id, queries.refuse(ROUTE, reason, description))


def _failure(request_id: str, failure: QueryFailure) -> bytes:
    return StoreQueryResponse(
        request_id=request_id, status_code=int(failure.status), status_desc=failure.description
    ).to_bytes()


async def serve_store_stream(
    queries: QueryEngine,
    read: Callable[[int], Awaitable[bytes]],
    write: Callable[[bytes], Awaitable[None]],
) -> None:
    """Answer the one framed request of a stream: ``read(n)`` gives 1 to ``n`` bytes
    (``b""`` at its end), ``write`` sends bytes.  A frame that is truncated or too long is
    answered with 400 and counted; a stream closed before a request gets no answer."""
    try:
        request = await read_frame(read, MAX_RPC_BYTES)
    except RemoteProtocolError as exc:
        await write(encode_frame(_refused(queries, "", refusal_reason(exc), str(exc))))
        return
    if request is not None:
        await write(encode_frame(await answer_store_query(queries, request)))
