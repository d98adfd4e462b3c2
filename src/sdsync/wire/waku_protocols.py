"""The Waku request/response protocols SDS needs: Store v3, LightPush, Filter v2, metadata.

Theory of operation
-------------------
A Waku node serves each protocol under its own libp2p protocol id (the ``*_PROTOCOL``
constants). On a stream, each side writes its RPCs as *frames*: an unsigned varint (LEB128)
length prefix, then that many bytes of protobuf. The schemas are the ``waku_*.proto`` files
beside this module, field for field those of @waku/proto 0.0.15 (but for metadata's
field 3, which nwaku and go-waku use and @waku/proto does not know).

Each dataclass here mirrors one protobuf message: a proto3 ``optional`` field or an
embedded message is ``None`` when absent; every other field has proto3's default. Equal
values give equal bytes, the bytes js-waku's encoder writes (but for a sint64 of at most
-2**53 with its low 32 bits zero, which protons-runtime 5.6 miswrites, and for metadata's
shards, which we write a second time in field 3: js-waku reads ours right either way).
``to_bytes`` writes a value and ``from_bytes`` parses a peer's. An embedded WakuMessage
travels as its serialized bytes (the schemas declare it ``bytes``: same encoding), so the
envelope's own decoder :func:`~sdsync.wire.waku.decode_waku_message` bounds and checks it.

Whose fault: a value that cannot be encoded (a number out of its field's range, a hash
that is not 32 bytes) raises :class:`~sdsync.errors.LocalProtocolError` from ``to_bytes``
or the constructor. ``from_bytes`` raises only :class:`~sdsync.errors.RemoteProtocolError`:
``MALFORMED_RPC`` for bytes that do not parse or that parse into values the constructors
refuse; the embedded WakuMessage's own reasons (``OVERSIZED``, ``NOT_WAKU_MESSAGE``)
otherwise. Only structure is checked here; what a store or a Filter service makes of a
well-formed request (exclusive filters, page sizes, how many topics) is theirs to judge.

Framing is the only I/O, and it is free of any event loop: :func:`read_frame` awaits a
``read(n)`` the transport supplies (between 1 and ``n`` bytes, ``b""`` at the end of the
stream). It reads the length prefix byte by byte and refuses it (``OVERSIZED``) as soon as
it exceeds ``max_length``, before a byte of the body is read or a buffer allocated. A
prefix longer than 10 bytes is ``MALFORMED_RPC``, a stream ending inside a frame is
``TRUNCATED_FRAME``, and one that ends cleanly before a frame gives ``None`` (js-waku's
relay node opens a metadata stream and closes it unused). How long to wait for bytes is
the transport's business: a deadline around the call.

Autosharding (51/WAKU2-RELAY-SHARDING) picks the pubsub topic of a content topic
``/<application>/<version>/<name>/<encoding>`` (optionally behind a generation ``/0``):
the shard is the big-endian uint64 of the last 8 bytes of sha256(application ‖ version)
modulo the cluster's shard count, and its pubsub topic ``/waku/2/rs/<cluster>/<shard>``.
Parsing a content topic says whose it is: ``remote=True`` for a peer's.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar

from google.protobuf.message import Message as ProtoMessage

from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError
from sdsync.wire import waku_filter_pb2 as filter_pb
from sdsync.wire import waku_lightpush_pb2 as lightpush_pb
from sdsync.wire import waku_metadata_pb2 as metadata_pb
from sdsync.wire import waku_store_pb2 as store_pb
from sdsync.wire.codec import uvarint
from sdsync.wire.untrusted import parse_untrusted
from sdsync.wire.waku import HASH_SIZE, MAX_WAKU_MESSAGE_BYTES, WakuMessage, decode_waku_message

RELAY_PROTOCOL = "/vac/waku/relay/2.0.0"
STORE_QUERY_PROTOCOL = "/vac/waku/store-query/3.0.0"
LIGHTPUSH_PROTOCOL = "/vac/waku/lightpush/3.0.0"
LIGHTPUSH_V2_PROTOCOL = "/vac/waku/lightpush/2.0.0-beta1"
FILTER_SUBSCRIBE_PROTOCOL = "/vac/waku/filter-subscribe/2.0.0-beta1"
FILTER_PUSH_PROTOCOL = "/vac/waku/filter-push/2.0.0-beta1"
METADATA_PROTOCOL = "/vac/waku/metadata/1.0.0"

#: The Waku Network (64/WAKU2-NETWORK): cluster 1, autosharded over 8 shards.
TWN_CLUSTER_ID = 1
TWN_SHARD_COUNT = 8

#: The most entries a store returns in one page (13/WAKU2-STORE, as nwaku enforces it).
MAX_STORE_PAGE_SIZE = 100
#: Room for everything of an RPC around its WakuMessages (nwaku allows the same 64 KiB).
RPC_OVERHEAD_BYTES = 64 * 1024
#: A frame of any RPC carrying at most one WakuMessage: every request, a push, a response
#: other than the store's.
MAX_RPC_BYTES = MAX_WAKU_MESSAGE_BYTES + RPC_OVERHEAD_BYTES
#: A StoreQueryResponse frame: a full page of the largest messages.
MAX_STORE_RESPONSE_BYTES = MAX_STORE_PAGE_SIZE * MAX_WAKU_MESSAGE_BYTES + RPC_OVERHEAD_BYTES

MAX_UVARINT_BYTES = 10
# The protobuf enum's value type, for mypy (an int at run time).
_PB_SUBSCRIBE_TYPE = filter_pb.FilterSubscribeRequest.FilterSubscribeType.ValueType
_M = TypeVar("_M", bound=ProtoMessage)


# --- framing ---------------------------------------------------------------------------


def frame_prefix(length: int) -> bytes:
    """The uvarint length prefix of a frame of ``length`` bytes."""
    return uvarint(length)


def encode_frame(body: bytes) -> bytes:
    """``body`` behind its uvarint length prefix."""
    return frame_prefix(len(body)) + body


async def read_frame(
    read: Callable[[int], Awaitable[bytes]], max_length: int = MAX_RPC_BYTES
) -> bytes | None:
    """The body of the next frame, or ``None`` if the stream ends before one starts.

    ``read(n)`` returns between 1 and ``n`` bytes, or ``b""`` at the end of the stream.
    Raises only :class:`RemoteProtocolError`.
    """
    length = await _read_length(read, max_length)
    if length is None:
        return None
    body = bytearray()
    while len(body) < length:
        chunk = await read(length - len(body))
        if not chunk:
            raise RemoteProtocolError(
                f"stream ended {len(body)} bytes into a frame of {length}",
                reason=RejectReason.TRUNCATED_FRAME,
            )
        body += chunk
    return bytes(body)


async def _read_length(read: Callable[[int], Awaitable[bytes]], max_length: int) -> int | None:
    length = 0
    for index in range(MAX_UVARINT_BYTES):
        byte = await read(1)
        if not byte:
            if index == 0:
                return None
            raise RemoteProtocolError(
                "stream ended inside a length prefix", reason=RejectReason.TRUNCATED_FRAME
            )
        length |= (byte[0] & 0x7F) << (7 * index)
        # Later bytes only add to the length: refuse it before reading them.
        if length > max_length:
            raise RemoteProtocolError(
                f"frame of at least {length} bytes exceeds {max_length}",
                reason=RejectReason.OVERSIZED,
            )
        if not byte[0] & 0x80:
            return length
    raise RemoteProtocolError(
        f"length prefix longer than {MAX_UVARINT_BYTES} bytes", reason=RejectReason.MALFORMED_RPC
    )


# --- codecs ----------------------------------------------------------------------------


class _Rpc(Generic[_M]):
    """What every RPC value shares: ``to_bytes`` and ``from_bytes`` through its protobuf
    message, the ``_pb_type`` each subclass names (for ``_M``)."""

    __slots__ = ()
    # Not a ClassVar: mypy allows no type variable in one.
    _pb_type: type[_M]

    def _to_pb(self) -> _M:
        raise NotImplementedError

    @classmethod
    def _from_pb(cls, parsed: _M) -> Self:
        raise NotImplementedError

    def to_bytes(self) -> bytes:
        try:
            return self._to_pb().SerializeToString()
        except ValueError as exc:  # a number out of its field's range, a lone surrogate
            raise LocalProtocolError(f"cannot encode {type(self).__name__}: {exc}") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> Self:
        """A peer's ``data`` parsed; raises only :class:`RemoteProtocolError`."""
        what = cls._pb_type.DESCRIPTOR.name
        parsed = parse_untrusted(cls._pb_type, data, what, RejectReason.MALFORMED_RPC)
        try:
            return cls._from_pb(parsed)
        except (ValueError, LocalProtocolError) as exc:
            # ValueError: an enum value we do not know; LocalProtocolError: a constructor
            # refused the peer's value.
            raise RemoteProtocolError(
                f"malformed {what}: {exc}", reason=RejectReason.MALFORMED_RPC
            ) from None


def _optional(parsed: ProtoMessage, name: str) -> Any:
    """Field ``name`` of ``parsed`` (a proto3 optional or a message), or None when absent."""
    return getattr(parsed, name) if parsed.HasField(name) else None


def _waku_message(parsed: ProtoMessage, name: str) -> WakuMessage | None:
    """The embedded WakuMessage ``name``, decoded and checked, or None when absent."""
    data = _optional(parsed, name)
    return None if data is None else decode_waku_message(data)


def _to_bytes(message: WakuMessage | None) -> bytes | None:
    return None if message is None else message.to_bytes()


def _check_hash(name: str, value: bytes | None) -> None:
    if value is not None and len(value) != HASH_SIZE:
        raise LocalProtocolError(f"{name} of {len(value)} bytes is not a {HASH_SIZE}-byte hash")


@dataclass(frozen=True, slots=True)
class StoreQueryRequest(_Rpc[store_pb.StoreQueryRequest]):
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
            _check_hash("a message hash", message_hash)
        _check_hash("pagination_cursor", self.pagination_cursor)

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
            pubsub_topic=_optional(parsed, "pubsub_topic"),
            content_topics=tuple(parsed.content_topics),
            time_start=_optional(parsed, "time_start"),
            time_end=_optional(parsed, "time_end"),
            message_hashes=tuple(parsed.message_hashes),
            pagination_cursor=_optional(parsed, "pagination_cursor"),
            pagination_forward=parsed.pagination_forward,
            pagination_limit=_optional(parsed, "pagination_limit"),
        )


@dataclass(frozen=True, slots=True)
class WakuMessageKeyValue:
    """One entry of a store's answer: a message hash, with the message and its pubsub
    topic when the query asked for data."""

    message_hash: bytes | None = None
    message: WakuMessage | None = None
    pubsub_topic: str | None = None

    def __post_init__(self) -> None:
        _check_hash("message_hash", self.message_hash)

    def _to_pb(self) -> store_pb.WakuMessageKeyValue:
        return store_pb.WakuMessageKeyValue(
            message_hash=self.message_hash,
            message=_to_bytes(self.message),
            pubsub_topic=self.pubsub_topic,
        )

    @classmethod
    def _from_pb(cls, parsed: store_pb.WakuMessageKeyValue) -> WakuMessageKeyValue:
        return cls(
            message_hash=_optional(parsed, "message_hash"),
            message=_waku_message(parsed, "message"),
            pubsub_topic=_optional(parsed, "pubsub_topic"),
        )


@dataclass(frozen=True, slots=True)
class StoreQueryResponse(_Rpc[store_pb.StoreQueryResponse]):
    """A store's answer: a v3 status code (200 OK, 400, 429, 503, 504) and one page."""

    _pb_type = store_pb.StoreQueryResponse

    request_id: str
    status_code: int | None = None
    status_desc: str | None = None
    messages: tuple[WakuMessageKeyValue, ...] = ()
    pagination_cursor: bytes | None = None

    def __post_init__(self) -> None:
        _check_hash("pagination_cursor", self.pagination_cursor)

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
            status_code=_optional(parsed, "status_code"),
            status_desc=_optional(parsed, "status_desc"),
            messages=tuple(map(WakuMessageKeyValue._from_pb, parsed.messages)),
            pagination_cursor=_optional(parsed, "pagination_cursor"),
        )


@dataclass(frozen=True, slots=True)
class LightPushRequestV3(_Rpc[lightpush_pb.LightPushRequestV3]):
    """LightPush v3: publish ``message`` on ``pubsub_topic`` (absent: autosharded)."""

    _pb_type = lightpush_pb.LightPushRequestV3

    request_id: str
    pubsub_topic: str | None = None
    message: WakuMessage | None = None

    def _to_pb(self) -> lightpush_pb.LightPushRequestV3:
        return lightpush_pb.LightPushRequestV3(
            request_id=self.request_id,
            pubsub_topic=self.pubsub_topic,
            message=_to_bytes(self.message),
        )

    @classmethod
    def _from_pb(cls, parsed: lightpush_pb.LightPushRequestV3) -> LightPushRequestV3:
        return cls(
            request_id=parsed.request_id,
            pubsub_topic=_optional(parsed, "pubsub_topic"),
            message=_waku_message(parsed, "message"),
        )


@dataclass(frozen=True, slots=True)
class LightPushResponseV3(_Rpc[lightpush_pb.LightPushResponseV3]):
    """LightPush v3's answer: a status code and how many relay peers got the message."""

    _pb_type = lightpush_pb.LightPushResponseV3

    request_id: str
    status_code: int = 0
    status_desc: str | None = None
    relay_peer_count: int | None = None

    def _to_pb(self) -> lightpush_pb.LightPushResponseV3:
        return lightpush_pb.LightPushResponseV3(
            request_id=self.request_id,
            status_code=self.status_code,
            status_desc=self.status_desc,
            relay_peer_count=self.relay_peer_count,
        )

    @classmethod
    def _from_pb(cls, parsed: lightpush_pb.LightPushResponseV3) -> LightPushResponseV3:
        return cls(
            request_id=parsed.request_id,
            status_code=parsed.status_code,
            status_desc=_optional(parsed, "status_desc"),
            relay_peer_count=_optional(parsed, "relay_peer_count"),
        )


@dataclass(frozen=True, slots=True)
class PushRequest:
    """LightPush 2.0.0-beta1's request, inside a :class:`PushRpc`."""

    pubsub_topic: str = ""
    message: WakuMessage | None = None

    def _to_pb(self) -> lightpush_pb.PushRequest:
        return lightpush_pb.PushRequest(
            pubsub_topic=self.pubsub_topic, message=_to_bytes(self.message)
        )

    @classmethod
    def _from_pb(cls, parsed: lightpush_pb.PushRequest) -> PushRequest:
        return cls(pubsub_topic=parsed.pubsub_topic, message=_waku_message(parsed, "message"))


@dataclass(frozen=True, slots=True)
class PushResponse:
    """LightPush 2.0.0-beta1's answer, inside a :class:`PushRpc`."""

    is_success: bool = False
    info: str | None = None
    status_code: int | None = None
    status_desc: str | None = None
    relay_peer_count: int | None = None

    def _to_pb(self) -> lightpush_pb.PushResponse:
        return lightpush_pb.PushResponse(
            is_success=self.is_success,
            info=self.info,
            status_code=self.status_code,
            status_desc=self.status_desc,
            relay_peer_count=self.relay_peer_count,
        )

    @classmethod
    def _from_pb(cls, parsed: lightpush_pb.PushResponse) -> PushResponse:
        return cls(
            is_success=parsed.is_success,
            info=_optional(parsed, "info"),
            status_code=_optional(parsed, "status_code"),
            status_desc=_optional(parsed, "status_desc"),
            relay_peer_count=_optional(parsed, "relay_peer_count"),
        )


@dataclass(frozen=True, slots=True)
class PushRpc(_Rpc[lightpush_pb.PushRpc]):
    """LightPush 2.0.0-beta1's frame both ways: a request out, a response back."""

    _pb_type = lightpush_pb.PushRpc

    request_id: str
    request: PushRequest | None = None
    response: PushResponse | None = None

    def _to_pb(self) -> lightpush_pb.PushRpc:
        return lightpush_pb.PushRpc(
            request_id=self.request_id,
            request=None if self.request is None else self.request._to_pb(),
            response=None if self.response is None else self.response._to_pb(),
        )

    @classmethod
    def _from_pb(cls, parsed: lightpush_pb.PushRpc) -> PushRpc:
        return cls(
            request_id=parsed.request_id,
            request=PushRequest._from_pb(parsed.request) if parsed.HasField("request") else None,
            response=(
                PushResponse._from_pb(parsed.response) if parsed.HasField("response") else None
            ),
        )


class FilterSubscribeType(enum.IntEnum):
    """What a :class:`FilterSubscribeRequest` asks for (the values of its protobuf enum)."""

    SUBSCRIBER_PING = 0
    SUBSCRIBE = 1
    UNSUBSCRIBE = 2
    UNSUBSCRIBE_ALL = 3


@dataclass(frozen=True, slots=True)
class FilterSubscribeRequest(_Rpc[filter_pb.FilterSubscribeRequest]):
    """Filter v2: ping, (un)subscribe ``content_topics`` on ``pubsub_topic``, or drop all."""

    _pb_type = filter_pb.FilterSubscribeRequest

    request_id: str
    filter_subscribe_type: FilterSubscribeType = FilterSubscribeType.SUBSCRIBER_PING
    pubsub_topic: str | None = None
    content_topics: tuple[str, ...] = ()

    def _to_pb(self) -> filter_pb.FilterSubscribeRequest:
        return filter_pb.FilterSubscribeRequest(
            request_id=self.request_id,
            filter_subscribe_type=_PB_SUBSCRIBE_TYPE(self.filter_subscribe_type),
            pubsub_topic=self.pubsub_topic,
            content_topics=self.content_topics,
        )

    @classmethod
    def _from_pb(cls, parsed: filter_pb.FilterSubscribeRequest) -> FilterSubscribeRequest:
        return cls(
            request_id=parsed.request_id,
            filter_subscribe_type=FilterSubscribeType(parsed.filter_subscribe_type),
            pubsub_topic=_optional(parsed, "pubsub_topic"),
            content_topics=tuple(parsed.content_topics),
        )


@dataclass(frozen=True, slots=True)
class FilterSubscribeResponse(_Rpc[filter_pb.FilterSubscribeResponse]):
    """Filter v2's answer to a :class:`FilterSubscribeRequest`."""

    _pb_type = filter_pb.FilterSubscribeResponse

    request_id: str
    status_code: int = 0
    status_desc: str | None = None

    def _to_pb(self) -> filter_pb.FilterSubscribeResponse:
        return filter_pb.FilterSubscribeResponse(
            request_id=self.request_id, status_code=self.status_code, status_desc=self.status_desc
        )

    @classmethod
    def _from_pb(cls, parsed: filter_pb.FilterSubscribeResponse) -> FilterSubscribeResponse:
        return cls(
            request_id=parsed.request_id,
            status_code=parsed.status_code,
            status_desc=_optional(parsed, "status_desc"),
        )


@dataclass(frozen=True, slots=True)
class MessagePush(_Rpc[filter_pb.MessagePush]):
    """Filter v2's push of one message to a subscriber."""

    _pb_type = filter_pb.MessagePush

    waku_message: WakuMessage | None = None
    pubsub_topic: str | None = None

    def _to_pb(self) -> filter_pb.MessagePush:
        return filter_pb.MessagePush(
            waku_message=_to_bytes(self.waku_message), pubsub_topic=self.pubsub_topic
        )

    @classmethod
    def _from_pb(cls, parsed: filter_pb.MessagePush) -> MessagePush:
        return cls(
            waku_message=_waku_message(parsed, "waku_message"),
            pubsub_topic=_optional(parsed, "pubsub_topic"),
        )


@dataclass(frozen=True, slots=True)
class WakuMetadata(_Rpc[metadata_pb.WakuMetadata]):
    """The metadata protocol's request and its response alike: a cluster and its shards.

    Written as nwaku writes it: the shards twice, in field 2 one tag each (what js-waku
    reads) and in field 3 packed (what go-waku reads, and all it reads). Read as nwaku
    reads it: field 3 when it holds any shard, else field 2, packed or not. So these are
    not @waku/proto's bytes when there are shards (it writes field 2 only), though each
    side reads the other's."""

    _pb_type = metadata_pb.WakuMetadata

    cluster_id: int | None = None
    shards: tuple[int, ...] = ()

    def _to_pb(self) -> metadata_pb.WakuMetadata:
        return metadata_pb.WakuMetadata(
            cluster_id=self.cluster_id, shards=self.shards, shards_packed=self.shards
        )

    @classmethod
    def _from_pb(cls, parsed: metadata_pb.WakuMetadata) -> WakuMetadata:
        return cls(
            cluster_id=_optional(parsed, "cluster_id"),
            shards=tuple(parsed.shards_packed or parsed.shards),
        )


# --- autosharding ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContentTopic:
    """A content topic ``/<application>/<version>/<name>/<encoding>``, parsed."""

    application: str
    version: str
    name: str
    encoding: str

    def shard(self, shard_count: int) -> int:
        """The shard autosharding puts this topic on, in a cluster of ``shard_count``."""
        if shard_count < 1:
            raise LocalProtocolError(f"a cluster needs at least one shard, not {shard_count}")
        digest = hashlib.sha256(self.application.encode() + self.version.encode()).digest()
        return int.from_bytes(digest[-8:], "big") % shard_count

    def pubsub_topic(self, cluster_id: int, shard_count: int) -> str:
        """The pubsub topic autosharding puts this topic on."""
        return shard_pubsub_topic(cluster_id, self.shard(shard_count))


SHARD_TOPIC_PREFIX = "/waku/2/rs/"
"""Every sharded pubsub topic starts so: ``/waku/2/rs/<cluster_id>/<shard>``."""


def shard_pubsub_topic(cluster_id: int, shard: int) -> str:
    """``/waku/2/rs/<cluster_id>/<shard>``."""
    if cluster_id < 0 or shard < 0:
        raise LocalProtocolError(f"no pubsub topic for cluster {cluster_id}, shard {shard}")
    return f"{SHARD_TOPIC_PREFIX}{cluster_id}/{shard}"


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def parse_content_topic(topic: str, *, remote: bool = False) -> ContentTopic:
    """``topic`` parsed: LocalProtocolError if it is malformed, RemoteProtocolError
    (``MALFORMED_CONTENT_TOPIC``) instead if a peer sent it (``remote=True``)."""
    parts = topic.split("/")
    if len(parts) == 6 and parts[1] == "0":  # the optional generation, only 0 so far
        del parts[1]
    # A lone surrogate has no UTF-8 form: no hash, no shard, no place on the wire.
    if len(parts) != 5 or parts[0] or not all(parts[1:]) or not _utf8(topic):
        problem = f"content topic {topic[:100]!r} is not /application/version/name/encoding"
        if remote:
            raise RemoteProtocolError(problem, reason=RejectReason.MALFORMED_CONTENT_TOPIC)
        raise LocalProtocolError(problem)
    return ContentTopic(*parts[1:])
