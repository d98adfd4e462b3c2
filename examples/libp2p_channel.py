"""Two participants and an archiver on Waku Relay over real libp2p (loopback).

alice and bob each run a ReliableChannel over their own Libp2pTransport, a Waku relay node
(content topic /sds/1/demo/proto, autosharded to /waku/2/rs/1/7); bob drops 30 % of what
he receives, and SDS repairs it. A third host subscribes to whole envelopes, as a store
node would, and prints what it would archive: WakuMessage fields and the Waku message
hash — the same bytes the participants use as retrieval hints.

    python examples/libp2p_channel.py
"""

from __future__ import annotations

import asyncio
import random

from sdsync.core import ChannelConfig, MessageDelivered, RepairConfig
from sdsync.runtime import ReliableChannel, RuntimeConfig
from sdsync.transport import Envelope, Libp2pTransport

TOPIC = "/sds/1/demo"  # ReliableChannel's topic for channel "demo"
FAST = RuntimeConfig(sync_interval_ms=300, resend_interval_ms=500)
CONFIG = ChannelConfig(repair=RepairConfig(t_min_ms=100, t_max_ms=600))


async def archive(envelopes: list[Envelope], source: Libp2pTransport) -> None:
    async for envelope in source.subscribe_envelopes(TOPIC):
        envelopes.append(envelope)


async def main() -> None:
    async with (
        Libp2pTransport() as alice_net,
        Libp2pTransport(peers=alice_net.listen_addrs, drop_rate=0.3, seed=7) as bob_net,
        Libp2pTransport(peers=alice_net.listen_addrs) as archiver,
    ):
        print("alice listens on", alice_net.listen_addrs[0])
        archived: list[Envelope] = []
        archiving = asyncio.create_task(archive(archived, archiver))
        channels = [
            ReliableChannel(net, "demo", name, config=CONFIG, runtime=FAST, rng=random.Random(i))
            for i, (name, net) in enumerate([("alice", alice_net), ("bob", bob_net)])
        ]
        async with channels[0] as alice, channels[1] as bob:
            assert await alice_net.wait_for_mesh(TOPIC, 2, 30)
            for i in range(5):
                await alice.send(f"alice {i}".encode())
                await bob.send(f"bob {i}".encode())
            async with asyncio.timeout(60):
                while not all(
                    len(c.channel.log_ids()) == 10 and c.driver.sync_status().synced
                    for c in (alice, bob)
                ):
                    await asyncio.sleep(0.1)
            assert alice.channel.log_ids() == bob.channel.log_ids()
            got = [e for e in bob.pending_events() if isinstance(e, MessageDelivered)]
            print(f"bob: {len(got)} messages delivered, log identical to alice's")
            print(f"bob's transport dropped {bob_net.randomly_dropped} frames; SDS repaired it")
        archiving.cancel()
        first = archived[0]
        print(
            f"archived {len(archived)} envelopes; first: pubsub topic {first.pubsub_topic}, "
            f"content topic {first.message.content_topic}, timestamp {first.message.timestamp} ns, "
            f"hash {first.message_hash.hex()[:16]}…"
        )


if __name__ == "__main__":
    asyncio.run(main())
