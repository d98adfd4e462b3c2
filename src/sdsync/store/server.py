"""The store node's HTTP API (aiohttp).

Theory of operation
-------------------
Routes, and who may call them:

* ``GET /store/v3/messages`` — anyone: one v3 query page, nwaku's parameters and JSON
  (:mod:`sdsync.store.rest`).  Malformed parameters answer 400; an unknown cursor 400;
  more than ``max_concurrent_queries`` in flight 429; a failing database 503; a query
  running past ``query_timeout_s`` 504.  The HTTP status equals the body's
  ``statusCode``; ``requestId`` is ``""``, as nwaku answers a query it does not forward.
  The same node answers the same queries over libp2p (:mod:`~sdsync.store.waku_store`).
* ``POST /store/v3/messages`` — token: ingest messages (JSON entries as the query
  returns them, or one protobuf WakuMessage with ``?pubsubTopic=``).  The whole
  request is rejected (400, nothing stored) if any message's hash does not match it.
* ``POST /admin/v1/retention`` and ``GET /admin/v1/info`` — token.
* ``GET /metrics`` (Prometheus) and ``GET /health`` — anyone, as scrapers expect.

Connections are bounded in time (:class:`HttpLimits`): one that has not sent a whole
request head within ``idle_timeout_s`` of opening, or of its last answer, is closed.
That is aiohttp's keep-alive timer (``keepalive_timeout``), which runs from the moment a
connection opens and fires whenever no request is in progress, so one deadline covers a
silent connection, a half-sent request head and an idle keep-alive connection; aiohttp's
default (3,630 s) let 600 such connections hold 600 descriptors.  A request being
handled is never cut by it, and aiohttp's own bounds cap a request head's size
(request line and each header 8,190 bytes, 128 headers).

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

The routes see the node as a :class:`~sdsync.store.host.ServedNode`, never the
:class:`~sdsync.store.node.StoreNode` that runs them: the node admits the queries
(:class:`~sdsync.store.host.QueriesBusy` becomes 429) and the archive says when its
database fails (:class:`~sdsync.store.archive.ArchiveUnavailable` becomes 503 on every route, the
query's in nwaku's JSON), so this
module knows neither the node nor a database driver.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sdsync.errors import RemoteProtocolError
from sdsync.store import rest
from sdsync.store.archive import ArchiveUnavailable
from sdsync.store.host import (
    QueryFailure,
    ServedNode,
    answer_query,
    one_line,
    refuse_query,
)
from sdsync.store.model import (
    InvalidMessageError,
    Page,
    QueryError,
    StoredMessage,
    check_ingestible,
)

NODE: web.AppKey[ServedNode] = web.AppKey("node")
MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Time bounds of the HTTP connections (module doc)."""

    idle_timeout_s: float = 60.0
    """nginx's ``client_header_timeout`` (60 s), which is stricter than its 75 s
    ``keepalive_timeout``: the one timer does both jobs here."""


def create_app(
    node: ServedNode,
    *,
    mounts: Mapping[str, web.Application] | None = None,
    http: HttpLimits = HttpLimits(),
) -> web.Application:
    app = web.Application(
        client_max_size=MAX_BODY_BYTES,
        middlewares=[archive_unavailable],
        handler_args={"keepalive_timeout": http.idle_timeout_s},
    )
    app[NODE] = node
    app.add_routes(
        [
            web.get("/store/v3/messages", query_messages),
            web.post("/store/v3/messages", ingest_messages),
            web.post("/admin/v1/retention", run_retention),
            web.get("/admin/v1/info", info),
            web.get("/metrics", metrics),
            web.get("/health", health),
        ]
    )
    for prefix, subapp in (mounts or {}).items():
        subapp[NODE] = node
        app.add_subapp(prefix, subapp)
    return app


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
    node = request.app[NODE]
    await node.refresh_gauges()
    return web.Response(
        body=generate_latest(node.metrics.registry),
        headers={"Content-Type": CONTENT_TYPE_LATEST},
    )


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})
