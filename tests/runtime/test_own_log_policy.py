"""Our own messages keep the transport's retrieval hint under both own-log policies.

Seed 004: with ``own_log_policy="on_ack"`` a message enters its sender's log only when it
is acknowledged, so the hint the transport returns on publishing must wait on the outgoing
entry (and in the stored outgoing row, across a restart) and enter the log with the
message. These run end to end — ReliableChannel with a ``state_dir``, over the in-memory
network and over real gossipsub on loopback — and compare every hint with the one the
transport actually returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from testdeps import require

from sdsync.core import (
    BloomParams,
    ChannelConfig,
    Event,
    MessageDelivered,
    OwnLogPolicy,
    RepairConfig,
)
from sdsync.runtime import ReliableChannel, RuntimeConfig
from sdsync.testing.memory import Faults, MemoryNetwork
from sdsync.transport import Received, Transport
from sdsync.wire import decode

CHANNEL = "hints"
TOPIC = f"/sds/1/{CHANNEL}"
FAST = RuntimeConfig(
    sync_interval_ms=200,
    resend_interval_ms=150,
    resend_possibly_acknowledged_ms=400,
    max_resend_interval_ms=1_000,
    incoming_sweep_ms=50,
)
# A liveness bound, not a performance assertion: each wait normally takes a second or two.
PATIENCE_S = 60

POLICIES = pytest.mark.parametrize("policy", ["on_send", "on_ack"])
TRANSPORTS = pytest.mark.parametrize("kind", ["memory", "libp2p"])

# message id -> (publisher, hint) for every publication of it, first publication first.
Published = dict[str, list[tuple[str, bytes]]]


class Recording:
    """A transport that remembers the hint it returned for each content publication."""

    def __init__(self, inner: Transport, name: str, published: Published) -> None:
        self.inner = inner
        self.name = name
        self.published = published

    async def publish(self, topic: str, data: bytes) -> bytes | None:
        hint = await self.inner.publish(topic, data)
        message = decode(data)
        if message.content is not None and hint is not None:  # sends, resends, repairs
            self.published.setdefault(message.message_id, []).append((self.name, hint))
        return hint

    def subscribe(self, topic: str) -> AsyncIterator[Received]:
        return self.inner.subscribe(topic)

    async def close(self) -> None:
        await self.inner.close()


class Network:
    """Transports of one kind that find each other; libp2p hosts dial those already up."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.memory = MemoryNetwork(
            Faults(loss=0.15, latency_ms=2, jitter_ms=1, duplicate=0.1), seed=4
        )
        self.hosts: dict[str, Transport] = {}
        self.listening: dict[str, list[str]] = {}

    async def transport(self, name: str) -> Transport:
        if self.kind == "memory":
            transport: Transport = self.memory.transport(name)
        else:
            Libp2pTransport = require(  # noqa: N806 -- the class, once importable
                "sdsync.transport.libp2p", "needs the 'p2p' extra"
            ).Libp2pTransport

            peers = [
                addr for other, addrs in self.listening.items() if other != name for addr in addrs
            ]
            host = Libp2pTransport(peers=peers)
            await host.start()
            self.listening[name] = host.listen_addrs
            transport = host
        self.hosts[name] = transport
        return transport

    async def meshed(self) -> None:
        """With libp2p, wait until each host's mesh holds all others: py-libp2p does not
        flood-publish, so frames sent before that reach nobody until resent."""
        if self.kind == "memory":
            return
        from sdsync.transport.libp2p import Libp2pTransport

        for host in self.hosts.values():
            assert isinstance(host, Libp2pTransport)
            assert await host.wait_for_mesh(TOPIC, len(self.hosts) - 1, PATIENCE_S)

    async def drop(self, name: str) -> None:
        """Close a participant's transport, as its process ending would."""
        await self.hosts.pop(name).close()
        self.listening.pop(name, None)

    async def close(self) -> None:
        for name in list(self.hosts):
            await self.drop(name)


class Member:
    """One participant across restarts: its state_dir, and every event it was handed."""

    def __init__(self, name: str, policy: OwnLogPolicy, root: Path, published: Published) -> None:
        self.name = name
        self.config = ChannelConfig(
            bloom=BloomParams(1_000, 0.01),
            causal_history_size=10,
            repair=RepairConfig(t_min_ms=100, t_max_ms=500),  # SDS-R at test speed
            own_log_policy=policy,
        )
        self.state_dir = root / name
        self.published = published
        self.sent: list[str] = []
        self.events: list[Event] = []
        self._consumer: asyncio.Task[None] | None = None
        self._channel: ReliableChannel | None = None

    @property
    def channel(self) -> ReliableChannel:
        assert self._channel is not None, f"{self.name} is not open"
        return self._channel

    def open(self, transport: Transport) -> ReliableChannel:
        """Restore the channel from state_dir (nothing is sent or received before start)."""
        self._channel = ReliableChannel(
            Recording(transport, self.name, self.published),
            CHANNEL,
            self.name,
            config=self.config,
            runtime=FAST,
            rng=random.Random(self.name),
            state_dir=self.state_dir,
        )
        return self._channel

    async def start(self) -> None:
        await self.channel.start()
        self._consumer = asyncio.create_task(self._consume())

    async def _consume(self) -> None:
        # events() raises once the channel has failed; the task then holds that error.
        async for event in self.channel.events():
            self.events.append(event)

    def check_alive(self) -> None:
        """Re-raise whatever failure events() reported (the consumer only ends on one)."""
        if self._consumer is not None and self._consumer.done():
            self._consumer.result()
            raise AssertionError(f"{self.name}: events() ended without an error")

    async def send(self, payload: bytes) -> str:
        mid = await self.channel.send(payload)
        self.sent.append(mid)
        return mid

    async def close(self) -> None:
        """Stop, take the events not consumed yet (handing them off while the state is
        open, so none is replayed), then store and close."""
        channel = self.channel
        await channel.stop()
        self.check_alive()
        if self._consumer is not None:
            self._consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._consumer
            self._consumer = None
        self.events += channel.pending_events()
        await channel.close()
        self._channel = None
        assert not channel.rejected  # every frame came from a participant

    async def abort(self) -> None:
        """Close without checking anything (cleanup after a failure)."""
        if self._consumer is not None:
            self._consumer.cancel()
            with contextlib.suppress(BaseException):
                await self._consumer
            self._consumer = None
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()
            self._channel = None

    def delivered(self) -> Counter[str]:
        return Counter(e.message_id for e in self.events if isinstance(e, MessageDelivered))


def first_hint(published: Published, sender: str, mid: str) -> bytes:
    """The hint the sender's transport returned for the first publication of ``mid``
    (a libp2p resend is a new Waku message with another hash; the first one counts)."""
    assert mid in published, f"{mid} was never published with a hint"
    publisher, hint = published[mid][0]
    assert publisher == sender
    return hint


async def converged(members: list[Member], expected: int) -> None:
    """Until every log holds ``expected`` identical entries and nothing awaits an ack."""

    def settled() -> bool:
        logs = [m.channel.channel.log_ids() for m in members]
        pending = sum(len(m.channel.channel.outgoing_ids()) for m in members)
        return len(logs[0]) == expected and all(log == logs[0] for log in logs) and not pending

    try:
        async with asyncio.timeout(PATIENCE_S):
            while not settled():
                for m in members:
                    m.check_alive()  # a failed channel never converges: say why now
                await asyncio.sleep(0.02)
    except TimeoutError:
        state = {
            m.name: (len(m.channel.channel.log_ids()), m.channel.channel.outgoing_ids())
            for m in members
        }
        pytest.fail(f"no convergence to {expected} entries in {PATIENCE_S} s: {state}")


def check_hints(members: list[Member], published: Published) -> None:
    """Own messages: log and stored history hold the sender's transport hint. Others'
    messages: a hint of one of their publications (with libp2p, whichever copy came first)."""
    for m in members:
        log = m.channel.channel.log
        history = {r.message_id: r for r in m.channel.history()}
        for owner in members:
            for mid in owner.sent:
                entry = log.get(mid)
                assert entry is not None, f"{mid} of {owner.name} is not in {m.name}'s log"
                record = history[mid]
                assert record.sender_id == entry.sender_id == owner.name
                if owner is m:
                    hint = first_hint(published, m.name, mid)
                    assert entry.retrieval_hint == hint
                    assert record.retrieval_hint == hint
                else:
                    heard = {h for _, h in published[mid]}
                    assert entry.retrieval_hint in heard
                    assert record.retrieval_hint == entry.retrieval_hint


def check_delivered_once(members: list[Member]) -> None:
    for m in members:
        others = [mid for o in members if o is not m for mid in o.sent]
        assert m.delivered() == Counter(others), f"{m.name}: deliveries are not exactly once"


class Offline:
    """The transport of a channel opened only to read what it restored: never used."""

    async def publish(self, topic: str, data: bytes) -> bytes | None:
        raise AssertionError("a channel that was not started published")

    def subscribe(self, topic: str) -> AsyncIterator[Received]:
        raise AssertionError("a channel that was not started subscribed")

    async def close(self) -> None:
        pass


async def check_reopened(members: list[Member]) -> None:
    """After everyone closed: each own message's hint was stored in its log row."""
    for m in members:
        channel = m.open(Offline())
        try:
            history = {r.message_id: r.retrieval_hint for r in channel.history()}
            for mid in m.sent:
                hint = first_hint(m.published, m.name, mid)
                assert history[mid] == hint
                entry = channel.channel.log.get(mid)
                assert entry is not None and entry.retrieval_hint == hint
            assert channel.channel.outgoing_ids() == []
        finally:
            await m.close()


async def teardown(members: list[Member], network: Network) -> None:
    """Release whatever a failed test left open, without raising over its error."""
    for m in members:
        await m.abort()
    await network.close()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    # A hang guard only; each wait inside has its own liveness bound.
    asyncio.run(asyncio.wait_for(scenario(), 4 * PATIENCE_S))


async def open_group(
    kind: str, policy: OwnLogPolicy, root: Path
) -> tuple[Network, list[Member], Published]:
    network = Network(kind)
    published: Published = {}
    members = [Member(name, policy, root, published) for name in ("a", "b", "c")]
    for m in members:
        m.open(await network.transport(m.name))
        await m.start()
    await network.meshed()
    return network, members, published


async def close_and_check(members: list[Member]) -> None:
    """Close everyone, reopen from the stored state, and count every delivery."""
    for m in members:
        await m.close()
    await check_reopened(members)  # may hand over replays: counted below
    check_delivered_once(members)


@TRANSPORTS
@POLICIES
def test_own_messages_carry_the_transport_hint_into_log_and_history(
    kind: str, policy: OwnLogPolicy, tmp_path: Path
) -> None:
    async def scenario() -> None:
        network, members, published = await open_group(kind, policy, tmp_path)
        try:
            for i in range(4):
                for m in members:
                    await m.send(f"{m.name} says {i}".encode())
            await converged(members, 12)
            check_hints(members, published)
            await close_and_check(members)
        finally:
            await teardown(members, network)

    run(scenario)


@TRANSPORTS
@POLICIES
def test_an_unacknowledged_message_keeps_its_hint_across_a_restart(
    kind: str, policy: OwnLogPolicy, tmp_path: Path
) -> None:
    async def scenario() -> None:
        network, members, published = await open_group(kind, policy, tmp_path)
        a, b, c = members
        try:
            for m in members:
                await m.send(f"hello from {m.name}".encode())
            await converged(members, 3)
            # With b and c gone nobody can acknowledge what a sends now.
            await b.close()
            await c.close()
            alone = [await a.send(f"alone {i}".encode()) for i in range(2)]
            hints = {mid: first_hint(published, "a", mid) for mid in alone}

            def check_outgoing(channel: ReliableChannel) -> None:
                log = channel.channel.log
                for mid in alone:
                    entry = channel.channel.outgoing_entry(mid)
                    assert entry is not None, f"{mid} is not awaiting acknowledgement"
                    assert entry.retrieval_hint == hints[mid]
                    if policy == "on_ack":
                        assert mid not in log  # the hint can only be on the outgoing entry
                    else:
                        logged = log.get(mid)
                        assert logged is not None and logged.retrieval_hint == hints[mid]

            check_outgoing(a.channel)
            await a.close()
            await network.drop("a")  # the process ends: its host goes too
            # Checked before start: this is what the stored outgoing rows gave back.
            check_outgoing(a.open(await network.transport("a")))
            # b and c only reopen their channels: their hosts stayed up, in the mesh.
            b.open(network.hosts["b"])
            c.open(network.hosts["c"])
            for m in members:
                await m.start()
            await network.meshed()
            await converged(members, 5)
            check_hints(members, published)  # a's messages: acknowledged, hint in the log
            await close_and_check(members)
        finally:
            await teardown(members, network)

    run(scenario)
