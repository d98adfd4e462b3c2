"""js-waku light nodes use an sdsync store node as their only service node.

`sdsync store serve --relay-shard 7`, a real process, is the one peer of two js-waku light
nodes (waku_light/, ``@waku/sdk`` 0.0.36 ``createLightNode``, started with ``--require``
store, lightpush and filter): what light node A pushes over LightPush reaches light node B
through Filter (its content topic only), is archived, and js-waku's store client reads it
back. Two ReliableChannels, one per light node, talk through it both ways with
acknowledgements, and B's channel recovers from our store a message sent before it
joined. Bad frames
sent straight at the LightPush and Filter handlers are refused, logged and counted, and the
node serves on. Every wait is bounded; every process is ended in ``finally``.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest
from storeprocess import StoreProcess, store_serve
from testdeps import require
from waku_drivers import (
    WakuDriver,
    b64,
    connected_client,
    light_node,
    send_cut_frames,
)

from sdsync.waku.filter.rpc import (
    FILTER_SUBSCRIBE_PROTOCOL,
    FilterSubscribeRequest,
    FilterSubscribeResponse,
    FilterSubscribeType,
)
from sdsync.waku.lightpush.rpc import (
    LIGHTPUSH_PROTOCOL,
    LIGHTPUSH_V2_PROTOCOL,
    LightPushRequestV3,
    LightPushResponseV3,
)
from sdsync.wire import decode
from sdsync.wire.waku import WakuMessage

require("sdsync.transport.libp2p", "needs the 'p2p' extra")

pytestmark = pytest.mark.interop

PUBSUB_TOPIC = "/waku/2/rs/1/7"  # every /sds/1/... content topic, autosharded on cluster 1
TOPIC_X = "/sds/1/light-x/proto"
TOPIC_Y = "/sds/1/light-y/proto"  # the same shard, another content topic
WAIT_S = 30.0  # a liveness bound: each step normally takes well under a second
# Fast SDS timers, so that syncs (which carry acknowledgements) and store retrievals
# come within seconds.
CHANNEL_OPTIONS = {
    "syncMinIntervalMs": 500,
    "retryIntervalMs": 1_000,
    "retrieveFrequencyMs": 500,
    "processTaskMinElapseMs": 100,
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreProcess]:
    protocols = (LIGHTPUSH_PROTOCOL, LIGHTPUSH_V2_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL)
    with store_serve(tmp_path_factory.mktemp("light-store"), PUBSUB_TOPIC, *protocols) as store:
        yield store


@pytest.fixture(scope="module")
def light_a(store: StoreProcess) -> Iterator[WakuDriver]:
    yield from light_node(store, "light-a")


@pytest.fixture(scope="module")
def light_b(store: StoreProcess) -> Iterator[WakuDriver]:
    yield from light_node(store, "light-b")


def test_a_lightpushed_message_reaches_filter_subscribers_and_the_store(
    store: StoreProcess, light_a: WakuDriver, light_b: WakuDriver
) -> None:
    assert light_b.ok("filter_subscribe", content_topic=TOPIC_X)["pubsub_topic"] == PUBSUB_TOPIC
    pushed = light_a.ok("lightpush", content_topic=TOPIC_X, payload=b64(b"hello, x"))
    assert pushed["successes"] == [light_a.started["service_peer"]]
    heard = light_b.event(lambda e: e.get("hash") == pushed["hash"], timeout=WAIT_S)
    assert heard["event"] == "filter_message"
    assert base64.b64decode(heard["payload"]) == b"hello, x"
    assert heard["pubsubTopic"] == PUBSUB_TOPIC

    # Subscribed to X, B does not get Y: pushes to one subscriber keep their order, so
    # once the X message pushed after it is in, the Y one would have been too.
    other = light_a.ok("lightpush", content_topic=TOPIC_Y, payload=b64(b"hello, y"))
    after = light_a.ok("lightpush", content_topic=TOPIC_X, payload=b64(b"after y"))
    light_b.event(lambda e: e.get("hash") == after["hash"], timeout=WAIT_S)
    with pytest.raises(AssertionError):
        light_b.event(lambda e: e.get("hash") == other["hash"], timeout=1.0)

    # Archived once each (our relay does not hand our own publication back), and
    # js-waku's store client reads them.
    assert store.metric("sdsync_store_ingested_messages_total", source="lightpush") >= 3
    assert store.metric("sdsync_store_duplicate_messages_total", source="lightpush") == 0
    hashes = [pushed["hash"], other["hash"], after["hash"]]
    found = light_b.ok("store_query", content_topics=[TOPIC_X, TOPIC_Y], hashes=hashes)
    assert sorted(found["hashes"]) == sorted(hashes)


def reliable(driver: WakuDriver, channel: str, kind: str, **detail: Any) -> dict[str, Any]:
    """The next ReliableChannel event of ``kind`` on ``channel`` whose detail has ``detail``."""

    def match(event: dict[str, Any]) -> bool:
        found = event.get("detail")
        return (
            event.get("event") == "reliable"
            and event.get("channel_id") == channel
            and event.get("type") == kind
            and all(isinstance(found, dict) and found.get(k) == v for k, v in detail.items())
        )

    return driver.event(match, timeout=WAIT_S)


def create_channel(driver: WakuDriver, channel: str, sender: str, content_topic: str) -> None:
    created = driver.ok(
        "reliable_channel_create",
        channel_id=channel,
        sender_id=sender,
        content_topic=content_topic,
        options=CHANNEL_OPTIONS,
    )
    # Mended as the chat page's channel is (web/src/mends.mjs), every mend applying to
    # the sdk the driver pins.
    mends = created["mends"]
    assert mends["installed"] == mends["written_for"], mends
    assert (mends["skipped"], mends["warnings"]) == ([], []), mends


def test_reliable_channels_of_two_light_nodes_talk_through_our_node(
    store: StoreProcess, light_a: WakuDriver, light_b: WakuDriver
) -> None:
    channel, topic = "light-chat", "/sds/1/light-chat/proto"
    create_channel(light_a, channel, "alice", topic)
    create_channel(light_b, channel, "bob", topic)
    first = light_a.ok("reliable_send", channel_id=channel, payload=b64(b"hi bob"))
    got = reliable(light_b, channel, "message-received", payload=b64(b"hi bob"))
    assert got["detail"]["pubsubTopic"] == PUBSUB_TOPIC
    light_b.ok("reliable_send", channel_id=channel, payload=b64(b"hi alice"))
    reliable(light_a, channel, "message-received", payload=b64(b"hi alice"))
    # B's message (and its syncs) name A's in their causal history.
    acknowledged = reliable(light_a, channel, "message-acknowledged")
    assert acknowledged["detail"] == first["message_id"]


def test_a_message_sent_before_a_channel_joined_is_in_our_store(
    store: StoreProcess, light_a: WakuDriver, light_b: WakuDriver
) -> None:
    channel, topic = "light-missed", "/sds/1/light-missed/proto"
    create_channel(light_a, channel, "alice", topic)
    light_a.ok("reliable_send", channel_id=channel, payload=b64(b"before bob"))
    reliable(light_a, channel, "message-sent")
    # B joins late: it was subscribed to nothing on this topic when A sent.
    create_channel(light_b, channel, "bob", topic)
    light_a.ok("reliable_send", channel_id=channel, payload=b64(b"bob is here"))
    reliable(light_b, channel, "message-received", payload=b64(b"bob is here"))
    # The second names the first in its causal history, with its Waku message hash as
    # the retrieval hint; B's channel asks our store for it by that hash. (js-waku takes
    # the hint from an encoding of its own and LightPush encodes again, each stamping the
    # time: the driver keeps the first stamp, as the chat page does: stamp-once in
    # web/src/mends.mjs.)
    reliable(light_b, channel, "message-received", payload=b64(b"before bob"))
    # The store client gets it by its hash too.
    history = light_b.ok("store_query", content_topic=topic)["messages"]
    contents = {decode(base64.b64decode(m["payload"])).content: m["hash"] for m in history}
    assert b"before bob" in contents, contents
    by_hash = light_b.ok("store_query", content_topic=topic, hashes=[contents[b"before bob"]])
    assert by_hash["hashes"] == [contents[b"before bob"]]


def test_bad_requests_are_refused_and_counted_and_the_node_serves_on(
    store: StoreProcess,
) -> None:
    async def scenario() -> None:
        async with connected_client(store) as (client, server):
            for protocol in (LIGHTPUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL):
                await send_cut_frames(client, server, protocol)
            # Not a protobuf of either: 400.
            answer = await client.request(server, LIGHTPUSH_PROTOCOL, b"\xff\xff\xff")
            assert LightPushResponseV3.from_bytes(answer).status_code == 400
            answer = await client.request(server, FILTER_SUBSCRIBE_PROTOCOL, b"\xff\xff\xff")
            assert FilterSubscribeResponse.from_bytes(answer).status_code == 400
            # Well-formed, but not acceptable: no timestamp (420), a shard we do not
            # relay (421), a Filter topic we do not serve (400).
            untimed = WakuMessage(b"x", TOPIC_X)
            answer = await client.request(
                server, LIGHTPUSH_PROTOCOL, LightPushRequestV3("r1", message=untimed).to_bytes()
            )
            assert LightPushResponseV3.from_bytes(answer).status_code == 420
            timed = WakuMessage(b"x", TOPIC_X, timestamp=time.time_ns())
            elsewhere = LightPushRequestV3("r2", "/waku/2/rs/1/3", timed)
            answer = await client.request(server, LIGHTPUSH_PROTOCOL, elsewhere.to_bytes())
            assert LightPushResponseV3.from_bytes(answer) == LightPushResponseV3(
                "r2", 421, LightPushResponseV3.from_bytes(answer).status_desc
            )
            subscribe = FilterSubscribeRequest(
                "r3", FilterSubscribeType.SUBSCRIBE, "/waku/2/rs/1/3", (TOPIC_X,)
            )
            answer = await client.request(server, FILTER_SUBSCRIBE_PROTOCOL, subscribe.to_bytes())
            assert FilterSubscribeResponse.from_bytes(answer).status_code == 400
            # And a good push still goes through.
            good = LightPushRequestV3("r4", PUBSUB_TOPIC, timed)
            answer = await client.request(server, LIGHTPUSH_PROTOCOL, good.to_bytes())
            assert LightPushResponseV3.from_bytes(answer).status_code == 200

    asyncio.run(scenario())
    for route in (LIGHTPUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL):
        refused = store.metric("sdsync_store_refused_total", route=route, reason="malformed_rpc")
        assert refused == 1.0
    assert store.metric("sdsync_store_refused_total", reason="no_timestamp") == 1.0
    assert store.metric("sdsync_store_lightpush_total", status="421") == 1.0
    store.wait_logged("refused", 6)
