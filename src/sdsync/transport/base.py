"""The transport contract: publish bytes on a topic, receive bytes with a retrieval hint.

Also the values transports hand out: :class:`Received` to a channel, and :class:`Envelope`
(the whole WakuMessage) to a store node, from transports that carry Waku envelopes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from sdsync.wire.waku import WakuMessage


@dataclass(frozen=True, slots=True)
class Received:
    """Bytes from the network and the hint that lets anyone fetch them again later
    (for Waku: the deterministic message hash)."""

    data: bytes
    retrieval_hint: bytes | None


@dataclass(frozen=True, slots=True)
class Envelope:
    """A whole publication as a store node archives it."""

    pubsub_topic: str
    message: WakuMessage
    message_hash: bytes


class Transport(Protocol):
    async def publish(self, topic: str, data: bytes) -> bytes | None:
        """Broadcast ``data``; returns its retrieval hint if the transport has one."""
        ...

    def subscribe(self, topic: str) -> AsyncIterator[Received]:
        """Everything published on ``topic`` by others, until the transport closes."""
        ...

    async def close(self) -> None: ...


def default_content_topic(pubsub_topic: str) -> str:
    """``/sds/1/<channel>`` → ``/sds/1/<channel>/proto`` (app, version, name, encoding): the
    content topic a Waku transport carries a channel's topic on."""
    return pubsub_topic.rstrip("/") + "/proto"
