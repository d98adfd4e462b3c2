"""Our store node relays between a go-waku node and a js-waku relay node.

go-waku 0.9.0 and js-waku's relay node (@waku/sdk 0.0.27) cannot be direct peers on
cluster 1: js-waku offers only mplex and go-waku only yamux, and go-waku reads js-waku's
metadata shards (field 2) as none. `sdsync store serve --relay-shard 7`, a real process,
speaks both, and here is the only peer of each: go-waku dials it (``--staticnode``), the
js-waku node dials it. A message go-waku publishes by REST reaches the js-waku node, one
the js-waku node publishes reaches go-waku's relay (its REST cache), each with the same
payload, timestamp and hash (RFC 14) on both sides, and our node archives both.

go-waku comes from the ``go_waku_nodes`` fixture (skips naming SDSYNC_GO_WAKU without a
binary, fails in CI). Every wait is a liveness bound.
"""

from __future__ import annotations

import base64
import contextlib
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from go_waku_steps import PATIENCE_S, archived, go_waku_publish, wait_until
from storeprocess import store_serve as store_process
from waku_drivers import (
    RELAY_DIR,
    DriverError,
    StoreProcess,
    WakuDriver,
    b64,
    relay_argv,
    require_driver,
)

from sdsync.testing.gowaku import GoWaku, GoWakuOptions
from sdsync.wire.waku import WakuMessage

pytestmark = pytest.mark.interop

CONTENT_TOPIC = "/sds/1/go-waku-bridge/proto"
PUBSUB_TOPIC = "/waku/2/rs/1/7"  # CONTENT_TOPIC's autoshard on cluster 1


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreProcess]:
    with store_process(tmp_path / "store", PUBSUB_TOPIC) as store:
        yield store


@pytest.fixture
def js_node(store: StoreProcess) -> Iterator[WakuDriver]:
    require_driver(RELAY_DIR)
    with WakuDriver("js", relay_argv(content_topics=[CONTENT_TOPIC])) as node:
        assert node.started["ok"], node.started
        node.ok("dial", multiaddr=store.relay_addrs[0])
        node.ok("subscribe", content_topic=CONTENT_TOPIC)
        yield node


def archived_payloads(store: StoreProcess) -> set[bytes]:
    return {
        base64.b64decode(e["message"]["payload"])
        for e in archived(store, PUBSUB_TOPIC, CONTENT_TOPIC)
    }


def test_our_store_node_relays_between_go_waku_and_js_waku(
    go_waku_nodes: Any, store: StoreProcess, js_node: WakuDriver
) -> None:
    ours = store.relay_addrs[0].rsplit("/", 1)[1]
    go_waku: GoWaku = go_waku_nodes(GoWakuOptions(static_nodes=[store.relay_addrs[0]]))
    go_waku.relay_subscribe(PUBSUB_TOPIC)
    js_node.ok("wait_subscribers", pubsub_topic=PUBSUB_TOPIC, timeout_ms=30_000)
    seen_by_go_waku: list[dict[str, Any]] = []

    def go_waku_has(payload: bytes) -> dict[str, Any] | None:
        seen_by_go_waku.extend(go_waku.relay_messages(PUBSUB_TOPIC))
        return next((m for m in seen_by_go_waku if m["payload"] == b64(payload)), None)

    # go-waku -> our node -> js-waku. Until go-waku has our node in its mesh a publish may
    # reach nobody (or be refused: "not enough peers to publish"), so publish anew, each a
    # new message, until one arrives; then one more, which must arrive as it is.
    def go_waku_published(text: str) -> WakuMessage:
        message = WakuMessage(text.encode(), CONTENT_TOPIC, timestamp=time.time_ns())
        go_waku_publish(go_waku, PUBSUB_TOPIC, message)
        return message

    def js_received(message: WakuMessage, timeout: float) -> dict[str, Any]:
        return js_node.event(
            lambda e: e.get("event") == "message" and e["payload"] == b64(message.payload),
            timeout=timeout,
        )

    def probe_arrived() -> bool:
        # HTTPError: go-waku refused it; DriverError: it did not come within the timeout.
        with contextlib.suppress(urllib.error.HTTPError, DriverError):
            js_received(go_waku_published(f"probe {time.monotonic_ns()}"), 0.5)
            return True
        return False

    wait_until(probe_arrived, "go-waku's probe at js-waku", go_waku, store)
    sent = go_waku_published("from go-waku")
    event = js_received(sent, PATIENCE_S)
    assert event["contentTopic"] == CONTENT_TOPIC and event["pubsubTopic"] == PUBSUB_TOPIC
    assert int(event["timestamp"]) == sent.timestamp
    assert event["hash"] == sent.hash(PUBSUB_TOPIC).hex()

    # js-waku -> our node -> go-waku.
    published = js_node.ok("publish", content_topic=CONTENT_TOPIC, payload=b64(b"from js-waku"))
    assert published["recipients"] == [ours]
    got = wait_until(lambda: go_waku_has(b"from js-waku"), "js-waku's at go-waku", go_waku, store)
    assert got["contentTopic"] == CONTENT_TOPIC and int(got["timestamp"]) == int(
        published["timestamp"]
    )
    theirs = WakuMessage(b"from js-waku", CONTENT_TOPIC, timestamp=int(got["timestamp"]))
    assert theirs.hash(PUBSUB_TOPIC).hex() == published["hash"]

    # Neither was the other's peer: our node carried both, and archived both.
    assert go_waku.connected_peers() == {ours}
    assert [peer["peer_id"] for peer in js_node.ok("peers")["peers"]] == [ours]
    both = {b"from go-waku", b"from js-waku"}
    wait_until(lambda: both <= archived_payloads(store), "both archived", go_waku, store)
