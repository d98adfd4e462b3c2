"""Steps the go-waku interop tests share: a bounded wait that ends with the logs of both
nodes, go-waku publishing a WakuMessage through its REST API, and what our store node
archived, read from its own REST API."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
from storeprocess import StoreProcess
from waku_drivers import b64

from sdsync.testing.gowaku import GoWaku
from sdsync.wire.waku import WakuMessage

PATIENCE_S = 30.0  # liveness bound of one step; each normally takes about a second


def wait_until(check: Any, what: str, go_waku: GoWaku, store: StoreProcess) -> Any:
    """``check()``'s first true value; the test fails with both logs after PATIENCE_S."""
    deadline = time.monotonic() + PATIENCE_S
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(
                f"not within {PATIENCE_S} s: {what}\n--- go-waku log:\n{go_waku.log()[-5000:]}"
                f"\n--- our store's log:\n{''.join(store.stderr)[-3000:]}"
            )
        time.sleep(0.2)
    return result


def go_waku_publish(go_waku: GoWaku, pubsub_topic: str, message: WakuMessage) -> str:
    """Publishes ``message`` (its payload, content topic, timestamp and meta) through
    go-waku's relay; its hash (hex)."""
    fields = {
        "payload": b64(message.payload),
        "contentTopic": message.content_topic,
        "timestamp": message.timestamp,
    }
    go_waku.relay_publish(
        pubsub_topic, {**fields, "meta": b64(message.meta)} if message.meta else fields
    )
    return message.hash(pubsub_topic).hex()


def archived(store: StoreProcess, pubsub_topic: str, content_topic: str) -> list[dict[str, Any]]:
    """The entries (with data) our store's REST API lists on ``content_topic``, oldest
    first; it writes hashes 0x-prefixed, as nwaku does."""
    query = urllib.parse.urlencode(
        {"pubsubTopic": pubsub_topic, "contentTopics": content_topic, "includeData": "true"}
    )
    with urllib.request.urlopen(f"{store.url}/store/v3/messages?{query}", timeout=10) as answer:
        entries: list[dict[str, Any]] = json.load(answer)["messages"]
    return entries
