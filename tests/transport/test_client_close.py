"""Close means close (issue 38, attack 6): a client host that closes hangs up its
connections at once — the muxer's GoAway, then TCP's FIN — so the node it was connected
to sees it gone, and a client that reconnects a few times never holds its old
connections (and the per-IP slots they take) behind it.

Before, ``Libp2pTransport.close()`` cancelled its host's tasks and left the TCP
connection open: the node listed the peer as connected for over 60 s.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from transporttest import PATIENCE_S, run

from sdsync.transport import Libp2pTransport

#: A closed client is gone from the node within this (a liveness bound: it takes ms).
GONE_S = 5.0


async def gone_within(node: Libp2pTransport, peer: str, within_s: float) -> float:
    """Seconds until ``node`` no longer lists ``peer`` as connected."""
    started = time.monotonic()
    while peer in await node.connected_peers():
        assert time.monotonic() - started < within_s, f"{peer} still connected"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


@pytest.mark.parametrize("relay", [True, False], ids=["relay", "light-client"])
def test_a_closed_client_is_gone_from_the_node_at_once(relay: bool) -> None:
    async def scenario() -> None:
        node = Libp2pTransport()
        await node.start()
        try:
            for _ in range(3):  # a client that reconnects: each old connection is gone
                client = Libp2pTransport(peers=node.listen_addrs, relay=relay)
                await client.start()
                peer = client.peer_id
                started = time.monotonic()
                while peer not in await node.connected_peers():
                    assert time.monotonic() - started < PATIENCE_S, "never connected"
                    await asyncio.sleep(0.01)
                await client.close()
                await gone_within(node, peer, GONE_S)
            assert await node.connected_peers() == []
        finally:
            await node.close()

    run(scenario)
