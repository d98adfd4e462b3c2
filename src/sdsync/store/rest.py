"""The REST shapes of the store, as nwaku's ``GET /store/v3/messages`` has them.

Theory of operation
-------------------
Both ends of the HTTP API use this module, so what the server writes is by
construction what the client reads.  Query parameters: ``includeData``,
``pubsubTopic``, ``contentTopics`` (comma separated), ``startTime``/``endTime``
(Unix ns; values <= 0 mean "no bound", as in nwaku), ``hashes`` (comma separated hex,
``0x`` optional), ``cursor`` (hex), ``ascending`` (true when absent or exactly ``true``,
as in nwaku: ``TRUE`` or ``1`` mean descending) and ``pageSize`` (<= 0: the default).
Content topics may come without a pubsub topic (nwaku serves that too), at most
:data:`~sdsync.waku.store.model.MAX_CONTENT_TOPICS` of them.
A response is ``{requestId, statusCode, statusDesc, messages: [{messageHash,
message?, pubsubTopic?}], paginationCursor?}`` with hashes as ``0x`` hex and bytes
as base64; a message carries ``payload``, ``contentTopic``, ``meta`` (when not empty),
``version``, ``timestamp`` and ``ephemeral``.  nwaku's messages may also carry a
``proof`` (RLN, base64): it is read as any other field, checked and then dropped, as
nwaku's archive drops it (its columns, and ours, have no place for it; the message hash
does not cover it), so our answers never carry one.

Every parameter is checked before the archive sees it: integers (times, page size) are
ASCII decimal within a signed 64-bit range, topics are storable (UTF-8, no NUL, at most
:data:`~sdsync.waku.store.model.MAX_TOPIC_BYTES`).  A bad one is a
:class:`~sdsync.waku.store.model.QueryError` (400) with the reason it is counted under.

Messages posted to a store for ingestion use the same entry shape (``{"messages":
[...]}``), so a page read from one store can be posted to another as it is.  Anything
read from the network is checked here: a malformed body or a hash that does not match
its message is a :class:`~sdsync.errors.RemoteProtocolError` (an
:class:`~sdsync.waku.messages.InvalidMessageError` when it has a reason more precise than
``malformed``).  :func:`parse_ingestion` reads a POSTed body and is meant to run on a
worker thread: before ``json.loads`` sees a JSON body, one pass (numpy, a megabyte at a
time) bounds its nesting to :data:`MAX_JSON_DEPTH` and its values to
:data:`MAX_JSON_VALUES`, so no body can make the decoder recurse or allocate without
bound.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.waku.messages import InvalidMessageError, StoredMessage
from sdsync.waku.store.model import (
    DEFAULT_PAGE_SIZE,
    INT64_MAX,
    INT64_MIN,
    Page,
    QueryError,
    StatusCode,
    StoreQuery,
)
from sdsync.wire.waku import WakuMessage, decode_waku_message

_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}
_INTEGER = re.compile(r"[+-]?[0-9]{1,20}")  # ASCII only: int() would take any Unicode digit
MAX_JSON_DEPTH = 8
"""Nesting of arrays and objects in an ingestion body (``{"messages": [{"message":
{}}]}`` is 4 deep)."""
MAX_JSON_VALUES = 2_000_000
"""Values (counted by their separating commas) in an ingestion body: a bound on what
``json.loads`` allocates.  A realistic entry has about 8, so about 250,000 entries."""
_JSON_CHUNK = 1 << 20
_QUOTE_CLASS, _OPEN_CLASS, _CLOSE_CLASS, _COMMA_CLASS = 1, 2, 3, 4
_JSON_CLASS = bytes(  # a translate table: every byte to its class, 0 for all others
    _QUOTE_CLASS
    if byte == ord('"')
    else _OPEN_CLASS
    if byte in b"[{"
    else _CLOSE_CLASS
    if byte in b"]}"
    else _COMMA_CLASS
    if byte == ord(",")
    else 0
    for byte in range(256)
)


# -- query parameters


def parse_query(params: Mapping[str, str]) -> StoreQuery:
    """A StoreQuery from URL parameters; QueryError (400) when they are malformed."""
    include = params.get("includeData", "").strip().lower()
    if include and include not in _TRUE | _FALSE:
        raise QueryError(
            StatusCode.BAD_REQUEST,
            f"includeData must be true or false, not {include[:40]!r}",
            "bad_include_data",
        )
    page_size = _integer(params, "pageSize", "bad_page_size")
    if page_size is None or page_size <= 0:  # nwaku's reading of a zero or negative size
        page_size = DEFAULT_PAGE_SIZE
    return StoreQuery(
        include_data=include in _TRUE,
        pubsub_topic=params.get("pubsubTopic") or None,
        content_topics=tuple(t for t in params.get("contentTopics", "").split(",") if t),
        time_start=_time(params, "startTime"),
        time_end=_time(params, "endTime"),
        message_hashes=tuple(
            _hex(h, "hashes", "bad_hash") for h in params.get("hashes", "").split(",") if h
        ),
        pagination_cursor=(
            _hex(params["cursor"], "cursor", "bad_cursor") if params.get("cursor") else None
        ),
        # nwaku's reading: descending is anything but an absent or exact "true".
        pagination_forward=params.get("ascending", "true") == "true",
        pagination_limit=page_size,
    )


def query_params(query: StoreQuery) -> dict[str, str]:
    """The URL parameters that :func:`parse_query` reads back as ``query``."""
    params = {
        "includeData": _bool(query.include_data),
        "ascending": _bool(query.pagination_forward),
        "pageSize": str(query.pagination_limit),
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
    if query.pagination_cursor is not None:
        params["cursor"] = _to_hex(query.pagination_cursor)
    return params


def _integer(params: Mapping[str, str], name: str, reason: str) -> int | None:
    """The signed 64-bit decimal integer ``name``, None when absent."""
    text = params.get(name, "").strip()
    if not text:
        return None
    if not _INTEGER.fullmatch(text) or not INT64_MIN <= (value := int(text)) <= INT64_MAX:
        raise QueryError(
            StatusCode.BAD_REQUEST,
            f"{name} must be a decimal integer from -2^63 to 2^63-1, not {text[:40]!r}",
            reason,
        )
    return value


def _time(params: Mapping[str, str], name: str) -> int | None:
    value = _integer(params, name, "bad_time")  # in Unix nanoseconds
    return value if value is not None and value > 0 else None  # <= 0: no bound (nwaku)


def _hex(text: str, name: str, reason: str) -> bytes:
    text = text.strip().removeprefix("0x").removeprefix("0X")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise QueryError(
            StatusCode.BAD_REQUEST, f"{name}: {text[:80]!r} is not hex", reason
        ) from None


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


def parse_ingestion(
    body: bytes, content_type: str, params: Mapping[str, str]
) -> list[StoredMessage]:
    """The messages of a POSTed ingestion body, their hashes checked.

    JSON (``{"messages": [entry, ...]}``) or, with ``application/x-protobuf``, one
    WakuMessage with ``?pubsubTopic=`` and optionally ``&hash=``.  CPU-bound (a large
    body takes a fraction of a second): run it on a worker thread.  Raises only
    :class:`~sdsync.errors.RemoteProtocolError`.
    """
    if content_type == "application/x-protobuf":
        pubsub_topic = params.get("pubsubTopic")
        if not pubsub_topic:
            raise RemoteProtocolError("a protobuf WakuMessage needs ?pubsubTopic=")
        stored = StoredMessage.of(pubsub_topic, decode_waku_message(body))
        claimed = params.get("hash", "").removeprefix("0x")
        if claimed and claimed.lower() != stored.message_hash.hex():
            raise InvalidMessageError(
                "hash_mismatch", f"message hash {claimed[:80]} does not match the message"
            )
        return [stored]
    return read_entries(load_json(body))


def load_json(body: bytes) -> Any:
    """``body`` as JSON (UTF-8, RFC 8259), within :data:`MAX_JSON_DEPTH` and
    :data:`MAX_JSON_VALUES`; :class:`InvalidMessageError` otherwise."""
    check_json_structure(body)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessageError("body_not_json", f"body is not UTF-8: {exc}") from None
    try:
        # The hook is a Python call per object: the decoder, a single C call otherwise,
        # then lets other threads (the event loop) run while it decodes a large body.
        return json.loads(text, object_hook=_same)
    except RecursionError:  # unreachable within MAX_JSON_DEPTH; never a 500 all the same
        raise InvalidMessageError("json_too_deep", "body is nested too deep") from None
    except ValueError as exc:
        raise InvalidMessageError("body_not_json", f"body is not JSON: {exc}") from None


def _same(obj: dict[str, Any]) -> dict[str, Any]:
    return obj


def check_json_structure(body: bytes) -> None:
    """Refuse a JSON body nested deeper than :data:`MAX_JSON_DEPTH` (reason
    ``json_too_deep``) or with more than :data:`MAX_JSON_VALUES` values
    (``json_too_large``), as ``json.loads`` would read it, without decoding it.

    Brackets and commas count only outside strings.  Inside strings, escaped backslashes
    and quotes are dropped first, so every remaining quote opens or closes one.  Where
    the body is not JSON the count may be off, but only past the point where the decoder
    stops anyway.  A megabyte at a time, only the bytes that matter become numpy arrays.
    """
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    depth = values = 0
    in_string = 0
    for start in range(0, len(body), _JSON_CHUNK):
        classes = np.frombuffer(body[start : start + _JSON_CHUNK].translate(_JSON_CLASS), np.uint8)
        kinds = classes[np.flatnonzero(classes)]  # quotes, brackets and commas, in order
        if not kinds.size:
            continue
        parity = (np.cumsum(kinds == _QUOTE_CLASS, dtype=np.int64) + in_string) & 1
        outside = parity == 0  # an opening quote counts as inside, its closing one outside
        levels = depth + np.cumsum(
            (outside & (kinds == _OPEN_CLASS)).astype(np.int64)
            - (outside & (kinds == _CLOSE_CLASS))
        )
        values += int(np.count_nonzero(outside & (kinds == _COMMA_CLASS)))
        if int(levels.max()) > MAX_JSON_DEPTH:
            raise InvalidMessageError(
                "json_too_deep", f"body is nested too deep (more than {MAX_JSON_DEPTH} levels)"
            )
        if values >= MAX_JSON_VALUES:
            raise InvalidMessageError(
                "json_too_large", f"body holds more than {MAX_JSON_VALUES} JSON values"
            )
        depth, in_string = int(levels[-1]), int(parity[-1])


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
    if not _is_int(timestamp) or not _is_int(version):
        raise RemoteProtocolError("timestamp and version must be integers")
    if not isinstance(content_topic, str):
        raise RemoteProtocolError("contentTopic must be a string")
    if "proof" in message:  # nwaku's RLN proof: read, checked, not kept (module doc)
        _unb64(message["proof"], "proof")
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
    if "messageHash" not in obj:  # a hand-written entry: nothing claimed, nothing to check
        return StoredMessage.of(pubsub_topic, waku)
    return StoredMessage(_remote_hash(obj["messageHash"]), pubsub_topic, waku)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no number


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
