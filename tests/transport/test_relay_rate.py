"""Relay frames per forwarding peer (issue 27 row 7): a peer flooding the relay has its
frames over its byte rate dropped by the validator — neither delivered nor relayed —
and counted; the token buckets themselves, with an explicit clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from transporttest import PATIENCE_S, run

from sdsync.errors import LocalProtocolError
from sdsync.transport import Received
from sdsync.transport.libp2p import Libp2pTransport
from sdsync.waku.ratelimit import PeerBuckets, RateLimit

TOPIC = "/sds/1/probe"
FRAME = 100_000
FLOOD = 60  # 6 MB from one peer, as fast as it can


async def delivered(node: Libp2pTransport, inbox: AsyncIterator[Received], sent: int) -> int:
    """How many of ``sent`` frames ``node`` delivered, once each was delivered or
    counted as over the rate."""
    got = 0
    async with asyncio.timeout(PATIENCE_S):
        while got + node.relay_rate_limited < sent:
            try:
                async with asyncio.timeout(1.0):
                    await anext(inbox)
                got += 1
            except TimeoutError:
                pass
    return got


def test_a_flooding_forwarder_is_cut_to_its_rate_and_counted() -> None:
    """60 frames of 100 kB from one peer against a relay rate of 1 MB/60 s: about ten
    are delivered (and relayed on), the rest dropped and counted."""

    async def scenario() -> None:
        node = Libp2pTransport(relay_rate=RateLimit(1_000_000, 60.0))
        await node.start()
        flooder = Libp2pTransport(peers=node.listen_addrs)
        await flooder.start()
        try:
            inbox = node.subscribe(TOPIC)
            flooder.subscribe(TOPIC)
            assert await flooder.wait_for_mesh(TOPIC, 1, PATIENCE_S)
            for i in range(FLOOD):
                await flooder.publish(TOPIC, i.to_bytes(2, "big") * (FRAME // 2))
            got = await delivered(node, inbox, FLOOD)
            assert 1 <= got <= 12  # 1 MB of 100-kB frames (and their envelopes)
            assert node.relay_rate_limited == FLOOD - got
        finally:
            await flooder.close()
            await node.close()

    run(scenario)


def test_fresh_forwarders_from_one_address_share_its_relay_rate() -> None:
    """Issue 38: three flooding peers on one address (127.0.0.1), each within a generous
    rate of its own, are held together to the address's 1 MB: identities cost nothing."""

    async def scenario() -> None:
        node = Libp2pTransport(
            relay_rate=RateLimit(10_000_000, 60.0), relay_rate_per_ip=RateLimit(1_000_000, 60.0)
        )
        await node.start()
        flooders = [Libp2pTransport(peers=node.listen_addrs) for _ in range(3)]
        try:
            inbox = node.subscribe(TOPIC)
            for flooder in flooders:
                await flooder.start()
                flooder.subscribe(TOPIC)
                assert await flooder.wait_for_mesh(TOPIC, 1, PATIENCE_S)
            for i in range(FLOOD // 3):
                for n, flooder in enumerate(flooders):
                    await flooder.publish(TOPIC, bytes([n, i]) * (FRAME // 2))
            got = await delivered(node, inbox, FLOOD - FLOOD % 3)
            assert 1 <= got <= 12  # the address's 1 MB, not three peers' 10 MB each
        finally:
            for flooder in flooders:
                await flooder.close()
            await node.close()

    run(scenario)


def test_buckets_refill_at_their_rate_and_forget_only_full_ones() -> None:
    rate = RateLimit(5, 1.0)
    buckets = PeerBuckets(rate, max_peers=2)
    assert [buckets.take("a", 0.0) for _ in range(6)] == [True] * 5 + [False]
    assert buckets.take("a", 0.2) and not buckets.take("a", 0.2)  # one refilled
    assert buckets.take("b", 0.2)
    assert not buckets.take("c", 0.2)  # full table, nobody's bucket full again
    assert buckets.take("c", 10.0)  # a and b refilled: forgotten, room for c
    assert len(buckets) == 1
    # One item above the volume passes from a full bucket, leaving it in debt.
    big = PeerBuckets(RateLimit(100, 1.0))
    assert big.take("p", 0.0, 250) and not big.take("p", 1.0, 1)
    assert big.take("p", 1.6, 1)


def test_a_refusal_says_how_long_to_wait() -> None:
    buckets = PeerBuckets(RateLimit(8, 40.0), max_peers=2)  # 8 at once, 12 a minute
    assert all(buckets.take("a", 0.0) for _ in range(8))
    assert not buckets.take("a", 0.0)
    assert buckets.wait_s("a", 0.0) == pytest.approx(5.0)
    assert buckets.wait_s("a", 4.0) == pytest.approx(1.0)
    assert buckets.wait_s("a", 5.0) == 0.0 and buckets.take("a", 5.0)
    assert buckets.wait_s("new", 5.0) == 0.0  # room in the table
    assert buckets.take("b", 5.0)
    # A full table: the newcomer waits for the first bucket to fill (b's, 5 s away).
    assert not buckets.take("c", 5.0)
    assert buckets.wait_s("c", 5.0) == pytest.approx(5.0)


def test_rate_limits_are_spelt_as_nwaku_does() -> None:
    assert RateLimit.parse("5/1s") == RateLimit(5, 1.0)
    assert RateLimit.parse("30/1m") == RateLimit(30, 60.0)
    assert RateLimit.parse("32MiB/16s") == RateLimit(32 * 2**20, 16.0)
    assert RateLimit.parse("0/1s") is None and RateLimit.parse("off") is None
    with pytest.raises(LocalProtocolError):
        RateLimit.parse("5 per second")
