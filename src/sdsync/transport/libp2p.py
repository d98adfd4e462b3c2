"""Libp2pNode: a Waku node over py-libp2p; Libp2pTransport: a relay node with its SDS transport.

Theory of operation
-------------------
A :class:`Libp2pNode` is a Waku node (docs/network.md): Waku Relay — gossipsub under
``/vac/waku/relay/2.0.0``, unsigned messages (StrictNoSign) identified by sha256 of their
bytes as js-waku does — ``/vac/waku/metadata/1.0.0`` answered with our cluster and
shards, and the request/response, conversation and push streams the Waku services run
on. Its relay carries whole WakuMessages (:meth:`Libp2pNode.publish_message`,
:meth:`Libp2pNode.subscribe_envelopes`) on the pubsub topics ``/waku/2/rs/<cluster>/<shard>``
of ``waku=`` (a static shard or autosharding; The Waku Network's cluster 1 by default).
A topic given to ``subscribe_envelopes`` or ``mesh_peers`` may also be a channel's
(``/sds/1/<channel>``), routed by its content topic (``content_topic``, by default
``/sds/1/<channel>/proto``): its subscriber gets the messages of that content topic only.

A :class:`Libp2pTransport` is a Libp2pNode with its SDS
:class:`~sdsync.waku.node.Transport` composed in: its ``publish`` and ``subscribe`` are
those of a :class:`~sdsync.waku.relay.transport.RelayTransport` over itself, which wraps SDS
bytes in WakuMessages and hands back their Waku message hashes as retrieval hints
(:mod:`sdsync.waku.relay.transport`). It keeps the whole
:class:`~sdsync.waku.node.WakuNode` contract: what a relay participant, a chat or a
store node runs on. A light client's host is a node alone.

py-libp2p runs on trio, our runtime on asyncio, so the node is split by the loop that
runs the code. This module is the asyncio face: its code runs on the caller's event loop
and never blocks on the other thread. The host, pubsub and router live in a dedicated
thread running ``trio.run`` (:mod:`sdsync.transport.libp2p_host`, with the py-libp2p
mends of :mod:`sdsync.transport.libp2p_patches`). All that both threads touch — the
settings, counters, subscriber tables, peers to redial, served protocols — is one
:class:`~sdsync.transport.libp2p_shared.HostState`, which the node makes and hands to
the host (that module says which thread writes what, under which lock); the settings
(:mod:`sdsync.transport.settings`) and counters are also this node's read-only
attributes. The two talk only through thread-safe hand-overs:

* asyncio → trio: ``TrioToken.run_sync_soon``. A publication goes into the relay outbox
  (:mod:`sdsync.transport.relay_outbox`), which the trio thread publishes from, in
  order; ``publish_message`` returns once it is queued, and waits only while the outbox
  is full. Other work (dialling, queries) runs as a trio task whose outcome settles an
  asyncio future (:meth:`Libp2pNode._call`);
* trio → asyncio: a :class:`~sdsync.transport.libp2p_shared.Handover`, whose calls the
  loop runs in order. Every frame that passes validation is put in the subscribers'
  unbounded asyncio queues, and each publication handed to pubsub makes room in the
  outbox. ``loop.call_soon_threadsafe`` per frame wrote to the loop's self-pipe each time
  (a syscall, and a wake-up, per frame: a seventh of the trio thread's time under load);
  the handover wakes the loop only when it had nothing waiting, and the loop then runs
  all that has come since.
  Outcomes of other work settle their futures through ``call_soon_threadsafe``.

Inbound frames are validated as a gossipsub topic validator, so a bad frame is neither
delivered nor relayed: it must be unsigned, and a WakuMessage no larger than
``max_message_bytes`` with a well-formed content topic (any application's: we relay them
all) that an archive would take: the store's rule
(:func:`~sdsync.wire.waku.check_relayable`), topics it can index, and a positive timestamp
at most ``timestamp_variance_s`` ahead of ``clock_ns()``. Each rejection is counted by its
:class:`~sdsync.errors.RejectReason` in :attr:`Libp2pNode.rejected` and logged. On a
topic given to :meth:`Libp2pNode.admit_before_relay`, a valid frame from another peer
then waits for an admission on the loop (a store node's commit) before it is delivered
or forwarded: whoever hears a message from a store node may acknowledge it.
``drop_rate`` then discards a seeded random share of the valid frames (after relaying:
only this node's application misses them), to exercise SDS under loss.

Request/response streams serve the Waku services (store query, LightPush, Filter):
:meth:`Libp2pNode.serve` answers a protocol with a handler on the asyncio loop and
:meth:`Libp2pNode.request` asks a peer (one frame out, one back); a peer that does not
speak the protocol is a :class:`~sdsync.errors.ProtocolNotSupportedError`. Pushes
(Filter's MessagePush) are unanswered frames: :meth:`Libp2pNode.push` writes them on one
long-lived stream per peer and protocol, its push lane (a stream per push would run into
js-waku's limit of 100 inbound streams; :mod:`sdsync.transport.push_lanes`), and
:meth:`Libp2pNode.serve_pushes` takes them, any number per stream. The bounds on a
peer's inbound streams are :mod:`sdsync.transport.libp2p_host`'s. Inbound connections
are bounded (:class:`~sdsync.transport.settings.ConnectionLimits`: per IP, handshakes
in progress, a handshake deadline), each freeing its slot when it ends; those closed
unserved are counted in :attr:`Libp2pNode.connections_refused`.

``announce_shards`` names shards in our metadata that we do not relay (a light
client's). ``relay=False`` makes a light client's host: no gossipsub at all (the relay
protocol is not offered, so a relay peer neither meshes with it nor queues it
publications), only metadata, request/response streams and push lanes; publishing,
subscribing or asking for the mesh is a LocalProtocolError there. Listen addresses may
be TCP or websocket (``/ip4/127.0.0.1/tcp/0/ws``), which is what a browser's js-waku
can dial.

``drain()`` leaves the network so that every peer sees a clean close, not a reset or a
hang: the host takes no new connection or stream (a stream opened now is reset) and
dials nobody, the exchanges in progress finish (bounded), what is queued for relay goes
out, then every connection gets the muxer's GoAway; the peer hangs up and our socket
closes after reading all it sent, with a FIN (a socket closed with bytes unread makes
the kernel send RST), or we close it once the peer has had its time
(:class:`~sdsync.transport.libp2p_patches.BoundedSwarm`). ``close()`` drains, cancels
the trio nursery, which tears down host, pubsub and router, and joins the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from sdsync.errors import LocalProtocolError, ProtocolNotSupportedError, RemoteProtocolError
from sdsync.lifecycle import AsyncLifecycle
from sdsync.transport.libp2p_host import Admit, RelayTrioHost, TrioHost, run_host
from sdsync.transport.libp2p_shared import Handover, HostState, LoopSide
from sdsync.transport.nodekey import NodeKey
from sdsync.transport.relay_outbox import OutboxBound
from sdsync.transport.settings import ConnectionLimits, GossipParams, HostSettings
from sdsync.waku.metadata.rpc import WakuMetadata
from sdsync.waku.node import (
    Conversation,
    Envelope,
    Handler,
    Opener,
    PushHandler,
    Received,
    WakuHost,
    WakuNode,
)
from sdsync.waku.ratelimit import DEFAULT_RELAY_RATE, DEFAULT_RELAY_RATE_PER_IP, RateLimit
from sdsync.waku.relay.topics import WakuRelayConfig, default_content_topic
from sdsync.waku.relay.transport import RelayNode, RelayTransport
from sdsync.waku.rpc import MAX_RPC_BYTES
from sdsync.wire.waku import DEFAULT_TIMESTAMP_VARIANCE_S, MAX_WAKU_MESSAGE_BYTES, WakuMessage

# The settings' types live in transport.settings (WakuRelayConfig in waku.relay.topics),
# importable without py-libp2p; users of the node may import them here too.
__all__ = [
    "DEFAULT_RELAY_RATE",
    "KEY_SIZE",
    "ConnectionLimits",
    "GossipParams",
    "Libp2pNode",
    "Libp2pTransport",
    "NodeKey",
    "WakuRelayConfig",
    "new_identity_key",
]

logger = logging.getLogger("sdsync.transport.libp2p")

T = TypeVar("T")
KEY_SIZE = 32
_CLOSE_TIMEOUT_S = 10.0
#: How long the exchanges in progress at a drain (a peer's request being answered) may
#: take to finish before the connections close under them.
_DRAIN_S = 5.0
_DRAIN_POLL_S = 0.02
#: How long a peer has to hang up after our GoAway before we close its connection,
#: and then how long that close may take.
_HANG_UP_S = 2.0
_STREAM_TIMEOUT_S = 10.0
_CONVERSATION_TIMEOUT_S = 120.0


def new_identity_key() -> bytes:
    """A fresh Ed25519 secret (32 bytes) for ``Libp2pNode(key=...)``."""
    return random.SystemRandom().randbytes(KEY_SIZE)


def _key_pair(key: bytes | NodeKey | None) -> KeyPair:
    """A node's identity: a service node's kept secp256k1 :class:`NodeKey`, or an Ed25519
    secret (a chat participant's, or a fresh one)."""
    if isinstance(key, NodeKey):
        return key.key_pair()
    if key is not None and len(key) != KEY_SIZE:
        raise LocalProtocolError(f"key must be {KEY_SIZE} bytes")
    return create_new_key_pair(key if key is not None else new_identity_key())


_THE_WAKU_NETWORK = WakuRelayConfig()


class _Shared(Generic[T]):
    """A read-only node attribute that is the field of the same name of its
    :class:`~sdsync.transport.libp2p_shared.HostState`'s ``settings`` or ``counters``:
    one copy, which the trio thread reads (settings) or writes (counters) there."""

    __slots__ = ("_name", "_part")

    def __init__(self, part: str) -> None:
        self._part = part
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, node: None, owner: type) -> _Shared[T]: ...

    @overload
    def __get__(self, node: Libp2pNode, owner: type) -> T: ...

    def __get__(self, node: Libp2pNode | None, owner: type) -> _Shared[T] | T:
        if node is None:
            return self
        return cast(T, getattr(getattr(node._shared, self._part), self._name))

    def __set__(self, node: Libp2pNode, value: T) -> None:
        raise AttributeError(f"{self._name} is the node's {self._part}: not to be set")


class Libp2pNode(AsyncLifecycle):
    """A Waku node over py-libp2p (see the module): relay (unless ``relay=False``) of
    whole WakuMessages, streams, push lanes, metadata; every part of the
    :class:`~sdsync.waku.node.WakuNode` contract but SDS publish and subscribe."""

    # The settings the constructor took, and what the trio thread counts
    # (:class:`~sdsync.transport.libp2p_shared.HostCounters` says what each counts).
    peer_id = _Shared[str]("settings")
    content_topic = _Shared[Callable[[str], str]]("settings")
    drop_rate = _Shared[float]("settings")
    max_message_bytes = _Shared[int]("settings")
    gossip = _Shared[GossipParams]("settings")
    waku = _Shared[WakuRelayConfig]("settings")
    announce_shards = _Shared[tuple[int, ...]]("settings")
    relay = _Shared[bool]("settings")
    limits = _Shared[ConnectionLimits]("settings")
    clock_ns = _Shared[Callable[[], int]]("settings")
    max_future_ns = _Shared[int]("settings")
    relay_rate = _Shared[RateLimit | None]("settings")
    relay_rate_per_ip = _Shared[RateLimit | None]("settings")
    connections_refused = _Shared[Counter[str]]("counters")
    rejected = _Shared[Counter[str]]("counters")
    stream_timeouts = _Shared[Counter[str]]("counters")
    stream_failures = _Shared[Counter[str]]("counters")
    streams_refused = _Shared[Counter[str]]("counters")
    push_streams = _Shared[Counter[str]]("counters")
    push_retries = _Shared[Counter[str]]("counters")
    pushes_resent = _Shared[Counter[str]]("counters")
    received = _Shared[int]("counters")
    randomly_dropped = _Shared[int]("counters")
    publish_failures = _Shared[int]("counters")
    relay_rate_limited = _Shared[int]("counters")
    mcache_evicted = _Shared[int]("counters")

    def __init__(
        self,
        *,
        listen: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",),
        peers: Sequence[str] = (),
        key: bytes | NodeKey | None = None,
        content_topic: Callable[[str], str] = default_content_topic,
        drop_rate: float = 0.0,
        seed: int | None = None,
        max_message_bytes: int = MAX_WAKU_MESSAGE_BYTES,
        gossip: GossipParams | None = None,
        waku: WakuRelayConfig = _THE_WAKU_NETWORK,
        announce_shards: Sequence[int] = (),
        relay: bool = True,
        limits: ConnectionLimits | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        timestamp_variance_s: float = DEFAULT_TIMESTAMP_VARIANCE_S,
        relay_rate: RateLimit | None = DEFAULT_RELAY_RATE,
        relay_rate_per_ip: RateLimit | None = DEFAULT_RELAY_RATE_PER_IP,
    ) -> None:
        if any(shard < 0 for shard in announce_shards):
            raise LocalProtocolError(f"no shard among {list(announce_shards)}")
        if not 0.0 <= drop_rate <= 1.0:
            raise LocalProtocolError("drop_rate must be a probability")
        key_pair = _key_pair(key)
        settings = HostSettings(
            key_pair=key_pair,
            peer_id=ID.from_pubkey(key_pair.public_key).to_base58(),
            listen=tuple(_multiaddr(a) for a in listen),
            content_topic=content_topic,
            waku=waku,
            gossip=gossip if gossip is not None else GossipParams(),
            relay=relay,
            announce_shards=tuple(sorted(set(announce_shards))),
            limits=limits if limits is not None else ConnectionLimits(),
            max_message_bytes=max_message_bytes,
            clock_ns=clock_ns,
            max_future_ns=int(timestamp_variance_s * 1e9),
            relay_rate=relay_rate,
            relay_rate_per_ip=relay_rate_per_ip,
            drop_rate=drop_rate,
            seed=seed,
        )
        self._shared = HostState(settings)
        self._shared.peers.update((info.peer_id, info) for info in map(_peer_info, peers))
        self.listen_addrs: list[str] = []
        self._thread: threading.Thread | None = None
        self._trio: TrioHost | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._outbox = OutboxBound()
        self._drained = False  # no connection, stream or dial from now on
        self._closed = False

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the host in its own thread; returns once it listens."""
        if self._thread is not None:
            raise LocalProtocolError("transport already started")
        _refuse_ports_in_use(self._shared.settings.listen)
        loop = asyncio.get_running_loop()
        self._shared.loop_side = LoopSide(loop, Handover(loop), self._outbox.sent)
        ready: concurrent.futures.Future[TrioHost] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=run_host,
            args=(self._shared, ready),
            name=f"libp2p-{self.peer_id[-8:]}",
            daemon=True,
        )
        self._thread.start()
        self._trio = await asyncio.wrap_future(ready)
        for topic in self._shared.subscriptions.topics():  # subscribed while the host started
            self._relaying("subscribe").join(topic)
        self.listen_addrs = self._trio.addrs()
        logger.info("libp2p host %s listening on %s", self.peer_id, ", ".join(self.listen_addrs))

    async def drain(self) -> None:
        """Leave the network cleanly: take no new connection or stream and dial nobody;
        let the exchanges in progress, the peers' and ours, finish (up to ``_DRAIN_S``)
        and what is queued for relay go out (briefly: :meth:`OutboxBound.drained`); then
        close every connection so that its peer sees a clean close, never a reset: the
        muxer's GoAway, the peer hangs up (up to ``_HANG_UP_S``, then we close), our
        socket closes once all it sent was read. From then on the node serves and asks
        nothing (LocalProtocolError) but still answers what needs no network. Done once;
        :meth:`close` does it first."""
        if self._drained or self._trio is None or self._closed:
            return
        trio_side = self._trio
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _DRAIN_S
        try:
            await self._call(lambda: trio_side.quiesce(_DRAIN_S))
            await self._outbox.drained()
            # Ours too: a Filter push of a message just accepted is on its way already.
            while self._pending and loop.time() < deadline:
                await asyncio.sleep(_DRAIN_POLL_S)
            await self._call(lambda: trio_side.hang_up(_HANG_UP_S))
        finally:
            self._drained = True

    async def close(self) -> None:
        """:meth:`drain`, stop the host and join its thread; subscriptions end."""
        if self._closed:
            return
        with contextlib.suppress(LocalProtocolError):  # its thread is gone: nobody to leave
            await self.drain()
        self._closed = True
        self._outbox.release()  # wakes publishers, who find the node closed
        self._shared.subscriptions.end()
        for future in self._pending:
            future.cancel()
        if self._trio is not None:
            self._trio.stop()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, _CLOSE_TIMEOUT_S)
            if self._thread.is_alive():
                logger.error("libp2p thread did not stop within %s s", _CLOSE_TIMEOUT_S)

    # -------------------------------------------------------------- publishing

    async def publish_message(self, pubsub_topic: str, message: WakuMessage) -> bytes:
        """Publish ``message`` as it is on ``pubsub_topic`` (a ``/waku/2/rs/...`` topic):
        a channel's SDS bytes (:class:`~sdsync.waku.relay.transport.RelayTransport`), or what a
        LightPush service relays for a light client. Returns its Waku message hash.

        Returns once the frame is queued for the trio thread, which publishes in order;
        it waits only while the relay outbox is full. A caller holding a lock across a
        publication (ReliableChannel does) is thus not held up by a slow peer.
        """
        self._refuse_unless_relaying("publish")
        frame = message.to_bytes()
        if len(frame) > self.max_message_bytes:
            raise LocalProtocolError(
                f"a {len(frame)}-byte frame exceeds max_message_bytes={self.max_message_bytes}"
            )
        await self._outbox.room(self._running)
        self._relaying("publish").relay(pubsub_topic, frame)
        self._outbox.handed_over()
        return message.hash(pubsub_topic)

    # -------------------------------------------------------------- receiving

    def subscribe_envelopes(self, topic: str) -> AsyncIterator[Envelope]:
        """Whole WakuMessages published by other peers on ``topic`` (for store nodes):
        every one of a pubsub topic, or those of a channel topic's content topic."""
        if self._closed:
            raise LocalProtocolError("transport is closed")
        self._refuse_unless_relaying("subscribe")
        queue, new_topic = self._shared.subscriptions.add(topic)
        if new_topic and self._trio is not None:
            self._relaying("subscribe").join(topic)
        return _QueueIterator(queue)

    async def admit_before_relay(self, topic: str, admit: Admit) -> None:
        """Have every valid message other peers relay on ``topic`` (what
        :meth:`subscribe_envelopes` would hand over: a pubsub topic's, or a channel's
        content topic's; the topic is joined if need be) admitted by ``admit(envelope)``
        on this loop before the host delivers it to subscribers or forwards it: what a
        store node needs, whose peers may acknowledge whatever it forwarded.

        ``admit`` returns whether to relay the message, or an awaitable of that; the
        host waits for it at most 10 s, then relays it anyway (counted in the log's
        summary). One that raises relays the message, one cancelled drops it. Meanwhile,
        copies of the message from other peers are dropped, as they are once it is seen.
        Returns once the host admits this way.
        """
        trio_side = self._relaying("admit relay messages")
        await self._call(lambda: trio_side.admit(topic, admit))

    # -------------------------------------------------------------- peers

    async def connect(self, address: str) -> None:
        """Dial a peer by multiaddr (with ``/p2p/<id>``) and keep redialling it."""
        info = _peer_info(address)
        trio_side = self._running()
        self._shared.peers[info.peer_id] = info
        await self._call(lambda: trio_side.dial(info))

    async def connected_peers(self) -> list[str]:
        trio_side = self._running()
        return await self._call(trio_side.connected_peers)

    async def peer_ip(self, peer: str) -> str | None:
        """The IP address the peer with id ``peer`` is connected from (what per-host limits
        count); None while it is not connected."""
        trio_side = self._running()
        return await self._call(lambda: trio_side.peer_ip(peer))

    async def mesh_peers(self, topic: str) -> list[str]:
        """The peers a publication on ``topic`` goes to now: our gossipsub mesh if we
        subscribed to it, else the known subscribers (gossipsub's fanout).

        While this is empty a publication reaches nobody (py-libp2p has no flood
        publishing); SDS repairs that, but a script may want to wait for peers first.
        """
        trio_side = self._relaying("mesh_peers")
        return await self._call(lambda: trio_side.mesh_peers(topic))

    async def wait_for_mesh(self, topic: str, count: int, timeout_s: float) -> bool:
        """Wait until the mesh for ``topic`` has ``count`` peers; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(await self.mesh_peers(topic)) < count:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    # -------------------------------------------------------------- request/response

    async def serve(
        self,
        protocol_id: str,
        handler: Handler,
        *,
        max_request_bytes: int = MAX_RPC_BYTES,
        timeout_s: float = _STREAM_TIMEOUT_S,
    ) -> None:
        """Answer ``protocol_id`` streams: each carries one request frame, which
        ``await handler(peer_id, request)`` answers on this loop with a frame (or with
        None: no answer); then the stream is closed.

        A request above ``max_request_bytes``, a truncated one, or an exchange not done
        within ``timeout_s`` (a peer that never sends or never reads) is refused: the
        stream is reset, and the refusal counted (:attr:`rejected` by reason,
        :attr:`stream_timeouts` by protocol) and logged in a summary at most once a
        minute per protocol and reason. An exception from ``handler`` resets the stream
        too (:attr:`stream_failures`). A peer holding too many streams of the protocol
        open has the extra ones reset (:attr:`streams_refused`).
        """
        if self._closed:
            raise LocalProtocolError("transport is closed")

        async def logged(peer: str, request: bytes) -> bytes | None:
            try:
                return await handler(peer, request)
            except Exception:
                logger.exception("%s handler failed on a request from %s", protocol_id, peer)
                raise

        self._shared.served[protocol_id] = (logged, max_request_bytes, timeout_s)
        trio_side = self._trio
        if trio_side is None:
            return  # the host serves it when it starts

        async def register() -> None:
            trio_side.serve(protocol_id, trio_side.on_loop(logged), max_request_bytes, timeout_s)

        await self._call(register)

    async def serve_pushes(
        self, protocol_id: str, handler: PushHandler, *, max_frame_bytes: int = MAX_RPC_BYTES
    ) -> None:
        """Take ``protocol_id`` push streams (the receiving end of :meth:`push`): each may
        carry many frames, and each frame goes to ``await handler(peer_id, frame)`` on this
        loop, in order; a stream stays open until its peer closes or resets it.

        A frame above ``max_frame_bytes`` or truncated, or a RemoteProtocolError from
        ``handler``, resets that stream only (counted in :attr:`rejected`); any other
        exception from ``handler`` is logged and the stream read on. A peer holding too
        many streams of the protocol open has the extra ones reset
        (:attr:`streams_refused`).
        """
        if self._closed:
            raise LocalProtocolError("transport is closed")

        async def logged(peer: str, frame: bytes) -> None:
            try:
                await handler(peer, frame)
            except RemoteProtocolError:
                raise
            except Exception:
                logger.exception("%s handler failed on a push from %s", protocol_id, peer)

        self._shared.push_served[protocol_id] = (logged, max_frame_bytes)
        trio_side = self._trio
        if trio_side is None:
            return  # the host takes them when it starts

        async def register() -> None:
            trio_side.serve_pushes(protocol_id, trio_side.on_loop(logged), max_frame_bytes)

        await self._call(register)

    async def serve_conversations(
        self,
        protocol_id: str,
        opener: Opener,
        *,
        max_frame_bytes: int = MAX_RPC_BYTES,
        timeout_s: float = _CONVERSATION_TIMEOUT_S,
    ) -> None:
        """Hold a conversation on each ``protocol_id`` stream a peer opens: ``await
        opener(peer_id)`` on this loop makes it (raising refuses the stream), then each
        frame goes to its ``receive`` and each reply back, until it is finished; then the
        stream is closed. Bounded as :meth:`serve` is: a frame above ``max_frame_bytes``
        or truncated, a RemoteProtocolError from the conversation, or an exchange not
        done within ``timeout_s`` resets the stream and is counted. Served on a running
        host, it is announced (identify push) to the connected peers that speak it too."""
        if self._closed:
            raise LocalProtocolError("transport is closed")

        async def logged(peer: str) -> Conversation:
            try:
                return await opener(peer)
            except Exception as exc:
                logger.info("%s: refused a stream from %s: %s", protocol_id, peer, exc)
                raise

        self._shared.conversed[protocol_id] = (logged, max_frame_bytes, timeout_s)
        trio_side = self._trio
        if trio_side is None:
            return  # the host serves it when it starts

        async def register() -> None:
            trio_side.serve_conversations(protocol_id, logged, max_frame_bytes, timeout_s)
            trio_side.announce(protocol_id)

        await self._call(register)

    async def converse(
        self,
        peer: str,
        protocol_id: str,
        first: bytes,
        conversation: Conversation,
        *,
        max_frame_bytes: int = MAX_RPC_BYTES,
        timeout_s: float = _CONVERSATION_TIMEOUT_S,
    ) -> None:
        """Open a ``protocol_id`` stream to ``peer`` (as :meth:`request` names it), write
        ``first``, then hand each frame that comes back to ``conversation.receive`` (on
        this loop) and write its replies, until it is finished. Raises as
        :meth:`request` does, and RemoteProtocolError if the peer ends the stream first
        or the conversation refuses a frame."""
        peer_id, info = _target(peer)
        trio_side = self._running()
        await self._stream_call(
            peer,
            protocol_id,
            lambda: _reached(
                trio_side,
                info,
                lambda: trio_side.converse(
                    peer_id, protocol_id, first, conversation, max_frame_bytes, timeout_s
                ),
            ),
        )

    async def peers_serving(self, *protocol_ids: str) -> list[str]:
        """The connected peers whose identify announced every one of ``protocol_ids``."""
        trio_side = self._running()
        return await self._call(lambda: trio_side.peers_serving(protocol_ids))

    async def request(
        self,
        peer: str,
        protocol_id: str,
        payload: bytes,
        *,
        max_response_bytes: int = MAX_RPC_BYTES,
        timeout_s: float = _STREAM_TIMEOUT_S,
    ) -> bytes:
        """Send ``payload`` as one frame to ``peer`` (a multiaddr with ``/p2p/<id>``,
        dialled first, or the id of a connected peer) on ``protocol_id``; returns the
        answer frame's body.

        Raises TimeoutError if the exchange takes longer than ``timeout_s``,
        RemoteProtocolError if the answer is above ``max_response_bytes``, truncated or
        missing, :class:`~sdsync.errors.ProtocolNotSupportedError` if the peer does not
        speak ``protocol_id``, and ConnectionError if it cannot be reached.
        """
        peer_id, info = _target(peer)
        trio_side = self._running()
        return await self._stream_call(
            peer,
            protocol_id,
            lambda: _reached(
                trio_side,
                info,
                lambda: trio_side.request(
                    peer_id, protocol_id, payload, max_response_bytes, timeout_s
                ),
            ),
        )

    async def push(
        self, peer: str, protocol_id: str, payload: bytes, *, timeout_s: float = _STREAM_TIMEOUT_S
    ) -> None:
        """Send ``payload`` as one frame to ``peer`` on ``protocol_id``, expecting no
        answer (Filter's MessagePush), on the push lane to that peer and protocol: one
        long-lived stream, reopened when the remote ends it, a push whose write fails
        written once more on a fresh stream; to a peer that reads one frame per stream
        (go-waku's Filter client), a stream per push (:mod:`~sdsync.transport.libp2p_host`).
        Returns once the frame is written. Raises as :meth:`request` does."""
        peer_id, info = _target(peer)
        trio_side = self._running()
        await self._stream_call(
            peer,
            protocol_id,
            lambda: _reached(
                trio_side, info, lambda: trio_side.push(peer_id, protocol_id, payload, timeout_s)
            ),
        )

    async def metadata(self) -> WakuMetadata:
        """What we answer on ``/vac/waku/metadata/1.0.0``: our cluster and the shards we
        relay."""
        trio_side = self._running()

        async def shards() -> tuple[int, ...]:
            return trio_side.shards()

        return WakuMetadata(cluster_id=self.waku.cluster_id, shards=await self._call(shards))

    async def _stream_call(
        self, peer: str, protocol_id: str, work: Callable[[], Awaitable[T]]
    ) -> T:
        try:
            return await self._call(work)
        except trio.TooSlowError:
            raise TimeoutError(f"{peer} did not complete {protocol_id} in time") from None
        except (
            RemoteProtocolError,
            LocalProtocolError,
            ProtocolNotSupportedError,
            _UnreachableError,
            asyncio.CancelledError,
        ):
            raise
        except Exception as exc:
            raise ConnectionError(f"{protocol_id} with {peer} failed: {exc!r}") from exc

    # -------------------------------------------------------------- thread plumbing

    def _running(self) -> TrioHost:
        if self._trio is None or self._closed or self._drained:
            raise LocalProtocolError("transport is not running (start() it, or it was closed)")
        return self._trio

    def _relaying(self, what: str) -> RelayTrioHost:
        """The running host, which relays (else our caller's misuse: ``what``)."""
        self._refuse_unless_relaying(what)
        trio_side = self._running()
        assert isinstance(trio_side, RelayTrioHost)
        return trio_side

    def _refuse_unless_relaying(self, what: str) -> None:
        if not self.relay:
            raise LocalProtocolError(
                f"cannot {what} on a host made with relay=False: it mounts no Waku Relay "
                "(a light client publishes by LightPush and hears by Filter)"
            )

    async def _call(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work()`` in the trio thread and await its outcome from asyncio."""
        assert self._shared.loop_side is not None
        loop = self._shared.loop_side.loop
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: T | None, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)  # type: ignore[arg-type]

        async def task() -> None:
            try:
                result = await work()
            except Exception as exc:
                loop.call_soon_threadsafe(settle, None, exc)
            else:
                loop.call_soon_threadsafe(settle, result, None)

        self._pending.add(future)
        try:
            self._running().spawn(task)
            return await future
        except asyncio.CancelledError:
            if self._closed:
                raise LocalProtocolError("transport closed") from None
            raise
        finally:
            self._pending.discard(future)


class _UnreachableError(ConnectionError):
    """The peer of a request or push could not be dialled."""


def _target(peer: str) -> tuple[ID, PeerInfo | None]:
    """The id of ``peer`` (a peer id, or a multiaddr with ``/p2p/<id>``), and the
    address to dial it at (None: a peer id, dialled already or never)."""
    if peer.startswith("/"):
        info = _peer_info(peer)
        return info.peer_id, info
    return _peer_id(peer), None


@functools.lru_cache(maxsize=1024)
def _peer_id(text: str) -> ID:
    # Parsed on every push to a subscriber (base58): its few ids are worth remembering.
    try:
        return ID.from_base58(text)
    except Exception as exc:
        raise LocalProtocolError(f"bad peer id {text!r}: {exc}") from None


async def _reached(
    trio_side: TrioHost, info: PeerInfo | None, work: Callable[[], Awaitable[T]]
) -> T:
    """``work()`` after dialling ``info`` (if any), in the one trio task: a request or
    push to a multiaddr costs one hand-over between the threads, not two."""
    if info is not None:
        try:
            await trio_side.dial(info)
        except Exception as exc:
            addrs = ", ".join(map(str, info.addrs))
            raise _UnreachableError(f"cannot reach {info.peer_id} at {addrs}: {exc!r}") from exc
    return await work()


def _refuse_ports_in_use(listen: Sequence[multiaddr.Multiaddr]) -> None:
    """py-libp2p listens with SO_REUSEPORT, so a second host on a busy port would silently
    share its connections with the first; a plain bind finds out first."""
    for address in listen:
        parts = str(address).split("/")
        if len(parts) < 5 or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp":
            continue
        host, port = parts[2], int(parts[4])
        if port == 0:
            continue
        family = socket.AF_INET if parts[1] == "ip4" else socket.AF_INET6
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                raise LocalProtocolError(f"cannot listen on {address}: {exc}") from None


def _multiaddr(address: str) -> multiaddr.Multiaddr:
    try:
        return multiaddr.Multiaddr(address)
    except Exception as exc:
        raise LocalProtocolError(f"bad multiaddr {address!r}: {exc}") from None


def _peer_info(address: str) -> PeerInfo:
    try:
        return info_from_p2p_addr(_multiaddr(address))
    except LocalProtocolError:
        raise
    except Exception as exc:
        raise LocalProtocolError(
            f"peer address {address!r} needs the form /ip4/HOST/tcp/PORT/p2p/PEER_ID ({exc})"
        ) from None


class _QueueIterator(AsyncIterator[T]):
    """Items from an asyncio queue until the ``None`` that close() puts in."""

    def __init__(self, queue: asyncio.Queue[T | None]) -> None:
        self._queue = queue

    def __aiter__(self) -> _QueueIterator[T]:
        return self

    async def __anext__(self) -> T:
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)  # stay ended for repeated calls
            raise StopAsyncIteration
        return item


class Libp2pTransport(Libp2pNode):
    """A relay node with its SDS transport: a :class:`Libp2pNode` whose ``publish`` and
    ``subscribe`` carry SDS bytes, those of a
    :class:`~sdsync.waku.relay.transport.RelayTransport` over itself (see the module)."""

    @functools.cached_property
    def _sds(self) -> RelayTransport:
        return RelayTransport(self)

    async def publish(self, topic: str, data: bytes) -> bytes:
        """Publish ``data`` in a WakuMessage on ``topic``; returns its Waku message hash
        (queued as :meth:`~Libp2pNode.publish_message` is)."""
        return await self._sds.publish(topic, data)

    def subscribe(self, topic: str) -> AsyncIterator[Received]:
        """SDS bytes published on ``topic`` by other peers, with their Waku hash as hint."""
        return self._sds.subscribe(topic)


if TYPE_CHECKING:  # mypy holds the nodes to the contracts the store and chat are typed with
    _RELAY_NODE: type[WakuNode] = Libp2pTransport
    _LIGHT_HOST: type[WakuHost] = Libp2pNode
    _RELAY: type[RelayNode] = Libp2pNode
