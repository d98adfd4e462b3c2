"""Filter's client side: the requests that carry a subscription, one request to one
service node, and the messages a service pushes.

Which services hold the subscription, when to ping and when to subscribe again is the
light client's (:class:`~sdsync.transport.waku_light.FilterPlan`); here is what goes on
the wire: :func:`filter_requests` splits what is wanted into requests of one pubsub topic
and at most a hundred content topics (nwaku's limit), :func:`filter_request` makes one
exchange (a refusal raises :class:`~sdsync.waku.rpc.ServiceRefusedError`, whose 404 on a
ping means the service holds no subscription of ours), and :func:`pushed_message` reads a
MessagePush frame, whose bytes are a peer's (RemoteProtocolError only).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

from sdsync.errors import RemoteProtocolError
from sdsync.waku.filter.rpc import (
    FILTER_SUBSCRIBE_PROTOCOL,
    FilterSubscribeRequest,
    FilterSubscribeResponse,
    FilterSubscribeType,
    MessagePush,
)
from sdsync.waku.rpc import Request, ServiceRefusedError, check_request_id
from sdsync.wire.waku import WakuMessage

Criterion = tuple[str, str]
"""(pubsub topic, content topic): what a Filter subscription asks for."""

#: A Filter request names at most this many content topics (nwaku's limit).
CONTENT_TOPICS_PER_REQUEST = 100
_OK = 200


def filter_requests(criteria: Iterable[Criterion]) -> list[tuple[str, tuple[str, ...]]]:
    """The Filter requests that ask for ``criteria``: one per pubsub topic and hundred
    content topics."""
    by_topic: dict[str, list[str]] = {}
    for pubsub_topic, content_topic in sorted(criteria):
        by_topic.setdefault(pubsub_topic, []).append(content_topic)
    step = CONTENT_TOPICS_PER_REQUEST
    return [
        (pubsub_topic, tuple(topics[start : start + step]))
        for pubsub_topic, topics in by_topic.items()
        for start in range(0, len(topics), step)
    ]


async def filter_request(
    request: Request,
    service: str,
    kind: FilterSubscribeType,
    pubsub_topic: str | None = None,
    content_topics: tuple[str, ...] = (),
) -> None:
    """One FilterSubscribeRequest of ``kind`` to ``service``, answered 200 or raised."""
    asked = FilterSubscribeRequest(uuid.uuid4().hex, kind, pubsub_topic, content_topics)
    response = FilterSubscribeResponse.from_bytes(
        await request(FILTER_SUBSCRIBE_PROTOCOL, asked.to_bytes())
    )
    check_request_id(service, FILTER_SUBSCRIBE_PROTOCOL, asked.request_id, response.request_id)
    if response.status_code != _OK:
        raise ServiceRefusedError(
            service, FILTER_SUBSCRIBE_PROTOCOL, response.status_code, response.status_desc
        )


def pushed_message(frame: bytes, pubsub_topic_of: Callable[[str], str]) -> tuple[str, WakuMessage]:
    """The pubsub topic and message of a MessagePush frame; a push that names no pubsub
    topic is on ``pubsub_topic_of(content_topic)`` (autosharding)."""
    push = MessagePush.from_bytes(frame)
    message = push.waku_message
    if message is None:
        raise RemoteProtocolError("a MessagePush without a message")
    return push.pubsub_topic or pubsub_topic_of(message.content_topic), message
