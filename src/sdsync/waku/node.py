"""The Waku node contract: what the store and the chat ask of a Waku node, declared once.

Theory of operation
-------------------
A Waku node is a libp2p host that relays WakuMessages on pubsub topics and speaks the
Waku request/response protocols (store query, LightPush, Filter) on protocol ids. What
its users need of it comes in parts, each a :class:`typing.Protocol` that the node
satisfies structurally (no base class to inherit), the smaller ones inside the larger:

* :class:`Transport` — what an SDS channel needs: bytes published on a topic, bytes
  received with a retrieval hint (:class:`Received`); kept over any node's relay by
  :class:`~sdsync.waku.relay.transport.RelayTransport`, over LightPush and Filter by a
  light client;
* :class:`WakuRequester` — one request frame to a peer, its answer back: what a store
  client asks a store peer through (:meth:`sdsync.store.WakuStoreClient.over`);
* :class:`WakuClient` — the :class:`~sdsync.waku.node.Transport` contract
  (publish/subscribe SDS bytes), a requester, and its connected and mesh peers: what a
  chat runs on, be it a relay node or a light client
  (:class:`~sdsync.transport.waku_light.WakuLightTransport`, whose "mesh" is the
  services holding its Filter subscription);
* :class:`WakuHost` — the streams side of a host, relaying or not: it serves protocol
  ids, takes and sends pushes, knows its connections and where each comes from; what
  a light client runs on (a :class:`~sdsync.transport.libp2p.Libp2pNode` made with
  ``relay=False``);
* :class:`WakuCounters` — what the host counts of its peers' misbehaviour, which a
  store node exports on ``/metrics``;
* :class:`WakuNode` — all of them and relay envelopes in and out: what a store node
  archives from, serves store query, LightPush and Filter on, and exports.

:class:`~sdsync.transport.libp2p.Libp2pNode` is a WakuNode over py-libp2p (and
:class:`~sdsync.transport.libp2p.Libp2pTransport` one with its relay's Transport);
:class:`~sdsync.testing.memory_waku.MemoryWakuNode` is one in memory, for tests.

What every implementation promises:

* *Peers* are named by their peer id, or by a multiaddr ending in ``/p2p/<id>``, which
  is dialled first; a request or push to a peer id we hold no connection to, or to an
  address that cannot be reached, raises ``ConnectionError``.
* *Requests* carry one uvarint-length-prefixed frame each way
  (:func:`~sdsync.waku.rpc.encode_frame`). :meth:`WakuRequester.request`
  raises ``TimeoutError`` past ``timeout_s``,
  :class:`~sdsync.errors.RemoteProtocolError` for an answer above
  ``max_response_bytes``, truncated or missing (a handler that answered None),
  :class:`~sdsync.errors.ProtocolNotSupportedError` if the peer does not serve the
  protocol id, and ``ConnectionError`` if the exchange broke (the server reset it: a
  request over its bound, its deadline passed, its handler failed).
* *Serving*: :meth:`WakuHost.serve` runs ``handler(peer_id, request)`` on the caller's
  asyncio loop for each request frame; the host refuses a request above
  ``max_request_bytes`` or truncated (counted in ``rejected`` by reason) and one not
  answered within ``timeout_s`` (``stream_timeouts`` by protocol id), and a handler's
  exception resets the exchange (``stream_failures``). Conversations
  (:meth:`WakuHost.converse`, :meth:`WakuHost.serve_conversations`) take turns on one
  stream under the same bounds, a frame each way per turn, until one side's
  :class:`Conversation` is finished. Pushes
  (:meth:`WakuHost.push`, Filter's MessagePush) are unanswered frames that reach the
  receiver's :meth:`WakuHost.serve_pushes` handler in the order sent to it.
* *Closed*, or not started, a node raises :class:`~sdsync.errors.LocalProtocolError`
  (our caller's misuse), as a relay-less host does when asked to relay.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
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


Handler = Callable[[str, bytes], Awaitable[bytes | None]]
"""``(peer_id, request) -> answer`` on the asyncio loop: a served protocol's handler
(None: no answer)."""
PushHandler = Callable[[str, bytes], Awaitable[None]]
"""``(peer_id, frame) -> None`` on the asyncio loop: where served push frames go."""


class Conversation(Protocol):
    """One side of a turn-taking exchange of frames on one stream (Waku Sync's
    reconciliation): each frame received gets at most one reply, until it is finished."""

    @property
    def finished(self) -> bool:
        """The exchange is over: the host closes the stream after the last reply."""
        ...

    async def receive(self, frame: bytes) -> bytes | None:
        """The reply to the peer's ``frame`` (None: none); raising
        :class:`~sdsync.errors.RemoteProtocolError` ends the exchange with a reset."""
        ...


Opener = Callable[[str], Awaitable[Conversation]]
"""``(peer_id) -> conversation`` on the asyncio loop: what a served conversation stream
holds; raising refuses the stream (it is reset)."""


class WakuRequester(Protocol):
    """The asking side of a Waku node."""

    async def request(
        self,
        peer: str,
        protocol_id: str,
        payload: bytes,
        *,
        max_response_bytes: int = ...,
        timeout_s: float = ...,
    ) -> bytes:
        """Send ``payload`` as one frame to ``peer`` on ``protocol_id``; the answer frame's
        body (errors: see the module)."""
        ...


class WakuClient(Transport, WakuRequester, Protocol):
    """What a chat runs on: a relay node or a light client."""

    async def connected_peers(self) -> list[str]:
        """The ids of the peers we hold a connection to."""
        ...

    async def mesh_peers(self, topic: str) -> list[str]:
        """The peers a publication on ``topic`` goes to now (for a light client, the
        services holding its subscription)."""
        ...


class WakuHost(WakuRequester, Protocol):
    """The streams side of a Waku node, relaying or not: what a light client runs on."""

    @property
    def peer_id(self) -> str: ...

    @property
    def listen_addrs(self) -> list[str]:
        """Where peers reach us: multiaddrs ending in ``/p2p/<peer_id>``."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def serve(
        self,
        protocol_id: str,
        handler: Handler,
        *,
        max_request_bytes: int = ...,
        timeout_s: float = ...,
    ) -> None:
        """Answer each request frame of ``protocol_id`` with ``handler``."""
        ...

    async def serve_pushes(
        self, protocol_id: str, handler: PushHandler, *, max_frame_bytes: int = ...
    ) -> None:
        """Hand each frame pushed to us on ``protocol_id`` to ``handler``, in order."""
        ...

    async def push(
        self, peer: str, protocol_id: str, payload: bytes, *, timeout_s: float = ...
    ) -> None:
        """Send ``payload`` as one unanswered frame; raises as
        :meth:`WakuRequester.request` does."""
        ...

    async def serve_conversations(
        self,
        protocol_id: str,
        opener: Opener,
        *,
        max_frame_bytes: int = ...,
        timeout_s: float = ...,
    ) -> None:
        """Hold a conversation (``await opener(peer_id)``) on each ``protocol_id`` stream a
        peer opens: its frames in, the conversation's replies out, the whole exchange
        within ``timeout_s``."""
        ...

    async def converse(
        self,
        peer: str,
        protocol_id: str,
        first: bytes,
        conversation: Conversation,
        *,
        max_frame_bytes: int = ...,
        timeout_s: float = ...,
    ) -> None:
        """Open a ``protocol_id`` stream to ``peer``, write ``first``, then hand every
        frame that comes back to ``conversation`` and write its replies, until it is
        finished; raises as :meth:`WakuRequester.request` does, and
        :class:`~sdsync.errors.RemoteProtocolError` if the peer ends the stream first."""
        ...

    async def peers_serving(self, *protocol_ids: str) -> list[str]:
        """The connected peers that announced (identify) every one of ``protocol_ids``."""
        ...

    async def connected_peers(self) -> list[str]: ...

    async def peer_ip(self, peer: str) -> str | None:
        """The IP address ``peer`` is connected from (what per-host limits count); None
        if it is not connected."""
        ...


class WakuCounters(Protocol):
    """What a Waku node counts of its peers, by reason or by protocol id (their meaning:
    :data:`sdsync.store.metrics.LIBP2P_COUNTERS` and ``LIBP2P_TOTALS``)."""

    @property
    def rejected(self) -> Mapping[str, int]: ...
    @property
    def connections_refused(self) -> Mapping[str, int]: ...
    @property
    def stream_timeouts(self) -> Mapping[str, int]: ...
    @property
    def stream_failures(self) -> Mapping[str, int]: ...
    @property
    def streams_refused(self) -> Mapping[str, int]: ...
    @property
    def push_streams(self) -> Mapping[str, int]: ...
    @property
    def push_retries(self) -> Mapping[str, int]: ...
    @property
    def pushes_resent(self) -> Mapping[str, int]: ...
    @property
    def relay_rate_limited(self) -> int: ...
    @property
    def mcache_evicted(self) -> int: ...


class WakuNode(WakuClient, WakuHost, WakuCounters, Protocol):
    """A Waku relay node: what a store node runs on."""

    def subscribe_envelopes(self, topic: str) -> AsyncIterator[Envelope]:
        """Whole WakuMessages published on ``topic`` by other peers: a pubsub topic, or
        a channel's topic, routed by its content topic (those of that content topic)."""
        ...

    async def publish_message(self, pubsub_topic: str, message: WakuMessage) -> bytes:
        """Relay ``message`` as it is on ``pubsub_topic``; its Waku message hash."""
        ...
