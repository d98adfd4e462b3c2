"""The trio half of Libp2pTransport: the py-libp2p host, pubsub and router.

Theory of operation
-------------------
Everything here runs on the transport's own thread, inside ``trio.run`` (:func:`run_host`
is the thread's target), except the few :class:`TrioHost` methods marked as called from
the asyncio loop, which only hand work over. Neither loop ever blocks on the other:

* asyncio → trio: :meth:`TrioHost.send` puts a publication in the outbox and
  :meth:`TrioHost.spawn` starts any other work (joining a topic, dialling, a query), both
  through ``TrioToken.run_sync_soon``, which is thread-safe and does not wait;
  :meth:`TrioHost.stop` cancels the nursery the same way;
* trio → asyncio: through ``loop.call_soon_threadsafe`` only — each frame that passes
  validation goes to the subscribers' queues, each publication handed to pubsub to the
  transport's outbox count, the outcome of spawned work to the future awaiting it.

A :class:`TrioHost` is the transport's other half: it reads the transport's settings and
its subscriber tables (under the transport's lock), and keeps its counters (``rejected``,
``received``, ``randomly_dropped``, ``publish_failures``: written here, read there).

The outbox publishes in order, waiting for room in py-libp2p's per-peer queues (which
drop when full) — but not for a peer that stopped taking frames, whose connection is
closed at length (:class:`_DrainWatch`). Inbound frames are checked as a gossipsub topic
validator, so a bad frame is neither delivered nor relayed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sized
from typing import TYPE_CHECKING

import trio
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.tools.anyio_service import background_trio_service

from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError
from sdsync.transport.base import Envelope, Received
from sdsync.transport.libp2p_patches import PEER_QUEUE_RPCS, DeliveringPubsub
from sdsync.wire.waku import decode_waku_message

if TYPE_CHECKING:
    from sdsync.transport.libp2p import Libp2pTransport

logger = logging.getLogger("sdsync.transport.libp2p")

_QUEUE_HIGH_WATER = PEER_QUEUE_RPCS * 3 // 4  # leaves room for relays and control
_STALL_S = 5.0
# A queue stuck this long is a wedged connection rather than a slow peer.
_WEDGED_S = 20.0
_ROOM_POLL_S = 0.005


def run_host(transport: Libp2pTransport, ready: concurrent.futures.Future[TrioHost]) -> None:
    """The host thread: runs until the host is stopped; ``ready`` gets the host once it
    listens, or the error that kept it from starting."""
    try:
        trio.run(TrioHost(transport).run, ready)
    except BaseException as exc:
        if not ready.done():
            ready.set_exception(exc)
        else:
            logger.exception("libp2p thread failed")


class TrioHost:
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
        self.pubsub = DeliveringPubsub(
            self.host,
            self.router,
            deliver=self._deliver,
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
        # Unbounded here: the asyncio side bounds what it puts in (its _OUTBOX_LIMIT).
        self._outbox_in, self._outbox_out = trio.open_memory_channel[tuple[str, bytes]](math.inf)

    async def run(self, ready: concurrent.futures.Future[TrioHost]) -> None:
        self.token = trio.lowlevel.current_trio_token()
        try:
            await self._serve(ready)
        finally:
            # Pubsub's seen-cache sweeps in a thread of its own that py-libp2p never stops.
            self.pubsub.seen_messages.stop()

    async def _serve(self, ready: concurrent.futures.Future[TrioHost]) -> None:
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
        """Topic validator: is this a frame we would deliver and relay?"""
        transport = self.transport
        topic = msg.topicIDs[0] if msg.topicIDs else ""
        try:
            _check_envelope(msg.data, transport.content_topic(topic), transport.max_message_bytes)
        except RemoteProtocolError as exc:
            transport.rejected[exc.reason] += 1
            logger.warning("%s: dropped a frame on %s: %s", transport.peer_id[-8:], topic, exc)
            return False
        return True

    def _deliver(self, msg: rpc_pb2.Message, own: bool) -> None:
        """A validated publication: hand it to the asyncio subscribers."""
        if own:
            return
        transport = self.transport
        transport.received += 1
        if transport.drop_rate and transport._rng.random() < transport.drop_rate:
            transport.randomly_dropped += 1
            return
        loop = transport._loop
        assert loop is not None
        for topic in msg.topicIDs:
            message = decode_waku_message(msg.data, max_bytes=transport.max_message_bytes)
            envelope = Envelope(topic, message, message.hash(topic))
            with transport._lock:
                frames = list(transport._frames.get(topic, ()))
                envelopes = list(transport._envelopes.get(topic, ()))
            frame = Received(message.payload, envelope.message_hash)
            for queue in frames:
                loop.call_soon_threadsafe(queue.put_nowait, frame)
            for envelope_queue in envelopes:
                loop.call_soon_threadsafe(envelope_queue.put_nowait, envelope)

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
            await trio.sleep(_ROOM_POLL_S)

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


def _check_envelope(data: bytes, content_topic: str, max_bytes: int) -> None:
    """Raises RemoteProtocolError unless ``data`` is a WakuMessage of at most ``max_bytes``
    on ``content_topic``."""
    message = decode_waku_message(data, max_bytes=max_bytes)
    if message.content_topic != content_topic:
        raise RemoteProtocolError(
            f"wrong content topic: {message.content_topic!r}, expected {content_topic!r}",
            reason=RejectReason.WRONG_CONTENT_TOPIC,
        )


def _gossip_message_id(msg: rpc_pb2.Message) -> bytes:
    """The Waku message hash of the frame; sha256 of the bytes for frames that are not
    WakuMessages (they still need an id for the seen cache before validation drops them)."""
    topic = msg.topicIDs[0] if msg.topicIDs else ""
    try:
        return decode_waku_message(msg.data).hash(topic)
    except RemoteProtocolError:
        return hashlib.sha256(msg.data).digest()
