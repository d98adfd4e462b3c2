"""The transport contract: publish bytes on a topic, receive bytes with a retrieval hint.

Also the values transports hand out: :class:`Received` to a channel, and :class:`Envelope`
(the whole WakuMessage) to a store node, from transports that carry Waku envelopes; and
how a Waku transport carries a channel's topic: on a content topic
(:func:`default_content_topic`) of a pubsub topic (:class:`WakuRelayConfig`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from sdsync.errors import LocalProtocolError
from sdsync.wire.waku import WakuMessage
from sdsync.wire.waku_protocols import (
    SHARD_TOPIC_PREFIX,
    TWN_CLUSTER_ID,
    TWN_SHARD_COUNT,
    parse_content_topic,
    shard_pubsub_topic,
)


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


@dataclass(frozen=True, slots=True)
class WakuRelayConfig:
    """Which Waku cluster a Waku node (:class:`~sdsync.transport.libp2p.Libp2pTransport`)
    relays on, and how content topics map to shards — all on ``shard`` (static sharding),
    or autosharded over ``shard_count`` shards when ``shard`` is None (The Waku Network:
    cluster 1, 8)."""

    cluster_id: int = TWN_CLUSTER_ID
    shard: int | None = None
    shard_count: int = TWN_SHARD_COUNT

    def __post_init__(self) -> None:
        if self.cluster_id < 0 or self.shard_count < 1:
            raise LocalProtocolError(f"no cluster {self.cluster_id} of {self.shard_count} shards")
        if self.shard is not None and self.shard < 0:
            raise LocalProtocolError(f"no shard {self.shard}")

    def pubsub_topic(self, content_topic: str) -> str:
        """The pubsub topic ``/waku/2/rs/<cluster>/<shard>`` that carries ``content_topic``."""
        if self.shard is not None:
            parse_content_topic(content_topic)  # well-formed all the same
            return shard_pubsub_topic(self.cluster_id, self.shard)
        return parse_content_topic(content_topic).pubsub_topic(self.cluster_id, self.shard_count)

    def route(
        self, topic: str, content_topic: Callable[[str], str] = default_content_topic
    ) -> tuple[str, str | None]:
        """The pubsub topic that carries a caller's ``topic``, and the content topic its
        subscribers want (None: every one, for a ``/waku/2/rs/...`` topic itself)."""
        if topic.startswith(SHARD_TOPIC_PREFIX):
            return topic, None
        content = content_topic(topic)
        return self.pubsub_topic(content), content
