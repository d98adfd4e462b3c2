"""The Python light client through go-waku's LightPush and Filter, and through our own
store node's, with the same test code.

Each test runs once per service kind: a go-waku 0.9.0 node on cluster 1 with
``--lightpush --filter`` (and a second go-waku node as its relay peer: go-waku refuses a
push it has no relay peer to publish to), or ``sdsync store serve --relay-shard 7``. Two
WakuLightTransports use it as their only service: what one pushes the other receives
by Filter, with the same Waku message hash as retrieval hint on both sides; then two
ReliableChannels over light clients converge, acknowledgements and all. go-waku speaks
LightPush 2.0.0-beta1 only: the client finds out on its first push and stays there.

go-waku comes from the ``go_waku_nodes`` fixture (skips naming SDSYNC_GO_WAKU without a
binary, fails in CI). Deadlines are liveness bounds only.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from storeprocess import store_serve

from sdsync.core import BloomParams, ChannelConfig, RepairConfig
from sdsync.runtime import ReliableChannel, RuntimeConfig
from sdsync.testing.gowaku import GoWakuOptions
from sdsync.transport.waku_light import LightTiming, WakuLightTransport
from sdsync.waku.filter.rpc import FILTER_SUBSCRIBE_PROTOCOL
from sdsync.waku.lightpush.rpc import LIGHTPUSH_PROTOCOL

pytestmark = pytest.mark.interop

SHARD = "/waku/2/rs/1/7"
PATIENCE_S = 60.0  # liveness bound
TIMING = LightTiming(ping_interval_s=2.0, retry_min_s=0.3, retry_max_s=2.0)
RUNTIME = RuntimeConfig(
    sync_interval_ms=300,
    resend_interval_ms=500,
    resend_possibly_acknowledged_ms=1_500,
    max_resend_interval_ms=2_000,
    incoming_sweep_ms=100,
)
CONFIG = ChannelConfig(
    bloom=BloomParams(1_000, 0.01), repair=RepairConfig(t_min_ms=200, t_max_ms=1_000)
)


@pytest.fixture(params=["go-waku", "sdsync"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A service node's multiaddr: go-waku's (with a go-waku relay peer) or our store's."""
    if request.param == "sdsync":
        with store_serve(tmp_path, SHARD, LIGHTPUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL) as store:
            yield store.relay_addrs[0]
        return
    start = request.getfixturevalue("go_waku_nodes")
    relay_peer = start(GoWakuOptions(), name="relay-peer")
    node = start(
        GoWakuOptions(lightpush=True, filter=True, static_nodes=[relay_peer.address]),
        name="service",
    )
    deadline = time.monotonic() + PATIENCE_S
    while relay_peer.peer_id not in node.connected_peers():
        assert time.monotonic() < deadline, node.log()
        time.sleep(0.2)
    yield node.address


@contextlib.asynccontextmanager
async def light_clients(service: str, count: int) -> AsyncIterator[list[WakuLightTransport]]:
    clients = [
        WakuLightTransport([service], topics=["/sds/1/x"], timing=TIMING) for _ in range(count)
    ]
    try:
        for light in clients:
            await light.start()
        yield clients
    finally:
        for light in clients:
            await light.close()


async def wait_until(check: Any, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not check():
        assert time.monotonic() < deadline, f"not within {PATIENCE_S} s: {what}"
        await asyncio.sleep(0.05)


def test_light_clients_push_and_receive_through_the_service(service: str) -> None:
    topic = "/sds/1/go-waku-light"

    async def scenario() -> None:
        async with light_clients(service, 2) as [alice, bob]:
            heard = {light: light.subscribe(topic) for light in (alice, bob)}
            for light in (alice, bob):
                assert await light.wait_for_mesh(topic, 1, PATIENCE_S), light.plan.subscribed()
            for sender, receiver in ((alice, bob), (bob, alice)):
                for i in range(3):
                    payload = f"{sender.peer_id[-4:]} {i}".encode()
                    hint = await sender.lightpush(topic, payload)
                    async with asyncio.timeout(PATIENCE_S):
                        got = await anext(heard[receiver])
                    assert (got.data, got.retrieval_hint) == (payload, hint)
            # Each heard its own messages back (deduplicated), nothing else.
            for light in (alice, bob):
                await wait_until(lambda light=light: light.duplicates == 3, "own pushes back")
                assert light.received == 3 and not light.rejected

    asyncio.run(scenario())


def test_reliable_channels_over_light_clients_converge(service: str) -> None:
    n = 8

    async def scenario() -> None:
        async with light_clients(service, 2) as clients:
            channels = [
                ReliableChannel(
                    light, "light-pair", name, config=CONFIG, runtime=RUNTIME, rng=random.Random(i)
                )
                for i, (light, name) in enumerate(zip(clients, ("alice", "bob"), strict=True))
            ]
            for channel in channels:
                await channel.start()
            try:
                for light in clients:
                    assert await light.wait_for_mesh("/sds/1/light-pair", 1, PATIENCE_S)
                for i in range(n):
                    for channel in channels:
                        await channel.send(f"{channel.channel.participant_id} {i}".encode())

                def done() -> bool:
                    logs = [c.channel.log_ids() for c in channels]
                    pending = sum(len(c.channel.outgoing_ids()) for c in channels)
                    return len(logs[0]) == 2 * n and logs[0] == logs[1] and not pending

                await wait_until(done, "both logs complete and every message acknowledged")
            finally:
                for channel in channels:
                    await channel.close()

    asyncio.run(scenario())
