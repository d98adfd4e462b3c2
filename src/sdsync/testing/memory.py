"""An in-process broadcast network with seeded faults, for tests and examples.

Each copy of a publication is decided on its own: lost (independently, or in bursts with
a Gilbert–Elliott receiver state), delayed by latency plus jitter (so copies reorder),
duplicated, or cut off by a partition. One ``seed`` fixes every decision; delivery uses
the running event loop's timers, so wall-clock interleaving still varies.

The same network also holds Waku nodes (:meth:`MemoryNetwork.waku_node`,
:mod:`sdsync.testing.memory_waku`): the whole Waku node contract — relay envelopes,
request/response and pushes between nodes, peers — without faults, in order.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sdsync.errors import LocalProtocolError
from sdsync.testing.memory_waku import MemoryWakuNode, Peers
from sdsync.waku.node import Received
from sdsync.waku.relay.topics import WakuRelayConfig


@dataclass(frozen=True, slots=True)
class Faults:
    loss: float = 0.0
    burst_enter: float = 0.0  # P(good -> bad) per copy; 0 disables burst loss
    burst_exit: float = 0.3
    burst_loss: float = 0.9
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    duplicate: float = 0.0

    def __post_init__(self) -> None:
        for name in ("loss", "burst_enter", "burst_exit", "burst_loss", "duplicate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise LocalProtocolError(f"{name} must be a probability")


class MemoryNetwork:
    def __init__(self, faults: Faults | None = None, *, seed: int = 0) -> None:
        self.faults = faults if faults is not None else Faults()
        self.rng = random.Random(seed)
        self._subscribers: dict[str, list[tuple[MemoryTransport, asyncio.Queue[Received]]]] = {}
        self._group: dict[str, int] = {}
        self._burst_bad: dict[str, bool] = {}
        self.copies = 0
        self.dropped = 0
        self._waku_nodes: Peers = {}

    def transport(self, name: str) -> MemoryTransport:
        return MemoryTransport(self, name)

    def waku_node(
        self,
        name: str,
        *,
        ip: str = "127.0.0.1",
        relay: bool = True,
        waku: WakuRelayConfig | None = None,
    ) -> MemoryWakuNode:
        """A Waku node named ``name`` (unique in the network), connecting from ``ip``;
        ``relay=False`` makes a light client's host."""
        return MemoryWakuNode(self._waku_nodes, name, ip=ip, relay=relay, waku=waku)

    def partition(self, *groups: list[str]) -> None:
        """Only members of the same group hear each other (others form group 0)."""
        self._group = {name: g for g, members in enumerate(groups, start=1) for name in members}

    def heal(self) -> None:
        self._group = {}

    def _attach(self, transport: MemoryTransport, topic: str) -> asyncio.Queue[Received]:
        queue: asyncio.Queue[Received] = asyncio.Queue()
        self._subscribers.setdefault(topic, []).append((transport, queue))
        return queue

    def _detach(self, transport: MemoryTransport) -> None:
        for topic, subs in self._subscribers.items():
            self._subscribers[topic] = [(t, q) for t, q in subs if t is not transport]

    def _publish(self, sender: MemoryTransport, topic: str, data: bytes) -> bytes:
        hint = hashlib.sha256(topic.encode() + data).digest()
        loop = asyncio.get_running_loop()
        for receiver, queue in self._subscribers.get(topic, []):
            if receiver is sender or not self._reachable(sender.name, receiver.name):
                continue
            self.copies += 1
            if self._lost(receiver.name):
                self.dropped += 1
                continue
            copies = 2 if self.rng.random() < self.faults.duplicate else 1
            for _ in range(copies):
                loop.call_later(self._delay(), queue.put_nowait, Received(data, hint))
        return hint

    def _reachable(self, a: str, b: str) -> bool:
        return self._group.get(a, 0) == self._group.get(b, 0)

    def _lost(self, receiver: str) -> bool:
        f = self.faults
        if f.burst_enter:
            bad = self._burst_bad.get(receiver, False)
            bad = self.rng.random() >= f.burst_exit if bad else self.rng.random() < f.burst_enter
            self._burst_bad[receiver] = bad
            if bad and self.rng.random() < f.burst_loss:
                return True
        return self.rng.random() < f.loss

    def _delay(self) -> float:
        f = self.faults
        ms = f.latency_ms + (self.rng.gauss(0, f.jitter_ms) if f.jitter_ms else 0.0)
        return max(0.0, ms) / 1000


class MemoryTransport:
    def __init__(self, network: MemoryNetwork, name: str) -> None:
        self.network = network
        self.name = name
        self._closed = asyncio.Event()

    async def publish(self, topic: str, data: bytes) -> bytes | None:
        if self._closed.is_set():
            raise LocalProtocolError(f"transport {self.name} is closed")
        return self.network._publish(self, topic, data)

    def subscribe(self, topic: str) -> AsyncIterator[Received]:
        # Attached now, not at first iteration, so nothing published meanwhile is missed.
        return _Subscription(self.network._attach(self, topic), self._closed)

    async def close(self) -> None:
        self._closed.set()
        self.network._detach(self)


class _Subscription:
    def __init__(self, queue: asyncio.Queue[Received], closed: asyncio.Event) -> None:
        self._queue = queue
        self._closed = closed

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> Received:
        if self._closed.is_set():
            raise StopAsyncIteration
        getter = asyncio.ensure_future(self._queue.get())
        closed = asyncio.ensure_future(self._closed.wait())
        done, _ = await asyncio.wait({getter, closed}, return_when=asyncio.FIRST_COMPLETED)
        closed.cancel()
        if getter not in done:
            getter.cancel()
            raise StopAsyncIteration
        return getter.result()
