"""The quick demo (``sdsync demo --quick``): a small group of the real engines in seconds.

Theory of operation
-------------------
A deliberately small event loop on a virtual clock, with no simulator, no store and no
Spark. Each participant is a :class:`MessageChannel` under a :class:`ChannelDriver`, which
decides when to resend, sync, sweep and answer repair requests, as in every runtime; the
loop only carries out the :class:`Transmit` actions of each step. A broadcast copy is lost
with probability ``loss``, or else arrives after a uniform random latency. The clock jumps
from one due time to the next — a send of the workload, an arrival, a driver's
``next_due`` — until every log holds the same entries and nothing is unacknowledged.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from sdsync.core import ChannelConfig, MessageChannel, MessageDelivered
from sdsync.runtime import ChannelDriver, RuntimeConfig, Step, Transmit

LATENCY_MS = (20, 400)
MAX_VIRTUAL_MS = 3_600_000
RESEND_MS = 3_000
# Quicker than the library's timers, and resends that neither back off nor give up within
# the demo's hour: even at 95 % loss a small group converges in minutes of virtual time.
TIMERS = RuntimeConfig(
    sync_interval_ms=5_000,
    resend_interval_ms=RESEND_MS,
    resend_possibly_acknowledged_ms=3 * RESEND_MS,
    resend_backoff=1.0,
    max_attempts=MAX_VIRTUAL_MS // RESEND_MS,
    incoming_sweep_ms=1_000,
)


@dataclass
class Member:
    driver: ChannelDriver
    sent: int = 0
    delivered: int = 0
    bytes_sent: int = 0

    @property
    def channel(self) -> MessageChannel:
        return self.driver.channel


class QuickNetwork:
    """Broadcast with independent loss and uniform latency, on a virtual clock."""

    def __init__(self, participants: int, loss: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.loss = loss
        config = ChannelConfig()
        self.members = [
            Member(
                ChannelDriver(
                    MessageChannel("demo", f"p{i}", now_ms=0, config=config),
                    TIMERS,
                    self.rng,
                    0,
                    query_stores=False,  # there are none
                )
            )
            for i in range(participants)
        ]
        self.in_flight: list[tuple[int, int, int, bytes]] = []
        self.copies = 0
        self.lost = 0

    def publish(self, sender: int, payload: bytes, now: int) -> None:
        self.members[sender].sent += 1
        self._carry_out(sender, self.members[sender].driver.publish(payload, now).whole(), now)

    def deliver_due(self, now: int) -> None:
        while self.in_flight and self.in_flight[0][0] <= now:
            _, _, dest, data = heapq.heappop(self.in_flight)
            self._carry_out(dest, self.members[dest].driver.receive(data, now), now)

    def tick_due(self, now: int) -> None:
        for index, member in enumerate(self.members):
            if member.driver.next_due() <= now:
                self._carry_out(index, member.driver.tick(now), now)

    def next_due(self) -> int:
        """The earliest arrival or driver timer."""
        due = min(member.driver.next_due() for member in self.members)
        return min(due, self.in_flight[0][0]) if self.in_flight else due

    def converged(self) -> bool:
        first = self.members[0].channel.log_ids()
        return all(m.channel.log_ids() == first for m in self.members[1:]) and not any(
            m.channel.outgoing_ids() for m in self.members
        )

    def _carry_out(self, index: int, step: Step, now: int) -> None:
        member = self.members[index]
        member.delivered += sum(isinstance(e, MessageDelivered) for e in step.events)
        for action in step.actions:
            if isinstance(action, Transmit):  # the only kind: no store is queried
                self._broadcast(index, action.data, now)

    def _broadcast(self, sender: int, data: bytes, now: int) -> None:
        self.members[sender].bytes_sent += len(data)
        for dest in range(len(self.members)):
            if dest == sender:
                continue
            self.copies += 1
            if self.rng.random() < self.loss:
                self.lost += 1
                continue
            arrival = now + self.rng.randint(*LATENCY_MS)
            heapq.heappush(self.in_flight, (arrival, self.copies, dest, data))


@dataclass
class QuickDemo:
    network: QuickNetwork
    messages: int
    converged: bool
    virtual_ms: int


def run_quick_demo(
    participants: int = 5,
    messages: int = 200,
    loss: float = 0.2,
    seed: int = 1,
    max_virtual_ms: int = MAX_VIRTUAL_MS,
) -> QuickDemo:
    """``messages`` sends by random participants over ``messages * 200`` ms, then until
    the group converged or ``max_virtual_ms`` passed."""
    net = QuickNetwork(participants, loss, seed)
    send_times = sorted(net.rng.randint(0, messages * 200) for _ in range(messages))
    sent = 0
    now = 0
    while now <= max_virtual_ms:
        while sent < messages and send_times[sent] <= now:
            sender = net.rng.randrange(participants)
            net.publish(sender, f"message {sent} from p{sender}".encode(), now)
            sent += 1
        net.deliver_due(now)
        net.tick_due(now)
        if sent == messages and not net.in_flight and net.converged():
            break
        now = min(send_times[sent], net.next_due()) if sent < messages else net.next_due()
    return QuickDemo(net, messages, net.converged(), now)
