"""The store node's HTTP API (aiohttp).

Theory of operation
-------------------
Routes, and who may call them:

* ``GET /store/v3/messages`` — anyone: one v3 query page, nwaku's parameters and JSON
  (:mod:`sdsync.store.rest`).  Malformed parameters answer 400; an unknown cursor 400;
  more than ``max_concurrent_queries`` in flight 429; a failing database 503; a query
  running past ``query_timeout_s`` 504.  The HTTP status equals the body's
  ``statusCode``.
* ``POST /store/v3/messages`` — token: ingest messages (JSON entries as the query
  returns them, or one protobuf WakuMessage with ``?pubsubTopic=``).  The whole
  request is rejected (400, nothing stored) if any message's hash does not match it.
* ``POST /admin/v1/retention`` and ``GET /admin/v1/info`` — token.
* ``GET /metrics`` (Prometheus) and ``GET /health`` — anyone, as scrapers expect.

The token is sent as ``Authorization: Bearer <token>`` and compared in constant time;
a node started without a token refuses every write (403).

Other protocols attach their own routes as sub-applications under a prefix of their
own (``mounts``), e.g. Store Sync under ``/sync/``: they share the node's archive,
metrics and token check through ``request.app[NODE]``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sqlite3
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

import psycopg
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sdsync.errors import RemoteProtocolError
from sdsync.store import rest
from sdsync.store.model import QueryError, StatusCode, StoredMessage
from sdsync.wire.waku import decode_waku_message

if TYPE_CHECKING:
    from sdsync.store.node import StoreNode

NODE: web.AppKey[StoreNode] = web.AppKey("node")
MAX_BODY_BYTES = 32 * 1024 * 1024
DATABASE_ERRORS = (sqlite3.Error, psycopg.Error)


def create_app(
    node: StoreNode, *, mounts: Mapping[str, web.Application] | None = None
) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
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


# -- queries


async def query_messages(request: web.Request) -> web.Response:
    node = request.app[NODE]
    request_id = uuid.uuid4().hex
    started = time.perf_counter()
    try:
        query = rest.parse_query(request.query)
        if node.queries_in_flight >= node.config.max_concurrent_queries:
            raise QueryError(StatusCode.TOO_MANY_REQUESTS, "too many queries in flight")
        node.queries_in_flight += 1
        try:
            page = await asyncio.wait_for(
                node.in_archive(node.archive.query, query), node.config.query_timeout_s
            )
        finally:
            node.queries_in_flight -= 1
    except QueryError as exc:
        return _query_error(node, exc.status, exc.description, request_id)
    except TimeoutError:
        return _query_error(node, StatusCode.GATEWAY_TIMEOUT, "query timed out", request_id)
    except DATABASE_ERRORS as exc:
        return _query_error(
            node, StatusCode.SERVICE_UNAVAILABLE, f"archive unavailable: {exc}", request_id
        )
    node.metrics.queries.labels(status=str(int(StatusCode.OK))).inc()
    node.metrics.query_seconds.observe(time.perf_counter() - started)
    return web.json_response(rest.page_json(page, request_id))


def _query_error(
    node: StoreNode, status: StatusCode, description: str, request_id: str
) -> web.Response:
    node.metrics.queries.labels(status=str(int(status))).inc()
    return web.json_response(rest.error_json(status, description, request_id), status=int(status))


# -- writes and administration


def require_token(request: web.Request) -> None:
    """Raise the HTTP error for a request that does not carry the node's token."""
    expected = request.app[NODE].config.token
    if expected is None:
        raise web.HTTPForbidden(text="writes are disabled: start the node with a token\n")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), expected.encode()):
        raise web.HTTPUnauthorized(
            text="a valid 'Authorization: Bearer <token>' is required\n",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def ingest_messages(request: web.Request) -> web.Response:
    require_token(request)
    node = request.app[NODE]
    try:
        messages = await _read_messages(request)
    except RemoteProtocolError as exc:
        node.metrics.rejected.labels(source="http").inc()
        raise web.HTTPBadRequest(text=f"rejected, nothing stored: {exc}\n") from None
    try:
        new = await node.ingest(messages, source="http")
    except DATABASE_ERRORS as exc:
        raise web.HTTPServiceUnavailable(text=f"archive unavailable: {exc}\n") from None
    return web.json_response(
        {"received": len(messages), "stored": new, "duplicates": len(messages) - new}
    )


async def _read_messages(request: web.Request) -> list[StoredMessage]:
    if request.content_type == "application/x-protobuf":
        pubsub_topic = request.query.get("pubsubTopic")
        if not pubsub_topic:
            raise RemoteProtocolError("a protobuf WakuMessage needs ?pubsubTopic=")
        stored = StoredMessage.of(pubsub_topic, decode_waku_message(await request.read()))
        claimed = request.query.get("hash", "").removeprefix("0x")
        if claimed and claimed.lower() != stored.message_hash.hex():
            raise RemoteProtocolError(f"message hash {claimed} does not match the message")
        return [stored]
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise RemoteProtocolError(f"body is not JSON: {exc}") from None
    return rest.read_entries(body)


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
