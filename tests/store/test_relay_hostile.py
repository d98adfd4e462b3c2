"""Relay validation is archive validation (issue 27, row 8): a relayed message the
archive would refuse (a timestamp an hour ahead, at 2^63-1, 0 or negative; a content
topic of 2,000 bytes or with a NUL) is neither delivered nor relayed onward, and is
counted by its reason."""

from __future__ import annotations

import asyncio
import time

from transporttest import PATIENCE_S, run, until

from sdsync.errors import RejectReason
from sdsync.transport import Libp2pTransport
from sdsync.wire import WakuMessage

PUBSUB_TOPIC = "/waku/2/rs/1/7"
HOUR_NS = 3600 * 10**9


def hostile(now_ns: int) -> list[WakuMessage]:
    good_topic = "/sds/1/hostile/proto"
    return [
        *(
            WakuMessage(payload=b"when", content_topic=good_topic, timestamp=ts)
            for ts in (now_ns + HOUR_NS, (1 << 63) - 1, 0, -5)
        ),
        WakuMessage(
            payload=b"long", content_topic="/a/1/" + "x" * 2000 + "/proto", timestamp=now_ns
        ),
        WakuMessage(payload=b"nul", content_topic="/a/1/b\x00c/proto", timestamp=now_ns),
    ]


def test_messages_the_archive_refuses_are_not_relayed() -> None:
    async def scenario() -> None:
        node = Libp2pTransport()  # the node under test, between attacker and listener
        node.subscribe_envelopes(PUBSUB_TOPIC)
        await node.start()
        attacker = Libp2pTransport(peers=node.listen_addrs)
        attacker.subscribe_envelopes(PUBSUB_TOPIC)
        listener = Libp2pTransport(peers=node.listen_addrs)
        heard = listener.subscribe_envelopes(PUBSUB_TOPIC)
        await attacker.start()
        await listener.start()
        try:
            for peer in (attacker, node, listener):
                assert await peer.wait_for_mesh(PUBSUB_TOPIC, 1, PATIENCE_S)
            pubsub = attacker._relaying("test").pubsub

            async def relay_anything() -> None:  # an attacker's node validates nothing
                pubsub.remove_topic_validator(PUBSUB_TOPIC)

            await attacker._call(relay_anything)
            for message in hostile(time.time_ns()):
                await attacker.publish_message(PUBSUB_TOPIC, message)
            honest = WakuMessage(b"ok", "/sds/1/hostile/proto", timestamp=time.time_ns())
            await attacker.publish_message(PUBSUB_TOPIC, honest)
            first = await asyncio.wait_for(heard.__anext__(), PATIENCE_S)
            assert first.message == honest  # the six before it were not relayed
            await until(lambda: sum(node.rejected.values()) >= 6)
            assert node.rejected[RejectReason.TIMESTAMP_IN_FUTURE] == 2
            assert node.rejected[RejectReason.TIMESTAMP_NOT_POSITIVE] == 2
            assert node.rejected[RejectReason.BAD_TOPIC] == 2
        finally:
            for peer in (listener, attacker, node):
                await peer.close()

    run(scenario)
