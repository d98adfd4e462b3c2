"""19/WAKU2-LIGHTPUSH, the service side: is a pushed message one to relay, and the answer.

Theory of operation
-------------------
A light node publishes through a service node: it opens ``/vac/waku/lightpush/3.0.0``
(or ``/vac/waku/lightpush/2.0.0-beta1``), writes one request — a WakuMessage and the
pubsub topic to publish it on — and reads one response with a status code.  Nothing
here touches a socket: the transport hands the request's bytes to
:func:`answer_lightpush` (:func:`answer_lightpush_v2`) and sends back the bytes they
return.  Between the two, :func:`check_push` judges the request and
:class:`PushService.accept` does what the node does with an accepted message (relay,
archive, Filter: :mod:`sdsync.store.light_clients`).

:func:`check_push` applies 14/WAKU2-MESSAGE and the node's own limits, the status codes
as js-waku's ``LightPushStatusCode`` and nwaku name them:

* 400 — no message, or bytes that are no request (``malformed_rpc``) or no WakuMessage;
* 413 — a WakuMessage above :data:`~sdsync.wire.waku.MAX_WAKU_MESSAGE_BYTES`;
* 420 — no timestamp, a timestamp not positive or more than the node's variance (20 s)
  ahead of its clock, a malformed content topic or one no backend can store;
* 421 — a pubsub topic the node does not relay (an absent one is the content topic's
  autoshard, :meth:`ServedTopics.pubsub_topic`);
* 429 — the pushing peer is over its rate, or its address is (:meth:`PushService.admit`:
  a token bucket per peer, nwaku's ``--rate-limit lightpush:5/1s``, inside one per IP
  address that every identity seen from it shares), judged once the request parsed (so
  its ``request_id`` is echoed) and before anything is relayed or archived.

An accepted message answers 200 with ``relay_peer_count``, the relay peers it went to,
as long as it reached somebody: a relay peer, the archive, or a Filter subscriber (a
service node with no relay peers still serves the light nodes around it — nwaku would
answer 505 there).  A message that is not ephemeral is answered only once the archive
has committed it, and 503 if the archive failed, even when relay peers took it: a store
node's 200 says the message is kept.  505 if an ephemeral message found nobody.  js-waku
counts a push as sent on 200 only.

Each answer is counted by the service's ``answered(status)``, each refusal by its
``refuse(route, reason)`` under a fixed word (``no_message``, ``oversized``,
``no_timestamp``, ``unsupported_topic``...).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple, Protocol, TypeVar

from sdsync.errors import RejectReason, RemoteProtocolError
from sdsync.waku.lightpush.rpc import (
    LightPushRequestV3,
    LightPushResponseV3,
    PushResponse,
    PushRpc,
)
from sdsync.waku.messages import InvalidMessageError, check_timestamp
from sdsync.waku.relay.topics import TWN_CLUSTER_ID, TWN_SHARD_COUNT, parse_content_topic
from sdsync.waku.rpc import Refused, refusal_reason
from sdsync.wire.waku import WakuMessage, topic_problem

logger = logging.getLogger("sdsync.waku.lightpush.service")


class LightPushStatus(IntEnum):
    """LightPush status codes (js-waku's ``LightPushStatusCode``, nwaku's)."""

    OK = 200
    BAD_REQUEST = 400
    PAYLOAD_TOO_LARGE = 413
    INVALID_MESSAGE = 420
    UNSUPPORTED_TOPIC = 421
    TOO_MANY_REQUESTS = 429
    SERVICE_UNAVAILABLE = 503
    NO_PEERS = 505


class LightPushRefused(Refused[LightPushStatus]):
    """A push answered with ``status`` (not 200)."""


@dataclass(frozen=True, slots=True)
class ServedTopics:
    """What a service node relays: (pubsub topic, content topic) pairs, a content topic
    of None meaning every one on that pubsub topic; and its cluster's autosharding."""

    topics: tuple[tuple[str, str | None], ...] = ()
    cluster_id: int = TWN_CLUSTER_ID
    shard_count: int = TWN_SHARD_COUNT

    def serves(self, pubsub_topic: str, content_topic: str) -> bool:
        return any(p == pubsub_topic and c in (None, content_topic) for p, c in self.topics)

    def pubsub_topic(self, content_topic: str) -> str:
        """The autoshard of a peer's ``content_topic`` (RemoteProtocolError if malformed)."""
        parsed = parse_content_topic(content_topic, remote=True)
        return parsed.pubsub_topic(self.cluster_id, self.shard_count)


@dataclass(frozen=True, slots=True)
class Push:
    """An accepted push: ``message`` to publish on ``pubsub_topic``."""

    pubsub_topic: str
    message: WakuMessage


class PushService(Protocol):
    """What answering a push needs of the node."""

    @property
    def served(self) -> ServedTopics: ...

    def now_ns(self) -> int: ...

    @property
    def max_future_ns(self) -> int: ...

    def refuse(self, route: str, reason: str) -> None: ...

    def answered(self, status: LightPushStatus) -> None: ...

    async def admit(self, peer: str) -> str | None:
        """May ``peer`` push now (within its rate and its address's)?  None if so, else
        the reason to count."""
        ...

    async def accept(self, push: Push) -> int:
        """Relay, archive and offer to Filter; the relay peers it went to, or
        :class:`LightPushRefused` (503, 505) if it reached nobody."""
        ...


def check_push(
    pubsub_topic: str | None,
    message: WakuMessage | None,
    served: ServedTopics,
    now_ns: int,
    max_future_ns: int,
) -> Push:
    """The push a request asks for, or :class:`LightPushRefused` (see the module)."""
    if message is None:
        raise LightPushRefused(LightPushStatus.BAD_REQUEST, "no_message", "no message to push")
    if message.timestamp is None:
        raise LightPushRefused(
            LightPushStatus.INVALID_MESSAGE, "no_timestamp", "a message needs a timestamp"
        )
    try:
        parse_content_topic(message.content_topic, remote=True)
        topic = pubsub_topic or served.pubsub_topic(message.content_topic)
        problem = topic_problem(message.content_topic)
        if problem is not None:
            raise InvalidMessageError("bad_topic", f"the content topic {problem}")
        check_timestamp(message.timestamp, now_ns, max_future_ns)
    except RemoteProtocolError as exc:
        raise LightPushRefused(
            LightPushStatus.INVALID_MESSAGE, refusal_reason(exc), str(exc)
        ) from None
    if not served.serves(topic, message.content_topic):
        raise LightPushRefused(
            LightPushStatus.UNSUPPORTED_TOPIC,
            "unsupported_topic",
            f"this node does not relay {message.content_topic[:100]} on {topic[:100]}",
        )
    return Push(topic, message)


def _decode_refused(exc: RemoteProtocolError) -> LightPushRefused:
    """Bytes that are no request, or hold no acceptable WakuMessage."""
    if exc.reason is RejectReason.OVERSIZED:
        return LightPushRefused(LightPushStatus.PAYLOAD_TOO_LARGE, "oversized", str(exc))
    return LightPushRefused(LightPushStatus.BAD_REQUEST, refusal_reason(exc), str(exc))


# A pushed RPC's pubsub topic (None: the autoshard) and message.
_Content = tuple[str | None, WakuMessage | None]
_R = TypeVar("_R", LightPushRequestV3, PushRpc)


class _Outcome(NamedTuple):
    request_id: str
    status: LightPushStatus
    description: str
    relay_peer_count: int | None


async def _push(
    service: PushService,
    route: str,
    peer: str,
    request: bytes,
    rpc: type[_R],
    content: Callable[[_R], _Content],
) -> _Outcome:
    """The outcome of one push from ``peer``: the ``rpc`` bytes ``request`` and what
    they carry."""
    request_id = ""  # what is answered to bytes with none
    try:
        try:
            parsed = rpc.from_bytes(request)
            request_id = parsed.request_id
            pubsub_topic, message = content(parsed)
        except RemoteProtocolError as exc:
            raise _decode_refused(exc) from None
        over = await service.admit(peer)
        if over is not None:
            raise LightPushRefused(
                LightPushStatus.TOO_MANY_REQUESTS, over, "too many pushes: slow down"
            )
        push = check_push(
            pubsub_topic, message, service.served, service.now_ns(), service.max_future_ns
        )
        peers = await service.accept(push)
    except LightPushRefused as exc:
        service.refuse(route, exc.reason)
        service.answered(exc.status)
        log = logger.warning if exc.status == LightPushStatus.BAD_REQUEST else logger.info
        log("%s push refused: %s", route, exc)
        return _Outcome(request_id, exc.status, exc.description, None)
    service.answered(LightPushStatus.OK)
    return _Outcome(request_id, LightPushStatus.OK, "OK", peers)


async def answer_lightpush(service: PushService, route: str, request: bytes, *, peer: str) -> bytes:
    """The LightPushResponseV3 bytes that answer the LightPushRequestV3 bytes ``request``
    from ``peer``."""
    outcome = await _push(
        service, route, peer, request, LightPushRequestV3, lambda v3: (v3.pubsub_topic, v3.message)
    )
    return LightPushResponseV3(
        request_id=outcome.request_id,
        status_code=int(outcome.status),
        status_desc=outcome.description,
        relay_peer_count=outcome.relay_peer_count,
    ).to_bytes()


def _v2_content(rpc: PushRpc) -> _Content:
    if rpc.request is None:
        raise RemoteProtocolError("a PushRpc without a request", reason=RejectReason.MALFORMED_RPC)
    return rpc.request.pubsub_topic or None, rpc.request.message


async def answer_lightpush_v2(
    service: PushService, route: str, request: bytes, *, peer: str
) -> bytes:
    """The PushRpc bytes that answer the PushRpc (2.0.0-beta1) bytes ``request`` from
    ``peer``."""
    outcome = await _push(service, route, peer, request, PushRpc, _v2_content)
    ok = outcome.status == LightPushStatus.OK
    response = PushResponse(
        is_success=ok,
        info=None if ok else outcome.description,
        status_code=int(outcome.status),
        status_desc=outcome.description,
        relay_peer_count=outcome.relay_peer_count,
    )
    return PushRpc(request_id=outcome.request_id, response=response).to_bytes()
