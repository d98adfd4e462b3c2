"""The state a Libp2pTransport's two threads share: settings, counters, subscriptions, peers.

Theory of operation
-------------------
A :class:`~sdsync.transport.libp2p.Libp2pTransport` is one Waku node run by two threads:
its asyncio face on the caller's loop, and its
:class:`~sdsync.transport.libp2p_host.TrioHost` on a thread of its own inside
``trio.run``. All that both threads touch is one :class:`HostState`, which the transport
makes in its constructor and hands to the host it starts; neither half reads the other's
members. Who writes what, and under which lock:

* ``settings`` (:class:`HostSettings`): frozen, made by the transport's constructor;
  both threads read it.
* ``counters`` (:class:`HostCounters`): written on the trio thread only, read on the
  loop for reporting. No lock: each is an int or a Counter, changed one step at a time
  under the GIL, so a reading is at most a moment stale, never torn.
* ``subscriptions`` (:class:`Subscriptions`): queues added and ended on the loop, looked
  up on the trio thread for every frame it delivers; both under the table's own lock.
  The trio thread only puts into a queue through the :class:`Handover`, never directly.
* ``peers``: the peers to keep dialled, added on the loop (``connect``), read by the
  trio thread's redial loop, which copies the items before it dials (a dict copy is
  atomic under the GIL).
* ``served``, ``push_served``, ``conversed``: the handlers of served protocols, added on
  the loop; the host reads them once, as it starts (one added later reaches the running host through
  its trio token).
* ``loop_side`` (:class:`LoopSide`): None until the transport's ``start()`` sets it,
  before the host thread starts; read-only after. It is the trio thread's way back to
  the loop: the :class:`Handover`, and what to call there when a publication has left.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import multiaddr
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from sdsync.transport.base import Envelope, Received, WakuRelayConfig
from sdsync.transport.libp2p_patches import MESSAGE_CACHE_BYTES, ConnectionLimits
from sdsync.transport.ratelimit import RateLimit
from sdsync.transport.waku_node import Handler, Opener, PushHandler

logger = logging.getLogger("sdsync.transport.libp2p")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GossipParams:
    """Gossipsub knobs; defaults suit a small group on one machine or a LAN."""

    degree: int = 6
    degree_low: int = 4
    degree_high: int = 12
    heartbeat_interval_s: int = 1
    # The gossip message cache (what IWANT is answered from) holds this many bytes at
    # most, the oldest going first, counted in Libp2pTransport.mcache_evicted.
    message_cache_bytes: int = MESSAGE_CACHE_BYTES
    # Redial configured peers that are not connected this often (they may start later,
    # or restart).
    redial_interval_s: float = 1.0
    dial_timeout_s: float = 5.0


@dataclass(frozen=True, slots=True)
class HostSettings:
    """A transport's settings, as its constructor took and checked them (its docs say
    what each means)."""

    key_pair: KeyPair
    peer_id: str
    listen: tuple[multiaddr.Multiaddr, ...]
    content_topic: Callable[[str], str]
    waku: WakuRelayConfig
    gossip: GossipParams
    # False: a light client's host, which mounts no gossipsub at all.
    relay: bool
    # Shards our metadata names besides those we relay: a light client relays none,
    # yet a node on its cluster (go-waku) drops a peer that names no shard.
    announce_shards: tuple[int, ...]
    limits: ConnectionLimits
    max_message_bytes: int
    # A relayed message's timestamp may be this far ahead of clock_ns() (as the
    # archive's): further, it is neither delivered nor relayed.
    clock_ns: Callable[[], int]
    max_future_ns: int
    # Bytes of valid relay frames one forwarding peer may bring (None: no limit); more
    # are dropped by the validator, neither delivered nor relayed, and counted.
    relay_rate: RateLimit | None
    drop_rate: float
    seed: int | None

    def route(self, topic: str) -> tuple[str, str | None]:
        """:meth:`~sdsync.transport.base.WakuRelayConfig.route` with our content topics."""
        return self.waku.route(topic, self.content_topic)


@dataclass(eq=False, slots=True)
class HostCounters:
    """What the trio thread counts, for the transport to report."""

    # Inbound connections closed unserved, by reason (ConnectionLimits).
    connections_refused: Counter[str] = field(default_factory=Counter)
    # Relay frames and stream frames refused, by RejectReason.
    rejected: Counter[str] = field(default_factory=Counter)
    # Request/response streams that timed out, or broke, by protocol id.
    stream_timeouts: Counter[str] = field(default_factory=Counter)
    stream_failures: Counter[str] = field(default_factory=Counter)
    # Inbound streams reset because their peer held too many of that protocol open.
    streams_refused: Counter[str] = field(default_factory=Counter)
    # Push lanes, by protocol id: streams opened (a lane's, or one per push to a
    # one-frame reader), pushes written again on a fresh stream after the lane's
    # failed, and pushes sent again after a one-frame reader dropped them unread.
    push_streams: Counter[str] = field(default_factory=Counter)
    push_retries: Counter[str] = field(default_factory=Counter)
    pushes_resent: Counter[str] = field(default_factory=Counter)
    # Valid relay frames from other peers; those of them drop_rate discarded.
    received: int = 0
    randomly_dropped: int = 0
    publish_failures: int = 0
    # Valid relay frames dropped for being over their forwarder's relay_rate.
    relay_rate_limited: int = 0
    # Messages dropped from the gossip cache to keep it within its byte budget.
    mcache_evicted: int = 0


class Subscriptions:
    """The subscribers' queues by the caller's topic: of frames (SDS bytes with their
    hint) and of whole envelopes. A queue ends with the ``None`` :meth:`end` puts in."""

    __slots__ = ("_envelopes", "_frames", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._frames: dict[str, list[asyncio.Queue[Received | None]]] = {}
        self._envelopes: dict[str, list[asyncio.Queue[Envelope | None]]] = {}

    def add_frames(self, topic: str) -> tuple[asyncio.Queue[Received | None], bool]:
        """A new frame queue on ``topic``, and whether no one had subscribed to it yet."""
        return self._add(self._frames, topic)

    def add_envelopes(self, topic: str) -> tuple[asyncio.Queue[Envelope | None], bool]:
        """A new envelope queue on ``topic``, and whether no one had subscribed to it yet."""
        return self._add(self._envelopes, topic)

    def _add(
        self, table: dict[str, list[asyncio.Queue[T | None]]], topic: str
    ) -> tuple[asyncio.Queue[T | None], bool]:
        queue: asyncio.Queue[T | None] = asyncio.Queue()
        with self._lock:
            new_topic = topic not in self._frames and topic not in self._envelopes
            table.setdefault(topic, []).append(queue)
        return queue, new_topic

    def topics(self) -> list[str]:
        with self._lock:
            return sorted({*self._frames, *self._envelopes})

    def matching(
        self, wanted: Callable[[str], bool]
    ) -> tuple[list[asyncio.Queue[Received | None]], list[asyncio.Queue[Envelope | None]]]:
        """The frame and envelope queues of the topics ``wanted`` picks."""
        with self._lock:
            frames = [q for t, qs in self._frames.items() if wanted(t) for q in qs]
            envelopes = [q for t, qs in self._envelopes.items() if wanted(t) for q in qs]
        return frames, envelopes

    def end(self) -> None:
        """End every subscription (on the loop): None, whatever its queue carries."""
        with self._lock:
            ended: list[list[asyncio.Queue[Any]]] = [
                *self._frames.values(),
                *self._envelopes.values(),
            ]
            for queues in ended:
                for subscriber in queues:
                    subscriber.put_nowait(None)


class Handover:
    """Calls from another thread (the trio thread) for an asyncio loop to run, in the
    order posted, with one wake-up of the loop per batch rather than per call.

    ``post`` wakes the loop (``call_soon_threadsafe``: a write to its self-pipe) only if
    nothing was waiting; the loop then runs every call waiting by then. Under load the
    loop thus wakes once for many frames. A call posted after the loop took the batch
    finds the queue empty and wakes it again, so none waits for a later post. Anything
    the other thread asks through ``call_soon_threadsafe`` after a ``post`` still runs
    after it: the wake-up that runs the post was queued first.
    """

    __slots__ = ("_calls", "_lock", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._calls: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()

    def post(self, call: Callable[..., object], *args: Any) -> None:
        """Have the loop run ``call(*args)`` (from any thread; does not wait)."""
        with self._lock:
            idle = not self._calls
            self._calls.append((call, args))
        if idle:
            self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, deque()
        for call, args in calls:
            try:
                call(*args)
            except Exception:  # as the loop treats a failing callback: logged, not fatal
                logger.exception("a call handed over to the loop failed")


@dataclass(frozen=True, slots=True)
class LoopSide:
    """The trio thread's way back to the transport's asyncio loop."""

    loop: asyncio.AbstractEventLoop
    handover: Handover
    # Runs on the loop (posted through the handover): one more publication has been
    # handed to pubsub, so the outbox has room for one more.
    sent: Callable[[], None]


@dataclass(eq=False, slots=True)
class HostState:
    """Everything both threads of a transport touch (see the theory of operation)."""

    settings: HostSettings
    counters: HostCounters = field(default_factory=HostCounters)
    subscriptions: Subscriptions = field(default_factory=Subscriptions)
    peers: dict[ID, PeerInfo] = field(default_factory=dict)
    # protocol id -> (handler, max request bytes, timeout), for a host yet to start.
    served: dict[str, tuple[Handler, int, float]] = field(default_factory=dict)
    push_served: dict[str, tuple[PushHandler, int]] = field(default_factory=dict)
    # protocol id -> (opener, max frame bytes, timeout), for a host yet to start.
    conversed: dict[str, tuple[Opener, int, float]] = field(default_factory=dict)
    loop_side: LoopSide | None = None
