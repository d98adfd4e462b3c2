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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.wire.waku import HASH_SIZE, WakuMessage

DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100
MAX_CONTENT_TOPICS = 100
MAX_HASHES = 100


class StatusCode(IntEnum):
    """Status codes of 13/WAKU2-STORE v3 responses (also used as HTTP statuses)."""

    OK = 200
    BAD_REQUEST = 400
    TOO_MANY_REQUESTS = 429
    SERVICE_UNAVAILABLE = 503
    GATEWAY_TIMEOUT = 504


class QueryError(LocalProtocolError):
    """A query the store cannot answer, with the v3 status code to answer it with."""

    def __init__(self, status: StatusCode, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.description = description


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as archived: its hash, its pubsub topic and the WakuMessage itself."""

    message_hash: bytes
    pubsub_topic: str
    message: WakuMessage

    def __post_init__(self) -> None:
        if self.message.timestamp is None:
            raise RemoteProtocolError("a message without a timestamp cannot be archived")
        if self.message.ephemeral:
            raise RemoteProtocolError("ephemeral messages are not archived")
        if self.message.hash(self.pubsub_topic) != self.message_hash:
            raise RemoteProtocolError(
                f"message hash {self.message_hash.hex()} does not match the message content"
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


def check_hash(value: bytes) -> bytes:
    if len(value) != HASH_SIZE:
        raise QueryError(
            StatusCode.BAD_REQUEST, f"a message hash has {HASH_SIZE} bytes, not {len(value)}"
        )
    return value


@dataclass(frozen=True)
class StoreQuery:
    """One v3 store query. Times are Unix nanoseconds, both bounds inclusive."""

    include_data: bool = False
    pubsub_topic: str | None = None
    content_topics: tuple[str, ...] = ()
    time_start: int | None = None
    time_end: int | None = None
    message_hashes: tuple[bytes, ...] = ()
    cursor: bytes | None = None
    forward: bool = True
    page_size: int = DEFAULT_PAGE_SIZE

    def __post_init__(self) -> None:
        bad = StatusCode.BAD_REQUEST
        if self.content_topics and self.pubsub_topic is None:
            raise QueryError(bad, "content topics need a pubsub topic")
        if self.message_hashes and (
            self.pubsub_topic is not None
            or self.content_topics
            or self.time_start is not None
            or self.time_end is not None
        ):
            raise QueryError(bad, "a query by message hashes takes no content filter")
        if len(self.content_topics) > MAX_CONTENT_TOPICS:
            raise QueryError(bad, f"at most {MAX_CONTENT_TOPICS} content topics per query")
        if len(self.message_hashes) > MAX_HASHES:
            raise QueryError(bad, f"at most {MAX_HASHES} message hashes per query")
        for value in self.message_hashes:
            check_hash(value)
        if self.cursor is not None:
            check_hash(self.cursor)
        if self.page_size < 1:
            raise QueryError(bad, "the page size must be positive")
        # The store, not the client, bounds the work of one query (nwaku clamps too).
        object.__setattr__(self, "page_size", min(self.page_size, MAX_PAGE_SIZE))


@dataclass(frozen=True)
class Page:
    """One page of results, in (timestamp, message hash) order.

    ``messages`` is filled only when the query asked for data. ``cursor`` is the hash
    of the last entry returned in the direction of travel, or None on the last page.
    """

    hashes: list[bytes]
    messages: list[StoredMessage] = field(default_factory=list)
    cursor: bytes | None = None
