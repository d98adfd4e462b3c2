"""RelayTransport: SDS bytes over any Waku node's relay, here MemoryWakuNodes (no py-libp2p).

The same adapter is Libp2pTransport's publish and subscribe (tests/transport/test_libp2p.py
runs it over real hosts); here it is shown generic over the relay half of the contract.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from sdsync.errors import LocalProtocolError
from sdsync.testing.memory import MemoryNetwork
from sdsync.waku.node import Envelope, Received
from sdsync.waku.relay.transport import RelayTransport
from sdsync.wire import WakuMessage

TOPIC = "/sds/1/chan"
SHARD = "/waku/2/rs/1/7"  # /sds/1/chan/proto autosharded on cluster 1


def run(scenario: Callable[[MemoryNetwork], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(MemoryNetwork()), 10.0))


def test_sds_bytes_travel_in_waku_messages_with_their_hash_as_hint() -> None:
    async def scenario(net: MemoryNetwork) -> None:
        alice = RelayTransport(net.waku_node("alice"), clock_ns=lambda: 7)
        bob = RelayTransport(net.waku_node("bob"))
        frames, shard = bob.subscribe(TOPIC), bob.subscribe(SHARD)
        envelopes = net.waku_node("store").subscribe_envelopes(SHARD)
        hints = [await alice.publish(TOPIC, b"sds") for _ in range(2)]
        first, second = await anext(envelopes), await anext(envelopes)
        # A frozen clock still stamps each publication afresh: a resend is a new message.
        assert [first.message.timestamp, second.message.timestamp] == [7, 8]
        assert first.message.content_topic == "/sds/1/chan/proto"
        assert hints == [first.message_hash, second.message_hash] and hints[0] != hints[1]
        assert [await anext(frames) for _ in hints] == [Received(b"sds", h) for h in hints]
        # Another application's message on the shard reaches a shard subscriber only.
        other = WakuMessage(b"theirs", "/other/1/x/proto", timestamp=1)
        await alice.node.publish_message(SHARD, other)
        await alice.publish(TOPIC, b"ours")
        assert (await anext(frames)).data == b"ours"
        assert [(await anext(shard)).data for _ in range(4)] == [b"sds", b"sds", b"theirs", b"ours"]

    run(scenario)


class Inbox:
    """Envelopes from a queue, as a Libp2pNode's subscription hands them over: a wait
    cancelled is that wait only."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Envelope] = asyncio.Queue()

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> Envelope:
        return await self.queue.get()


def test_a_reader_that_gives_up_waiting_reads_on() -> None:
    async def scenario(net: MemoryNetwork) -> None:
        node, inbox = net.waku_node("bob"), Inbox()
        node.subscribe_envelopes = lambda topic: inbox  # type: ignore[method-assign]
        frames = RelayTransport(node).subscribe(TOPIC)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await anext(frames)
        message = WakuMessage(b"later", "/sds/1/chan/proto", timestamp=1)
        inbox.queue.put_nowait(Envelope(SHARD, message, message.hash(SHARD)))
        assert await anext(frames) == Received(b"later", message.hash(SHARD))

    run(scenario)


def test_start_and_close_are_the_nodes() -> None:
    async def scenario(net: MemoryNetwork) -> None:
        bob = RelayTransport(net.waku_node("bob"))
        async with bob:
            frames = bob.subscribe(TOPIC)
        assert [frame async for frame in frames] == []
        with pytest.raises(LocalProtocolError, match="closed"):
            bob.subscribe(TOPIC)

    run(scenario)


def test_a_node_that_relays_nothing_refuses_at_once() -> None:
    async def scenario(net: MemoryNetwork) -> None:
        light = RelayTransport(net.waku_node("light", relay=False))
        with pytest.raises(LocalProtocolError, match="relay=False"):
            light.subscribe(TOPIC)  # not at the first iteration
        with pytest.raises(LocalProtocolError, match="relay=False"):
            await light.publish(TOPIC, b"x")

    run(scenario)
