"""Subclasses that mend py-libp2p 0.8.1 where it loses frames, or a whole node, unasked,
or cannot speak Waku Relay (gossipsub v1.1 under ``/vac/waku/relay/2.0.0``, unsigned:
StrictNoSign).

Theory of operation
-------------------
These subclasses run on the transport's trio thread, inside the host's pubsub service
(:mod:`sdsync.transport.libp2p_host` builds them); they know nothing of asyncio. Each
replaces one behaviour of the pinned py-libp2p:

* :class:`DeliveringPubsub` hands every delivery straight to a callback instead of the
  32-slot subscription channel, which drops on overflow; and lets a peer's undecodable
  RPC cost that peer its stream rather than end the pubsub service;
* :class:`RoomyQueues` enlarges each peer's outbound queue, which drops whole RPCs when
  full;
* :meth:`DeliveringPubsub.publish_unsigned` sends a message with only ``data`` and
  ``topicIDs``: py-libp2p's ``publish`` always sets ``from`` and ``seqno``, and js-waku
  drops any message that carries a seqno;
* :class:`WakuGossipSub` takes a peer that speaks the relay protocol id as a gossipsub
  v1.1 peer (py-libp2p's ``add_peer`` raises on any id it does not know, and the peer is
  never added); skips the equivocation check for unsigned messages (it keys on
  ``from``+``seqno``, empty for all of them, so from the second message on nothing was
  forwarded); and keys its message cache, which answers IWANT and feeds IHAVE, by the
  pubsub's message id instead of ``from``+``seqno`` (:class:`KeyedMessageCache`: keyed on
  the empty ``from``+``seqno``, it would hold the first unsigned message only), bounded
  in bytes as well as heartbeats, oldest first; and
  queues a publication for a peer not subscribed to its topic only while that peer is
  new (:class:`NewcomerQueues`): py-libp2p queues every publication for every such peer,
  re-filters each 100-entry queue on every publish and logs a WARNING each time;
* :func:`cached_peer_record` stands in for py-libp2p's ``env_to_send_in_RPC`` in its
  gossipsub module: every RPC carries our signed peer record, and py-libp2p rebuilds
  every listen address (multiaddr, base58) to check the record it has is current, on
  every publish; the check is made at most once per ``PEER_RECORD_CHECK_S`` per host;
* :class:`BoundedSwarm` frees an inbound connection's slot when the connection ends
  (py-libp2p holds it until the whole swarm stops, so after 250 inbound connections in a
  node's life every dial was refused), and bounds inbound connections per remote IP and
  handshakes in progress, each within a deadline, the handshakes' slots shared fairly
  between addresses (:mod:`~sdsync.transport.handshakes`)
  (:class:`~sdsync.transport.settings.ConnectionLimits`); and it stops in two bounded
  steps instead of tearing its connections down where they stand
  (:meth:`BoundedSwarm.stop_accepting`, :meth:`BoundedSwarm.hang_up`): py-libp2p's
  ``Yamux.close`` sends GoAway and closes the socket in the same breath, so what the
  peer sent meanwhile is unread, and the kernel answers a close with bytes unread with
  RST; and a cancelled host closes its sockets wherever its tasks were, or not at all
  (an outbound connection stayed open);
* :class:`ClientConnection` makes each inbound connection answer for its client
  (``get_remote_address``, which :func:`remote_ip` reads for every per-IP bound): the
  socket's peer, or for a WebSocket from a trusted proxy
  (``ConnectionLimits.trusted_proxies``) the client the proxy names in
  ``X-Forwarded-For`` (:mod:`~sdsync.transport.forwarded`). py-libp2p's WebSocket
  connection has no remote address at all (a placeholder returns None), so every
  WebSocket client counted as one address, "", and the sixth at once was refused; and
  its listener drops the upgrade request, headers and all, once it has accepted it.
  :func:`_upgrade_seen` wraps the listener's handler of an upgrade request to keep it
  (:data:`_UPGRADE`, a context variable: the listener hands the connection to the swarm
  in the same task, so the swarm reads the request that connection came with, and no
  private attribute of either is touched). Where TCP and WebSocket listen on one host
  and port (``--web`` without ``--relay-listen``: both on port 0) py-libp2p serves both
  from one socket and upgrades WebSocket connections itself, through trio-websocket's
  ``wrap_server_stream``: :func:`_server_stream_seen` keeps the request there, and the
  peer from the socket under py-libp2p's peeking stream (the request knows none);
* :class:`RefusalIsNoError` logs a peer's refusal of a protocol (multistream "na") at
  DEBUG: py-libp2p logs each one as a seven-line ERROR, yet it is routine (every light
  client, ours or js-waku's, refuses the relay protocol that pubsub opens to each new
  peer) and reaches whoever asked as an exception (ours: ProtocolNotSupportedError).

tests/transport/test_libp2p.py and tests/transport/test_waku_relay.py check each of them
against the pinned version.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import struct
import time
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
import trio_websocket
from google.protobuf.message import DecodeError
from libp2p.abc import IHost, IMuxedConn, INetConn, INetStream
from libp2p.custom_types import TProtocol
from libp2p.io.abc import ReadWriteCloser
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.network.connection.swarm_connection import SwarmConn
from libp2p.network.exceptions import SwarmException
from libp2p.network.swarm import Swarm
from libp2p.peer import peerstore
from libp2p.peer.id import ID
from libp2p.pubsub import gossipsub
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.mcache import CacheEntry, MessageCache
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import RpcQueue
from libp2p.stream_muxer.yamux.yamux import (
    GO_AWAY_NORMAL,
    TYPE_GO_AWAY,
    YAMUX_HEADER_FORMAT,
    Yamux,
)
from libp2p.transport.websocket.connection import P2PWebSocketConnection
from libp2p.transport.websocket.listener import WebsocketListener

from sdsync.transport.forwarded import FORWARDED_FOR, client_ip
from sdsync.transport.handshakes import HandshakeSlots
from sdsync.transport.settings import MESSAGE_CACHE_BYTES, ConnectionLimits

logger = logging.getLogger("sdsync.transport.libp2p")

PEER_QUEUE_RPCS = 256
#: How long after a relay peer is added publications are still queued for it while we
#: have not seen it subscribe to their topic (see :class:`NewcomerQueues`).
SUBSCRIPTION_GRACE_S = 5.0
#: How often a host's signed peer record is checked against its listen addresses.
PEER_RECORD_CHECK_S = 1.0
_REFUSAL_LOGGER = "libp2p.host.basic_host"


class DeliveringPubsub(Pubsub):
    """Pubsub whose deliveries go straight to a callback instead of a bounded channel,
    and whose per-peer outbound queues have room for bursts."""

    def __init__(
        self, *args: Any, deliver: Callable[[rpc_pb2.Message, bool], None], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._deliver = deliver
        self.corrupt_rpcs = 0
        self.peer_queues = RoomyQueues()
        # Our unsigned publications in flight: they carry no `from` to recognise them by.
        self._own_unsigned: list[rpc_pb2.Message] = []

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        own = any(publish_message is mine for mine in self._own_unsigned)
        self._deliver(publish_message, own)

    async def publish_unsigned(self, topic: str, data: bytes) -> None:
        """Publish ``data`` as Waku relay does (StrictNoSign): no ``from``, ``seqno``,
        ``signature`` or ``key``, which ``publish`` would always set."""
        message = rpc_pb2.Message(data=data, topicIDs=[topic])
        self._own_unsigned.append(message)
        try:
            await self.push_msg(self.my_id, message)
        finally:
            self._own_unsigned.remove(message)

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


class RoomyQueues(dict[ID, RpcQueue]):
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


class WakuGossipSub(GossipSub):
    """GossipSub that relays Waku's way: under protocol ids taken as gossipsub v1.1
    (``relay_protocols``), with unsigned messages."""

    def __init__(
        self,
        *args: Any,
        relay_protocols: tuple[str, ...],
        message_cache_bytes: int = MESSAGE_CACHE_BYTES,
        on_cache_evict: Callable[[int], None] = lambda n: None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.relay_protocols = relay_protocols
        self._message_cache_bytes = message_cache_bytes
        self._on_cache_evict = on_cache_evict
        self._added_at: dict[ID, float] = {}
        self._pending_messages = NewcomerQueues(self._new)

    def attach(self, pubsub: Pubsub) -> None:
        super().attach(pubsub)
        self.mcache = KeyedMessageCache(
            self.mcache.window_size,
            self.mcache.history_size,
            pubsub.get_message_id,
            max_bytes=self._message_cache_bytes,
            on_evict=self._on_cache_evict,
        )

    def add_peer(self, peer_id: ID, protocol_id: TProtocol | None) -> None:
        if protocol_id in self.relay_protocols:
            protocol_id = PROTOCOL_ID_V11
        super().add_peer(peer_id, protocol_id)
        self._added_at[peer_id] = time.monotonic()

    def remove_peer(self, peer_id: ID) -> None:
        super().remove_peer(peer_id)
        self._added_at.pop(peer_id, None)

    def unidentified_since(self, wall_time: float) -> set[ID]:
        """Peers the router does not know that it has held frames for since before
        ``wall_time`` (``time.time()``, as py-libp2p stamps its pending messages)."""
        return {
            peer
            for peer, queue in list(self._pending_messages.items())
            if queue and peer not in self.peer_protocol and queue[0][0] < wall_time
        }

    def _new(self, peer_id: ID) -> bool:
        """Not identified yet, or identified less than ``SUBSCRIPTION_GRACE_S`` ago."""
        if peer_id not in self.peer_protocol:
            return True
        added = self._added_at.get(peer_id)
        return added is not None and time.monotonic() - added < SUBSCRIPTION_GRACE_S

    def _prune_pending_messages(self, peer_id: ID) -> None:
        queue = self._pending_messages.get(peer_id)
        if queue is None:
            return
        if not self._new(peer_id):
            # Its subscriptions are known by now: standard gossipsub rules apply to it,
            # and a subscription arriving later still gets the recent messages replayed.
            del self._pending_messages[peer_id]
            return
        # Full is routine for a peer in identify under load, not worth py-libp2p's
        # WARNING on every publish: the oldest goes quietly.
        excess = len(queue) - self._max_pending_messages_per_peer
        if excess > 0:
            del queue[:excess]
        super()._prune_pending_messages(peer_id)

    def _check_equivocation(self, msg: rpc_pb2.Message) -> bool:
        # Equivocation is one sender giving one seqno to two messages: an unsigned
        # message has neither, and its id is a hash of its data.
        if not msg.from_id and not msg.seqno:
            return True
        return bool(super()._check_equivocation(msg))


class NewcomerQueues(defaultdict[ID, list[tuple[float, rpc_pb2.RPC]]]):
    """GossipSub's queues of publications for peers whose subscription to their topic
    we have not seen, kept for new peers only (``is_new``).

    py-libp2p queues each publication for every pubsub peer not subscribed to its topic,
    identified or not, in case its SUBSCRIBE is still on the way, and keeps each for
    30 s, up to 100 per peer. A relay peer of other shards, or any peer that will never
    subscribe to the topic, thus costs every publish a re-filtered 100-entry queue and a
    logged WARNING. The race the queue exists for is a peer's first moments: identify
    not done, or done but its SUBSCRIBE (sent with its first RPC, milliseconds later)
    not yet read. So only a new peer gets a queue; an older one gets a list nobody keeps.
    A SUBSCRIBE read later than ``SUBSCRIPTION_GRACE_S`` is still covered, for what was
    published over the last gossip window, by py-libp2p's replay of its message cache to
    a newly subscribed peer.
    """

    def __init__(self, is_new: Callable[[ID], bool]) -> None:
        super().__init__(list)
        self._is_new = is_new

    def __missing__(self, peer: ID) -> list[tuple[float, rpc_pb2.RPC]]:
        if self._is_new(peer):
            return super().__missing__(peer)
        return []


class KeyedMessageCache(MessageCache):
    """Gossipsub's message cache keyed by the pubsub's message id, which is also what
    IHAVE announces and IWANT asks for, and bounded in bytes as well as in heartbeats.

    py-libp2p's cache holds what arrived over the last ``history_size`` heartbeats,
    whatever its size: a flood from many peers at once is held whole for that long. At
    ``max_bytes`` the oldest entries go first (from the oldest window on, each removed
    from its window too, so no IHAVE announces what IWANT could not answer), each counted
    through ``on_evict``; a message larger than the whole budget is not cached at all.
    """

    def __init__(
        self,
        window_size: int,
        history_size: int,
        message_id: Callable[[rpc_pb2.Message], bytes],
        *,
        max_bytes: int = MESSAGE_CACHE_BYTES,
        on_evict: Callable[[int], None] = lambda n: None,
    ) -> None:
        super().__init__(window_size, history_size)
        self._message_id = message_id
        self.max_bytes = max_bytes
        self._on_evict = on_evict
        self._sizes: dict[bytes, int] = {}
        self.bytes = 0

    def put(self, msg: rpc_pb2.Message) -> None:
        mid = self._message_id(msg)
        if mid in self.msgs:
            return
        size = msg.ByteSize()
        if size > self.max_bytes:
            self._on_evict(1)
            return
        self._make_room(size)
        self.msgs[mid] = msg
        self._sizes[mid] = size
        self.bytes += size
        self.history[0].append(CacheEntry(mid, msg.topicIDs))

    def shift(self) -> None:
        for entry in self.history[-1]:
            self.bytes -= self._sizes.pop(entry.mid, 0)
        super().shift()

    def _make_room(self, size: int) -> None:
        """Drop the oldest entries until ``size`` more bytes fit the budget."""
        evicted = 0
        for window in reversed(self.history):
            dropped = 0
            while dropped < len(window) and self.bytes + size > self.max_bytes:
                mid = window[dropped].mid
                self.msgs.pop(mid, None)
                self.bytes -= self._sizes.pop(mid, 0)
                dropped += 1
            del window[:dropped]
            evicted += dropped
        if evicted:
            self._on_evict(evicted)


class BoundedSwarm(Swarm):
    """py-libp2p's swarm, whose inbound connections are bounded
    (:class:`~sdsync.transport.settings.ConnectionLimits`) and give their slot back when
    they end.

    py-libp2p 0.8.1 admits an inbound connection under a capacity limiter and keeps
    the handler holding it until the swarm finishes, so the slot outlives the
    connection. Here the handler returns once the connection closes. Refusals are
    counted in ``refused`` by reason. A swarm is made by ``new_host`` deep inside it, so
    :meth:`adopt` turns that one into a BoundedSwarm. Only TCP and websocket connections
    (ours) take this path; the connection gate (allow and deny lists), which we never
    configure, is not consulted.

    Stopping (module doc) is :meth:`stop_accepting`, then :meth:`hang_up` once what
    was in progress is done.
    """

    limits: ConnectionLimits
    refused: Counter[str]
    stopping: bool
    _by_ip: Counter[str]
    slots: HandshakeSlots

    @classmethod
    def adopt(cls, swarm: Swarm, limits: ConnectionLimits, refused: Counter[str]) -> BoundedSwarm:
        if type(swarm) is not Swarm:
            raise TypeError(f"cannot bound a {type(swarm).__name__}")
        swarm.__class__ = cls
        assert isinstance(swarm, BoundedSwarm)
        swarm.limits, swarm.refused, swarm._by_ip = limits, refused, Counter()
        swarm.slots = HandshakeSlots(limits.pending, limits.pending_per_ip, limits.exempt_ips)
        swarm.stopping = False
        return swarm

    def stop_accepting(self) -> None:
        """No new connection from now on, either way: one that comes is closed
        unserved, and nobody is dialled, not even to open a stream. The listeners stay
        open: closing one closes the connections it accepted (trio's ``serve_listeners``
        closes each stream its handler ends with), and connections up stay up."""
        self.stopping = True

    async def dial_peer(self, peer_id: ID) -> list[INetConn]:
        if self.stopping:
            raise SwarmException(f"not dialling {peer_id}: the host is stopping")
        return await super().dial_peer(peer_id)

    async def hang_up(self, wait_s: float) -> None:
        """Close every connection cleanly: yamux's GoAway (normal termination), then
        the peer hangs up (py-libp2p and js-libp2p do at a GoAway), our reader takes
        what it still sent up to its end of the stream, and only then does our socket
        close, with a FIN. A peer still there after ``wait_s`` (go-libp2p keeps a
        connection after a GoAway until its streams end), or one without GoAway
        (mplex), is closed from our side."""
        async with trio.open_nursery() as nursery:
            for conn in self.get_connections():
                if isinstance(conn, SwarmConn):
                    nursery.start_soon(_hang_up, conn, wait_s)

    async def _do_handle_inbound_connection(
        self, read_write_closer: ReadWriteCloser, maddr: Any, failure_event: Any
    ) -> None:
        if isinstance(read_write_closer, IMuxedConn):  # QUIC and the like: not ours
            await super()._do_handle_inbound_connection(read_write_closer, maddr, failure_event)
            return
        raw = ClientConnection(read_write_closer, self._client_address(read_write_closer))
        ip = remote_ip(raw)
        refusal = "stopping" if self.stopping else self._refusal(ip)
        if refusal is not None:
            self.refused[refusal] += 1
            with contextlib.suppress(Exception):
                await read_write_closer.close()
            return
        self._by_ip[ip] += 1
        try:
            muxed = await self._handshake(raw, maddr, ip)
            if muxed is not None:
                await self._until_closed(muxed)
        finally:
            self._by_ip[ip] -= 1
            if not self._by_ip[ip]:
                del self._by_ip[ip]

    def _client_address(self, read_write_closer: ReadWriteCloser) -> tuple[str, int] | None:
        """Whom an inbound connection is for (module doc): its socket's peer, or the
        client a trusted proxy names for a WebSocket (port unknown: 0)."""
        upgrade = _UPGRADE.get()
        if upgrade is None or not isinstance(read_write_closer, P2PWebSocketConnection):
            return read_write_closer.get_remote_address()
        if upgrade.peer is None:
            return None
        peer_ip, port = upgrade.peer
        client = client_ip(peer_ip, upgrade.forwarded_for, self.limits.trusted_proxies)
        return (client, port) if client == peer_ip else (client, 0)

    def _refusal(self, ip: str) -> str | None:
        per_ip = self.limits.per_ip
        if per_ip and ip not in self.limits.exempt_ips and self._by_ip[ip] >= per_ip:
            return "per-IP limit"
        return None

    async def _handshake(self, raw: ClientConnection, maddr: Any, ip: str) -> IMuxedConn | None:
        """The upgraded connection, or None (the socket closed) if no handshake slot was
        free (:class:`~sdsync.transport.handshakes.HandshakeSlots`), or the upgrade
        failed, was evicted, or did not finish within the deadline."""
        with trio.CancelScope() as evictable:
            slot = self.slots.take(ip, evictable.cancel)
            if isinstance(slot, str):
                self.refused[slot] += 1
            else:
                try:
                    with trio.move_on_after(self.limits.handshake_timeout_s):
                        return await self.upgrade_inbound_raw_conn(raw, maddr)
                    self.refused["handshake timeout"] += 1
                except Exception as exc:
                    logger.debug("inbound connection from %s failed its handshake: %r", maddr, exc)
                finally:
                    self.slots.release(slot)
        if evictable.cancelled_caught:
            self.refused["handshake evicted"] += 1
        with contextlib.suppress(Exception):
            await raw.close()
        return None

    async def _until_closed(self, muxed: IMuxedConn) -> None:
        for conn in list(self.connections.get(muxed.peer_id, ())):
            if conn.muxed_conn is muxed and isinstance(conn, SwarmConn):
                await conn.event_closed.wait()


async def _hang_up(conn: SwarmConn, wait_s: float) -> None:
    """One connection of :meth:`BoundedSwarm.hang_up`, within ``2 * wait_s``."""
    with trio.move_on_after(wait_s), contextlib.suppress(Exception):
        if await _go_away(conn.muxed_conn):
            await conn.event_closed.wait()
    if not conn.is_closed:
        with trio.move_on_after(wait_s), contextlib.suppress(Exception):
            await conn.close()


async def _go_away(muxed: IMuxedConn) -> bool:
    """Send yamux's GoAway alone, the connection left up and read (``Yamux.close``
    would close it at once); False for a muxer without GoAway (mplex)."""
    if not isinstance(muxed, Yamux):
        return False
    go_away = struct.pack(YAMUX_HEADER_FORMAT, 0, TYPE_GO_AWAY, 0, 0, GO_AWAY_NORMAL)
    await muxed._write_frame(go_away)
    return True


class ClientConnection(RawConnection):
    """An inbound connection whose remote address is its client's, as
    :class:`BoundedSwarm` admitted it; the secured and muxed connections built on it
    report it too, to :func:`remote_ip` of a peer's connection and to identify (the
    address it tells a peer it was observed at: a WebSocket peer is told one now)."""

    def __init__(self, stream: ReadWriteCloser, address: tuple[str, int] | None) -> None:
        super().__init__(stream, False)
        self.address = address

    def get_remote_address(self) -> tuple[str, int] | None:
        return self.address


def remote_ip(read_write_closer: object) -> str:
    """Whose connection this is (raw, secured or muxed): the IP address of its client
    (:class:`ClientConnection`: behind a trusted proxy, the client it names), else of
    its socket's peer; "" if unknown. Every per-IP bound of a libp2p host asks this."""
    get = getattr(read_write_closer, "get_remote_address", None)
    address = get() if get is not None else None
    return str(address[0]) if address else ""


@dataclass(frozen=True, slots=True)
class WebSocketUpgrade:
    """What a WebSocket connection's upgrade request said about its sender: the
    socket's peer (None if the stream has no address) and its ``X-Forwarded-For``
    values, in order."""

    peer: tuple[str, int] | None
    forwarded_for: tuple[str, ...]

    @classmethod
    def of(cls, request: Any, stream: Any = None) -> WebSocketUpgrade:
        """From trio-websocket's ``WebSocketRequest`` (header names in lower case), read
        from ``stream`` (whose socket names the peer when the request cannot)."""
        remote = getattr(request, "remote", None)  # an Endpoint, or a str if none
        address, port = getattr(remote, "address", None), getattr(remote, "port", 0)
        sock = getattr(stream, "socket", None)
        if address is None and sock is not None:
            with contextlib.suppress(OSError, ValueError):
                address, port, *_ = sock.getpeername()
        peer = (str(address), int(port)) if address is not None else None
        name = FORWARDED_FOR.lower().encode()
        forwarded = tuple(
            value.decode("latin-1")
            for key, value in getattr(request, "headers", ())
            if key.lower() == name
        )
        return cls(peer, forwarded)


#: The upgrade request of the WebSocket connection being handed to the swarm in this task.
_UPGRADE: contextvars.ContextVar[WebSocketUpgrade | None] = contextvars.ContextVar(
    "sdsync_websocket_upgrade", default=None
)


async def _upgrade_seen(listener: WebsocketListener, request: Any) -> None:
    """``WebsocketListener._handle_websocket_connection``, with the upgrade request
    kept in :data:`_UPGRADE` while the connection it opens is handled (module doc)."""
    token = _UPGRADE.set(WebSocketUpgrade.of(request))
    try:
        await _handle_websocket_connection(listener, request)
    finally:
        _UPGRADE.reset(token)


async def _server_stream_seen(nursery: trio.Nursery, stream: Any, *args: Any, **kw: Any) -> Any:
    """trio-websocket's ``wrap_server_stream``, with the upgrade request kept in
    :data:`_UPGRADE` (module doc). Not reset: py-libp2p's shared-port listener runs each
    connection in a task of its own, and hands it to the swarm in that task."""
    request = await _wrap_server_stream(nursery, stream, *args, **kw)
    _UPGRADE.set(WebSocketUpgrade.of(request, stream))
    return request


def cached_peer_record(host: IHost) -> tuple[bytes, bool]:
    """``env_to_send_in_RPC(host)``: our signed peer record, and whether it was made
    afresh; the real one is asked at most once per ``PEER_RECORD_CHECK_S`` per host, which
    is how long a change of listen addresses may take to show in the record."""
    now = time.monotonic()
    cached = _PEER_RECORDS.get(host)
    if cached is not None and now - cached[0] < PEER_RECORD_CHECK_S:
        return cached[1], False
    record, fresh = _env_to_send_in_rpc(host)
    _PEER_RECORDS[host] = (now, record)
    return record, fresh


_env_to_send_in_rpc = peerstore.env_to_send_in_RPC
_handle_websocket_connection = WebsocketListener._handle_websocket_connection
_wrap_server_stream = trio_websocket.wrap_server_stream
_PEER_RECORDS: weakref.WeakKeyDictionary[IHost, tuple[float, bytes]] = weakref.WeakKeyDictionary()


class RefusalIsNoError(logging.Filter):
    """Turns py-libp2p's ERROR "Failed to open stream to peer …" into a DEBUG record when
    the peer only refused the protocol; other failures to open a stream stay errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Failed to open stream to peer") and (
            "protocols not supported" in message
        ):
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


# Once, when the host first imports us: a filter on the very logger that says it; the
# cached record where gossipsub (publish, IWANT answers, control) looks it up; and the
# WebSocket listeners' handlers of upgrade requests, which keep each request.
logging.getLogger(_REFUSAL_LOGGER).addFilter(RefusalIsNoError())
setattr(gossipsub, "env_to_send_in_RPC", cached_peer_record)  # noqa: B010 (not re-exported)
setattr(WebsocketListener, "_handle_websocket_connection", _upgrade_seen)  # noqa: B010
setattr(trio_websocket, "wrap_server_stream", _server_stream_seen)  # noqa: B010
