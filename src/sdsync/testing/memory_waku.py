"""MemoryWakuNode: the Waku node contract in memory, for tests of what runs on a node.

Theory of operation
-------------------
A :class:`MemoryWakuNode` is a :class:`~sdsync.waku.node.WakuNode` whose peers
are the other nodes of the same :class:`~sdsync.testing.memory.MemoryNetwork`
(:meth:`~sdsync.testing.memory.MemoryNetwork.waku_node` makes them): no sockets, no
threads, no py-libp2p, and every step runs on the caller's event loop in the order it is
asked, so a test of a store node, its light services or a light client is deterministic
and fast.

*Identity.* A node's peer id is derived from its name (a sha256 multihash, as a libp2p
peer id is written) and its address is ``/ip4/<ip>/tcp/<port>/p2p/<peer id>``; ``ip`` is
the node's own attribute, which a test sets to put nodes on one host or many (what
:meth:`peer_ip` tells a per-host limit).

*Relay.* The relaying nodes of a network form one full mesh: a publication on a pubsub
topic is handed at once to every other open relaying node subscribed to it (as an
:class:`~sdsync.waku.node.Envelope` to :meth:`subscribe_envelopes`; :meth:`publish` and
:meth:`subscribe` carry a channel's SDS bytes on them through the same
:class:`~sdsync.waku.relay.transport.RelayTransport` a libp2p relay node uses), and
:meth:`mesh_peers` names those nodes. Nothing is validated on the way: what a node does
with a hostile message is the node's to show.

*Streams.* :meth:`request`, :meth:`push` and :meth:`converse` carry real frames
(:func:`~sdsync.waku.rpc.encode_frame`, read back with
:func:`~sdsync.waku.rpc.read_frame` under the same bounds), so they fail as
the libp2p host's do: a peer addressed by multiaddr is dialled (both ends are then
connected), one addressed by id must be connected already, else ``ConnectionError``; an
unserved protocol id is a :class:`~sdsync.errors.ProtocolNotSupportedError`; an answer
above ``max_response_bytes``, truncated or missing is a RemoteProtocolError; past
``timeout_s``, TimeoutError. The serving node counts what it refuses as the real host
does (``rejected``, ``stream_timeouts``, ``stream_failures``) and the asker sees a reset
stream, a ``ConnectionError``. The handler runs within the asker's call, so the asker's
deadline cancels it too (a real host lets it run to its own). Pushes reach the
receiver's push handler in the order sent; one it refuses (too long, or its handler
raises RemoteProtocolError) is counted there and dropped, unbeknown to the sender, as on
a lane the receiver resets.

:meth:`disconnect` drops a connection (both ends); :meth:`close` ends the node's
subscriptions and connections, after which it is unreachable.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from sdsync.errors import (
    LocalProtocolError,
    ProtocolNotSupportedError,
    RejectReason,
    RemoteProtocolError,
)
from sdsync.lifecycle import AsyncLifecycle
from sdsync.waku.node import (
    Conversation,
    Envelope,
    Handler,
    Opener,
    PushHandler,
    Received,
    WakuNode,
)
from sdsync.waku.relay.topics import WakuRelayConfig, default_content_topic
from sdsync.waku.relay.transport import RelayTransport
from sdsync.waku.rpc import MAX_RPC_BYTES, encode_frame, read_frame
from sdsync.wire.waku import MAX_WAKU_MESSAGE_BYTES, WakuMessage

logger = logging.getLogger("sdsync.testing.memory_waku")

K = TypeVar("K")
V = TypeVar("V")
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_STREAM_TIMEOUT_S = 10.0
_CONVERSATION_TIMEOUT_S = 120.0
_TCP_PORT = 60000

Peers = dict[str, "MemoryWakuNode"]
"""A network's Waku nodes by peer id."""


def memory_peer_id(name: str) -> str:
    """The peer id of the node named ``name``: base58 of the sha256 multihash of the name."""
    digest = b"\x12\x20" + hashlib.sha256(name.encode()).digest()
    number, text = int.from_bytes(digest, "big"), ""
    while number:
        number, digit = divmod(number, 58)
        text = _BASE58[digit] + text
    return text


class MemoryWakuNode(AsyncLifecycle):
    """A Waku node of a :class:`~sdsync.testing.memory.MemoryNetwork` (see the module)."""

    def __init__(
        self,
        peers: Peers,
        name: str,
        *,
        ip: str = "127.0.0.1",
        relay: bool = True,
        waku: WakuRelayConfig | None = None,
        content_topic: Callable[[str], str] = default_content_topic,
        max_message_bytes: int = MAX_WAKU_MESSAGE_BYTES,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.peer_id = memory_peer_id(name)
        if self.peer_id in peers:
            raise LocalProtocolError(f"the network has a Waku node named {name!r} already")
        peers[self.peer_id] = self
        self.name = name
        self.ip = ip
        self.relay = relay
        self.waku = waku if waku is not None else WakuRelayConfig()
        self.content_topic = content_topic
        self.max_message_bytes = max_message_bytes
        self._clock_ns = clock_ns
        self._peers = peers
        self._port = _TCP_PORT + len(peers)
        self._closed = False
        self._connections: set[str] = set()
        self._served: dict[str, tuple[Handler, int, float]] = {}
        self._push_served: dict[str, tuple[PushHandler, int]] = {}
        self._conversed: dict[str, tuple[Opener, int]] = {}
        self._lanes: set[tuple[str, str]] = set()
        # By (pubsub topic, content topic): None takes every content topic.
        self._envelopes: dict[tuple[str, str | None], list[asyncio.Queue[Envelope | None]]] = {}
        # What a libp2p host counts (WakuCounters): the first four happen here; the rest
        # (connection limits, stream slots, lane retries) are the libp2p host's own.
        self.rejected: Counter[str] = Counter()
        self.stream_timeouts: Counter[str] = Counter()
        self.stream_failures: Counter[str] = Counter()
        self.push_streams: Counter[str] = Counter()
        self.connections_refused: Counter[str] = Counter()
        self.streams_refused: Counter[str] = Counter()
        self.push_retries: Counter[str] = Counter()
        self.pushes_resent: Counter[str] = Counter()
        self.relay_rate_limited = self.mcache_evicted = 0  # no rate, no gossip cache here
        # A channel's SDS bytes, as over a libp2p relay node: the same adapter.
        self._sds = RelayTransport(self, clock_ns=clock_ns)

    @property
    def listen_addrs(self) -> list[str]:
        return [f"/ip4/{self.ip}/tcp/{self._port}/p2p/{self.peer_id}"]

    # -- lifecycle

    async def start(self) -> None:
        """Nothing to start: a memory node serves from the moment it is made."""

    async def close(self) -> None:
        """End the subscriptions and every connection; the node is unreachable after."""
        if self._closed:
            return
        self._closed = True
        for peer in list(self._connections):
            self.disconnect(peer)
        _end(self._envelopes)

    # -- relay

    async def publish(self, topic: str, data: bytes) -> bytes:
        """Relay ``data`` in a WakuMessage on ``topic``'s content topic; its hash."""
        return await self._sds.publish(topic, data)

    async def publish_message(self, pubsub_topic: str, message: WakuMessage) -> bytes:
        self._relaying("publish")
        size = len(message.to_bytes())
        if size > self.max_message_bytes:
            raise LocalProtocolError(
                f"a {size}-byte frame exceeds max_message_bytes={self.max_message_bytes}"
            )
        message_hash = message.hash(pubsub_topic)
        for node in self._mesh(pubsub_topic):
            node._deliver(pubsub_topic, message, message_hash)
        return message_hash

    def subscribe(self, topic: str) -> AsyncIterator[Received]:
        """SDS bytes published on ``topic`` by other nodes, with their Waku hash as hint."""
        return self._sds.subscribe(topic)

    def subscribe_envelopes(self, topic: str) -> AsyncIterator[Envelope]:
        self._relaying("subscribe")
        return _drain(self._envelopes, self.waku.route(topic, self.content_topic))

    async def mesh_peers(self, topic: str) -> list[str]:
        self._relaying("mesh_peers")
        pubsub_topic, _ = self.waku.route(topic, self.content_topic)
        return [node.peer_id for node in self._mesh(pubsub_topic)]

    def _mesh(self, pubsub_topic: str) -> list[MemoryWakuNode]:
        return [
            node
            for node in self._peers.values()
            if node is not self and not node._closed and node._relays(pubsub_topic)
        ]

    def _relays(self, pubsub_topic: str) -> bool:
        return any(topic == pubsub_topic for topic, _ in self._envelopes)

    def _deliver(self, pubsub_topic: str, message: WakuMessage, message_hash: bytes) -> None:
        envelope = Envelope(pubsub_topic, message, message_hash)
        for content_topic in (None, message.content_topic):
            for queue in self._envelopes.get((pubsub_topic, content_topic), []):
                queue.put_nowait(envelope)

    def _relaying(self, what: str) -> None:
        self._check_open()
        if not self.relay:
            raise LocalProtocolError(f"cannot {what} on a node made with relay=False")

    # -- peers

    async def connect(self, address: str) -> None:
        """Dial the node at ``address`` (a multiaddr ending in ``/p2p/<id>``)."""
        self._reach(address)

    def disconnect(self, peer: str) -> None:
        """Drop the connection to ``peer``, at both ends (a link that broke)."""
        self._connections.discard(peer)
        node = self._peers.get(peer)
        if node is not None:
            node._connections.discard(self.peer_id)

    async def connected_peers(self) -> list[str]:
        self._check_open()
        return sorted(self._connections)

    async def peer_ip(self, peer: str) -> str | None:
        self._check_open()
        return self._peers[peer].ip if peer in self._connections else None

    def _reach(self, peer: str) -> MemoryWakuNode:
        """The node ``peer`` names, dialled if it is an address (ConnectionError if it
        cannot be reached, or is named by id without a connection)."""
        self._check_open()
        if not peer.startswith("/"):
            if peer not in self._connections:
                raise ConnectionError(f"no connection to {peer}")
            return self._peers[peer]
        _, marker, peer_id = peer.rpartition("/p2p/")
        if not marker:
            raise LocalProtocolError(f"peer address {peer!r} names no peer (/p2p/PEER_ID)")
        node = self._peers.get(peer_id)
        if node is None or node._closed:
            raise ConnectionError(f"cannot reach {peer_id} at {peer}")
        self._connections.add(peer_id)
        node._connections.add(self.peer_id)
        return node

    # -- request/response

    async def serve(
        self,
        protocol_id: str,
        handler: Handler,
        *,
        max_request_bytes: int = MAX_RPC_BYTES,
        timeout_s: float = _STREAM_TIMEOUT_S,
    ) -> None:
        self._check_open()
        self._served[protocol_id] = (handler, max_request_bytes, timeout_s)

    async def serve_pushes(
        self, protocol_id: str, handler: PushHandler, *, max_frame_bytes: int = MAX_RPC_BYTES
    ) -> None:
        self._check_open()
        self._push_served[protocol_id] = (handler, max_frame_bytes)

    async def serve_conversations(
        self,
        protocol_id: str,
        opener: Opener,
        *,
        max_frame_bytes: int = MAX_RPC_BYTES,
        timeout_s: float = _CONVERSATION_TIMEOUT_S,
    ) -> None:
        self._check_open()
        self._conversed[protocol_id] = (opener, max_frame_bytes)

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
        node = self._reach(peer)
        async with asyncio.timeout(timeout_s):
            theirs = await node._open_conversation(self.peer_id, protocol_id)
            frame: bytes | None = first
            while frame is not None:
                reply = await node._turn(theirs, protocol_id, frame)
                if reply is None:
                    if not theirs.finished:
                        await asyncio.sleep(timeout_s)  # both wait for a frame: a deadlock
                    break
                frame = await conversation.receive(await _framed(reply, max_frame_bytes) or b"")
                if conversation.finished:
                    if frame is not None and not theirs.finished:
                        await node._turn(theirs, protocol_id, frame)
                    return
                if theirs.finished:
                    break
        raise RemoteProtocolError(
            f"{node.peer_id} closed its {protocol_id} stream before the exchange ended",
            reason=RejectReason.TRUNCATED_FRAME,
        )

    async def _open_conversation(self, peer: str, protocol_id: str) -> Conversation:
        if protocol_id not in self._conversed:
            raise ProtocolNotSupportedError(self.peer_id, protocol_id)
        opener, _ = self._conversed[protocol_id]
        try:
            return await opener(peer)
        except Exception as exc:
            self.stream_failures[protocol_id] += 1
            raise ConnectionError(f"{self.peer_id} reset our {protocol_id} stream") from exc

    async def _turn(
        self, conversation: Conversation, protocol_id: str, frame: bytes
    ) -> bytes | None:
        """``conversation``'s reply to ``frame`` (read under the served bound);
        ConnectionError when it refuses the frame (the stream is reset)."""
        _, max_bytes = self._conversed[protocol_id]
        try:
            return await conversation.receive(await _framed(frame, max_bytes) or b"")
        except RemoteProtocolError as exc:
            self.rejected[exc.reason] += 1
        raise ConnectionError(f"{self.peer_id} reset our {protocol_id} stream")

    async def peers_serving(self, *protocol_ids: str) -> list[str]:
        self._check_open()
        return sorted(
            peer
            for peer in self._connections
            if all(self._peers[peer]._serves(p) for p in protocol_ids)
        )

    def _serves(self, protocol_id: str) -> bool:
        return any(protocol_id in t for t in (self._served, self._push_served, self._conversed))

    async def request(
        self,
        peer: str,
        protocol_id: str,
        payload: bytes,
        *,
        max_response_bytes: int = MAX_RPC_BYTES,
        timeout_s: float = _STREAM_TIMEOUT_S,
    ) -> bytes:
        node = self._reach(peer)
        async with asyncio.timeout(timeout_s):
            answer = await node._answer(self.peer_id, protocol_id, encode_frame(payload))
            body = None if answer is None else await read_frame(_reader(answer), max_response_bytes)
        if body is None:
            raise RemoteProtocolError(
                f"{node.peer_id} closed its {protocol_id} stream without answering",
                reason=RejectReason.TRUNCATED_FRAME,
            )
        return body

    async def push(
        self, peer: str, protocol_id: str, payload: bytes, *, timeout_s: float = _STREAM_TIMEOUT_S
    ) -> None:
        node = self._reach(peer)
        async with asyncio.timeout(timeout_s):
            await node._take_push(self.peer_id, protocol_id, encode_frame(payload))
        if (node.peer_id, protocol_id) not in self._lanes:
            self._lanes.add((node.peer_id, protocol_id))
            self.push_streams[protocol_id] += 1

    async def _answer(self, peer: str, protocol_id: str, frame: bytes) -> bytes | None:
        """The answer frame to ``frame`` from ``peer`` (None: none); ConnectionError when
        the stream is reset."""
        if protocol_id not in self._served:
            raise ProtocolNotSupportedError(self.peer_id, protocol_id)
        handler, max_bytes, timeout_s = self._served[protocol_id]
        try:
            async with asyncio.timeout(timeout_s):
                request = await read_frame(_reader(frame), max_bytes)
                answer = None if request is None else await handler(peer, request)
        except RemoteProtocolError as exc:
            self.rejected[exc.reason] += 1
        except TimeoutError:
            self.stream_timeouts[protocol_id] += 1
        except Exception:
            logger.exception("%s handler failed on a request from %s", protocol_id, peer)
            self.stream_failures[protocol_id] += 1
        else:
            return None if answer is None else encode_frame(answer)
        raise ConnectionError(f"{self.peer_id} reset our {protocol_id} stream")

    async def _take_push(self, peer: str, protocol_id: str, frame: bytes) -> None:
        if protocol_id not in self._push_served:
            raise ProtocolNotSupportedError(self.peer_id, protocol_id)
        handler, max_bytes = self._push_served[protocol_id]
        try:
            body = await read_frame(_reader(frame), max_bytes)
            if body is not None:
                await handler(peer, body)
        except RemoteProtocolError as exc:
            self.rejected[exc.reason] += 1
        except Exception:
            logger.exception("%s handler failed on a push from %s", protocol_id, peer)

    def _check_open(self) -> None:
        if self._closed:
            raise LocalProtocolError(f"Waku node {self.name} is closed")


async def _framed(body: bytes, max_bytes: int) -> bytes | None:
    """``body`` as the reader of a stream gets it: framed and read back under ``max_bytes``."""
    return await read_frame(_reader(encode_frame(body)), max_bytes)


def _reader(data: bytes) -> Callable[[int], Awaitable[bytes]]:
    """``read(n)`` over ``data``, as :func:`~sdsync.waku.rpc.read_frame` reads
    a stream."""
    view = memoryview(data)
    offset = 0

    async def read(n: int) -> bytes:
        nonlocal offset
        chunk = bytes(view[offset : offset + n])
        offset += len(chunk)
        return chunk

    return read


def _drain(table: dict[K, list[asyncio.Queue[V | None]]], key: K) -> AsyncIterator[V]:
    """The items of a new queue in ``table[key]`` until close() ends it; attached now,
    not at the first iteration, so nothing published meanwhile is missed."""
    queue: asyncio.Queue[V | None] = asyncio.Queue()
    table.setdefault(key, []).append(queue)
    return _items(queue)


def _end(table: dict[K, list[asyncio.Queue[V | None]]]) -> None:
    for queues in table.values():
        for queue in queues:
            queue.put_nowait(None)


async def _items(queue: asyncio.Queue[V | None]) -> AsyncIterator[V]:
    while (item := await queue.get()) is not None:
        yield item
    queue.put_nowait(None)  # stay ended for another reader


if TYPE_CHECKING:  # mypy holds the node to the contract it stands in for
    _CONTRACT: type[WakuNode] = MemoryWakuNode
