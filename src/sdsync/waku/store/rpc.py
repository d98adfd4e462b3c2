"""13/WAKU2-STORE v3's messages (``/vac/waku/store-query/3.0.0``): a query and its
answer, a page of message hashes with the messages when asked for."""

from __future__ import annotations

from dataclasses import dataclass

from sdsync.waku.rpc import (
    RPC_OVERHEAD_BYTES,
    Rpc,
    check_hash_size,
    embedded_message,
    message_bytes,
    optional_field,
)
from sdsync.waku.store import waku_store_pb2 as store_pb
from sdsync.wire.waku import MAX_WAKU_MESSAGE_BYTES, WakuMessage

STORE_QUERY_PROTOCOL = "/vac/waku/store-query/3.0.0"
#: The most entries a store returns in one page (13/WAKU2-STORE, as nwaku enforces it).
MAX_STORE_PAGE_SIZE = 100
#: A StoreQueryResponse frame: a full page of the largest messages.
MAX_STORE_RESPONSE_BYTES = MAX_STORE_PAGE_SIZE * MAX_WAKU_MESSAGE_BYTES + RPC_OVERHEAD_BYTES


@dataclass(frozen=True, slots=True)
class StoreQueryRequest(Rpc[store_pb.StoreQueryRequest]):
    """A 13/WAKU2-STORE v3 query. ``time_*`` are Unix nanoseconds, ``time_start`` inclusive;
    ``pagination_cursor`` is the hash of the last entry of the previous page."""

    _pb_type = store_pb.StoreQueryRequest

    request_id: str
    include_data: bool = False
    pubsub_topic: str | None = None
    content_topics: tuple[str, ...] = ()
    time_start: int | None = None
    time_end: int | None = None
    message_hashes: tuple[bytes, ...] = ()
    pagination_cursor: bytes | None = None
    pagination_forward: bool = False
    pagination_limit: int | None = None

    def __post_init__(self) -> None:
        for message_hash in self.message_hashes:
            check_hash_size("a message hash", message_hash)
        check_hash_size("pagination_cursor", self.pagination_cursor)

    def _to_pb(self) -> store_pb.StoreQueryRequest:
        return store_pb.StoreQueryRequest(
            request_id=self.request_id,
            include_data=self.include_data,
            pubsub_topic=self.pubsub_topic,
            content_topics=self.content_topics,
            time_start=self.time_start,
            time_end=self.time_end,
            message_hashes=self.message_hashes,
            pagination_cursor=self.pagination_cursor,
            pagination_forward=self.pagination_forward,
            pagination_limit=self.pagination_limit,
        )

    @classmethod
    def _from_pb(cls, parsed: store_pb.StoreQueryRequest) -> StoreQueryRequest:
        return cls(
            request_id=parsed.request_id,
            include_data=parsed.include_data,
            pubsub_topic=optional_field(parsed, "pubsub_topic"),
            content_topics=tuple(parsed.content_topics),
            time_start=optional_field(parsed, "time_start"),
            time_end=optional_field(parsed, "time_end"),
            message_hashes=tuple(parsed.message_hashes),
            pagination_cursor=optional_field(parsed, "pagination_cursor"),
            pagination_forward=parsed.pagination_forward,
            pagination_limit=optional_field(parsed, "pagination_limit"),
        )


@dataclass(frozen=True, slots=True)
class WakuMessageKeyValue:
    """One entry of a store's answer: a message hash, with the message and its pubsub
    topic when the query asked for data."""

    message_hash: bytes | None = None
    message: WakuMessage | None = None
    pubsub_topic: str | None = None

    def __post_init__(self) -> None:
        check_hash_size("message_hash", self.message_hash)

    def _to_pb(self) -> store_pb.WakuMessageKeyValue:
        return store_pb.WakuMessageKeyValue(
            message_hash=self.message_hash,
            message=message_bytes(self.message),
            pubsub_topic=self.pubsub_topic,
        )

    @classmethod
    def _from_pb(cls, parsed: store_pb.WakuMessageKeyValue) -> WakuMessageKeyValue:
        return cls(
            message_hash=optional_field(parsed, "message_hash"),
            message=embedded_message(parsed, "message"),
            pubsub_topic=optional_field(parsed, "pubsub_topic"),
        )


@dataclass(frozen=True, slots=True)
class StoreQueryResponse(Rpc[store_pb.StoreQueryResponse]):
    """A store's answer: a v3 status code (200 OK, 400, 429, 503, 504) and one page."""

    _pb_type = store_pb.StoreQueryResponse

    request_id: str
    status_code: int | None = None
    status_desc: str | None = None
    messages: tuple[WakuMessageKeyValue, ...] = ()
    pagination_cursor: bytes | None = None

    def __post_init__(self) -> None:
        check_hash_size("pagination_cursor", self.pagination_cursor)

    def _to_pb(self) -> store_pb.StoreQueryResponse:
        return store_pb.StoreQueryResponse(
            request_id=self.request_id,
            status_code=self.status_code,
            status_desc=self.status_desc,
            messages=[entry._to_pb() for entry in self.messages],
            pagination_cursor=self.pagination_cursor,
        )

    @classmethod
    def _from_pb(cls, parsed: store_pb.StoreQueryResponse) -> StoreQueryResponse:
        return cls(
            request_id=parsed.request_id,
            status_code=optional_field(parsed, "status_code"),
            status_desc=optional_field(parsed, "status_desc"),
            messages=tuple(map(WakuMessageKeyValue._from_pb, parsed.messages)),
            pagination_cursor=optional_field(parsed, "pagination_cursor"),
        )
