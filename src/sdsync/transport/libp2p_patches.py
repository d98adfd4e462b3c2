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
  the empty ``from``+``seqno``, it would hold the first unsigned message only);
* :class:`RefusalIsNoError` logs a peer's refusal of a protocol (multistream "na") at
  DEBUG: py-libp2p logs each one as a seven-line ERROR, yet it is routine (every light
  client, ours or js-waku's, refuses the relay protocol that pubsub opens to each new
  peer) and reaches whoever asked as an exception (ours: ProtocolNotSupportedError).

tests/transport/test_libp2p.py and tests/transport/test_waku_relay.py check each of them
against the pinned version.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.mcache import CacheEntry, MessageCache
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import RpcQueue

logger = logging.getLogger("sdsync.transport.libp2p")

PEER_QUEUE_RPCS = 256
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

    def __init__(self, *args: Any, relay_protocols: tuple[str, ...], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.relay_protocols = relay_protocols

    def attach(self, pubsub: Pubsub) -> None:
        super().attach(pubsub)
        self.mcache = KeyedMessageCache(
            self.mcache.window_size, self.mcache.history_size, pubsub.get_message_id
        )

    def add_peer(self, peer_id: ID, protocol_id: TProtocol | None) -> None:
        if protocol_id in self.relay_protocols:
            protocol_id = PROTOCOL_ID_V11
        super().add_peer(peer_id, protocol_id)

    def _check_equivocation(self, msg: rpc_pb2.Message) -> bool:
        # Equivocation is one sender giving one seqno to two messages: an unsigned
        # message has neither, and its id is a hash of its data.
        if not msg.from_id and not msg.seqno:
            return True
        return bool(super()._check_equivocation(msg))


class KeyedMessageCache(MessageCache):
    """Gossipsub's message cache keyed by the pubsub's message id, which is also what
    IHAVE announces and IWANT asks for."""

    def __init__(
        self, window_size: int, history_size: int, message_id: Callable[[rpc_pb2.Message], bytes]
    ) -> None:
        super().__init__(window_size, history_size)
        self._message_id = message_id

    def put(self, msg: rpc_pb2.Message) -> None:
        mid = self._message_id(msg)
        if mid in self.msgs:
            return
        self.msgs[mid] = msg
        self.history[0].append(CacheEntry(mid, msg.topicIDs))


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


# Once, when the host first imports us: a filter on the very logger that says it.
logging.getLogger(_REFUSAL_LOGGER).addFilter(RefusalIsNoError())
