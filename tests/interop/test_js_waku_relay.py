"""Waku Relay between our transport and js-waku's own relay node.

waku_relay/relay.mjs (``@waku/sdk`` 0.0.27 ``createRelayNode``) and a
:class:`~sdsync.transport.Libp2pTransport` in this process exchange messages both ways,
each received once under the same Waku message hash, whoever dials, over TCP and over our
websocket listener; ours relays between two js-waku nodes; and js-waku drops a message
signed py-libp2p's way (``from`` + ``seqno``), which is why we publish unsigned.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from testdeps import require
from transporttest import PATIENCE_S, nothing_more, run, take
from waku_drivers import RELAY_DIR, WakuDriver, b64, relay_argv, require_driver

from sdsync.transport import Received
from sdsync.waku.metadata.rpc import METADATA_PROTOCOL
from sdsync.waku.relay.topics import RELAY_PROTOCOL
from sdsync.wire import WakuMessage

if TYPE_CHECKING:
    from sdsync.transport.libp2p import Libp2pTransport

libp2p = require("sdsync.transport.libp2p", "needs the 'p2p' extra")

pytestmark = pytest.mark.interop

TOPIC = "/sds/1/probe"  # what a channel names
CONTENT_TOPIC = "/sds/1/probe/proto"
PUBSUB_TOPIC = "/waku/2/rs/1/7"  # CONTENT_TOPIC autosharded on cluster 1 (REFERENCE §7)


async def waku_node(**options: Any) -> Libp2pTransport:
    transport: Libp2pTransport = libp2p.Libp2pTransport(**options)
    await transport.start()
    return transport


@pytest.fixture
def js() -> Iterator[Callable[..., WakuDriver]]:
    require_driver(RELAY_DIR)
    drivers: list[WakuDriver] = []

    def start(name: str, **options: Any) -> WakuDriver:
        driver = WakuDriver(name, relay_argv(content_topics=[CONTENT_TOPIC], **options))
        drivers.append(driver)
        assert driver.started["ok"], driver.started
        assert driver.started["pubsub_topics"] == [PUBSUB_TOPIC]
        return driver

    try:
        yield start
    finally:
        for driver in drivers:
            driver.close()


async def call(driver: WakuDriver, op: str, **fields: Any) -> dict[str, Any]:
    """A driver request off the event loop (it blocks on the driver's pipe)."""
    return await asyncio.to_thread(lambda: driver.ok(op, **fields))


async def js_event(driver: WakuDriver, hash_hex: str) -> dict[str, Any]:
    return await asyncio.to_thread(
        lambda: driver.event(lambda e: e["event"] == "message" and e["hash"] == hash_hex)
    )


async def js_publish(driver: WakuDriver, payload: bytes) -> dict[str, Any]:
    return await call(driver, "publish", content_topic=CONTENT_TOPIC, payload=b64(payload))


def js_address(driver: WakuDriver, ws: bool = False) -> str:
    addresses: list[str] = driver.started["multiaddrs"]
    return next(a for a in addresses if ("/ws/" in a) == ws)


def our_address(node: Libp2pTransport, ws: bool = False) -> str:
    return next(a for a in node.listen_addrs if ("/ws/" in a) == ws)


async def exchange(ours: Libp2pTransport, theirs: WakuDriver, n: int) -> None:
    """``n`` messages each way, each received once with the same Waku message hash."""
    inbox = ours.subscribe(TOPIC)
    await call(theirs, "subscribe", content_topic=CONTENT_TOPIC)
    assert await ours.wait_for_mesh(TOPIC, 1, PATIENCE_S)
    await call(theirs, "wait_subscribers", pubsub_topic=PUBSUB_TOPIC)
    for i in range(n):
        sent = await js_publish(theirs, f"from js {i}".encode())
        assert sent["recipients"] == [ours.peer_id]
        [got] = await take(inbox, 1)
        assert got == Received(f"from js {i}".encode(), bytes.fromhex(sent["hash"]))
    for i in range(n):
        hint = await ours.publish(TOPIC, f"from us {i}".encode())
        event = await js_event(theirs, hint.hex())
        assert base64.b64decode(event["payload"]) == f"from us {i}".encode()
        assert event["contentTopic"] == CONTENT_TOPIC and event["pubsubTopic"] == PUBSUB_TOPIC
    assert await nothing_more(inbox)
    with pytest.raises(AssertionError, match="no a matching event"):
        await asyncio.to_thread(lambda: theirs.event(lambda e: True, timeout=0.5))


@pytest.mark.parametrize("who_dials", ["js dials us", "we dial js"])
def test_js_waku_and_we_exchange_messages_over_tcp(
    js: Callable[..., WakuDriver], who_dials: str
) -> None:
    async def scenario() -> None:
        theirs = js("js")
        ours = await waku_node()
        try:
            if who_dials == "js dials us":
                reply = await call(theirs, "dial", multiaddr=our_address(ours))
                assert reply["peer_id"] == ours.peer_id
            else:
                await ours.connect(js_address(theirs))
            await exchange(ours, theirs, 4)
            [seen] = (await call(theirs, "peers"))["peers"]
            assert RELAY_PROTOCOL in seen["protocols"] and METADATA_PROTOCOL in seen["protocols"]
        finally:
            await ours.close()

    run(scenario)


def test_js_waku_dials_our_websocket_listener(js: Callable[..., WakuDriver]) -> None:
    async def scenario() -> None:
        theirs = js("js")
        ours = await waku_node(listen=["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/tcp/0/ws"])
        try:
            await call(theirs, "dial", multiaddr=our_address(ours, ws=True))
            await exchange(ours, theirs, 1)
        finally:
            await ours.close()

    run(scenario)


def test_we_relay_between_two_js_waku_nodes(js: Callable[..., WakuDriver]) -> None:
    """JS ↔ ours ↔ JS: every message from the second on too (the equivocation mend)."""

    async def scenario() -> None:
        alice, bob = js("alice"), js("bob")
        ours = await waku_node()
        try:
            ours.subscribe(TOPIC)
            for driver in (alice, bob):
                await call(driver, "dial", multiaddr=our_address(ours))
                await call(driver, "subscribe", content_topic=CONTENT_TOPIC)
                await call(driver, "wait_subscribers", pubsub_topic=PUBSUB_TOPIC)
            assert await ours.wait_for_mesh(TOPIC, 2, PATIENCE_S)
            for sender, receiver in ((alice, bob), (bob, alice)):
                for i in range(4):
                    sent = await js_publish(sender, f"{sender.name} {i}".encode())
                    got = await js_event(receiver, sent["hash"])
                    assert got["payload"] == sent["payload"]
            peers = (await call(alice, "peers"))["peers"]
            assert [p["peer_id"] for p in peers] == [ours.peer_id]  # bob only through us
        finally:
            await ours.close()

    run(scenario)


def test_js_waku_drops_a_relay_message_with_a_seqno(js: Callable[..., WakuDriver]) -> None:
    """What py-libp2p's Pubsub.publish sends (from + seqno) js-waku does not deliver,
    even on the relay protocol; the unsigned one after it, it does."""

    async def scenario() -> None:
        theirs = js("js")
        ours = await waku_node()
        try:
            await ours.connect(js_address(theirs))
            ours.subscribe(TOPIC)
            await call(theirs, "subscribe", content_topic=CONTENT_TOPIC)
            assert await ours.wait_for_mesh(TOPIC, 1, PATIENCE_S)
            trio_side = ours._running()
            signed = WakuMessage(b"with seqno", CONTENT_TOPIC, timestamp=1)
            await ours._call(lambda: trio_side.pubsub.publish(PUBSUB_TOPIC, signed.to_bytes()))
            hint = await ours.publish(TOPIC, b"unsigned")
            await js_event(theirs, hint.hex())
            with pytest.raises(AssertionError, match="no a matching event"):
                await asyncio.to_thread(
                    lambda: theirs.event(lambda e: True, timeout=1.0)  # nothing else came
                )
        finally:
            await ours.close()

    run(scenario)
