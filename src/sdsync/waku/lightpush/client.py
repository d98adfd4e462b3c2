"""LightPush's client side: one message to one service node, over v3 or 2.0.0-beta1.

Which service is asked, when to ask again and what a 429 costs is the light client's
(:class:`~sdsync.transport.waku_light.WakuLightTransport`); here is one exchange: the
request written, the answer's request id checked, and a refusal raised as
:class:`~sdsync.waku.rpc.ServiceRefusedError` with the service's status and reason.
"""

from __future__ import annotations

import uuid

from sdsync.errors import RemoteProtocolError
from sdsync.waku.lightpush.rpc import (
    LIGHTPUSH_PROTOCOL,
    LIGHTPUSH_V2_PROTOCOL,
    LightPushRequestV3,
    LightPushResponseV3,
    PushRequest,
    PushRpc,
)
from sdsync.waku.rpc import Request, ServiceRefusedError, check_request_id
from sdsync.wire.waku import WakuMessage

_OK = 200


async def lightpush_v3(
    request: Request, service: str, pubsub_topic: str, message: WakuMessage
) -> None:
    """Ask ``service`` over ``/vac/waku/lightpush/3.0.0`` to relay ``message``."""
    asked = LightPushRequestV3(uuid.uuid4().hex, pubsub_topic, message)
    response = LightPushResponseV3.from_bytes(await request(LIGHTPUSH_PROTOCOL, asked.to_bytes()))
    check_request_id(service, LIGHTPUSH_PROTOCOL, asked.request_id, response.request_id)
    if response.status_code != _OK:
        raise ServiceRefusedError(
            service, LIGHTPUSH_PROTOCOL, response.status_code, response.status_desc
        )


async def lightpush_v2(
    request: Request, service: str, pubsub_topic: str, message: WakuMessage
) -> None:
    """Ask ``service`` over ``/vac/waku/lightpush/2.0.0-beta1`` (go-waku 0.9.0's only
    LightPush) to relay ``message``."""
    asked = PushRpc(uuid.uuid4().hex, request=PushRequest(pubsub_topic, message))
    answer = PushRpc.from_bytes(await request(LIGHTPUSH_V2_PROTOCOL, asked.to_bytes()))
    check_request_id(service, LIGHTPUSH_V2_PROTOCOL, asked.request_id, answer.request_id)
    response = answer.response
    if response is None:
        raise RemoteProtocolError(f"{service} answered a push without a response")
    if not response.is_success:
        raise ServiceRefusedError(
            service,
            LIGHTPUSH_V2_PROTOCOL,
            response.status_code,
            response.status_desc or response.info,
        )
