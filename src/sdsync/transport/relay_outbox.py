"""The relay outbox: what a node publishes on Waku Relay, in order, without losing it.

Theory of operation
-------------------
A publication crosses the node's two threads. On the asyncio loop,
:meth:`~sdsync.transport.libp2p.Libp2pNode.publish_message` hands the frame to the trio
thread (through its trio token: no waiting) and returns; :class:`OutboxBound`, kept on
the loop, counts the frames handed over and not yet given to pubsub, and makes a
publisher wait only while ``_OUTBOX_LIMIT`` are. A caller holding a lock across a
publication (ReliableChannel does) is thus not held up by a slow peer. On the trio
thread, :class:`RelayOutbox` publishes them one at a time, in order, and tells the loop
of each one it handed to pubsub (:attr:`~sdsync.transport.libp2p_shared.LoopSide.sent`,
through the handover), which makes room for the next. The two halves share nothing
else. On ``close`` the node lets what is queued drain, for up to ``_FLUSH_S``.

Pubsub silently drops whole RPCs when a peer's outbound queue is full (py-libp2p's
per-peer queues, which :class:`~sdsync.transport.libp2p_patches.RoomyQueues` enlarges),
which under load turns into far more loss than the network has. So each publication
waits, as TCP would, while a peer's queue is nearly full and still draining — but not
for a peer that stopped taking frames, whose connection is closed at length
(:class:`_DrainWatch`, :meth:`RelayOutbox.room_to_send`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sized

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID

from sdsync.transport.libp2p_patches import PEER_QUEUE_RPCS, DeliveringPubsub, WakuGossipSub
from sdsync.transport.libp2p_shared import HostState

logger = logging.getLogger("sdsync.transport.libp2p")

#: Frames handed to the trio thread and not yet to pubsub, at most: more wait.
_OUTBOX_LIMIT = 256
_FLUSH_S = 2.0
_FLUSH_POLL_S = 0.005
_QUEUE_HIGH_WATER = PEER_QUEUE_RPCS * 3 // 4  # leaves room for relays and control
_STALL_S = 5.0
# A queue stuck this long is a wedged connection rather than a slow peer.
_WEDGED_S = 20.0
# Identify takes milliseconds; a peer still unknown to the router this long after we
# queued it a frame never will be (within py-libp2p's 30-s life of queued frames).
_UNIDENTIFIED_S = 10.0
_ROOM_POLL_S = 0.005


class OutboxBound:
    """The outbox as the asyncio loop sees it: how many frames it has handed to the trio
    thread that have not reached pubsub yet (``queued``), and room for more."""

    def __init__(self) -> None:
        self.queued = 0
        self._room = asyncio.Event()

    async def room(self, running: Callable[[], object]) -> None:
        """Wait until fewer than ``_OUTBOX_LIMIT`` frames are queued; ``running()``
        raises once the node is closed (as :meth:`release` wakes the waiters)."""
        while self.queued >= _OUTBOX_LIMIT:
            running()
            self._room.clear()
            await self._room.wait()

    def handed_over(self) -> None:
        """One more frame went to the trio thread."""
        self.queued += 1

    def sent(self) -> None:
        """The trio thread gave one more frame to pubsub (posted through the handover)."""
        self.queued -= 1
        if self.queued < _OUTBOX_LIMIT:
            self._room.set()

    async def drained(self) -> None:
        """Return once nothing is queued, or after ``_FLUSH_S``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _FLUSH_S
        while self.queued and loop.time() < deadline:
            await asyncio.sleep(_FLUSH_POLL_S)

    def release(self) -> None:
        """Wake every waiting publisher (the node closed: they find out)."""
        self._room.set()


class RelayOutbox:
    """The outbox on the trio thread: publishes what :meth:`put` queues, in order, with
    room in every peer's queue (see the theory of operation)."""

    def __init__(
        self,
        state: HostState,
        host: IHost,
        pubsub: DeliveringPubsub,
        router: WakuGossipSub,
        start_soon: Callable[..., object],
    ) -> None:
        self._state = state
        self._host = host
        self._pubsub = pubsub
        self._router = router
        self._start_soon = start_soon
        self._drain = _DrainWatch(_QUEUE_HIGH_WATER, _STALL_S)
        self._dropped: set[ID] = set()  # stuck peers we disconnected
        # Unbounded here: the loop bounds what it hands over (OutboxBound).
        self._in, self._out = trio.open_memory_channel[tuple[str, bytes]](math.inf)

    def put(self, pubsub_topic: str, frame: bytes) -> None:
        """Queue ``frame`` for ``pubsub_topic`` (on the trio thread: the host's token runs it)."""
        self._in.send_nowait((pubsub_topic, frame))

    async def run(self) -> None:
        """Publish what is queued, in order, for as long as the host runs."""
        loop_side = self._state.loop_side
        assert loop_side is not None
        async for topic, frame in self._out:
            try:
                await self.room_to_send()
                await self._pubsub.publish_unsigned(topic, frame)
            except Exception as exc:
                self._state.counters.publish_failures += 1
                logger.warning("publishing on %s failed: %r", topic, exc)
            finally:
                loop_side.handover.post(loop_side.sent)

    async def room_to_send(self) -> None:
        """Wait while a peer's outbound queue is nearly full and still draining.

        Not for a stuck one (see :class:`_DrainWatch`). One stuck for ``_WEDGED_S``, or
        never identified (:meth:`_unidentified`), is disconnected, so that a redial
        gives it a fresh connection.
        """
        while True:
            now = trio.current_time()
            blocking = self._drain.holding_back(self._pubsub.peer_queues, now)
            wedged = self._drain.stuck(now, _WEDGED_S)
            unknown = self._unidentified(time.time())
            stuck = wedged | unknown
            for peer in stuck - self._dropped:
                why = (
                    f"took no frame for {_WEDGED_S:.0f} s"
                    if peer in wedged
                    else f"was not identified {_UNIDENTIFIED_S:.0f} s after we queued it frames"
                )
                self._drop_stuck(peer, why)
            # Once one moves again (or is gone), it may be dropped again if it sticks.
            self._dropped = stuck
            if not blocking:
                return
            await trio.sleep(_ROOM_POLL_S)

    def _unidentified(self, wall_now: float) -> set[ID]:
        """Peers still unknown to the router that it has held frames for since
        ``_UNIDENTIFIED_S`` ago.

        py-libp2p queues what we publish for a subscribed peer until identify completes
        for it. Under load (CI) identify once never completed: the queue dropped frames
        at its cap, our publications never reached that peer (in a line, the rest of the
        group) and the chat never converged. A fresh connection identifies afresh.

        It also queues publications for a new peer identified but not (yet) subscribed
        to their topic (:class:`~sdsync.transport.libp2p_patches.NewcomerQueues`): such
        a queue may be old, yet its peer is identified."""
        return self._router.unidentified_since(wall_now - _UNIDENTIFIED_S)

    def _drop_stuck(self, peer: ID, why: str) -> None:
        settings = self._state.settings
        logger.warning("%s: peer %s %s: disconnecting it", settings.peer_id[-8:], peer, why)
        host = self._host

        async def drop() -> None:
            try:
                with trio.move_on_after(settings.gossip.dial_timeout_s):
                    for conn in host.get_network().get_connections(peer):
                        # The muxer's own close() would queue its goodbye behind the very
                        # write that is stuck; closing the secured connection beneath it
                        # fails that write, and py-libp2p then clears the peer away.
                        secured = getattr(conn.muxed_conn, "secured_conn", None)
                        await (secured.close() if secured is not None else conn.close())
            except Exception as exc:
                logger.debug("disconnecting %s failed: %r", peer, exc)

        self._start_soon(drop)


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
