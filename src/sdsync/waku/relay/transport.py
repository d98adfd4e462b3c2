"""RelayTransport: SDS bytes over a Waku node's relay, each publication a WakuMessage.

Theory of operation
-------------------
An SDS channel needs a :class:`~sdsync.waku.node.Transport`: bytes published and
subscribed to on a topic. A Waku relay node offers WakuMessages on pubsub topics
(``publish_message``, ``subscribe_envelopes``). :class:`RelayTransport` is the adapter
between the two, as :class:`~sdsync.transport.waku_light.WakuLightTransport` is for a
light client over its host: it holds no connection, thread or task of its own, and it
starts and closes the node it runs on. It needs of that node the relay half of the
contract only (:class:`RelayNode`), so any Waku node will do: a
:class:`~sdsync.transport.libp2p.Libp2pNode` (a
:class:`~sdsync.transport.libp2p.Libp2pTransport` is one with a RelayTransport over
itself), or an in-memory one.

The topic a channel names (``/sds/1/<channel>``) is mapped to a content topic by the
node's ``content_topic`` (by default ``/sds/1/<channel>/proto``), and that to the pubsub
topic ``/waku/2/rs/<cluster>/<shard>`` of the node's ``waku``
(:meth:`~sdsync.waku.relay.topics.WakuRelayConfig.route`: a static shard, or
autosharding).

Every publication is a WakuMessage (14/WAKU2-MESSAGE) whose payload is the SDS bytes,
with that content topic and a fresh timestamp in nanoseconds, strictly increasing, so
that two publications of the same bytes never share a hash. Its deterministic Waku
message hash on the pubsub topic is the retrieval hint; a resend — same SDS bytes, new
timestamp — is a new gossipsub message and is not swallowed by the seen cache.

A subscriber gets the messages of its content topic only, since other applications
share the shard: the channel's topic goes to the node's ``subscribe_envelopes`` as it
is, and the node leaves out the others where it receives them (a libp2p node on its
trio thread, before they cross to the event loop). Subscribing to a ``/waku/2/rs/...``
topic itself gets every message on it. The subscription is attached when
:meth:`RelayTransport.subscribe` returns, not at the first iteration, so nothing
published meanwhile is missed; it ends when the node closes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol

from sdsync.lifecycle import AsyncLifecycle
from sdsync.waku.node import Envelope, Received, Transport
from sdsync.waku.relay.topics import WakuRelayConfig
from sdsync.wire.waku import WakuMessage


class RelayNode(Protocol):
    """What a :class:`RelayTransport` runs on: the relay half of a
    :class:`~sdsync.waku.node.WakuNode`, and the node's topic mapping."""

    @property
    def waku(self) -> WakuRelayConfig:
        """The cluster, and how content topics map to its shards."""
        ...

    @property
    def content_topic(self) -> Callable[[str], str]:
        """A channel's topic → the content topic it is carried on."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None:
        """Stop the node; its subscriptions end."""
        ...

    async def publish_message(self, pubsub_topic: str, message: WakuMessage) -> bytes:
        """Relay ``message`` as it is on ``pubsub_topic``; its Waku message hash."""
        ...

    def subscribe_envelopes(self, topic: str) -> AsyncIterator[Envelope]:
        """Whole WakuMessages published on ``topic`` by other peers: a pubsub topic, or
        a channel's topic, routed by its content topic (those of that content topic)."""
        ...


class RelayTransport(AsyncLifecycle):
    """SDS bytes over ``node``'s relay (see the module); ``clock_ns`` stamps the
    publications (nanoseconds since the epoch)."""

    def __init__(self, node: RelayNode, *, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.node = node
        self._clock_ns = clock_ns
        self._last_timestamp = 0

    async def start(self) -> None:
        """Start the node."""
        await self.node.start()

    async def close(self) -> None:
        """Close the node; subscriptions end."""
        await self.node.close()

    async def publish(self, topic: str, data: bytes) -> bytes:
        """Publish ``data`` in a WakuMessage on ``topic``'s content topic; returns its
        Waku message hash. Returns as the node's ``publish_message`` does (a
        :class:`~sdsync.transport.libp2p.Libp2pNode`: once it is queued)."""
        node = self.node
        pubsub_topic, _ = node.waku.route(topic, node.content_topic)
        message = WakuMessage(
            payload=data, content_topic=node.content_topic(topic), timestamp=self._timestamp()
        )
        return await node.publish_message(pubsub_topic, message)

    def subscribe(self, topic: str) -> AsyncIterator[Received]:
        """SDS bytes published on ``topic`` by other peers, with their Waku hash as hint."""
        return _Payloads(self.node.subscribe_envelopes(topic))

    def _timestamp(self) -> int:
        self._last_timestamp = max(self._clock_ns(), self._last_timestamp + 1)
        return self._last_timestamp


class _Payloads(AsyncIterator[Received]):
    """The payloads of ``envelopes``, with their Waku hashes as hints.

    An iterator class rather than an async generator: a reader that gives up waiting
    (a timeout around ``anext``) cancels only that wait, where a generator would be
    closed for good by the cancellation thrown into it."""

    __slots__ = ("_envelopes",)

    def __init__(self, envelopes: AsyncIterator[Envelope]) -> None:
        self._envelopes = envelopes

    def __aiter__(self) -> _Payloads:
        return self

    async def __anext__(self) -> Received:
        envelope = await anext(self._envelopes)
        return Received(envelope.message.payload, envelope.message_hash)


if TYPE_CHECKING:  # mypy holds the adapter to the contract an SDS channel is typed with
    _CONTRACT: type[Transport] = RelayTransport
