"""A js-waku light node receives N Filter pushes from our store node: none lost, none
twice, and its connection never dropped.

js-waku (``@waku/sdk`` 0.0.36) never closes its side of a Filter push stream and refuses a
peer's 101st inbound stream of a protocol, then closes the whole connection: a service node
that opens a stream per push loses the light node after 100 pushes. `sdsync store serve
--relay-shard 7` (a real process) is the light node's one service node (waku_light/,
``filter_tally_subscribe``: pushes are counted by payload in the driver, not printed).
A Python LightPush client pushes the messages to the store node, eight requests in
flight at a time, in windows of ``WINDOW`` (the store node queues at most 256 pushes per
subscriber, more are dropped by design: a window never outruns that queue), so each
window is a burst of pushes back to back to the light node. N is 1,000, or 10,000 with
SDSYNC_SOAK=1 (``make soak``).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from storeprocess import StoreProcess, store_serve
from testdeps import require
from waku_drivers import WakuDriver, connected_client, light_node

from sdsync.testing.hostile import soak_scale
from sdsync.waku.filter.rpc import FILTER_PUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL
from sdsync.waku.lightpush.rpc import LIGHTPUSH_PROTOCOL, LightPushRequestV3, LightPushResponseV3
from sdsync.wire.waku import WakuMessage

if TYPE_CHECKING:
    from sdsync.transport.libp2p import Libp2pTransport

require("sdsync.transport.libp2p", "needs the 'p2p' extra")

pytestmark = pytest.mark.interop

PUBSUB_TOPIC = "/waku/2/rs/1/7"  # /sds/1/... content topics, autosharded on cluster 1
# The load is the point: no LightPush rate limit (its default would answer 429).
UNLIMITED = ("--lightpush-rate-limit", "off")
TOPIC = "/sds/1/filter-load/proto"
PUSHES = soak_scale(1_000, 10_000)
WINDOW = 200
IN_FLIGHT = 8
WAIT_S = 60.0  # a liveness bound per window: one normally takes well under a second


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreProcess]:
    protocols = (LIGHTPUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL)
    data_dir = tmp_path_factory.mktemp("filter-load")
    with store_serve(data_dir, PUBSUB_TOPIC, *protocols, flags=UNLIMITED) as store:
        yield store


@pytest.fixture(scope="module")
def light(store: StoreProcess) -> Iterator[WakuDriver]:
    yield from light_node(store, "filter-load", require=("filter",))


def payload(i: int) -> bytes:
    return b"load %d" % i


async def lightpush_window(
    client: Libp2pTransport, server: str, numbers: range, slots: asyncio.Semaphore
) -> None:
    """LightPush one message per number, ``IN_FLIGHT`` requests at a time; each answered 200."""

    async def one(i: int) -> None:
        message = WakuMessage(payload(i), TOPIC, timestamp=time.time_ns())
        request = LightPushRequestV3(f"load-{i}", PUBSUB_TOPIC, message).to_bytes()
        async with slots:
            answer = await client.request(server, LIGHTPUSH_PROTOCOL, request)
        assert LightPushResponseV3.from_bytes(answer).status_code == 200

    await asyncio.gather(*(one(i) for i in numbers))


async def tallied(light: WakuDriver, count: int) -> int:
    """Until the light node has received ``count`` pushes; how many it has."""
    deadline = time.monotonic() + WAIT_S
    while True:
        received: int = (await asyncio.to_thread(light.ok, "filter_tally"))["received"]
        if received >= count or time.monotonic() > deadline:
            return received
        await asyncio.sleep(0.05)


def pushes(store: StoreProcess) -> dict[str, float]:
    return {
        outcome: store.metric("sdsync_store_filter_pushes_total", outcome=outcome)
        for outcome in ("sent", "failed", "dropped")
    }


def test_a_js_waku_light_node_gets_every_filter_push_without_a_dropped_connection(
    store: StoreProcess, light: WakuDriver
) -> None:
    assert light.ok("filter_tally_subscribe", content_topic=TOPIC)["pubsub_topic"] == PUBSUB_TOPIC
    service = light.started["service_peer"]

    async def scenario() -> None:
        slots = asyncio.Semaphore(IN_FLIGHT)
        async with connected_client(store) as (client, server):
            for start in range(0, PUSHES, WINDOW):
                window = range(start, min(start + WINDOW, PUSHES))
                await lightpush_window(client, server, window, slots)
                received = await tallied(light, window.stop)
                log = light.ok("connection_log")
                assert received == window.stop, (received, pushes(store), log)

    asyncio.run(scenario())
    tally = light.ok("filter_tally", payloads=True, timeout=60)
    assert tally["received"] == PUSHES and tally["duplicates"] == 0
    expected = {base64.b64encode(payload(i)).decode() for i in range(PUSHES)}
    assert set(tally["payloads"]) == expected
    connections = light.ok("connection_log")
    assert connections["closed"] == 0, connections
    assert [peer["peer_id"] for peer in light.ok("peers")["peers"]] == [service]
    # One push lane, not a stream per push (js-waku would have refused the 101st).
    assert connections["open_streams"].get(FILTER_PUSH_PROTOCOL, 0) <= 1, connections
    assert pushes(store) == {"sent": PUSHES, "failed": 0, "dropped": 0}
