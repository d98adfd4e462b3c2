"""The REST shapes of the store, as nwaku's ``GET /store/v3/messages`` has them.

Theory of operation
-------------------
Both ends of the HTTP API use this module, so what the server writes is by
construction what the client reads.  Query parameters: ``includeData``,
``pubsubTopic``, ``contentTopics`` (comma separated), ``startTime``/``endTime``
(Unix ns; values <= 0 mean "no bound", as in nwaku), ``hashes`` (comma separated hex,
``0x`` optional), ``cursor`` (hex), ``ascending`` (default true) and ``pageSize``
(<= 0: the default).
A response is ``{requestId, statusCode, statusDesc, messages: [{messageHash,
message?, pubsubTopic?}], paginationCursor?}`` with hashes as ``0x`` hex and bytes
as base64; a message carries ``payload``, ``contentTopic``, ``meta`` (when not empty),
``version``, ``timestamp`` and ``ephemeral``.

Messages posted to a store for ingestion use the same entry shape (``{"messages":
[...]}``), so a page read from one store can be posted to another as it is.  Anything
read from the network is checked here: a malformed body or a hash that does not match
its message is a :class:`~sdsync.errors.RemoteProtocolError`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.store.model import (
    DEFAULT_PAGE_SIZE,
    Page,
    QueryError,
    StatusCode,
    StoredMessage,
    StoreQuery,
)
from sdsync.wire.waku import WakuMessage

_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}


# -- query parameters


def parse_query(params: Mapping[str, str]) -> StoreQuery:
    """A StoreQuery from URL parameters; QueryError (400) when they are malformed."""
    bad = StatusCode.BAD_REQUEST
    include = params.get("includeData", "").strip().lower()
    if include and include not in _TRUE | _FALSE:
        raise QueryError(bad, f"includeData must be true or false, not {include!r}")
    content_topics = params.get("contentTopics", "")
    try:
        page_size = int(params.get("pageSize") or DEFAULT_PAGE_SIZE)
    except ValueError:
        raise QueryError(bad, "pageSize must be an integer") from None
    if page_size <= 0:  # nwaku's reading of a zero or negative page size
        page_size = DEFAULT_PAGE_SIZE
    return StoreQuery(
        include_data=include in _TRUE,
        pubsub_topic=params.get("pubsubTopic") or None,
        content_topics=tuple(t for t in content_topics.split(",") if t),
        time_start=_time(params, "startTime"),
        time_end=_time(params, "endTime"),
        message_hashes=tuple(_hex(h, "hashes") for h in params.get("hashes", "").split(",") if h),
        cursor=_hex(params["cursor"], "cursor") if params.get("cursor") else None,
        forward=params.get("ascending", "true").strip().lower() not in _FALSE,
        page_size=page_size,
    )


def query_params(query: StoreQuery) -> dict[str, str]:
    """The URL parameters that :func:`parse_query` reads back as ``query``."""
    params = {
        "includeData": _bool(query.include_data),
        "ascending": _bool(query.forward),
        "pageSize": str(query.page_size),
    }
    if query.pubsub_topic is not None:
        params["pubsubTopic"] = query.pubsub_topic
    if query.content_topics:
        params["contentTopics"] = ",".join(query.content_topics)
    if query.time_start is not None:
        params["startTime"] = str(query.time_start)
    if query.time_end is not None:
        params["endTime"] = str(query.time_end)
    if query.message_hashes:
        params["hashes"] = ",".join(_to_hex(h) for h in query.message_hashes)
    if query.cursor is not None:
        params["cursor"] = _to_hex(query.cursor)
    return params


def _time(params: Mapping[str, str], name: str) -> int | None:
    text = params.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise QueryError(StatusCode.BAD_REQUEST, f"{name} must be Unix nanoseconds") from None
    return value if value > 0 else None


def _hex(text: str, name: str) -> bytes:
    text = text.strip().removeprefix("0x").removeprefix("0X")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise QueryError(StatusCode.BAD_REQUEST, f"{name}: {text!r} is not hex") from None


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _to_hex(value: bytes) -> str:
    return "0x" + value.hex()


# -- responses


def page_json(page: Page, request_id: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "requestId": request_id,
        "statusCode": int(StatusCode.OK),
        "statusDesc": "OK",
        "messages": [entry_json(m) for m in page.messages]
        if page.messages
        else [{"messageHash": _to_hex(h)} for h in page.hashes],
    }
    if page.cursor is not None:
        body["paginationCursor"] = _to_hex(page.cursor)
    return body


def error_json(status: StatusCode, description: str, request_id: str) -> dict[str, Any]:
    return {
        "requestId": request_id,
        "statusCode": int(status),
        "statusDesc": description,
        "messages": [],
    }


def entry_json(stored: StoredMessage) -> dict[str, Any]:
    msg = stored.message
    message: dict[str, Any] = {
        "payload": _b64(msg.payload),
        "contentTopic": msg.content_topic,
        "version": msg.version,
        "timestamp": msg.timestamp,
        "ephemeral": msg.ephemeral,
    }
    if msg.meta:
        message["meta"] = _b64(msg.meta)
    return {
        "messageHash": _to_hex(stored.message_hash),
        "message": message,
        "pubsubTopic": stored.pubsub_topic,
    }


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


# -- reading what a remote sent


def read_page(body: Any, *, include_data: bool) -> Page:
    """A Page from a store's JSON response; RemoteProtocolError if it is malformed."""
    obj = _object(body, "response")
    status = obj.get("statusCode")
    if status != StatusCode.OK:
        raise RemoteProtocolError(f"store answered {status}: {obj.get('statusDesc')!r}")
    entries = obj.get("messages")
    if not isinstance(entries, list):
        raise RemoteProtocolError("response without a messages list")
    cursor = obj.get("paginationCursor")
    return Page(
        hashes=[_remote_hash(_object(e, "entry").get("messageHash")) for e in entries],
        messages=[read_entry(e) for e in entries] if include_data else [],
        cursor=_remote_hash(cursor) if cursor is not None else None,
    )


def read_entries(body: Any) -> list[StoredMessage]:
    """The messages of an ingestion request ``{"messages": [entry, ...]}``."""
    entries = _object(body, "request").get("messages")
    if not isinstance(entries, list):
        raise RemoteProtocolError('expected {"messages": [...]}')
    return [read_entry(e) for e in entries]


def read_entry(entry: Any) -> StoredMessage:
    obj = _object(entry, "entry")
    message = _object(obj.get("message"), "message")
    pubsub_topic = obj.get("pubsubTopic")
    if not isinstance(pubsub_topic, str) or not pubsub_topic:
        raise RemoteProtocolError("entry without a pubsubTopic")
    timestamp = message.get("timestamp")
    version = message.get("version", 0)
    content_topic = message.get("contentTopic")
    if not isinstance(timestamp, int) or not isinstance(version, int):
        raise RemoteProtocolError("timestamp and version must be integers")
    if not isinstance(content_topic, str):
        raise RemoteProtocolError("contentTopic must be a string")
    try:
        waku = WakuMessage(
            payload=_unb64(message.get("payload", ""), "payload"),
            content_topic=content_topic,
            timestamp=timestamp,
            meta=_unb64(message.get("meta", ""), "meta"),
            version=version,
            ephemeral=message.get("ephemeral") is True,
        )
    except LocalProtocolError as exc:  # the sender's values, not our call
        raise RemoteProtocolError(f"bad message: {exc}") from None
    return StoredMessage(_remote_hash(obj.get("messageHash")), pubsub_topic, waku)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RemoteProtocolError(f"{what} is not a JSON object")
    return value


def _remote_hash(value: Any) -> bytes:
    if not isinstance(value, str):
        raise RemoteProtocolError("a message hash must be a hex string")
    try:
        raw = bytes.fromhex(value.removeprefix("0x"))
    except ValueError:
        raise RemoteProtocolError(f"{value!r} is not a hex message hash") from None
    if len(raw) != 32:
        raise RemoteProtocolError(f"a message hash has 32 bytes, not {len(raw)}")
    return raw


def _unb64(value: Any, name: str) -> bytes:
    if not isinstance(value, str):
        raise RemoteProtocolError(f"{name} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise RemoteProtocolError(f"{name} is not valid base64") from None
