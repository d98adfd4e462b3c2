"""LightPush's messages: v3 (``/vac/waku/lightpush/3.0.0``) and 2.0.0-beta1, which
js-waku before 0.0.36 and go-waku still speak."""

from __future__ import annotations

from dataclasses import dataclass

from sdsync.waku.lightpush import waku_lightpush_pb2 as lightpush_pb
from sdsync.waku.rpc import Rpc, embedded_message, message_bytes, optional_field
from sdsync.wire.waku import WakuMessage

LIGHTPUSH_PROTOCOL = "/vac/waku/lightpush/3.0.0"
LIGHTPUSH_V2_PROTOCOL = "/vac/waku/lightpush/2.0.0-beta1"


@dataclass(frozen=True, slots=True)
class LightPushRequestV3(Rpc[lightpush_pb.LightPushRequestV3]):
    """LightPush v3: publish ``message`` on ``pubsub_topic`` (absent: autosharded)."""

    _pb_type = lightpush_pb.LightPushRequestV3

    request_id: str
    pubsub_topic: str | None = None
    message: WakuMessage | None = None

    def _to_pb(self) -> lightpush_pb.LightPushRequestV3:
        return lightpush_pb.LightPushRequestV3(
            request_id=self.request_id,
            pubsub_topic=self.pubsub_topic,
            message=message_bytes(self.message),
        )

    @classmethod
    def _from_pb(cls, parsed: lightpush_pb.LightPushRequestV3) -> LightPushRequestV3:
        return cls(
            request_id=parsed.request_id,
            pubsub_topic=optional_field(parsed, "pubsub_topic"),
            message=embedded_message(parsed, "message"),
        )


@dataclass(frozen=True, slots=True)
class LightPushResponseV3(Rpc[lightpush_pb.LightPushResponseV3]):
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
            status_desc=optional_field(parsed, "status_desc"),
            relay_peer_count=optional_field(parsed, "relay_peer_count"),
        )


@dataclass(frozen=True, slots=True)
class PushRequest:
    """LightPush 2.0.0-beta1's request, inside a :class:`PushRpc`."""

    pubsub_topic: str = ""
    message: WakuMessage | None = None

    def _to_pb(self) -> lightpush_pb.PushRequest:
        return lightpush_pb.PushRequest(
            pubsub_topic=self.pubsub_topic, message=message_bytes(self.message)
        )

    @classmethod
    def _from_pb(cls, parsed: lightpush_pb.PushRequest) -> PushRequest:
        return cls(pubsub_topic=parsed.pubsub_topic, message=embedded_message(parsed, "message"))


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
            info=optional_field(parsed, "info"),
            status_code=optional_field(parsed, "status_code"),
            status_desc=optional_field(parsed, "status_desc"),
            relay_peer_count=optional_field(parsed, "relay_peer_count"),
        )


@dataclass(frozen=True, slots=True)
class PushRpc(Rpc[lightpush_pb.PushRpc]):
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
