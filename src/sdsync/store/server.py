"""The store node's HTTP API (aiohttp).

Theory of operation
-------------------
Routes, and who may call them:

* ``GET /store/v3/messages`` — anyone: one v3 query page, nwaku's parameters and JSON
  (:mod:`sdsync.store.rest`).  Malformed parameters answer 400; an unknown cursor 400;
  more than ``max_concurrent_queries`` in flight 429; a failing database 503; a query
  running past ``query_timeout_s`` 504.  The HTTP status equals the body's
  ``statusCode``; ``requestId`` is ``""``, as nwaku answers a query it does not forward.
  The same node answers the same queries over libp2p (:mod:`~sdsync.waku.store.service`).
* ``POST /store/v3/messages`` — token: ingest messages (JSON entries as the query
  returns them, or one protobuf WakuMessage with ``?pubsubTopic=``).  The whole
  request is rejected (400, nothing stored) if any message's hash does not match it.
* ``POST /admin/v1/retention`` and ``GET /admin/v1/info`` — token.
* ``GET /metrics`` (Prometheus) and ``GET /health`` — anyone, as scrapers expect.
  ``/metrics`` and ``/status`` read the archive's figures from a summary measured in the
  background (:mod:`sdsync.store.summary`), never per request, and each address may ask
  for them at ``pages_rate`` (:class:`HttpLimits`; 429 past it, ``pages_rate_limited``).
* ``GET /chat/`` — with ``--web``: the chat page (:mod:`sdsync.store.chat_page`).
* ``GET /status`` (``/`` redirects there) — anyone: the operator's page of the same
  counters (:mod:`sdsync.store.status`); with the token it shows the node's
  configuration and Store Sync rounds too, as ``/admin/v1/info`` does.

Behind a reverse proxy named in ``HttpLimits.trusted_proxies`` a request is its client's,
the one the proxy names in ``X-Forwarded-For`` (:mod:`~sdsync.transport.forwarded`):
:func:`forwarded_client` sets ``request.remote`` to it before any handler runs, so every
bound of an address that a request meets (page pacing, Store Sync's sessions per
address) is the client's; a header from any other address is ignored.  A trusted proxy's
connections are not held to the per-IP connection limit: a proxy keeps a pool of them,
each carrying the requests of many clients, whose addresses are known only request by
request.

Connections are bounded in time (:class:`HttpLimits`): one that has not sent a whole
request head within ``idle_timeout_s`` of opening, or of its last answer, is closed.
That is aiohttp's keep-alive timer (``keepalive_timeout``), which runs from the moment a
connection opens and fires whenever no request is in progress, so one deadline covers a
silent connection, a half-sent request head and an idle keep-alive connection; aiohttp's
default (3,630 s) let 600 such connections hold 600 descriptors.  A request being
handled is never cut by it, and aiohttp's own bounds cap a request head's size
(request line and each header 8,190 bytes, 128 headers).  Connections are bounded in
number per IP address too: one past ``max_connections_per_ip`` is closed as soon as it
opens.  Both closes are counted in ``sdsync_store_http_connections_closed_total{reason}``
(``idle_timeout``, ``per_ip_limit``): :class:`HttpServer` serves the app on a listener
of its own, whose :class:`GuardedConnection` protocol sees each connection open and end
around aiohttp's handler (:class:`ConnectionGuard`).

The token is sent as ``Authorization: Bearer <token>`` and compared in constant time;
a node started without a token refuses every write (403).

Hostile input never makes a 500.  Every refusal is a 4xx with a one-line reason, and is
counted in ``sdsync_store_refused_total{route, reason}``: ``route`` is the method and
the route's path template (``POST /store/v3/messages``), ``reason`` a fixed word
(:func:`refuse`, :meth:`~sdsync.store.metrics.StoreMetrics.refuse`).  A text answer
ends with the reason in brackets (``... [timestamp_in_future]``); a v3 query answer
keeps nwaku's shape, the description in ``statusDesc``.  An ingestion body is parsed,
its hashes and timestamps checked, on a worker thread
(:func:`~sdsync.store.rest.parse_ingestion`), so a 30 MB POST does not hold up the
other requests.

Other protocols attach their own routes as sub-applications under a prefix of their
own (``mounts``), e.g. Store Sync under ``/sync/``: they share the node's archive,
metrics and token check through ``request.app[NODE]``.

The routes see the node as a :class:`~sdsync.store.served.ServedNode`, never the
:class:`~sdsync.store.node.StoreNode` that runs them: the node admits the queries
(:class:`~sdsync.store.served.QueriesBusy` becomes 429) and the archive says when its
database fails (:class:`~sdsync.store.archive.ArchiveUnavailable` becomes 503 on every route, the
query's in nwaku's JSON), so this
module knows neither the node nor a database driver.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import math
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest

from sdsync.errors import RemoteProtocolError
from sdsync.store import rest, status
from sdsync.store.archive import ArchiveUnavailable
from sdsync.store.served import ServedNode, answer_query, one_line, refuse_query
from sdsync.transport.forwarded import FORWARDED_FOR, client_ip
from sdsync.waku.messages import InvalidMessageError, StoredMessage, check_ingestible
from sdsync.waku.ratelimit import PeerBuckets, RateLimit, address_key
from sdsync.waku.store.model import Page, QueryError, QueryFailure

NODE: web.AppKey[ServedNode] = web.AppKey("node")
CONNECTIONS: web.AppKey[ConnectionGuard] = web.AppKey("connections")
MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_PAGES_RATE = RateLimit(100, 10.0)


class PagePace:
    """How often each address may ask for a public page (:attr:`HttpLimits.pages_rate`)."""

    def __init__(self, http: HttpLimits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._rates = None if http.pages_rate is None else PeerBuckets(http.pages_rate)
        self._exempt = http.exempt_ips
        self._clock = clock

    def check(self, request: web.Request) -> None:
        """Raise the 429 for a request over its address's pace (counted)."""
        ip = request.remote
        if self._rates is None or ip is None or ip in self._exempt:
            return
        token = request.app[NODE].config.token
        if token is not None and bearer_matches(request, token):
            return
        address, now = address_key(ip), self._clock()
        if not self._rates.take(address, now):
            wait_s = math.ceil(self._rates.wait_s(address, now))
            raise refuse(
                request,
                web.HTTPTooManyRequests,
                "pages_rate_limited",
                "too many page requests from this address: slow down",
                headers={"Retry-After": str(max(1, wait_s))},
            )


PAGES: web.AppKey[PagePace] = web.AppKey("pages")


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Time bounds of the HTTP connections (module doc)."""

    idle_timeout_s: float = 60.0
    """nginx's ``client_header_timeout`` (60 s), which is stricter than its 75 s
    ``keepalive_timeout``: the one timer does both jobs here."""
    max_connections_per_ip: int = 64
    """Connections one IP address may hold open at once (0: no limit); more are closed
    as soon as they open.  Neither nginx (``limit_conn``) nor aiohttp limits them by
    default; 64 is ten browsers' six connections behind one NAT, with room."""
    exempt_ips: frozenset[str] = frozenset()
    """Addresses not held to ``max_connections_per_ip`` nor ``pages_rate``.  Loopback is
    not exempt by default: a local reverse proxy's clients all come from it."""
    trusted_proxies: frozenset[str] = frozenset()
    """Reverse proxies (canonical addresses) whose ``X-Forwarded-For`` names the client of
    a request (module doc); not held to ``max_connections_per_ip``."""
    pages_rate: RateLimit | None = DEFAULT_PAGES_RATE
    """Requests one IP address may make of the public read-only pages (``/status``, its
    files, ``/metrics``): 10 a second on average, 100 at once — a scraper asks every 15 s,
    a page reloads every 10 s, and the archive's figures are never measured per request,
    so this bounds only the rendering; more are answered 429.  A caller holding the token
    is not counted (None: no limit)."""


def create_app(
    node: ServedNode,
    *,
    mounts: Mapping[str, web.Application] | None = None,
    http: HttpLimits = HttpLimits(),
) -> web.Application:
    guard = ConnectionGuard(http, node.metrics.http_connections_closed)
    forwarded = [forwarded_client(http.trusted_proxies)] if http.trusted_proxies else []
    app = web.Application(
        client_max_size=MAX_BODY_BYTES,
        middlewares=[*forwarded, guard.middleware(), archive_unavailable],
        handler_args={"keepalive_timeout": http.idle_timeout_s},
    )
    app[NODE] = node
    app[CONNECTIONS] = guard
    app[PAGES] = PagePace(http)
    app.add_routes(
        [
            web.get("/store/v3/messages", query_messages),
            web.post("/store/v3/messages", ingest_messages),
            web.post("/admin/v1/retention", run_retention),
            web.get("/admin/v1/info", info),
            web.get("/metrics", metrics),
            web.get("/health", health),
            web.get("/status", status_page),
            web.get("/status/{name}", status_asset),
            web.get("/", to_status),
        ]
    )
    for prefix, subapp in (mounts or {}).items():
        subapp[NODE] = node
        app.router.add_get(prefix, _to_mount(prefix + "/"))  # before the mount claims it
        app.add_subapp(prefix, subapp)
    return app


def forwarded_client(trusted: frozenset[str]) -> Middleware:
    """Sets a request's ``remote`` to its client's address when it comes from a
    ``trusted`` proxy (module doc)."""

    @web.middleware
    async def forwarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        peer = request.remote
        if peer is None or peer not in trusted:
            return await handler(request)
        client = client_ip(peer, request.headers.getall(FORWARDED_FOR, ()), trusted)
        return await handler(request.clone(remote=client) if client != peer else request)

    return forwarded


# -- connections


class HttpServer:
    """``app`` (made by :func:`create_app`) served on a listening socket, each
    connection admitted by the app's :class:`ConnectionGuard`."""

    def __init__(self, runner: web.AppRunner, listener: asyncio.Server, guard: ConnectionGuard):
        self._runner = runner
        self._listener = listener
        self._guard = guard

    @classmethod
    async def start(cls, app: web.Application, sock: socket.socket) -> HttpServer:
        runner = web.AppRunner(app)
        await runner.setup()
        server = runner.server
        assert server is not None  # set up
        guard = app[CONNECTIONS]
        # Our own listener rather than an aiohttp site: its protocol factory is where a
        # connection is seen before aiohttp's handler exists (public asyncio API).
        listener = await asyncio.get_running_loop().create_server(
            lambda: GuardedConnection(guard, server), sock=sock
        )
        return cls(runner, listener, guard)

    async def stop(self) -> None:
        """Stop accepting, then let aiohttp close the connections (none is counted)."""
        self._guard.stopping = True
        self._listener.close()
        await self._runner.cleanup()
        await self._listener.wait_closed()


class ConnectionGuard:
    """The open HTTP connections, per IP address (:class:`HttpLimits`), and the count of
    those closed by the server on its own (``sdsync_store_http_connections_closed_total``).

    aiohttp closes a connection whose idle timer fires without a word; a connection the
    server closes is told to be the timer's by what we see: its peer did not close it
    (no EOF, no error), no request was being handled on it (:meth:`middleware`), and
    the idle timeout has passed since it opened or its last request was answered.  A
    400 for a bad request head, or ``Connection: close``, close it sooner; a shutdown
    is not counted.
    """

    def __init__(self, limits: HttpLimits, closed: Counter) -> None:
        self.limits = limits
        self.stopping = False
        self._closed = closed
        self._by_ip: collections.Counter[str] = collections.Counter()
        self._open: dict[asyncio.BaseTransport, GuardedConnection] = {}

    def admit(self, connection: GuardedConnection, transport: asyncio.BaseTransport) -> bool:
        """Whether ``connection`` may be served; counted either way."""
        ip, cap, limits = connection.ip, self.limits.max_connections_per_ip, self.limits
        held = ip not in limits.exempt_ips and ip not in limits.trusted_proxies
        if cap and held and self._by_ip[ip] >= cap:
            self._closed.labels(reason="per_ip_limit").inc()
            return False
        self._by_ip[ip] += 1
        self._open[transport] = connection
        return True

    def release(self, connection: GuardedConnection, transport: asyncio.BaseTransport) -> None:
        """``connection`` (admitted) ended; counted if the idle timer closed it."""
        del self._open[transport]
        self._by_ip[connection.ip] -= 1
        if not self._by_ip[connection.ip]:
            del self._by_ip[connection.ip]
        if self._idle_closed(connection):
            self._closed.labels(reason="idle_timeout").inc()

    def _idle_closed(self, connection: GuardedConnection) -> bool:
        idle_s = asyncio.get_running_loop().time() - connection.idle_since
        return (
            not self.stopping
            and not connection.peer_closed
            and not connection.requests
            and idle_s >= self.limits.idle_timeout_s
        )

    def middleware(self) -> Middleware:
        """Marks a connection busy while one of its requests is handled."""

        @web.middleware
        async def busy(request: web.Request, handler: Handler) -> web.StreamResponse:
            connection = self._open.get(request.transport) if request.transport else None
            if connection is None:  # an app served some other way
                return await handler(request)
            connection.requests += 1
            try:
                return await handler(request)
            finally:
                connection.requests -= 1
                connection.idle_since = asyncio.get_running_loop().time()

        return busy


class GuardedConnection(asyncio.Protocol):
    """One HTTP connection: closed at once if its :class:`ConnectionGuard` does not admit
    it, else handed to aiohttp's handler, which sees every event as it would alone."""

    def __init__(self, guard: ConnectionGuard, make_handler: Callable[[], asyncio.Protocol]):
        self._guard = guard
        self._make_handler = make_handler
        self._handler: asyncio.Protocol | None = None
        self._transport: asyncio.BaseTransport | None = None
        self.ip = ""
        self.requests = 0
        self.idle_since = 0.0
        self.peer_closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.ip = str(peer[0]) if peer else ""
        if not self._guard.admit(self, transport):
            transport.close()
            return
        self._transport = transport
        self.idle_since = asyncio.get_running_loop().time()
        self._handler = self._make_handler()
        self._handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._handler is not None:
            self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        self.peer_closed = True
        return self._handler.eof_received() if self._handler is not None else None

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handler is None or self._transport is None:
            return  # refused
        self.peer_closed |= exc is not None
        self._guard.release(self, self._transport)
        self._handler.connection_lost(exc)


# -- errors


@web.middleware
async def archive_unavailable(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A failing database answers 503 on every route, never a 500; retry later."""
    try:
        return await handler(request)
    except ArchiveUnavailable as exc:
        raise web.HTTPServiceUnavailable(
            text=f"archive unavailable: {one_line(str(exc))}\n"
        ) from None


# -- queries


async def query_messages(request: web.Request) -> web.Response:
    node = request.app[NODE]
    route = route_label(request)
    outcome: Page | QueryFailure
    try:
        query = rest.parse_query(request.query)
    except QueryError as exc:
        outcome = refuse_query(node, route, exc.reason, exc.description, exc.status)
    else:
        outcome = await answer_query(node, query, route)
    # nwaku's requestId for a query it answers itself rather than forwards.
    if isinstance(outcome, QueryFailure):
        body = rest.error_json(outcome.status, outcome.description, request_id="")
        return web.json_response(body, status=int(outcome.status))
    return web.json_response(rest.page_json(outcome, request_id=""))


# -- refusals


def route_label(request: web.Request) -> str:
    """``METHOD /path/{template}`` of the route ``request`` matched (bounded, never data)."""
    resource = request.match_info.route.resource
    return f"{request.method} {resource.canonical if resource is not None else '(none)'}"


def refuse(
    request: web.Request,
    status: type[web.HTTPClientError],
    reason: str,
    description: str,
    *,
    headers: Mapping[str, str] | None = None,
) -> web.HTTPClientError:
    """The 4xx answering ``request``, counted under ``reason``; raise it.

    The body is one line, ``description [reason]``.  Sub-applications (Store Sync)
    can use it too: the node comes from ``request.app[NODE]``.
    """
    request.app[NODE].metrics.refuse(route_label(request), reason)
    return status(text=f"{one_line(description)} [{reason}]\n", headers=headers)


# -- writes and administration


def bearer_matches(request: web.Request, token: str) -> bool:
    """Whether the request carries ``Authorization: Bearer <token>`` (constant time)."""
    scheme, _, given = (request.headers.get("Authorization") or "").partition(" ")
    try:
        # aiohttp hands undecodable header bytes over as lone surrogates: no token of ours.
        given_bytes = given.encode()
    except UnicodeEncodeError:
        given_bytes = b""
    return scheme.lower() == "bearer" and hmac.compare_digest(given_bytes, token.encode())


def require_token(request: web.Request) -> None:
    """Raise the HTTP error for a request that does not carry the node's token."""
    expected = request.app[NODE].config.token
    if expected is None:
        raise refuse(
            request,
            web.HTTPForbidden,
            "writes_disabled",
            "writes are disabled: start the node with a token",
        )
    if not bearer_matches(request, expected):
        raise refuse(
            request,
            web.HTTPUnauthorized,
            "missing_token" if "Authorization" not in request.headers else "bad_token",
            "a valid 'Authorization: Bearer <token>' is required",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def ingest_messages(request: web.Request) -> web.Response:
    require_token(request)
    node = request.app[NODE]
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        node.metrics.refuse(route_label(request), "body_too_large")
        raise
    now = node.now_ns()
    try:
        messages = await asyncio.to_thread(
            _parse_and_check,
            body,
            request.content_type,
            request.query,
            now,
            node.max_future_ns,
        )
    except RemoteProtocolError as exc:
        node.metrics.rejected.labels(source="http").inc()
        reason = exc.reason if isinstance(exc, InvalidMessageError) else "malformed"
        raise refuse(
            request, web.HTTPBadRequest, reason, f"rejected, nothing stored: {exc}"
        ) from None
    new = await node.ingest(messages, source="http")
    return web.json_response(
        {"received": len(messages), "stored": new, "duplicates": len(messages) - new}
    )


def _parse_and_check(
    body: bytes,
    content_type: str,
    params: Mapping[str, str],
    now_ns: int,
    max_future_ns: int,
) -> list[StoredMessage]:
    """On a worker thread: the body's messages, each one checked for ingestion."""
    messages = rest.parse_ingestion(body, content_type, params)
    for message in messages:
        check_ingestible(message, now_ns, max_future_ns)
    return messages


async def run_retention(request: web.Request) -> web.Response:
    require_token(request)
    deleted = await request.app[NODE].apply_retention()
    return web.json_response({"deleted": deleted})


async def info(request: web.Request) -> web.Response:
    require_token(request)
    return web.json_response(await request.app[NODE].info())


# -- public


async def metrics(request: web.Request) -> web.Response:
    request.app[PAGES].check(request)
    node = request.app[NODE]
    await node.refresh_gauges()
    return web.Response(
        body=generate_latest(node.metrics.registry),
        headers={"Content-Type": CONTENT_TYPE_LATEST},
    )


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def status_page(request: web.Request) -> web.Response:
    request.app[PAGES].check(request)
    node = request.app[NODE]
    token = node.config.token
    view = await status.gather(node, admin=token is not None and bearer_matches(request, token))
    return web.Response(text=status.render(view), content_type="text/html", headers=status.HEADERS)


async def status_asset(request: web.Request) -> web.Response:
    request.app[PAGES].check(request)
    found = status.asset(request.match_info["name"])
    if found is None:
        raise web.HTTPNotFound()
    body, content_type = found
    return web.Response(body=body, content_type=content_type, headers=status.HEADERS)


async def to_status(request: web.Request) -> web.Response:
    raise web.HTTPFound("/status")


def _to_mount(path: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A mount's bare prefix (``/chat``) leads to its root (``/chat/``), query kept."""

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(path + (f"?{request.query_string}" if request.query_string else ""))

    return redirect
