"""The state a Libp2pNode's two threads share: settings, counters, subscriptions, peers.

Theory of operation
-------------------
A :class:`~sdsync.transport.libp2p.Libp2pNode` is one Waku node run by two threads:
its asyncio face on the caller's loop, and its
:class:`~sdsync.transport.libp2p_host.TrioHost` on a thread of its own inside
``trio.run``. All that both threads touch is one :class:`HostState`, which the node
makes in its constructor and hands to the host it starts; neither half reads the other's
members. Who writes what, and under which lock:

* ``settings`` (:class:`~sdsync.transport.settings.HostSettings`): frozen, made by the
  node's constructor; both threads read it.
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
  the loop; the host reads them once, as it starts (one added later reaches the running
  host through its trio token).
* ``loop_side`` (:class:`LoopSide`): None until the node's ``start()`` sets it, before
  the host thread starts; read-only after. It is the trio thread's way back to the loop:
  the :class:`Handover`, and what to call there when a publication has left the relay
  outbox (:mod:`sdsync.transport.relay_outbox`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from sdsync.transport.settings import HostSettings
from sdsync.waku.node import Envelope, Handler, Opener, PushHandler

logger = logging.getLogger("sdsync.transport.libp2p")


@dataclass(eq=False, slots=True)
class HostCounters:
    """What the trio thread counts, for the node to report."""

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
    """The subscribers' envelope queues by the caller's topic (a pubsub topic, or a topic
    its content topic routes). A queue ends with the ``None`` :meth:`end` puts in."""

    __slots__ = ("_lock", "_queues")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, list[asyncio.Queue[Envelope | None]]] = {}

    def add(self, topic: str) -> tuple[asyncio.Queue[Envelope | None], bool]:
        """A new queue on ``topic``, and whether no one had subscribed to it yet."""
        queue: asyncio.Queue[Envelope | None] = asyncio.Queue()
        with self._lock:
            new_topic = topic not in self._queues
            self._queues.setdefault(topic, []).append(queue)
        return queue, new_topic

    def topics(self) -> list[str]:
        with self._lock:
            return sorted(self._queues)

    def matching(self, wanted: Callable[[str], bool]) -> list[asyncio.Queue[Envelope | None]]:
        """The queues of the topics ``wanted`` picks."""
        with self._lock:
            return [q for t, qs in self._queues.items() if wanted(t) for q in qs]

    def end(self) -> None:
        """End every subscription (on the loop)."""
        with self._lock:
            for queues in self._queues.values():
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
    """The trio thread's way back to the node's asyncio loop."""

    loop: asyncio.AbstractEventLoop
    handover: Handover
    # Runs on the loop (posted through the handover): one more publication has been
    # handed to pubsub, so the outbox has room for one more.
    sent: Callable[[], None]


@dataclass(eq=False, slots=True)
class HostState:
    """Everything both threads of a node touch (see the theory of operation)."""

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
