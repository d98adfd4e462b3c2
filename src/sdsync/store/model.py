"""What a store keeps and what it is asked: stored messages, queries, pages.

Theory of operation
-------------------
A :class:`StoredMessage` is a WakuMessage together with the pubsub topic it was
published on and its deterministic message hash.  The hash is *checked* when the value
is built, so every StoredMessage in the process is one whose hash matches its content:
the archive, the HTTP ingestion and Store Resume can therefore all trust it.  Messages
reach a store from elsewhere (tools, peers, other stores), so a mismatch is a
:class:`~sdsync.errors.RemoteProtocolError`.

A :class:`StoreQuery` is one 13/WAKU2-STORE v3 query: either a list of message hashes
or a content filter (pubsub topic, content topics, time range), plus pagination.  Its
constructor enforces the protocol's rules, so a query that exists is a valid one;
:class:`QueryError` carries the v3 status code of a query that cannot be answered.

What is refused carries a *reason*, a short fixed word (``bad_time``,
``timestamp_in_future``, ...) that the node counts in
``sdsync_store_refused_total{route, reason}``: :class:`QueryError` for queries,
:class:`InvalidMessageError` for messages.  :func:`check_ingestible` is what every
ingestion path (HTTP, relay, Store Resume, Store Sync) checks beyond the hash: topics a
backend can store and index, a size nwaku would relay, and a plausible timestamp —
positive and at most :data:`DEFAULT_TIMESTAMP_VARIANCE_S` ahead of the node's clock
(nwaku's ``MaxMessageTimestampVariance``).  Old messages are fine: Store Resume and
Store Sync exist to bring them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Generic, TypeVar

from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError
from sdsync.wire import waku
from sdsync.wire.waku import (
    DEFAULT_TIMESTAMP_VARIANCE_S,
    HASH_SIZE,
    MAX_WAKU_MESSAGE_BYTES,
    WakuMessage,
    topic_problem,
)
from sdsync.wire.waku_protocols import MAX_STORE_PAGE_SIZE, StoreQueryRequest

DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = MAX_STORE_PAGE_SIZE
MAX_CONTENT_TOPICS = 10
"""Per query, as nwaku's archive allows."""
MAX_HASHES = 100
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


class StatusCode(IntEnum):
    """Status codes of 13/WAKU2-STORE v3 responses (also used as HTTP statuses)."""

    OK = 200
    BAD_REQUEST = 400
    TOO_MANY_REQUESTS = 429
    SERVICE_UNAVAILABLE = 503
    GATEWAY_TIMEOUT = 504


class QueryError(LocalProtocolError):
    """A query the store cannot answer, with the v3 status code to answer it with and
    the ``reason`` it is counted under."""

    def __init__(self, status: StatusCode, description: str, reason: str = "bad_request") -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.reason = reason


class InvalidMessageError(RemoteProtocolError):
    """A message (or an ingestion request) refused, with the ``reason`` it is counted
    under (a metrics label: a short fixed word, never data from the request)."""

    def __init__(self, reason: str, description: str) -> None:
        super().__init__(description)
        self.reason = reason


Status = TypeVar("Status", bound=int)


class Refused(Exception, Generic[Status]):  # noqa: N818 -- an answer, not a bug
    """A service request (LightPush, Filter) answered with ``status``, counted under
    ``reason`` (a metrics label)."""

    def __init__(self, status: Status, reason: str, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.reason = reason
        self.description = description


def refusal_reason(exc: RemoteProtocolError) -> str:
    """The fixed word ``exc`` is counted under: its :class:`~sdsync.errors.RejectReason`'s
    name (``malformed_rpc``...), or the finer word of a subclass
    (:class:`InvalidMessageError`'s ``bad_topic``...)."""
    return exc.reason.name.lower() if isinstance(exc.reason, RejectReason) else exc.reason


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as archived: its hash, its pubsub topic and the WakuMessage itself."""

    message_hash: bytes
    pubsub_topic: str
    message: WakuMessage

    def __post_init__(self) -> None:
        if self.message.timestamp is None:
            raise InvalidMessageError(
                "no_timestamp", "a message without a timestamp cannot be archived"
            )
        if self.message.ephemeral:
            raise InvalidMessageError("ephemeral", "ephemeral messages are not archived")
        try:
            actual = self.message.hash(self.pubsub_topic)
        except UnicodeEncodeError:  # a lone surrogate, as JSON can spell it
            raise InvalidMessageError("bad_topic", "a topic is not valid UTF-8 text") from None
        if actual != self.message_hash:
            raise InvalidMessageError(
                "hash_mismatch",
                f"message hash {self.message_hash.hex()} does not match the message content",
            )

    @classmethod
    def of(cls, pubsub_topic: str, message: WakuMessage) -> StoredMessage:
        """The stored form of ``message`` heard on ``pubsub_topic`` (hash computed)."""
        return cls(message.hash(pubsub_topic), pubsub_topic, message)

    @classmethod
    def from_columns(
        cls,
        message_hash: bytes,
        timestamp: int,
        pubsub_topic: str,
        content_topic: str,
        payload: bytes,
        meta: bytes | None,
        version: int,
    ) -> StoredMessage:
        """Rebuild a message from the archive's columns (re-checking its hash)."""
        message = WakuMessage(
            payload=bytes(payload),
            content_topic=content_topic,
            timestamp=timestamp,
            meta=bytes(meta or b""),
            version=version,
        )
        return cls(bytes(message_hash), pubsub_topic, message)

    @property
    def timestamp(self) -> int:
        return self.message.timestamp  # type: ignore[return-value]  # checked on creation


def check_hash(value: bytes, reason: str = "bad_hash") -> bytes:
    if len(value) != HASH_SIZE:
        raise QueryError(
            StatusCode.BAD_REQUEST,
            f"a message hash has {HASH_SIZE} bytes, not {len(value)}",
            reason,
        )
    return value


#: The store's refusal labels for the shared message checks of sdsync.wire.waku.
_LABELS: dict[str, str] = {
    RejectReason.BAD_TOPIC: "bad_topic",
    RejectReason.NO_TIMESTAMP: "no_timestamp",
    RejectReason.TIMESTAMP_NOT_POSITIVE: "timestamp_not_positive",
    RejectReason.TIMESTAMP_IN_FUTURE: "timestamp_in_future",
}


def check_timestamp(timestamp: int, now_ns: int, max_future_ns: int) -> None:
    """Refuse a timestamp that is not positive, or more than ``max_future_ns`` ahead of
    ``now_ns``: :class:`InvalidMessageError` with reason ``timestamp_not_positive`` or
    ``timestamp_in_future``.  Old timestamps pass."""
    try:
        waku.check_timestamp(timestamp, now_ns, max_future_ns)
    except RemoteProtocolError as exc:
        raise InvalidMessageError(_LABELS[exc.reason], str(exc)) from None


def check_ingestible(
    message: StoredMessage,
    now_ns: int,
    max_future_ns: int = int(DEFAULT_TIMESTAMP_VARIANCE_S * 1e9),
) -> None:
    """What every ingestion path checks before archiving ``message`` (its hash is checked
    already): storable topics (reason ``bad_topic``), nwaku's maximum message size
    (``too_large``) and a plausible timestamp (:func:`check_timestamp`).  Raises
    :class:`InvalidMessageError`."""
    msg = message.message
    try:
        waku.check_relayable(msg, message.pubsub_topic, now_ns, max_future_ns)
    except RemoteProtocolError as exc:
        raise InvalidMessageError(_LABELS[exc.reason], str(exc)) from None
    size = len(msg.payload) + len(msg.meta) + len(msg.content_topic.encode())
    if size > MAX_WAKU_MESSAGE_BYTES:
        raise InvalidMessageError(
            "too_large", f"a message of {size} bytes exceeds {MAX_WAKU_MESSAGE_BYTES}"
        )


@dataclass(frozen=True, slots=True)
class StoreQuery(StoreQueryRequest):
    """One v3 store query the store can answer: the protocol's
    :class:`~sdsync.wire.waku_protocols.StoreQueryRequest`, with the store's defaults and
    rules.  Times are Unix nanoseconds, both bounds inclusive.

    Both ways in build one: the REST parameters (:func:`~sdsync.store.rest.parse_query`)
    and a libp2p request (:func:`~sdsync.store.waku_store.store_query`).  Unlike the
    protobuf's defaults, a query is ascending and has a page size unless told otherwise,
    as nwaku reads both.  Content topics without a pubsub topic are a filter of their
    own, as nwaku serves them.
    """

    request_id: str = ""
    pagination_forward: bool = True
    pagination_limit: int = DEFAULT_PAGE_SIZE

    def __post_init__(self) -> None:
        bad = StatusCode.BAD_REQUEST
        # A pubsub topic may narrow a query by hashes: js-waku's store client always
        # sends its decoder's, and nwaku answers the hashes on that topic.
        if self.message_hashes and (
            self.content_topics or self.time_start is not None or self.time_end is not None
        ):
            raise QueryError(
                bad,
                "a query by message hashes takes no content topics or time range",
                "hashes_with_filter",
            )
        if len(self.content_topics) > MAX_CONTENT_TOPICS:
            raise QueryError(
                bad,
                f"at most {MAX_CONTENT_TOPICS} content topics per query",
                "too_many_content_topics",
            )
        for topic in filter(None, (self.pubsub_topic, *self.content_topics)):
            problem = topic_problem(topic)
            if problem is not None:
                raise QueryError(bad, f"a topic {problem}", "bad_topic")
        if len(self.message_hashes) > MAX_HASHES:
            raise QueryError(
                bad, f"at most {MAX_HASHES} message hashes per query", "too_many_hashes"
            )
        for value in self.message_hashes:
            check_hash(value)
        if self.pagination_cursor is not None:
            check_hash(self.pagination_cursor, "bad_cursor")
        for name, time in (("startTime", self.time_start), ("endTime", self.time_end)):
            if time is not None and not INT64_MIN <= time <= INT64_MAX:
                raise QueryError(bad, f"{name} does not fit a signed 64-bit integer", "bad_time")
        if self.pagination_limit < 1:
            raise QueryError(bad, "the page size must be positive", "bad_page_size")
        # The store, not the client, bounds the work of one query (nwaku clamps too).
        object.__setattr__(self, "pagination_limit", min(self.pagination_limit, MAX_PAGE_SIZE))


@dataclass(frozen=True)
class Page:
    """One page of results, in (timestamp, message hash) order.

    ``messages`` is filled only when the query asked for data. ``cursor`` is the hash
    of the last entry returned in the direction of travel, or None on the last page.
    """

    hashes: list[bytes]
    messages: list[StoredMessage] = field(default_factory=list)
    cursor: bytes | None = None
