"""`sdsync demo`: a group of in-process participants over a lossy network converges.

A deliberately small event loop on a virtual clock: every broadcast copy is lost with
probability ``loss`` or arrives after a random latency; each participant resends what is
unacknowledged, sends sync messages, sweeps its buffers and answers repair requests on a
timer. The point is to show the real core engine converging, not to model networks in
depth (that is the simulator's job).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from sdsync.core import ChannelConfig, MessageChannel, MessageDelivered

STEP_MS = 10
TICK_MS = 1_000
RESEND_AFTER_MS = 3_000
SYNC_EVERY_MS = 5_000


@dataclass
class Member:
    channel: MessageChannel
    sent: int = 0
    delivered: int = 0
    bytes_sent: int = 0
    next_sync_ms: int = 0


class DemoNetwork:
    """Broadcast with independent loss and uniform latency, on a virtual clock."""

    def __init__(self, participants: int, loss: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.loss = loss
        config = ChannelConfig()
        self.members = [
            Member(MessageChannel("demo", f"p{i}", now_ms=0, config=config))
            for i in range(participants)
        ]
        self.in_flight: list[tuple[int, int, int, bytes]] = []
        self.copies = 0
        self.lost = 0

    def broadcast(self, sender: int, data: bytes, now: int) -> None:
        self.members[sender].bytes_sent += len(data)
        for dest in range(len(self.members)):
            if dest == sender:
                continue
            self.copies += 1
            if self.rng.random() < self.loss:
                self.lost += 1
                continue
            arrival = now + self.rng.randint(20, 400)
            heapq.heappush(self.in_flight, (arrival, self.copies, dest, data))

    def deliver_due(self, now: int) -> None:
        while self.in_flight and self.in_flight[0][0] <= now:
            _, _, dest, data = heapq.heappop(self.in_flight)
            events = self.members[dest].channel.receive(data, now)
            self.members[dest].delivered += sum(isinstance(e, MessageDelivered) for e in events)

    def housekeeping(self, now: int) -> None:
        for index, member in enumerate(self.members):
            chan = member.channel
            chan.sweep_incoming(now)
            sweep = chan.sweep_outgoing()
            for entry in sweep.unacknowledged + sweep.possibly_acknowledged:
                if now - entry.last_sent_ms >= RESEND_AFTER_MS:
                    self.broadcast(index, chan.resend(entry.message.message_id, now), now)
            if now >= member.next_sync_ms:
                member.next_sync_ms = now + self.rng.randint(SYNC_EVERY_MS // 2, SYNC_EVERY_MS)
                sync = chan.send_sync(now)
                if sync is not None:
                    self.broadcast(index, sync.data, now)
            for data in chan.sweep_repair(now).data:
                self.broadcast(index, data, now)

    def converged(self) -> bool:
        first = self.members[0].channel.log_ids()
        return all(m.channel.log_ids() == first for m in self.members[1:]) and not any(
            m.channel.outgoing_ids() for m in self.members
        )


@dataclass
class DemoResult:
    network: DemoNetwork
    messages: int
    converged: bool
    virtual_ms: int


def run_demo(
    participants: int = 5,
    messages: int = 200,
    loss: float = 0.2,
    seed: int = 1,
    max_virtual_ms: int = 3_600_000,
) -> DemoResult:
    net = DemoNetwork(participants, loss, seed)
    send_times = sorted(net.rng.randint(0, messages * 200) for _ in range(messages))
    sent = 0
    now = 0
    while now <= max_virtual_ms:
        while sent < messages and send_times[sent] <= now:
            sender = net.rng.randrange(participants)
            out = net.members[sender].channel.send(f"message {sent} from p{sender}".encode(), now)
            net.members[sender].sent += 1
            net.broadcast(sender, out.data, now)
            sent += 1
        net.deliver_due(now)
        if now % TICK_MS == 0:
            net.housekeeping(now)
        if sent == messages and not net.in_flight and net.converged():
            break
        now += STEP_MS
    return DemoResult(net, messages, net.converged(), now)


def print_demo(result: DemoResult, console: Console) -> None:
    net = result.network
    table = Table(
        title=f"SDS demo: {len(net.members)} participants, {result.messages} messages, "
        f"{net.lost} of {net.copies} broadcast copies lost"
    )
    for column in ("participant", "sent", "delivered", "log entries", "unacked", "KiB sent"):
        table.add_column(column, justify="right")
    table.add_column("same log as p0", justify="center")
    reference = net.members[0].channel.log_ids()
    for member in net.members:
        chan = member.channel
        log = chan.log_ids()
        table.add_row(
            chan.participant_id,
            str(member.sent),
            str(member.delivered),
            str(len(log)),
            str(len(chan.outgoing_ids())),
            f"{member.bytes_sent / 1024:.0f}",
            "[green]yes[/green]" if log == reference else "[red]no[/red]",
        )
    console.print(table)
    if result.converged:
        console.print(
            f"[bold green]converged[/bold green]: every log holds the same "
            f"{len(reference)} entries in the same order after "
            f"{result.virtual_ms / 1000:.1f} s of virtual time"
        )
    else:
        console.print("[bold red]not converged[/bold red] within the time limit")
