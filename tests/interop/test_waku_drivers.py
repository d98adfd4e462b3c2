"""The js-waku drivers work on their own, JS against JS on 127.0.0.1.

Self-checks of the test tools in waku_relay/ and waku_light/ (see waku_drivers.py): two
relay nodes exchange messages both ways, and the light node starts, or says in one JSON
line why it cannot. The interop tests built on these drivers can then fail only for
sdsync's reasons.
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from waku_drivers import (
    LIGHT_DIR,
    RELAY_DIR,
    Event,
    WakuDriver,
    b64,
    light_argv,
    relay_argv,
    require_driver,
)

from sdsync.wire.waku import WakuMessage

pytestmark = pytest.mark.interop

TOPIC = "/sds/1/probe/proto"
PUBSUB_TOPIC = "/waku/2/rs/1/7"  # TOPIC's autosharding on cluster 1 (8 shards)
RELAY_CODEC = "/vac/waku/relay/2.0.0"
SOME_PEER_ID = "12D3KooWLteLJhV37rBqUg6Rr4vFKENAh9p9W7oc7zyot5cnCbdD"

Starter = Callable[..., WakuDriver]


def closed_port() -> int:
    """A loopback port nobody listens on (it was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def message_event(hash_hex: str) -> Callable[[Event], bool]:
    return lambda event: event["event"] == "message" and event["hash"] == hash_hex


@pytest.fixture
def start() -> Iterator[Starter]:
    drivers: list[WakuDriver] = []

    def start_driver(name: str, argv: list[str]) -> WakuDriver:
        driver = WakuDriver(name, argv)
        drivers.append(driver)
        return driver

    try:
        yield start_driver
    finally:
        for driver in drivers:
            driver.close()


@pytest.fixture
def relay(start: Starter) -> Starter:
    require_driver(RELAY_DIR)

    def start_relay(name: str, **options: Any) -> WakuDriver:
        driver = start(name, relay_argv(**options))
        assert driver.started["ok"], driver.started
        return driver

    return start_relay


@pytest.fixture
def light(start: Starter) -> Starter:
    require_driver(LIGHT_DIR)
    return lambda name, peer, **options: start(name, light_argv(peer, **options))


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_two_relay_nodes_exchange_messages_both_ways(relay: Starter, transport: str) -> None:
    alice = relay("alice", content_topics=[TOPIC], ws=transport == "ws")
    bob = relay("bob", content_topics=[TOPIC])
    assert alice.started["pubsub_topics"] == [PUBSUB_TOPIC]
    address = next(a for a in alice.started["multiaddrs"] if ("/ws/" in a) == (transport == "ws"))
    assert address.startswith("/ip4/127.0.0.1/tcp/")
    assert bob.ok("dial", multiaddr=address)["peer_id"] == alice.started["peer_id"]
    for node in (alice, bob):
        assert node.ok("subscribe", content_topic=TOPIC)["pubsub_topic"] == PUBSUB_TOPIC
    for node, other in ((alice, bob), (bob, alice)):
        subscribers = node.ok("wait_subscribers", pubsub_topic=PUBSUB_TOPIC)["subscribers"]
        assert subscribers == [other.started["peer_id"]]

    for n, (sender, receiver) in enumerate(((alice, bob), (bob, alice), (alice, bob))):
        payload = f"hello {n} from {sender.name}".encode()
        sent = sender.ok(
            "publish", content_topic=TOPIC, payload=b64(payload), timestamp_ms=1_700_000_000_000 + n
        )
        assert sent["recipients"] == [receiver.started["peer_id"]]
        assert sent["timestamp"] == str((1_700_000_000_000 + n) * 1_000_000)
        ours = WakuMessage(payload, TOPIC, timestamp=int(sent["timestamp"]))
        assert sent["hash"] == ours.hash(PUBSUB_TOPIC).hex()
        got = receiver.event(message_event(sent["hash"]))
        assert base64.b64decode(got["payload"]) == payload
        fields = ("contentTopic", "pubsubTopic", "timestamp", "meta", "version", "ephemeral")
        assert {k: got[k] for k in fields} == {k: sent[k] for k in fields}

    peers = alice.ok("peers")
    [bob_seen] = peers["peers"]
    assert bob_seen["peer_id"] == bob.started["peer_id"]
    assert RELAY_CODEC in bob_seen["protocols"]
    assert peers["topics"][PUBSUB_TOPIC]["subscribers"] == [bob.started["peer_id"]]


def test_relay_driver_answers_every_error_as_one_json_line(relay: Starter) -> None:
    alone = relay("alone", shards=[0])
    assert alone.started["pubsub_topics"] == ["/waku/2/rs/1/0"]
    hello = b64(b"hello")
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"op": "publish", "content_topic": TOPIC, "shard": 0, "payload": hello},
            "publish failed: PublishError.NoPeersSubscribedToTopic",
        ),
        (
            {"op": "publish", "content_topic": TOPIC, "payload": hello},
            f"publish bad request: {PUBSUB_TOPIC} is not a topic this node relays",
        ),
        (
            {"op": "subscribe", "content_topic": TOPIC},
            f"subscribe bad request: {PUBSUB_TOPIC} is not a topic this node relays",
        ),
        (
            {"op": "publish", "shard": 0, "payload": hello},
            'publish bad request: "content_topic" must be a string',
        ),
        (
            {"op": "publish", "content_topic": TOPIC, "shard": 0, "payload": "not base64!"},
            'publish bad request: "payload" must be standard base64',
        ),
        (
            {"op": "dial", "multiaddr": f"/ip4/127.0.0.1/tcp/{closed_port()}/p2p/{SOME_PEER_ID}"},
            "dial failed: ",
        ),
        ({"op": "fly"}, 'bad request: unknown op "fly"'),
    ]
    for request, error in cases:
        reply = alone.request(**request)
        assert reply["ok"] is False
        assert reply["error"].startswith(error), (request, reply)
    assert alone.ok("shard_of", content_topic=TOPIC) == {
        "ok": True,
        "shard": 7,
        "pubsub_topic": PUBSUB_TOPIC,
    }
    assert alone.ok("peers")["peers"] == []  # still answering after all that


def test_relay_driver_without_topics_says_why_it_did_not_start(start: Starter) -> None:
    require_driver(RELAY_DIR)
    driver = start("no-topics", relay_argv())
    assert driver.started["ok"] is False
    assert "give either --shard or --content-topic" in driver.started["error"]
    assert driver.proc.wait(timeout=10) == 1


def test_light_node_starts_against_a_service_node(relay: Starter, light: Starter) -> None:
    service = relay("service", content_topics=[TOPIC])
    node = light("light", service.started["multiaddrs"][0], require=())
    assert node.started["ok"], node.started
    assert node.started["service_peer"] == service.started["peer_id"]
    assert RELAY_CODEC in node.started["service_protocols"]
    [seen] = node.ok("peers")["peers"]
    assert seen["peer_id"] == service.started["peer_id"]
    # A relay node serves none of the light protocols: each op says so, and the driver lives on.
    failures: dict[str, dict[str, Any]] = {
        "store_query": {"content_topic": TOPIC},
        "lightpush": {"content_topic": TOPIC, "payload": b64(b"hello")},
        "filter_subscribe": {"content_topic": TOPIC},
    }
    for op, fields in failures.items():
        reply = node.request(op, **fields)
        assert reply["ok"] is False and reply["error"].startswith(f"{op} failed: "), reply
    reply = node.request("reliable_send", channel_id="nope", payload=b64(b"x"))
    assert reply["error"].startswith('reliable_send bad request: no reliable channel "nope"')


def test_light_node_names_the_protocols_its_service_node_lacks(
    relay: Starter, light: Starter
) -> None:
    service = relay("service", content_topics=[TOPIC])
    node = light("light", service.started["multiaddrs"][0], timeout_ms=2_000)
    assert node.started["ok"] is False
    error = node.started["error"]
    assert error.startswith("light node did not start: timed out after 2000 ms: ")
    assert (
        "lacks store (/vac/waku/store-query/3.0.0), lightpush (/vac/waku/lightpush/3.0.0), "
        "filter (/vac/waku/filter-subscribe/2.0.0-beta1)"
    ) in error
    assert RELAY_CODEC in error
    assert node.proc.wait(timeout=10) == 1


def test_light_node_reports_an_unreachable_service_node(light: Starter) -> None:
    peer = f"/ip4/127.0.0.1/tcp/{closed_port()}/p2p/{SOME_PEER_ID}"
    node = light("light", peer, timeout_ms=5_000)
    assert node.started["ok"] is False
    assert node.started["error"].startswith(
        f"light node did not start: service node {peer} is not reachable: "
    )
    assert "ECONNREFUSED" in node.started["error"]
    assert node.proc.wait(timeout=10) == 1
