"""Filter v2's messages: subscription requests and answers
(``/vac/waku/filter-subscribe/2.0.0-beta1``) and the pushes to a subscriber
(``/vac/waku/filter-push/2.0.0-beta1``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sdsync.waku.filter import waku_filter_pb2 as filter_pb
from sdsync.waku.rpc import Rpc, embedded_message, message_bytes, optional_field
from sdsync.wire.waku import WakuMessage

FILTER_SUBSCRIBE_PROTOCOL = "/vac/waku/filter-subscribe/2.0.0-beta1"
FILTER_PUSH_PROTOCOL = "/vac/waku/filter-push/2.0.0-beta1"

# The protobuf enum's value type, for mypy (an int at run time).
_PB_SUBSCRIBE_TYPE = filter_pb.FilterSubscribeRequest.FilterSubscribeType.ValueType


class FilterSubscribeType(enum.IntEnum):
    """What a :class:`FilterSubscribeRequest` asks for (the values of its protobuf enum)."""

    SUBSCRIBER_PING = 0
    SUBSCRIBE = 1
    UNSUBSCRIBE = 2
    UNSUBSCRIBE_ALL = 3


@dataclass(frozen=True, slots=True)
class FilterSubscribeRequest(Rpc[filter_pb.FilterSubscribeRequest]):
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
            pubsub_topic=optional_field(parsed, "pubsub_topic"),
            content_topics=tuple(parsed.content_topics),
        )


@dataclass(frozen=True, slots=True)
class FilterSubscribeResponse(Rpc[filter_pb.FilterSubscribeResponse]):
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
            status_desc=optional_field(parsed, "status_desc"),
        )


@dataclass(frozen=True, slots=True)
class MessagePush(Rpc[filter_pb.MessagePush]):
    """Filter v2's push of one message to a subscriber."""

    _pb_type = filter_pb.MessagePush

    waku_message: WakuMessage | None = None
    pubsub_topic: str | None = None

    def _to_pb(self) -> filter_pb.MessagePush:
        return filter_pb.MessagePush(
            waku_message=message_bytes(self.waku_message), pubsub_topic=self.pubsub_topic
        )

    @classmethod
    def _from_pb(cls, parsed: filter_pb.MessagePush) -> MessagePush:
        return cls(
            waku_message=embedded_message(parsed, "waku_message"),
            pubsub_topic=optional_field(parsed, "pubsub_topic"),
        )
