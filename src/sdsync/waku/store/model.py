"""What a store is asked (13/WAKU2-STORE v3): queries, pages, status codes.

Theory of operation
-------------------
A :class:`StoreQuery` is one v3 query: either a list of message hashes or a content
filter (pubsub topic, content topics, time range), plus pagination.  Its constructor
enforces the protocol's rules, so a query that exists is a valid one; :class:`QueryError`
carries the v3 status code of a query that cannot be answered, and the reason it is
counted under (``sdsync_store_refused_total{route, reason}``).  A :class:`Page` is one
answer, in (timestamp, message hash) order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from sdsync.errors import LocalProtocolError
from sdsync.waku.messages import StoredMessage
from sdsync.waku.store.rpc import MAX_STORE_PAGE_SIZE, StoreQueryRequest
from sdsync.wire.waku import HASH_SIZE, topic_problem

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


def check_hash(value: bytes, reason: str = "bad_hash") -> bytes:
    if len(value) != HASH_SIZE:
        raise QueryError(
            StatusCode.BAD_REQUEST,
            f"a message hash has {HASH_SIZE} bytes, not {len(value)}",
            reason,
        )
    return value


@dataclass(frozen=True, slots=True)
class StoreQuery(StoreQueryRequest):
    """One v3 store query the store can answer: the protocol's
    :class:`~sdsync.waku.store.rpc.StoreQueryRequest`, with the store's defaults and
    rules.  Times are Unix nanoseconds, both bounds inclusive.

    Both ways in build one: the REST parameters (:func:`~sdsync.store.rest.parse_query`)
    and a libp2p request (:func:`~sdsync.waku.store.service.store_query`).  Unlike the
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


@dataclass(frozen=True)
class QueryFailure:
    """A v3 query not answered: the status to answer with, and why (one line)."""

    status: StatusCode
    description: str
