"""Admission before relay (issue 37, what a store node forwards): on a topic given to
``admit_before_relay``, a relay message from a peer is delivered and forwarded once its
admission says so — dropped on False or when its admission is cancelled, relayed when it
raises or takes longer than the host waits — and on a channel's topic only that content
topic's messages wait for it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
from transporttest import PATIENCE_S, nothing_more, run

from sdsync.transport import libp2p_host
from sdsync.transport.libp2p import Libp2pNode
from sdsync.waku.node import Envelope
from sdsync.wire.waku import WakuMessage

SHARD = "/waku/2/rs/1/7"
CONTENT_TOPIC = "/sds/1/admission/proto"  # autosharded to SHARD on cluster 1
OTHER_CONTENT = "/other/1/x/proto"
Admit = Callable[[Envelope], Awaitable[bool] | bool]


@dataclass
class Relay:
    """A node between a publisher and a listener, each meshed with it alone."""

    publisher: Libp2pNode
    heard: AsyncIterator[Envelope]

    async def publish(self, payload: bytes, content_topic: str = CONTENT_TOPIC) -> WakuMessage:
        message = WakuMessage(payload, content_topic, timestamp=time.time_ns())
        await self.publisher.publish_message(SHARD, message)
        return message

    async def next_heard(self) -> WakuMessage:
        async with asyncio.timeout(PATIENCE_S):
            return (await anext(self.heard)).message


@contextlib.asynccontextmanager
async def relay_admitting(topic: str, admit: Admit) -> AsyncIterator[Relay]:
    node = Libp2pNode()
    async with node:
        await node.admit_before_relay(topic, admit)
        publisher = Libp2pNode(peers=node.listen_addrs)
        publisher.subscribe_envelopes(SHARD)
        listener = Libp2pNode(peers=node.listen_addrs)
        heard = listener.subscribe_envelopes(SHARD)
        async with publisher, listener:
            for peer in (publisher, listener):
                assert await peer.wait_for_mesh(SHARD, 1, PATIENCE_S)
            yield Relay(publisher, heard)


def test_the_verdict_decides_and_a_failing_admission_relays() -> None:
    async def admit(envelope: Envelope) -> bool:
        payload = envelope.message.payload
        if payload == b"raise":
            raise RuntimeError("a bug in the admission")
        if payload == b"cancel":
            raise asyncio.CancelledError
        await asyncio.sleep(0)
        return payload != b"drop"

    async def scenario() -> None:
        async with relay_admitting(SHARD, admit) as relay:
            for payload in (b"drop", b"cancel", b"raise", b"keep"):
                await relay.publish(payload)
            # Each waits for its admission apart: they may come out in any order.
            heard = {(await relay.next_heard()).payload for _ in range(2)}
            assert heard == {b"raise", b"keep"}
            assert await nothing_more(relay.heard)

    run(scenario)


def test_an_admission_that_takes_too_long_relays_the_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(libp2p_host, "_ADMIT_S", 0.2)
    never = asyncio.Event()

    async def admit(envelope: Envelope) -> bool:
        await never.wait()
        return False

    async def scenario() -> None:
        async with relay_admitting(SHARD, admit) as relay:
            message = await relay.publish(b"stuck archive")
            assert await relay.next_heard() == message
            never.set()

    run(scenario)


def test_on_a_channel_topic_only_its_content_topic_waits() -> None:
    admitted: list[bytes] = []

    def admit(envelope: Envelope) -> bool:
        admitted.append(envelope.message.payload)
        return envelope.message.payload != b"drop"

    async def scenario() -> None:
        async with relay_admitting("/sds/1/admission", admit) as relay:
            await relay.publish(b"drop")
            await relay.publish(b"another application's", OTHER_CONTENT)
            await relay.publish(b"ours")
            heard = {(await relay.next_heard()).payload for _ in range(2)}
            assert heard == {b"another application's", b"ours"}
            assert sorted(admitted) == [b"drop", b"ours"]

    run(scenario)
