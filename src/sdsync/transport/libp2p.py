"""Libp2pTransport: SDS over py-libp2p gossipsub, each frame a WakuMessage.

Theory of operation
-------------------
One pubsub topic per channel (the topic ReliableChannel passes in). Every publication is a
WakuMessage (14/WAKU2-MESSAGE) whose payload is the SDS bytes, with the transport's content
topic and a fresh timestamp in nanoseconds; its deterministic Waku message hash is the
retrieval hint, and also the gossipsub message id (as in Waku relay), so a resend — same
SDS bytes, new timestamp — is a new gossipsub message and is not swallowed by the seen
cache.

py-libp2p runs on trio, our runtime on asyncio. The host, pubsub and router live in a
dedicated thread running ``trio.run``; the asyncio side never blocks on it:

* asyncio → trio: publications go through an outbox — ``TrioToken.run_sync_soon``
  (thread-safe, non-blocking) puts the frame in a trio channel that one task publishes
  from, in order, waiting for room in py-libp2p's per-peer queues (which drop when full)
  — but not for a peer that stopped taking frames, whose connection is closed at length;
  other work (dialling, queries) runs as a task whose outcome comes back through an
  asyncio future settled with ``loop.call_soon_threadsafe``;
* trio → asyncio: every frame that passes validation is handed to unbounded asyncio
  queues with ``loop.call_soon_threadsafe``. Frames are taken straight from pubsub's
  delivery hook rather than its 32-slot subscription channel, which drops on overflow.

Inbound frames are validated as a gossipsub topic validator, so a bad frame is neither
delivered nor relayed: it must be a WakuMessage no larger than ``max_message_bytes``
carrying the expected content topic. Each rejection is counted by reason in
:attr:`Libp2pTransport.rejected` and logged. ``drop_rate`` then discards a seeded random
share of the valid frames (after relaying: only this node's application misses them), to
exercise SDS under loss.

``close()`` lets the outbox drain (briefly), cancels the trio nursery, which tears down
host, pubsub and router, and joins the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import math
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence, Sized
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import multiaddr
import trio
from google.protobuf.message import DecodeError
from libp2p import new_host
from libp2p.abc import IHost, INetStream
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import RpcQueue
from libp2p.tools.anyio_service import background_trio_service

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.transport.base import Received
from sdsync.wire.waku import MAX_WAKU_MESSAGE_BYTES, WakuMessage, decode_waku_message

logger = logging.getLogger("sdsync.transport.libp2p")

T = TypeVar("T")
KEY_SIZE = 32
_CLOSE_TIMEOUT_S = 10.0
PEER_QUEUE_RPCS = 256
_QUEUE_HIGH_WATER = PEER_QUEUE_RPCS * 3 // 4  # leaves room for relays and control
_STALL_S = 5.0
# A queue stuck this long is a wedged connection rather than a slow peer.
_WEDGED_S = 20.0
_POLL_S = 0.005
_OUTBOX_LIMIT = 256
_FLUSH_S = 2.0


@dataclass(frozen=True, slots=True)
class Envelope:
    """A whole publication as a store node archives it."""

    pubsub_topic: str
    message: WakuMessage
    message_hash: bytes


@dataclass(frozen=True, slots=True)
class GossipParams:
    """Gossipsub knobs; defaults suit a small group on one machine or a LAN."""

    degree: int = 6
    degree_low: int = 4
    degree_high: int = 12
    heartbeat_interval_s: int = 1
    # Redial configured peers that are not connected this often (they may start later,
    # or restart).
    redial_interval_s: float = 1.0
    dial_timeout_s: float = 5.0


def new_identity_key() -> bytes:
    """A fresh Ed25519 secret (32 bytes) for ``Libp2pTransport(key=...)``."""
    return random.SystemRandom().randbytes(KEY_SIZE)


def default_content_topic(pubsub_topic: str) -> str:
    """``/sds/1/<channel>`` → ``/sds/1/<channel>/proto`` (app, version, name, encoding)."""
    return pubsub_topic.rstrip("/") + "/proto"


class Libp2pTransport:
    """A :class:`~sdsync.transport.Transport` over gossipsub; also a source of envelopes."""

    def __init__(
        self,
        *,
        listen: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",),
        peers: Sequence[str] = (),
        key: bytes | None = None,
        content_topic: Callable[[str], str] = default_content_topic,
        drop_rate: float = 0.0,
        seed: int | None = None,
        max_message_bytes: int = MAX_WAKU_MESSAGE_BYTES,
        gossip: GossipParams | None = None,
    ) -> None:
        if not 0.0 <= drop_rate <= 1.0:
            raise LocalProtocolError("drop_rate must be a probability")
        if key is not None and len(key) != KEY_SIZE:
            raise LocalProtocolError(f"key must be {KEY_SIZE} bytes")
        self._listen = [_multiaddr(a) for a in listen]
        self._peers = {info.peer_id: info for info in map(_peer_info, peers)}
        self._key_pair = create_new_key_pair(key if key is not None else new_identity_key())
        self.peer_id = ID.from_pubkey(self._key_pair.public_key).to_base58()
        self.content_topic = content_topic
        self.drop_rate = drop_rate
        self.max_message_bytes = max_message_bytes
        self.gossip = gossip if gossip is not None else GossipParams()
        self._rng = random.Random(seed)
        # Written on the trio thread; plain counters, read for reporting.
        self.rejected: Counter[str] = Counter()
        self.received = 0
        self.randomly_dropped = 0
        self.listen_addrs: list[str] = []
        # Subscriber queues, registered on the asyncio thread, read on the trio thread.
        self._lock = threading.Lock()
        self._frames: dict[str, list[asyncio.Queue[Received | None]]] = {}
        self._envelopes: dict[str, list[asyncio.Queue[Envelope | None]]] = {}
        self._last_timestamp = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._trio: _TrioSide | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._outbox = 0  # frames queued for the trio thread, not yet given to pubsub
        self._outbox_room = asyncio.Event()
        self.publish_failures = 0
        self._closed = False

    # -------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Libp2pTransport:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the host in its own thread; returns once it listens."""
        if self._thread is not None:
            raise LocalProtocolError("transport already started")
        _refuse_ports_in_use(self._listen)
        self._loop = asyncio.get_running_loop()
        ready: concurrent.futures.Future[_TrioSide] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run_trio, args=(ready,), name=f"libp2p-{self.peer_id[-8:]}", daemon=True
        )
        self._thread.start()
        self._trio = await asyncio.wrap_future(ready)
        for topic in self._topics():  # subscribed while the host was starting
            self._trio.join(topic)
        self.listen_addrs = self._trio.addrs()
        logger.info("libp2p host %s listening on %s", self.peer_id, ", ".join(self.listen_addrs))

    async def close(self) -> None:
        """Publish what is queued (for up to ``_FLUSH_S``), stop the host and join its
        thread; subscriptions end."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _FLUSH_S
        while self._outbox and self._trio is not None and loop.time() < deadline:
            await asyncio.sleep(_POLL_S)
        self._closed = True
        self._outbox_room.set()  # wakes publishers, who find the transport closed
        with self._lock:
            for frames in self._frames.values():
                for frame_queue in frames:
                    frame_queue.put_nowait(None)
            for envelopes in self._envelopes.values():
                for envelope_queue in envelopes:
                    envelope_queue.put_nowait(None)
        for future in self._pending:
            future.cancel()
        if self._trio is not None:
            self._trio.stop()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, _CLOSE_TIMEOUT_S)
            if self._thread.is_alive():
                logger.error("libp2p thread did not stop within %s s", _CLOSE_TIMEOUT_S)

    # -------------------------------------------------------------- publishing

    async def publish(self, topic: str, data: bytes) -> bytes:
        """Publish ``data`` in a WakuMessage on ``topic``; returns its Waku message hash.

        Returns once the frame is queued for the trio thread, which publishes in order;
        it waits only while ``_OUTBOX_LIMIT`` frames are queued. A caller holding a lock
        across ``publish`` (ReliableChannel does) is thus not held up by a slow peer.
        """
        message = WakuMessage(
            payload=data, content_topic=self.content_topic(topic), timestamp=self._timestamp()
        )
        frame = message.to_bytes()
        if len(frame) > self.max_message_bytes:
            raise LocalProtocolError(
                f"a {len(frame)}-byte frame exceeds max_message_bytes={self.max_message_bytes}"
            )
        while self._outbox >= _OUTBOX_LIMIT:
            self._running()
            self._outbox_room.clear()
            await self._outbox_room.wait()
        self._running().send(topic, frame)
        self._outbox += 1
        return message.hash(topic)

    def _sent(self) -> None:
        """The trio thread handed one more publication to pubsub (runs on the loop)."""
        self._outbox -= 1
        if self._outbox < _OUTBOX_LIMIT:
            self._outbox_room.set()

    def _timestamp(self) -> int:
        # Strictly increasing, so two publications of the same bytes never share a hash.
        self._last_timestamp = max(time.time_ns(), self._last_timestamp + 1)
        return self._last_timestamp

    # -------------------------------------------------------------- receiving

    def subscribe(self, topic: str) -> AsyncIterator[Received]:
        """SDS bytes published on ``topic`` by other peers, with their Waku hash as hint."""
        return _QueueIterator(self._register(self._frames, topic))

    def subscribe_envelopes(self, topic: str) -> AsyncIterator[Envelope]:
        """Whole WakuMessages published on ``topic`` by other peers (for store nodes)."""
        return _QueueIterator(self._register(self._envelopes, topic))

    def _register(self, table: dict[str, list[asyncio.Queue[T | None]]], topic: str) -> Any:
        if self._closed:
            raise LocalProtocolError("transport is closed")
        queue: asyncio.Queue[T | None] = asyncio.Queue()
        with self._lock:
            new_topic = topic not in self._frames and topic not in self._envelopes
            table.setdefault(topic, []).append(queue)
        if new_topic and self._trio is not None:
            self._trio.join(topic)
        return queue

    def _topics(self) -> list[str]:
        with self._lock:
            return sorted({*self._frames, *self._envelopes})

    def _accept(self, msg: rpc_pb2.Message) -> bool:
        """Topic validator (trio thread): is this a frame we would deliver and relay?"""
        topic = msg.topicIDs[0] if msg.topicIDs else ""
        try:
            _checked_envelope(msg.data, topic, self.content_topic(topic), self.max_message_bytes)
        except RemoteProtocolError as exc:
            reason = str(exc).split(":")[0]
            self.rejected[reason] += 1
            logger.warning("%s: dropped a frame on %s: %s", self.peer_id[-8:], topic, exc)
            return False
        return True

    def _deliver(self, msg: rpc_pb2.Message, own: bool) -> None:
        """A validated publication (trio thread): hand it to the asyncio subscribers."""
        if own:
            return
        self.received += 1
        if self.drop_rate and self._rng.random() < self.drop_rate:
            self.randomly_dropped += 1
            return
        loop = self._loop
        assert loop is not None
        for topic in msg.topicIDs:
            message = decode_waku_message(msg.data, max_bytes=self.max_message_bytes)
            envelope = Envelope(topic, message, message.hash(topic))
            with self._lock:
                frames = list(self._frames.get(topic, ()))
                envelopes = list(self._envelopes.get(topic, ()))
            frame = Received(message.payload, envelope.message_hash)
            for queue in frames:
                loop.call_soon_threadsafe(queue.put_nowait, frame)
            for envelope_queue in envelopes:
                loop.call_soon_threadsafe(envelope_queue.put_nowait, envelope)

    # -------------------------------------------------------------- peers

    async def connect(self, address: str) -> None:
        """Dial a peer by multiaddr (with ``/p2p/<id>``) and keep redialling it."""
        info = _peer_info(address)
        trio_side = self._running()
        self._peers[info.peer_id] = info
        await self._call(lambda: trio_side.dial(info))

    async def connected_peers(self) -> list[str]:
        trio_side = self._running()
        return await self._call(trio_side.connected_peers)

    async def mesh_peers(self, topic: str) -> list[str]:
        """The peers a publication on ``topic`` goes to now: our gossipsub mesh if we
        subscribed to it, else the known subscribers (gossipsub's fanout).

        While this is empty a publication reaches nobody (py-libp2p has no flood
        publishing); SDS repairs that, but a script may want to wait for peers first.
        """
        trio_side = self._running()
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

    # -------------------------------------------------------------- thread plumbing

    def _running(self) -> _TrioSide:
        if self._trio is None or self._closed:
            raise LocalProtocolError("transport is not running (start() it, or it was closed)")
        return self._trio

    async def _call(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work()`` in the trio thread and await its outcome from asyncio."""
        loop = self._loop
        assert loop is not None
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

    def _run_trio(self, ready: concurrent.futures.Future[_TrioSide]) -> None:
        try:
            trio.run(_TrioSide(self).run, ready)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                logger.exception("libp2p thread failed")


class _TrioSide:
    """Everything that lives on the trio thread."""

    def __init__(self, transport: Libp2pTransport) -> None:
        self.transport = transport
        gossip = transport.gossip
        self.host: IHost = new_host(key_pair=transport._key_pair, listen_addrs=transport._listen)
        self.router = GossipSub(
            protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11, PROTOCOL_ID],
            degree=gossip.degree,
            degree_low=gossip.degree_low,
            degree_high=gossip.degree_high,
            heartbeat_interval=gossip.heartbeat_interval_s,
            # Its per-peer limit (10 msg/s) would silently drop a fast sender's frames
            # and our own publications; SDS rate control belongs to the application.
            spam_protection_enabled=False,
        )
        self.pubsub = _DeliveringPubsub(
            self.host,
            self.router,
            deliver=transport._deliver,
            # Waku relay publishes unsigned; authenticity is the application's concern.
            strict_signing=False,
            msg_id_constructor=_gossip_message_id,
            # Oversized frames must reach the validator to be counted, within reason.
            max_inbound_rpc_size=max(1 << 20, 2 * transport.max_message_bytes),
        )
        self.token: trio.lowlevel.TrioToken | None = None
        self.nursery: trio.Nursery | None = None
        self._joined: set[str] = set()
        self._drain = _DrainWatch(_QUEUE_HIGH_WATER, _STALL_S)
        self._dropped: set[ID] = set()  # stuck peers we disconnected
        # Unbounded here: the asyncio side bounds what it puts in (_OUTBOX_LIMIT).
        self._outbox_in, self._outbox_out = trio.open_memory_channel[tuple[str, bytes]](math.inf)

    async def run(self, ready: concurrent.futures.Future[_TrioSide]) -> None:
        self.token = trio.lowlevel.current_trio_token()
        try:
            await self._serve(ready)
        finally:
            # Pubsub's seen-cache sweeps in a thread of its own that py-libp2p never stops.
            self.pubsub.seen_messages.stop()

    async def _serve(self, ready: concurrent.futures.Future[_TrioSide]) -> None:
        async with (
            self.host.run(self.transport._listen),
            background_trio_service(self.pubsub),
            background_trio_service(self.router),
            trio.open_nursery() as nursery,
        ):
            self.nursery = nursery
            await self.pubsub.wait_until_ready()
            for topic in self.transport._topics():
                await self._join(topic)
            nursery.start_soon(self._redial_forever)
            nursery.start_soon(self._send_forever)
            ready.set_result(self)
            await trio.sleep_forever()

    # Called from the asyncio thread: only ever through the trio token.

    def spawn(self, task: Callable[[], Awaitable[None]]) -> None:
        assert self.token is not None and self.nursery is not None
        nursery = self.nursery
        try:
            self.token.run_sync_soon(lambda: nursery.start_soon(task))
        except trio.RunFinishedError:
            raise LocalProtocolError("transport closed") from None

    def join(self, topic: str) -> None:
        self.spawn(lambda: self._join(topic))

    def send(self, topic: str, frame: bytes) -> None:
        assert self.token is not None
        try:
            self.token.run_sync_soon(self._outbox_in.send_nowait, (topic, frame))
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

    async def mesh_peers(self, topic: str) -> list[str]:
        if topic in self.router.mesh:
            peers = self.router.mesh[topic]
        else:
            peers = self.pubsub.peer_topics.get(topic, set())
        return sorted(p.to_base58() for p in peers)

    # Trio side proper.

    async def _join(self, topic: str) -> None:
        if topic in self._joined:
            return
        self._joined.add(topic)
        self.pubsub.set_topic_validator(topic, self._validate, is_async_validator=False)
        await self.pubsub.subscribe(topic)

    def _validate(self, forwarder: ID, msg: rpc_pb2.Message) -> bool:
        return self.transport._accept(msg)

    async def _send_forever(self) -> None:
        loop = self.transport._loop
        assert loop is not None
        async for topic, frame in self._outbox_out:
            try:
                await self._room_to_send()
                await self.pubsub.publish(topic, frame)
            except Exception as exc:
                self.transport.publish_failures += 1
                logger.warning("publishing on %s failed: %r", topic, exc)
            finally:
                loop.call_soon_threadsafe(self.transport._sent)

    async def _room_to_send(self) -> None:
        """Wait while a peer's outbound queue is nearly full and still draining.

        Pubsub silently drops whole RPCs when a peer's queue is full, which under load
        turns into far more loss than the network has. So a publication waits, as TCP
        would, for a slow peer — but not for a stuck one (see :class:`_DrainWatch`). One
        stuck for ``_WEDGED_S`` is disconnected, so that a redial gives it a fresh
        connection.
        """
        while True:
            now = trio.current_time()
            blocking = self._drain.holding_back(self.pubsub.peer_queues, now)
            stuck = self._drain.stuck(now, _WEDGED_S)
            for peer in stuck - self._dropped:
                self._drop_stuck(peer)
            # Once one moves again (or is gone), it may be dropped again if it sticks.
            self._dropped = stuck
            if not blocking:
                return
            await trio.sleep(_POLL_S)

    def _drop_stuck(self, peer: ID) -> None:
        assert self.nursery is not None
        logger.warning(
            "%s: peer %s took no frame for %.0f s: disconnecting it",
            self.transport.peer_id[-8:],
            peer,
            _WEDGED_S,
        )

        async def drop() -> None:
            try:
                with trio.move_on_after(self.transport.gossip.dial_timeout_s):
                    for conn in self.host.get_network().get_connections(peer):
                        # The muxer's own close() would queue its goodbye behind the very
                        # write that is stuck; closing the secured connection beneath it
                        # fails that write, and py-libp2p then clears the peer away.
                        secured = getattr(conn.muxed_conn, "secured_conn", None)
                        await (secured.close() if secured is not None else conn.close())
            except Exception as exc:
                logger.debug("disconnecting %s failed: %r", peer, exc)

        self.nursery.start_soon(drop)

    async def dial(self, info: PeerInfo) -> None:
        with trio.fail_after(self.transport.gossip.dial_timeout_s):
            await self.host.connect(info)

    async def _redial_forever(self) -> None:
        while True:
            connected = set(self.host.get_connected_peers())
            for peer_id, info in list(self.transport._peers.items()):
                if peer_id not in connected:
                    try:
                        await self.dial(info)
                    except (Exception, trio.TooSlowError) as exc:
                        logger.debug("dial %s failed: %s", peer_id, exc)
            await trio.sleep(self.transport.gossip.redial_interval_s)


class _DrainWatch:
    """Which peers' nearly full outbound queues should hold a publication back.

    A queue at or above ``high_water`` holds publications back while it drains. One that
    has not got shorter for ``stall_s`` is *stuck* — py-libp2p can wedge a connection so
    that nothing is written to it again, yet never closes it — and holds nothing back
    until it moves again. This is remembered across publications: judged afresh each
    time, a stuck peer would cost every publication ``stall_s``, and a publisher would
    fall that far behind its caller, who would then stop altogether (the outbox is
    bounded) while its other peers are fine.
    """

    __slots__ = ("_progress", "high_water", "stall_s")

    def __init__(self, high_water: int, stall_s: float) -> None:
        self.high_water = high_water
        self.stall_s = stall_s
        # peer -> (shortest length seen while above high water, when it was seen)
        self._progress: dict[ID, tuple[int, float]] = {}

    def holding_back(self, queues: Mapping[ID, Sized], now: float) -> bool:
        progress: dict[ID, tuple[int, float]] = {}
        blocking = False
        for peer, queue in list(queues.items()):
            length = len(queue)
            if length < self.high_water:
                continue  # drained (or left): judged afresh when it fills up again
            shortest, since = self._progress.get(peer, (length + 1, now))
            if length < shortest:
                shortest, since = length, now
            progress[peer] = (shortest, since)
            blocking = blocking or now - since < self.stall_s
        self._progress = progress
        return blocking

    def stuck(self, now: float, for_s: float) -> set[ID]:
        """Peers whose queue has not got shorter for ``for_s`` (no less than ``stall_s``)."""
        return {p for p, (_, since) in self._progress.items() if now - since >= for_s}


class _DeliveringPubsub(Pubsub):
    """Pubsub whose deliveries go straight to a callback instead of a bounded channel,
    and whose per-peer outbound queues have room for bursts."""

    def __init__(
        self, *args: Any, deliver: Callable[[rpc_pb2.Message, bool], None], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._deliver = deliver
        self.corrupt_rpcs = 0
        self.peer_queues = _RoomyQueues()
        # Sequence numbers start at the time in seconds, and peers remember (sender, seqno)
        # forever to catch equivocation: a host restarted with the same identity within
        # as many seconds as it published messages would have its new messages rejected.
        self.counter = time.time_ns()

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        own = publish_message.from_id == self.my_id.to_bytes()
        self._deliver(publish_message, own)

    async def continuously_read_stream(self, stream: INetStream) -> None:
        """Read a peer's RPCs; one that does not decode costs that peer its stream.

        py-libp2p lets the DecodeError end the whole pubsub service — every channel on
        this host, for one peer's corrupt (or hostile) bytes. It is treated as py-libp2p
        treats an oversized RPC: the stream is reset and the peer dropped, and it may
        connect again.
        """
        try:
            await super().continuously_read_stream(stream)
        except DecodeError as exc:
            peer_id = stream.muxed_conn.peer_id
            self.corrupt_rpcs += 1
            logger.warning(
                "pubsub RPC from %s does not decode (%s): dropping the peer", peer_id, exc
            )
            with contextlib.suppress(Exception):
                await stream.reset()
            self._handle_dead_peer(peer_id)


class _RoomyQueues(dict[ID, RpcQueue]):
    """Pubsub's table of per-peer outbound queues, each enlarged on insertion.

    py-libp2p drops any RPC pushed onto a full queue, and its 32 slots fill whenever the
    writer to a peer is slower than a burst — which in Python, with 40 KB SDS frames and
    every message relayed once more by the third member of a mesh, is routine. There is
    no parameter for the size, so the queue's bound is raised here (checked by a test
    against the pinned py-libp2p).
    """

    def __setitem__(self, peer: ID, queue: RpcQueue) -> None:
        queue._queue.max_size = PEER_QUEUE_RPCS
        super().__setitem__(peer, queue)


def _checked_envelope(data: bytes, topic: str, content_topic: str, max_bytes: int) -> WakuMessage:
    if len(data) > max_bytes:
        raise RemoteProtocolError(f"oversized: {len(data)} bytes exceed {max_bytes}")
    try:
        message = decode_waku_message(data, max_bytes=max_bytes)
    except RemoteProtocolError as exc:
        raise RemoteProtocolError(f"not a WakuMessage: {exc}") from None
    if message.content_topic != content_topic:
        raise RemoteProtocolError(
            f"wrong content topic: {message.content_topic!r}, expected {content_topic!r}"
        )
    return message


def _gossip_message_id(msg: rpc_pb2.Message) -> bytes:
    """The Waku message hash of the frame; sha256 of the bytes for frames that are not
    WakuMessages (they still need an id for the seen cache before validation drops them)."""
    topic = msg.topicIDs[0] if msg.topicIDs else ""
    try:
        return decode_waku_message(msg.data).hash(topic)
    except RemoteProtocolError:
        return hashlib.sha256(msg.data).digest()


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
