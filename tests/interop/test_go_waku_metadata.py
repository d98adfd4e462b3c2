"""An sdsync relay node stays connected to go-waku on cluster 1, metadata check and all.

go-waku 0.9.0 (the node status-go uses) asks every peer for its metadata
(/vac/waku/metadata/1.0.0) and disconnects one on its own cluster whose shard list it reads
as empty ("invalid shard count"); it reads field 3 (packed) only. Here a go-waku node on
127.0.0.1 (--cluster-id 1, shard 7) and a Libp2pTransport that dials it: after a few
seconds go-waku still lists our peer as connected and never logged the complaint, and a
message we publish reaches go-waku's relay (its REST message cache).

go-waku comes from the ``go_waku_nodes`` fixture (tests/interop/conftest.py: skips naming
SDSYNC_GO_WAKU without a binary, fails in CI). Deadlines are liveness bounds only.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import pytest

from sdsync.testing.gowaku import GoWaku
from sdsync.transport.libp2p import Libp2pTransport, WakuRelayConfig

pytestmark = pytest.mark.interop

TOPIC = "/sds/1/go-waku-metadata"  # a channel; /sds/1/... autoshards to 7 on cluster 1
PUBSUB_TOPIC = "/waku/2/rs/1/7"
PATIENCE_S = 30.0  # liveness bound
HOLD_S = 4.0  # go-waku dropped a bad peer every half second


async def until(check: Any, what: str, node: GoWaku) -> Any:
    deadline = time.monotonic() + PATIENCE_S
    while not (result := await check()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {PATIENCE_S} s: {what}\n--- go-waku log:\n{node.log()}")
        await asyncio.sleep(0.2)
    return result


def test_go_waku_keeps_an_sdsync_relay_node_and_relays_its_messages(go_waku_nodes: Any) -> None:
    go_waku: GoWaku = go_waku_nodes()
    address, go_waku_id = go_waku.address, go_waku.peer_id
    go_waku.relay_subscribe(PUBSUB_TOPIC)

    async def scenario() -> None:
        node = Libp2pTransport(peers=[address], waku=WakuRelayConfig(cluster_id=1))
        node.subscribe(TOPIC)  # joins /waku/2/rs/1/7 (we read nothing from it)
        await node.start()
        try:

            async def both_connected() -> bool:
                ours = go_waku_id in await node.connected_peers()
                return ours and node.peer_id in await asyncio.to_thread(go_waku.connected_peers)

            await until(both_connected, "sdsync and go-waku connected", go_waku)
            assert await node.wait_for_mesh(TOPIC, 1, PATIENCE_S), go_waku.log()
            await asyncio.sleep(HOLD_S)  # go-waku checks metadata and would drop us by now
            assert node.peer_id in await asyncio.to_thread(go_waku.connected_peers)
            assert go_waku_id in await node.connected_peers()

            payload = b"sdsync to go-waku"
            await node.publish(TOPIC, payload)
            wanted = base64.b64encode(payload).decode()
            seen_payloads: list[str] = []

            async def seen() -> bool:
                # The cache empties as it is read: keep what each poll returns.
                batch = await asyncio.to_thread(go_waku.relay_messages, PUBSUB_TOPIC)
                seen_payloads.extend(m.get("payload") for m in batch or [])
                return wanted in seen_payloads

            await until(seen, "go-waku received our message", go_waku)
        finally:
            await node.close()

    asyncio.run(scenario())
    log = go_waku.log()
    assert "invalid shard count" not in log, log
