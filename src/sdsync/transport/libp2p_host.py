"""The trio half of a Libp2pNode: the py-libp2p host, and a relay host's pubsub and router.

Theory of operation
-------------------
Everything here runs on the node's own thread, inside ``trio.run`` (:func:`run_host`
is the thread's target), except the few :class:`TrioHost` methods marked as called from
the asyncio loop, which only hand work over. Neither loop ever blocks on the other:

* asyncio → trio: :meth:`RelayTrioHost.relay` puts a publication in the relay outbox
  and :meth:`TrioHost.spawn` starts any other work (joining a topic, dialling, a query),
  both through ``TrioToken.run_sync_soon``, which is thread-safe and does not wait;
  :meth:`TrioHost.stop` cancels the nursery the same way;
* trio → asyncio: each frame that passes validation goes to the subscribers' queues,
  and each publication handed to pubsub to the node's outbox count, through the
  :class:`~sdsync.transport.libp2p_shared.Handover` of the shared state's ``loop_side``
  (one wake-up of the loop per batch); the outcome of spawned work goes to the future
  awaiting it through ``loop.call_soon_threadsafe``.

A :class:`TrioHost` is the node's other half. It knows the node only by the
:class:`~sdsync.transport.libp2p_shared.HostState` the node made and handed it: it
reads the settings, the peers to redial, the served protocols and the subscriber tables
(under their lock) there, and writes the counters there (``rejected``, ``received``,
``randomly_dropped``, ``publish_failures``, …: written here, read by the node).
:class:`TrioHost` itself is a light client's host (``relay=False``): metadata,
request/response streams and push lanes, no gossipsub. :class:`RelayTrioHost` adds Waku
Relay: pubsub, router and the relay outbox, run alongside the host
(``_relay_services``). Two parts of a host have modules of their own, each with its
theory: its push lanes (:class:`~sdsync.transport.push_lanes.PushLanes`) and a relay
host's outbox (:class:`~sdsync.transport.relay_outbox.RelayOutbox`).

The router is Waku Relay: :class:`~sdsync.transport.libp2p_patches.WakuGossipSub` under
``/vac/waku/relay/2.0.0``, publications unsigned (no ``from`` or ``seqno``), message id
sha256(data) as js-waku's. Inbound frames are checked as a gossipsub topic validator
(unsigned, and the 14/WAKU2-MESSAGE checks), so a bad frame is neither delivered nor
relayed; so is a valid one over its forwarding peer's ``relay_rate`` (a token bucket of
bytes per peer that hands us frames, inside one per IP address, ``relay_rate_per_ip``,
which every identity seen from it shares; counted in ``relay_rate_limited``). Its message
cache is bounded in bytes (``GossipParams.message_cache_bytes``; evictions counted in
``mcache_evicted``) as well as in heartbeats, with adaptive gossip off so that the
heartbeat does not slow down while the mesh is thin.
``/vac/waku/metadata/1.0.0`` is answered with our cluster and shards.

A topic with an *admission* (:meth:`RelayTrioHost.admit`: a store node's archive) has an
async validator instead: after the same checks, a frame from another peer waits for its
admission's verdict, asked on the asyncio loop through the handover and answered through
the trio token, and pubsub delivers and forwards it only then. The wait is bounded by
``_ADMIT_S``, past which the frame is relayed anyway (a stuck archive must not stop the
relay; summarised in the log), so pubsub's own validation timeout is off: it would cache
a late frame as invalid for five minutes. Pubsub marks a message seen only once it is
validated, so copies of it from other peers arriving meanwhile would be validated,
delivered and forwarded again; they are dropped while it waits (``_admitting``, until
:meth:`RelayTrioHost._deliver` sees it marked). Up to ``_ADMITTING`` frames wait at once,
so that a store commits many in one transaction.

Request/response streams (:meth:`TrioHost.serve`, :meth:`TrioHost.request`) carry one
uvarint-length-prefixed frame each way (:func:`~sdsync.waku.rpc.read_frame`),
all within one deadline. A served request goes to its handler on the asyncio loop
(:meth:`TrioHost._on_loop`: the trio task awaits a trio event that the asyncio side sets
through the token, so neither loop blocks); the answer comes back as a frame, then the
stream is closed. Streams are opened, read, written and reset as
:mod:`sdsync.transport.libp2p_streams` does it for every stream of a host.

Inbound streams of a served protocol are bounded per peer (``_MAX_INBOUND_STREAMS``
open at once; more are reset and counted in ``streams_refused``). A push stream beyond
the bound waits up to ``_PUSH_ADMIT_S`` for a slot first (at most
``_MAX_WAITING_STREAMS`` of them per peer and protocol): nwaku's Filter service opens a
stream per push, a burst opens dozens at once, and a reset one makes it drop the
connection for good. A frame above the
limit, a truncated one, or a peer that never sends or never reads costs that stream only:
it is reset and counted (``rejected`` by reason, ``stream_timeouts`` by protocol), and
logged as a summary at most once a minute per protocol and reason
(:class:`_StreamTroubles`): a peer opening streams it never uses is not worth a warning
a stream. A push stream, the receiving end of a peer's push lane, may carry any number
of frames, and stays open, idle, between them: it has no deadline.

A host stops in two bounded steps before its nursery is cancelled (the node's drain):
:meth:`TrioHost.quiesce` takes no new connection or stream and dials nobody, and waits
for the served exchanges under way (a request received and not yet answered, a
conversation) to end; :meth:`TrioHost.hang_up` then closes every connection cleanly
(:meth:`~sdsync.transport.libp2p_patches.BoundedSwarm.hang_up`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import hashlib
import logging
import math
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

import trio
from libp2p import new_host
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.identity.identify_push.identify_push import push_identify_to_peers
from libp2p.network.config import ConnectionConfig
from libp2p.network.stream.exceptions import StreamError, StreamReset
from libp2p.network.swarm import Swarm
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.peer.peerstore import PeerStoreError
from libp2p.pubsub.pb import rpc_pb2
from libp2p.tools.anyio_service import background_trio_service

from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError
from sdsync.transport.libp2p_patches import (
    BoundedSwarm,
    DeliveringPubsub,
    WakuGossipSub,
    remote_ip,
)
from sdsync.transport.libp2p_shared import HostState, LoopSide
from sdsync.transport.libp2p_streams import frame_reader, open_stream, reset, write_frame
from sdsync.transport.push_lanes import PushLanes
from sdsync.transport.redial import Redial
from sdsync.transport.relay_outbox import RelayOutbox
from sdsync.waku.metadata.rpc import METADATA_PROTOCOL, WakuMetadata
from sdsync.waku.node import Conversation, Envelope, Handler, Opener
from sdsync.waku.ratelimit import PeerBuckets
from sdsync.waku.relay.topics import RELAY_PROTOCOL, SHARD_TOPIC_PREFIX, parse_content_topic
from sdsync.waku.rpc import encode_frame, read_frame
from sdsync.wire.waku import WakuMessage, check_relayable, decode_waku_message

logger = logging.getLogger("sdsync.transport.libp2p")

T = TypeVar("T")
_METADATA_TIMEOUT_S = 10.0
#: ``(peer_id, request) -> answer`` on the trio thread: a served protocol's responder
#: (a :data:`~sdsync.waku.node.Handler` is the asyncio loop's).
Responder = Callable[[str, bytes], Awaitable[bytes | None]]
#: ``(peer_id, frame) -> None`` on the trio thread: where the frames of served push
#: streams go (a :data:`~sdsync.waku.node.PushHandler` is the loop's).
Receiver = Callable[[str, bytes], Awaitable[object]]
#: ``envelope -> verdict`` on the asyncio loop, called before a relay message from a peer
#: is delivered or forwarded: whether to relay it, or an awaitable of that verdict.
Admit = Callable[[Envelope], Awaitable[bool] | bool]
#: Streams of one protocol one peer may hold open with us at once; more are reset. A
#: js-waku or go-waku peer holds one or two; our own push lanes one.
_MAX_INBOUND_STREAMS = 16
#: Push streams beyond the bound that may wait for a slot, per (protocol, peer), and how
#: long each may wait before it is reset.
_MAX_WAITING_STREAMS = 256
_PUSH_ADMIT_S = 10.0
#: How often a quiescing host looks whether its exchanges in progress are done.
_DRAIN_POLL_S = 0.02
#: Stream troubles are logged at most this often per (protocol, reason), as a summary.
_SUMMARY_S = 60.0
#: How long a relay message may wait for its admission (a store node's commit); past it,
#: it is delivered and relayed anyway (a stuck archive must not stop the relay).
_ADMIT_S = 10.0
#: Relay messages awaiting admission at once: their commits share transactions, so
#: py-libp2p's 10 concurrent validators would cap a transaction at 10 messages.
_ADMITTING = 1024
# How often the redial loop looks at the configured peers (each has its own retry time).
_REDIAL_TICK_S = 0.25


def run_host(state: HostState, ready: concurrent.futures.Future[TrioHost]) -> None:
    """The host thread: runs until the host is stopped; ``ready`` gets the host once it
    listens, or the error that kept it from starting."""
    try:
        host = RelayTrioHost(state) if state.settings.relay else TrioHost(state)
        trio.run(host.run, ready)
    except BaseException as exc:
        if not ready.done():
            ready.set_exception(exc)
        else:
            logger.exception("libp2p thread failed")


class TrioHost:
    """Everything that lives on the trio thread of a host that relays nothing (a light
    client's): the libp2p host, its request/response streams, push lanes and metadata.
    :class:`RelayTrioHost` adds Waku Relay."""

    def __init__(self, state: HostState) -> None:
        self.state = state
        self.settings = settings = state.settings
        self.counters = state.counters
        limits = settings.limits
        self.host: IHost = new_host(
            key_pair=settings.key_pair,
            listen_addrs=settings.listen,
            connection_config=ConnectionConfig(
                max_connections=limits.max_connections,
                inbound_upgrade_timeout=limits.handshake_timeout_s,
            ),
        )
        swarm = self.host.get_network()
        assert isinstance(swarm, Swarm)
        self.swarm = BoundedSwarm.adopt(swarm, limits, self.counters.connections_refused)
        self.stopping = False  # no new stream, connection or dial (quiesce)
        self._exchanges: set[INetStream] = set()  # served ones under way (_exchanging)
        self.token: trio.lowlevel.TrioToken | None = None
        self.nursery: trio.Nursery | None = None
        self.lanes = PushLanes(self.host, self.counters, self.start_soon)
        self._inbound: Counter[tuple[str, str]] = Counter()  # open streams by (protocol, peer)
        self._waiting: Counter[tuple[str, str]] = Counter()  # push streams waiting for a slot
        self._freed: dict[tuple[str, str], trio.Event] = {}  # set when a slot of the key frees
        self._troubles = _StreamTroubles(settings.peer_id[-8:], _SUMMARY_S)

    async def run(self, ready: concurrent.futures.Future[TrioHost]) -> None:
        self.token = trio.lowlevel.current_trio_token()
        async with self.host.run(self.settings.listen), trio.open_nursery() as nursery:
            self.nursery = nursery
            async with self._relay_services():
                for protocol, (handler, max_bytes, timeout_s) in self.state.served.items():
                    self.serve(protocol, self.on_loop(handler), max_bytes, timeout_s)
                for protocol, (push_handler, max_bytes) in self.state.push_served.items():
                    self.serve_pushes(protocol, self.on_loop(push_handler), max_bytes)
                for protocol, (opener, max_bytes, timeout_s) in self.state.conversed.items():
                    self.serve_conversations(protocol, opener, max_bytes, timeout_s)
                self.serve(METADATA_PROTOCOL, self._answer_metadata, 1024, _METADATA_TIMEOUT_S)
                nursery.start_soon(self._redial_forever)
                ready.set_result(self)
                await trio.sleep_forever()

    def _relay_services(self) -> contextlib.AbstractAsyncContextManager[None]:
        """What runs besides while the host listens (a relay host's pubsub): nothing."""
        return contextlib.nullcontext()

    # Called from the asyncio thread: only ever through the trio token.

    def spawn(self, task: Callable[[], Awaitable[None]]) -> None:
        assert self.token is not None and self.nursery is not None
        nursery = self.nursery
        try:
            self.token.run_sync_soon(lambda: nursery.start_soon(task))
        except trio.RunFinishedError:
            raise LocalProtocolError("transport closed") from None

    def stop(self) -> None:
        assert self.token is not None and self.nursery is not None
        nursery = self.nursery
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(nursery.cancel_scope.cancel)

    def addrs(self) -> list[str]:
        return [str(a) for a in self.host.get_addrs()]

    async def connected_peers(self) -> list[str]:
        return sorted(p.to_base58() for p in self.host.get_connected_peers())

    async def peers_serving(self, protocols: tuple[str, ...]) -> list[str]:
        """Connected peers whose identify announced every one of ``protocols``."""
        store = self.host.get_peerstore()
        serving = []
        for peer in self.host.get_connected_peers():
            try:
                announced = set(store.get_protocols(peer))
            except PeerStoreError:
                continue  # not identified yet
            if announced.issuperset(protocols):
                serving.append(peer.to_base58())
        return sorted(serving)

    def announce(self, protocol: str) -> None:
        """Tell the connected peers that speak ``protocol`` too (identify push) that we
        serve it now: a peer that picks whom to sync with by what they announce (nwaku's
        Waku Sync) would otherwise not know until it reconnects. Peers that do not speak
        it (a browser's light node) are left alone."""
        host = self.host

        async def push() -> None:
            peers = {ID.from_base58(p) for p in await self.peers_serving((protocol,))}
            if peers:
                with contextlib.suppress(Exception):
                    await push_identify_to_peers(host, peers)

        self.start_soon(push)

    async def peer_ip(self, peer: str) -> str | None:
        """The IP address ``peer`` is connected from; None while it is not connected."""
        return self._peer_ip(ID.from_base58(peer))

    def _peer_ip(self, peer: ID) -> str | None:
        for conn in self.host.get_network().get_connections(peer):
            if ip := remote_ip(conn.muxed_conn):
                return ip
        return None

    # Trio side proper.

    async def quiesce(self, drain_s: float) -> None:
        """Take no new connection or stream and dial nobody; return once the served
        exchanges under way are done (:meth:`_exchanging`), or after ``drain_s``."""
        self.stopping = True
        self.swarm.stop_accepting()
        with trio.move_on_after(drain_s):
            while any(not _given_up(stream) for stream in self._exchanges):
                await trio.sleep(_DRAIN_POLL_S)

    async def hang_up(self, wait_s: float) -> None:
        """Close every connection cleanly (:meth:`BoundedSwarm.hang_up`)."""
        self.lanes.hanging_up = True
        await self.swarm.hang_up(wait_s)

    def start_soon(self, task: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run ``task(*args)`` in the host's nursery, as long as the host runs."""
        assert self.nursery is not None
        self.nursery.start_soon(task, *args)

    def shards(self) -> tuple[int, ...]:
        """The shards our metadata names: those the node announces (a light client's),
        and a relay host's relayed ones."""
        return self.settings.announce_shards

    async def dial(self, info: PeerInfo) -> None:
        # py-libp2p refuses to dial a peer for 60 s once all its addresses failed; our
        # callers pace their dials themselves (transport/redial.py), and a node that
        # restarted must be found in seconds.
        network = self.host.get_network()
        if isinstance(network, Swarm):
            network.unblock_peer(info.peer_id)
        with trio.fail_after(self.settings.gossip.dial_timeout_s):
            await self.host.connect(info)

    # Request/response streams, and push lanes.

    def serve(self, protocol: str, responder: Responder, max_bytes: int, timeout_s: float) -> None:
        """Answer ``protocol``: one request frame in, ``responder``'s frame (if any) out."""

        async def handle(stream: INetStream) -> None:
            async with self._admitted(stream, protocol) as peer:
                if peer is not None:
                    await self._answer(stream, peer, protocol, responder, max_bytes, timeout_s)

        self.host.set_stream_handler(TProtocol(protocol), handle)

    def serve_pushes(self, protocol: str, receiver: Receiver, max_bytes: int) -> None:
        """Take ``protocol`` push streams: every frame of each goes to ``receiver`` in
        order, until the remote ends the stream."""

        async def handle(stream: INetStream) -> None:
            async with self._admitted(stream, protocol, wait_s=_PUSH_ADMIT_S) as peer:
                if peer is not None:
                    await self._take_pushes(stream, peer, protocol, receiver, max_bytes)

        self.host.set_stream_handler(TProtocol(protocol), handle)

    def serve_conversations(
        self, protocol: str, opener: Opener, max_bytes: int, timeout_s: float
    ) -> None:
        """Hold a conversation (``opener``'s, on the asyncio loop) on each ``protocol``
        stream: frames in, its replies out, the whole exchange within ``timeout_s``."""

        async def handle(stream: INetStream) -> None:
            async with self._admitted(stream, protocol) as peer:
                if peer is not None:
                    await self._hold(stream, peer, protocol, opener, max_bytes, timeout_s)

        self.host.set_stream_handler(TProtocol(protocol), handle)

    async def _hold(
        self,
        stream: INetStream,
        peer: str,
        protocol: str,
        opener: Opener,
        max_bytes: int,
        timeout_s: float,
    ) -> None:
        async with self._guarded(stream, peer, protocol, timeout_s):
            conversation = await self._on_loop(lambda: opener(peer))
            with self._exchanging(stream):
                await self._take_turns(stream, conversation, max_bytes)
                await stream.close()

    async def _take_turns(
        self, stream: INetStream, conversation: Conversation, max_bytes: int
    ) -> bool:
        """Frames of ``stream`` to ``conversation``, its replies back, until it is
        finished (True) or the peer ends the stream (False)."""
        read = frame_reader(stream)
        while (frame := await read_frame(read, max_bytes)) is not None:
            reply = await self._on_loop(functools.partial(conversation.receive, frame))
            if reply is not None:
                await write_frame(stream, reply)
            if conversation.finished:
                return True
        return conversation.finished

    async def converse(
        self,
        peer: ID,
        protocol: str,
        first: bytes,
        conversation: Conversation,
        max_bytes: int,
        timeout_s: float,
    ) -> None:
        with trio.fail_after(timeout_s):
            stream = await open_stream(self.host, peer, protocol)
            try:
                await write_frame(stream, first)
                finished = await self._take_turns(stream, conversation, max_bytes)
            except BaseException:
                await reset(stream)
                raise
            with contextlib.suppress(Exception):
                await stream.close()
        if not finished:
            raise RemoteProtocolError(
                f"{peer} closed its {protocol} stream before the exchange ended",
                reason=RejectReason.TRUNCATED_FRAME,
            )

    @contextlib.asynccontextmanager
    async def _admitted(
        self, stream: INetStream, protocol: str, *, wait_s: float = 0.0
    ) -> AsyncIterator[str | None]:
        """The remote peer's id, or None (and the stream reset) if it already has
        ``_MAX_INBOUND_STREAMS`` streams of ``protocol`` open with us and none frees
        within ``wait_s``."""
        peer = stream.muxed_conn.peer_id.to_base58()
        key = (protocol, peer)
        if self.stopping:  # begun now, it might not end before we hang up
            await reset(stream)
            yield None
            return
        if self._inbound[key] >= _MAX_INBOUND_STREAMS and not await self._slot(key, wait_s):
            self.counters.streams_refused[protocol] += 1
            self._troubles.note(protocol, "refused: too many open streams", peer, "")
            await reset(stream)
            yield None
            return
        self._inbound[key] += 1
        try:
            yield peer
        finally:
            self._inbound[key] -= 1
            if not self._inbound[key]:
                del self._inbound[key]
            freed = self._freed.pop(key, None)
            if freed is not None:
                freed.set()

    async def _slot(self, key: tuple[str, str], wait_s: float) -> bool:
        """Whether a slot of ``key`` frees within ``wait_s`` (no wait once
        ``_MAX_WAITING_STREAMS`` streams of ``key`` are waiting)."""
        if wait_s <= 0 or self._waiting[key] >= _MAX_WAITING_STREAMS:
            return False
        self._waiting[key] += 1
        try:
            with trio.move_on_after(wait_s):
                while self._inbound[key] >= _MAX_INBOUND_STREAMS:
                    await self._freed.setdefault(key, trio.Event()).wait()
                return True
            return False
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key]

    async def _answer(
        self,
        stream: INetStream,
        peer: str,
        protocol: str,
        responder: Responder,
        max_bytes: int,
        timeout_s: float,
    ) -> None:
        async with self._guarded(stream, peer, protocol, timeout_s):
            request = await read_frame(frame_reader(stream), max_bytes)
            # None: the peer closed the stream unused (js-waku does, for metadata).
            with self._exchanging(stream):
                answer = None if request is None else await responder(peer, request)
                if answer is not None:
                    await write_frame(stream, answer)
                await stream.close()

    @contextlib.asynccontextmanager
    async def _guarded(
        self, stream: INetStream, peer: str, protocol: str, timeout_s: float
    ) -> AsyncIterator[None]:
        """A served exchange on ``stream`` within ``timeout_s``: nothing escapes it. A
        refusal, the deadline or a break (the stream, or the handler: logged there) is
        counted and noted, and the stream reset."""
        try:
            with trio.fail_after(timeout_s):
                yield
            return
        except RemoteProtocolError as exc:
            self.counters.rejected[exc.reason] += 1
            self._troubles.note(protocol, f"refused: {exc.reason}", peer, str(exc))
        except trio.TooSlowError:
            self.counters.stream_timeouts[protocol] += 1
            reason = f"reset: the peer's request and our answer took over {timeout_s:g} s"
            self._troubles.note(protocol, reason, peer, "")
        except Exception as exc:
            if not (self.stopping and isinstance(exc, StreamError)):  # hung up on at a stop
                self.counters.stream_failures[protocol] += 1
                self._troubles.note(protocol, "failed", peer, repr(exc))
        await reset(stream)

    @contextlib.contextmanager
    def _exchanging(self, stream: INetStream) -> Iterator[None]:
        """A served exchange under way on ``stream``: its request came, its answer is
        not written yet (or a conversation not finished). A quiescing host lets it
        finish; a stream a peer opened and sent nothing on yet (js-waku opens them
        ahead) it does not wait for, nor one the peer reset (it gave up)."""
        self._exchanges.add(stream)
        try:
            yield
        finally:
            self._exchanges.discard(stream)

    async def _take_pushes(
        self, stream: INetStream, peer: str, protocol: str, receiver: Receiver, max_bytes: int
    ) -> None:
        """Frames of one push stream to ``receiver``, in order; no deadline, since a push
        lane stays open, idle, between pushes (it costs one of the peer's bounded slots)."""
        read = frame_reader(stream)
        try:
            while (frame := await read_frame(read, max_bytes)) is not None:
                await receiver(peer, frame)
        except StreamReset:
            return  # the sender gave the stream up: nothing to answer
        except RemoteProtocolError as exc:
            self.counters.rejected[exc.reason] += 1
            self._troubles.note(protocol, f"refused: {exc.reason}", peer, str(exc))
        except Exception as exc:
            self.counters.stream_failures[protocol] += 1
            self._troubles.note(protocol, "failed", peer, repr(exc))
        else:
            with contextlib.suppress(Exception):
                await stream.close()
            return
        await reset(stream)

    def on_loop(self, handler: Handler) -> Responder:
        """A responder that runs ``handler`` on the asyncio loop (see :meth:`_on_loop`)."""

        async def respond(peer: str, request: bytes) -> bytes | None:
            return await self._on_loop(lambda: handler(peer, request))

        return respond

    async def _on_loop(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work()`` on the asyncio loop; await its outcome without blocking either
        loop. Cancelled here (a deadline), it is cancelled there too."""
        loop = self._loop_side().loop
        assert self.token is not None
        token = self.token
        done = trio.Event()

        async def run() -> T:
            return await work()

        future = asyncio.run_coroutine_threadsafe(run(), loop)

        def settled(_: object) -> None:  # runs on the asyncio thread
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        future.add_done_callback(settled)
        try:
            await done.wait()
        except trio.Cancelled:
            future.cancel()
            raise
        return future.result()

    async def request(
        self, peer: ID, protocol: str, payload: bytes, max_response_bytes: int, timeout_s: float
    ) -> bytes:
        with trio.fail_after(timeout_s):
            stream = await open_stream(self.host, peer, protocol)
            try:
                await stream.write(encode_frame(payload))
                answer = await read_frame(frame_reader(stream), max_response_bytes)
            except BaseException:
                await reset(stream)  # a half-done exchange never lingers on the peer
                raise
            with contextlib.suppress(Exception):
                await stream.close()
        if answer is None:
            raise RemoteProtocolError(
                f"{peer} closed its {protocol} stream without answering",
                reason=RejectReason.TRUNCATED_FRAME,
            )
        return answer

    async def push(self, peer: ID, protocol: str, payload: bytes, timeout_s: float) -> None:
        """Write ``payload`` as one frame on the push lane to ``(peer, protocol)``
        (:mod:`sdsync.transport.push_lanes`)."""
        await self.lanes.push(peer, protocol, payload, timeout_s)

    async def _answer_metadata(self, peer: str, request: bytes) -> bytes:
        """``/vac/waku/metadata/1.0.0``: the peer's cluster and shards in, ours out."""
        theirs = WakuMetadata.from_bytes(request)
        waku = self.settings.waku
        if theirs.cluster_id not in (None, waku.cluster_id):
            logger.info(
                "peer %s is on cluster %s, we are on %s", peer, theirs.cluster_id, waku.cluster_id
            )
        return WakuMetadata(cluster_id=waku.cluster_id, shards=self.shards()).to_bytes()

    async def _redial_forever(self) -> None:
        gossip = self.settings.gossip
        redial = Redial(gossip.redial_interval_s, gossip.redial_max_s)
        while not self.stopping:
            connected = set(self.host.get_connected_peers())
            for peer_id, info in list(self.state.peers.items()):
                peer = str(peer_id)
                if peer_id in connected:
                    _say(redial.connected(peer, trio.current_time()))
                elif redial.due(peer, trio.current_time()):
                    try:
                        await self.dial(info)
                    except (Exception, trio.TooSlowError) as exc:
                        _say(redial.failed(peer, trio.current_time(), exc))
                    else:
                        _say(redial.connected(peer, trio.current_time()))
            await trio.sleep(min(_REDIAL_TICK_S, gossip.redial_interval_s))

    def _loop_side(self) -> LoopSide:
        """The way back to the asyncio loop (set before the host thread started)."""
        loop_side = self.state.loop_side
        assert loop_side is not None
        return loop_side


def _given_up(stream: INetStream) -> bool:
    """Whether the peer reset ``stream`` (yamux notes it as the frame comes in)."""
    muxed = getattr(stream, "muxed_stream", None)  # a NetStream's; not in INetStream
    return bool(getattr(muxed, "reset_received", False))


def _say(line: str | None) -> None:
    if line is not None:
        logger.warning("%s", line)


class RelayTrioHost(TrioHost):
    """A host that relays too: Waku Relay's gossipsub router and pubsub, the outbox the
    asyncio side publishes through (:class:`~sdsync.transport.relay_outbox.RelayOutbox`),
    and the validation and delivery of inbound frames."""

    def __init__(self, state: HostState) -> None:
        super().__init__(state)
        gossip = self.settings.gossip
        self.router = WakuGossipSub(
            protocols=[TProtocol(RELAY_PROTOCOL)],
            relay_protocols=(RELAY_PROTOCOL,),
            degree=gossip.degree,
            degree_low=gossip.degree_low,
            degree_high=gossip.degree_high,
            heartbeat_interval=gossip.heartbeat_interval_s,
            # Its per-peer limit (10 msg/s) would silently drop a fast sender's frames
            # and our own publications; SDS rate control belongs to the application.
            spam_protection_enabled=False,
            # Adaptive gossip slows the heartbeat to 30-60 s while the mesh is thin, and
            # the message cache holds 5 heartbeats: memory would follow mesh health.
            adaptive_gossip_enabled=False,
            # Heartbeats bound the cache in time, this in bytes, however many flood it.
            message_cache_bytes=gossip.message_cache_bytes,
            on_cache_evict=self._cache_evicted,
        )
        self.pubsub = DeliveringPubsub(
            self.host,
            self.router,
            deliver=self._deliver,
            # Waku relay publishes unsigned; authenticity is the application's concern.
            strict_signing=False,
            msg_id_constructor=_relay_message_id,
            # Oversized frames must reach the validator to be counted, within reason.
            max_inbound_rpc_size=max(1 << 20, 2 * self.settings.max_message_bytes),
            max_concurrent_validator_count=_ADMITTING,
            # Ours is the bound (_ADMIT_S): pubsub's would count the wait for a validator
            # slot too, and a message past it is cached as invalid for five minutes.
            validation_timeout=math.inf,
        )
        self._joined: set[str] = set()
        # By pubsub topic: each admission's content topic (None: all) and admit.
        self._admits: dict[str, list[tuple[str | None, Admit]]] = {}
        # Ids of messages in admission, until pubsub marks them seen (see _validate_admitted).
        self._admitting: set[bytes] = set()
        self._late = 0  # relayed past _ADMIT_S since the last report
        self._late_reported = -math.inf
        self._rng = random.Random(self.settings.seed)  # drop_rate's
        settings = self.settings
        self._relay_rates = PeerBuckets.of(settings.relay_rate, settings.relay_rate_per_ip)
        self.outbox = RelayOutbox(state, self.host, self.pubsub, self.router, self.start_soon)

    async def run(self, ready: concurrent.futures.Future[TrioHost]) -> None:
        try:
            await super().run(ready)
        finally:
            # Pubsub's seen-cache sweeps in a thread of its own that py-libp2p never stops.
            self.pubsub.seen_messages.stop()

    @contextlib.asynccontextmanager
    async def _relay_services(self) -> AsyncIterator[None]:
        async with background_trio_service(self.pubsub), background_trio_service(self.router):
            await self.pubsub.wait_until_ready()
            for topic in self.state.subscriptions.topics():
                await self._join(topic)
            self.start_soon(self.outbox.run)
            yield

    # Called from the asyncio thread: only ever through the trio token.

    def join(self, topic: str) -> None:
        self.spawn(lambda: self._join(topic))

    async def admit(self, topic: str, admit: Admit) -> None:
        """Have the messages of ``topic`` (routed as a subscription's) admitted by
        ``admit`` before they are delivered or forwarded, joining it if need be."""
        pubsub_topic, content_topic = self.settings.route(topic)
        self._admits.setdefault(pubsub_topic, []).append((content_topic, admit))
        if pubsub_topic in self._joined:
            self._set_validator(pubsub_topic)
        else:
            await self._join(pubsub_topic)

    def relay(self, pubsub_topic: str, frame: bytes) -> None:
        """Queue ``frame`` in the relay outbox, to be published on ``pubsub_topic``."""
        assert self.token is not None
        try:
            self.token.run_sync_soon(self.outbox.put, pubsub_topic, frame)
        except trio.RunFinishedError:
            raise LocalProtocolError("transport closed") from None

    async def mesh_peers(self, topic: str) -> list[str]:
        topic = self.settings.route(topic)[0]
        if topic in self.router.mesh:
            peers = self.router.mesh[topic]
        else:
            peers = self.pubsub.peer_topics.get(topic, set())
        return sorted(p.to_base58() for p in peers)

    # Trio side proper.

    def shards(self) -> tuple[int, ...]:
        prefix = f"{SHARD_TOPIC_PREFIX}{self.settings.waku.cluster_id}/"
        relayed = {
            int(t[len(prefix) :])
            for t in self._joined
            if t.startswith(prefix) and t[len(prefix) :].isdigit()
        }
        return tuple(sorted(relayed | set(super().shards())))

    async def _join(self, topic: str) -> None:
        pubsub_topic = self.settings.route(topic)[0]
        if pubsub_topic in self._joined:
            return
        self._joined.add(pubsub_topic)
        self._set_validator(pubsub_topic)
        await self.pubsub.subscribe(pubsub_topic)

    def _set_validator(self, pubsub_topic: str) -> None:
        if pubsub_topic in self._admits:
            self.pubsub.set_topic_validator(
                pubsub_topic, self._validate_admitted, is_async_validator=True
            )
        else:
            self.pubsub.set_topic_validator(pubsub_topic, self._validate, is_async_validator=False)

    def _validate(self, forwarder: ID, msg: rpc_pb2.Message) -> bool:
        """Topic validator: is this a frame we would deliver and relay? Unsigned, and a
        valid 14/WAKU2-MESSAGE on any well-formed content topic (other applications share
        the shard; we relay theirs)."""
        return self._valid(forwarder, msg) is not None

    def _valid(self, forwarder: ID, msg: rpc_pb2.Message) -> WakuMessage | None:
        """The message of a frame :meth:`_validate` passes; None (counted) otherwise."""
        try:
            settings = self.settings
            message = _check_relay_message(
                msg, settings.max_message_bytes, settings.clock_ns(), settings.max_future_ns
            )
        except RemoteProtocolError as exc:
            topic = msg.topicIDs[0] if msg.topicIDs else ""
            self.counters.rejected[exc.reason] += 1
            logger.warning("%s: dropped a frame on %s: %s", self.settings.peer_id[-8:], topic, exc)
            return None
        return message if self._within_rate(forwarder, len(msg.data)) else None

    async def _validate_admitted(self, forwarder: ID, msg: rpc_pb2.Message) -> bool:
        """Topic validator of a topic with an admission: :meth:`_validate`, then a frame
        from another peer waits for its admission (a store node's commit), since pubsub
        delivers and forwards it as soon as this returns True."""
        msg_id = _relay_message_id(msg)
        if msg_id in self._admitting or self.pubsub.seen_messages.has(msg_id):
            # Its twin from another peer is in admission, or was admitted while this one
            # waited for a validator slot: pubsub marks a message seen only after
            # validation, and would deliver and forward both.
            return False
        message = self._valid(forwarder, msg)
        if message is None:
            return False
        if forwarder == self.host.get_id():
            return True  # our own publication: its publisher saw to it
        self._admitting.add(msg_id)
        try:
            for topic in msg.topicIDs:
                for content_topic, admit in self._admits.get(topic, ()):
                    if content_topic not in (None, message.content_topic):
                        continue
                    envelope = Envelope(topic, message, message.hash(topic))
                    if not await self._verdict(admit, envelope):
                        self._admitting.discard(msg_id)
                        return False
        except BaseException:
            self._admitting.discard(msg_id)
            raise
        return True  # _deliver forgets msg_id, once pubsub has marked the message seen

    async def _verdict(self, admit: Admit, envelope: Envelope) -> bool:
        """``admit``'s verdict on ``envelope``, from the asyncio loop (neither loop
        waits on the other); True if it takes longer than ``_ADMIT_S``."""
        assert self.token is not None
        token = self.token
        verdict: list[bool] = []
        done = trio.Event()

        def settle(relay: bool) -> None:  # on the trio thread
            verdict.append(relay)
            done.set()

        def answer(relay: bool) -> None:  # on the asyncio thread
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(settle, relay)

        self._loop_side().handover.post(_admit_on_loop, admit, envelope, answer)
        with trio.move_on_after(_ADMIT_S):
            await done.wait()
            return verdict[0]
        self._admitted_late()
        return True

    def _admitted_late(self) -> None:
        self._late += 1
        now = time.monotonic()
        if now - self._late_reported >= _SUMMARY_S:
            logger.warning(
                "%s: %d relay messages relayed unadmitted since the last report: their "
                "admission took over %g s",
                self.settings.peer_id[-8:],
                self._late,
                _ADMIT_S,
            )
            self._late, self._late_reported = 0, now

    def _within_rate(self, forwarder: ID, size: int) -> bool:
        """Is a valid frame of ``size`` bytes within its forwarder's relay rate? Our own
        publications are not charged; one over it is dropped and counted."""
        rates = self._relay_rates
        if rates is None or forwarder == self.host.get_id():
            return True
        address = self._peer_ip(forwarder) if rates.per_address is not None else None
        if rates.take(forwarder.to_base58(), time.monotonic(), size, address=address):
            return True
        self.counters.relay_rate_limited += 1
        return False

    def _cache_evicted(self, count: int) -> None:
        self.counters.mcache_evicted += count

    def _deliver(self, msg: rpc_pb2.Message, own: bool) -> None:
        """A validated publication: hand it to the asyncio subscribers of its pubsub
        topic (and content topic, where they asked for one)."""
        if self._admitting:  # pubsub has marked it seen: it drops a twin itself now
            self._admitting.discard(_relay_message_id(msg))
        if own:
            return
        counters, drop_rate = self.counters, self.settings.drop_rate
        counters.received += 1
        if drop_rate and self._rng.random() < drop_rate:
            counters.randomly_dropped += 1
            return
        handover = self._loop_side().handover
        message = decode_waku_message(msg.data, max_bytes=self.settings.max_message_bytes)
        for pubsub_topic in msg.topicIDs:
            envelope = Envelope(pubsub_topic, message, message.hash(pubsub_topic))
            for queue in self._subscribers(pubsub_topic, message):
                handover.post(queue.put_nowait, envelope)

    def _subscribers(
        self, pubsub_topic: str, message: WakuMessage
    ) -> list[asyncio.Queue[Envelope | None]]:
        """The queues of the subscriptions ``message`` belongs to."""
        route = self.settings.route

        def wanted(topic: str) -> bool:
            routed, content_topic = route(topic)
            return routed == pubsub_topic and content_topic in (None, message.content_topic)

        return self.state.subscriptions.matching(wanted)


def _check_relay_message(
    msg: rpc_pb2.Message, max_bytes: int, now_ns: int, max_future_ns: int
) -> WakuMessage:
    """The WakuMessage of ``msg``; raises RemoteProtocolError unless ``msg`` is an
    unsigned relay message holding a WakuMessage of at most ``max_bytes`` with a
    well-formed content topic that an archive would take
    (:func:`~sdsync.wire.waku.check_relayable`: the same rule as the store's)."""
    if msg.from_id or msg.seqno or msg.signature or msg.key:
        raise RemoteProtocolError(
            "a Waku relay message must carry no from, seqno, signature or key (StrictNoSign)",
            reason=RejectReason.SIGNED_RELAY_MESSAGE,
        )
    message = decode_waku_message(msg.data, max_bytes=max_bytes)
    for pubsub_topic in msg.topicIDs:
        check_relayable(message, pubsub_topic, now_ns, max_future_ns)
    parse_content_topic(message.content_topic, remote=True)
    return message


def _admit_on_loop(admit: Admit, envelope: Envelope, answer: Callable[[bool], None]) -> None:
    """On the asyncio loop: ``admit(envelope)``, its verdict to ``answer`` when it comes.
    An admission that fails relays the message: it is a store's bookkeeping, not a
    judgement of the message, which the validator passed."""
    try:
        verdict = admit(envelope)
    except Exception:
        logger.exception("admitting a relay message failed; relaying it")
        answer(True)
        return
    if isinstance(verdict, bool):
        answer(verdict)
        return

    def done(future: asyncio.Future[bool]) -> None:
        if future.cancelled():
            answer(False)  # its admitter is going away
        elif (error := future.exception()) is not None:
            logger.error("admitting a relay message failed; relaying it", exc_info=error)
            answer(True)
        else:
            answer(future.result())

    asyncio.ensure_future(verdict).add_done_callback(done)


def _relay_message_id(msg: rpc_pb2.Message) -> bytes:
    """js-waku's gossipsub message id: sha256 of the WakuMessage bytes."""
    return hashlib.sha256(msg.data).digest()


class _StreamTroubles:
    """Inbound stream troubles (refusals, deadlines, breaks) logged as a summary: the
    first of each (protocol, reason) at once, then at most once per ``every_s`` with the
    count since — a peer that opens streams and never uses them is not worth a warning
    a stream."""

    def __init__(self, who: str, every_s: float, clock: Callable[[], float] = time.monotonic):
        self.who = who
        self.every_s = every_s
        self._clock = clock
        self._counts: Counter[tuple[str, str]] = Counter()
        self._logged: dict[tuple[str, str], float] = {}

    def note(self, protocol: str, reason: str, peer: str, detail: str) -> None:
        key = (protocol, reason)
        self._counts[key] += 1
        now = self._clock()
        last = self._logged.get(key)
        if last is not None and now - last < self.every_s:
            return
        self._logged[key] = now
        count = self._counts.pop(key)
        logger.warning(
            "%s: inbound %s streams %s: %d since the last report (the latest from %s%s)",
            self.who,
            protocol,
            reason,
            count,
            peer,
            f": {detail}" if detail else "",
        )
