"""go-waku 0.9.0's Filter client, subscribed to `sdsync store serve`, gets every push.

go-waku's Filter client reads exactly one MessagePush per stream and closes it (and its
muxer drops anything written after that, unread): our push lanes must learn that and
give it a stream per push. A go-waku node whose filter node is our store
(``--filternode``) subscribes through its REST API (``POST /filter/v2/subscriptions``); a
Python LightPush client pushes ``PUSHES`` messages to our store, which pushes each to
go-waku by Filter. go-waku logs "received message push" for every push it reads and
takes: there must be exactly ``PUSHES`` of them, its REST cache must hold every message,
and it must stay connected to our store.

The go-waku node relays shard 7 as well, so messages also reach it by relay (its log
lines, not its cache, tell the pushes): go-waku 0.9.0 without relay has no shard in its
ENR and fails its own metadata request ("invalid shard count"), dropping every peer on
cluster 1; and relaying another shard, it never learns that our store serves shard 7
(it learns peers' shards from gossipsub only) and finds no filter peer for it.
"""

from __future__ import annotations

import asyncio
import base64
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from storeprocess import StoreProcess, store_serve
from testdeps import require
from waku_drivers import connected_client

from sdsync.waku.filter.rpc import FILTER_SUBSCRIBE_PROTOCOL
from sdsync.waku.lightpush.rpc import LIGHTPUSH_PROTOCOL, LightPushRequestV3, LightPushResponseV3
from sdsync.wire.waku import WakuMessage

require("sdsync.transport.libp2p", "needs the 'p2p' extra")

pytestmark = pytest.mark.interop

PUBSUB_TOPIC = "/waku/2/rs/1/7"
# The load is the point: no LightPush rate limit (its default would answer 429).
UNLIMITED = ("--lightpush-rate-limit", "off")
TOPIC = "/sds/1/go-filter/proto"
PUSHES = 200
WAIT_S = 60.0  # a liveness bound: all of it normally takes a few seconds


@pytest.fixture
def store(tmp_path: Any) -> Iterator[StoreProcess]:
    protocols = (LIGHTPUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL)
    with store_serve(tmp_path / "store", PUBSUB_TOPIC, *protocols, flags=UNLIMITED) as store:
        yield store


def subscribed(go_waku: Any) -> None:
    """Subscribe go-waku to TOPIC through its filter node, once it knows that node."""
    deadline = time.monotonic() + WAIT_S
    body = {"requestId": "load", "contentFilters": [TOPIC], "pubsubTopic": PUBSUB_TOPIC}
    while True:
        try:
            answer = go_waku.rest("POST", "/filter/v2/subscriptions", body)
            assert answer["statusDesc"] == "OK", answer
            return
        except OSError as exc:  # no filter peer identified yet: 503
            if time.monotonic() > deadline:
                raise AssertionError(f"{exc}\n{go_waku.log()[-3000:]}") from exc
            time.sleep(0.5)


def cached_payloads(go_waku: Any) -> set[bytes]:
    """The payloads in go-waku's Filter REST cache for TOPIC."""
    path = "/filter/v2/messages/{}/{}".format(
        urllib.parse.quote(PUBSUB_TOPIC, safe=""), urllib.parse.quote(TOPIC, safe="")
    )
    return {base64.b64decode(m["payload"]) for m in go_waku.rest("GET", path) or []}


def pushes_read(go_waku: Any) -> int:
    """MessagePushes go-waku read and took for its subscription (one log line each)."""
    return int(go_waku.log().count("received message push"))


async def lightpush_all(store: StoreProcess) -> None:
    async with connected_client(store) as (client, server):
        for i in range(PUSHES):
            message = WakuMessage(b"go %d" % i, TOPIC, timestamp=time.time_ns())
            request = LightPushRequestV3(f"go-{i}", PUBSUB_TOPIC, message).to_bytes()
            answer = await client.request(server, LIGHTPUSH_PROTOCOL, request)
            assert LightPushResponseV3.from_bytes(answer).status_code == 200


def test_go_waku_filter_client_gets_every_push_from_our_store(
    store: StoreProcess, go_waku_nodes: Any
) -> None:
    from sdsync.testing.gowaku import GoWakuOptions

    go_waku = go_waku_nodes(
        GoWakuOptions(
            extra=(
                f"--filternode={store.relay_addrs[0]}",
                f"--rest-filter-cache-capacity={2 * PUSHES}",
            ),
        ),
        name="go-waku-filter-client",
    )
    subscribed(go_waku)
    asyncio.run(lightpush_all(store))
    # The REST cache keeps what it holds across reads, relayed copies included.
    expected = {b"go %d" % i for i in range(PUSHES)}
    deadline = time.monotonic() + WAIT_S
    while (cached := cached_payloads(go_waku)) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cached == expected, go_waku.log()[-3000:]
    deadline = time.monotonic() + WAIT_S
    while pushes_read(go_waku) < PUSHES and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pushes_read(go_waku) == PUSHES
    sent = store.metric("sdsync_store_filter_pushes_total", outcome="sent")
    assert sent == PUSHES
    assert store.metric("sdsync_store_filter_pushes_total", outcome="failed") == 0
    store_id = store.relay_addrs[0].rsplit("/", 1)[1]
    assert store_id in go_waku.connected_peers()
