"""go-waku's relay is archived by `sdsync store serve`, and its store-v3 client reads it back.

A go-waku node (0.9.0, cluster 1, shard 7, metadata check on) dials our store node, a real
`sdsync store serve --relay-shard 7` process, and publishes by REST (``POST
/relay/v1/messages/{topic}``): five messages on one content topic, two on another (with
``meta``, which is hashed too), timestamps a microsecond apart. Our store archives them
from the relay. go-waku's own store-v3 *client* (``GET /store/v3/messages?peerAddr=<our
multiaddr>&…``, which asks our node over ``/vac/waku/store-query/3.0.0``) then reads them
back by content topic, by a time range (inclusive at both ends, as nwaku's), in cursor
pages forward and backward, and by hash, with and without the messages' data. Every hash
it reports (base64) is the one we compute (RFC 14) and the one our own REST API reports
(hex). An empty answer and our refusal of an unknown cursor (400) reach its REST caller
as such.

go-waku's client takes ``hashes`` and ``cursor`` in URL-safe base64 and answers in standard
base64; both are converted here. go-waku comes from the ``go_waku_nodes`` fixture (skips
naming SDSYNC_GO_WAKU without a binary, fails in CI). Every wait is a liveness bound.
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
from go_waku_steps import archived, go_waku_publish, wait_until
from storeprocess import StoreProcess, store_serve

from sdsync.testing.gowaku import GoWaku, GoWakuOptions
from sdsync.wire.waku import WakuMessage

pytestmark = pytest.mark.interop

PUBSUB_TOPIC = "/waku/2/rs/1/7"
TOPIC_A = "/sds/1/go-waku-store/proto"
TOPIC_B = "/sds/1/go-waku-store-b/proto"
PROBE_TOPIC = "/sds/1/go-waku-store-probe/proto"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreProcess]:
    with store_serve(tmp_path / "store", PUBSUB_TOPIC) as store:
        yield store


def our_hashes(store: StoreProcess, content_topic: str) -> list[str]:
    """The hashes (hex) our store archived on ``content_topic``, oldest first."""
    return [
        e["messageHash"].removeprefix("0x") for e in archived(store, PUBSUB_TOPIC, content_topic)
    ]


def published(go_waku: GoWaku, message: WakuMessage) -> str:
    return go_waku_publish(go_waku, PUBSUB_TOPIC, message)


def url_b64(hex_hash: str) -> str:
    """A hash as go-waku's client reads it from a URL: URL-safe base64."""
    return base64.urlsafe_b64encode(bytes.fromhex(hex_hash)).decode()


def hex_of(std_b64: str) -> str:
    """A hash as go-waku's client answers it (standard base64), in hex."""
    return base64.b64decode(std_b64).hex()


class GoWakuStoreClient:
    """go-waku's store-v3 client, aimed at our store node."""

    def __init__(self, go_waku: GoWaku, store: StoreProcess) -> None:
        self.go_waku, self.peer = go_waku, store.relay_addrs[0]

    def query(self, **params: str) -> dict[str, Any]:
        answer = self.go_waku.store_v3_query(self.peer, **params)
        assert answer["status_code"] == 200, answer
        return answer

    def by_topic(self, content_topic: str, **params: str) -> dict[str, Any]:
        return self.query(pubsubTopic=PUBSUB_TOPIC, contentTopics=content_topic, **params)

    def pages(self, content_topic: str, **params: str) -> list[list[str]]:
        """Each page's hashes (hex), following the cursor to the last page."""
        pages: list[list[str]] = []
        cursor: dict[str, str] = {}
        while True:
            answer = self.by_topic(content_topic, **params, **cursor)
            pages.append([hex_of(m["message_hash"]) for m in answer.get("messages") or []])
            if "pagination_cursor" not in answer:
                return pages
            cursor = {"cursor": url_b64(hex_of(answer["pagination_cursor"]))}
            assert len(pages) < 20, pages  # a cursor that never ends the reading


def test_go_waku_reads_back_from_our_store_what_it_published(
    go_waku_nodes: Any, store: StoreProcess
) -> None:
    go_waku: GoWaku = go_waku_nodes(GoWakuOptions(static_nodes=[store.relay_addrs[0]]))
    client = GoWakuStoreClient(go_waku, store)

    # Until the relay mesh has formed, a publish may reach nobody (or go-waku refuses it:
    # "not enough peers to publish"): probe until one arrives.
    def probe_archived() -> list[str]:
        probe = WakuMessage(b"probe", PROBE_TOPIC, timestamp=time.time_ns())
        with contextlib.suppress(urllib.error.HTTPError):
            published(go_waku, probe)
        return our_hashes(store, PROBE_TOPIC)

    wait_until(probe_archived, "a probe go-waku published archived by our store", go_waku, store)

    base = time.time_ns() - 10**9  # in the past: our store refuses the far future
    stamps = [base + i * 1_000 for i in range(7)]
    messages = [WakuMessage(f"a{i}".encode(), TOPIC_A, timestamp=stamps[i]) for i in range(5)]
    # Meta is hashed too (RFC 14): B's carry some.
    messages += [
        WakuMessage(f"b{i}".encode(), TOPIC_B, timestamp=stamps[5 + i], meta=b"meta %d" % i)
        for i in range(2)
    ]
    hashes = [published(go_waku, message) for message in messages]
    a_hashes, b_hashes = hashes[:5], hashes[5:]

    # 1. Archived from go-waku's relay, with our hashes; go-waku reads them by content topic.
    wait_until(lambda: our_hashes(store, TOPIC_A) == a_hashes, "A archived", go_waku, store)
    wait_until(lambda: our_hashes(store, TOPIC_B) == b_hashes, "B archived", go_waku, store)
    answer = client.by_topic(TOPIC_A, includeData="true")
    entries = answer["messages"]
    assert [hex_of(e["message_hash"]) for e in entries] == a_hashes
    assert [base64.b64decode(e["message"]["payload"]) for e in entries] == [
        m.payload for m in messages[:5]
    ]
    assert {e["pubsub_topic"] for e in entries} == {PUBSUB_TOPIC}
    assert [int(e["message"]["timestamp"]) for e in entries] == stamps[:5]
    assert "pagination_cursor" not in answer
    both = client.by_topic(f"{TOPIC_A},{TOPIC_B}")
    assert [hex_of(e["message_hash"]) for e in both["messages"]] == hashes
    assert all("message" not in e for e in both["messages"])  # includeData defaults to false

    # 2. A time range, inclusive at both ends, across both content topics.
    ranged = client.by_topic(
        f"{TOPIC_A},{TOPIC_B}", startTime=str(stamps[3]), endTime=str(stamps[5])
    )
    assert [hex_of(e["message_hash"]) for e in ranged["messages"]] == hashes[3:6]

    # 3. Cursor pages of 2, forward and backward: every message once, in order.
    assert client.pages(TOPIC_A, pageSize="2") == [a_hashes[0:2], a_hashes[2:4], a_hashes[4:]]
    backward = client.pages(TOPIC_A, pageSize="2", ascending="false")
    # A page is in chronological order whichever the direction (as nwaku's).
    assert backward == [a_hashes[3:5], a_hashes[1:3], a_hashes[0:1]]

    # 4. By hash (no content filter allowed): exactly those, one unknown hash ignored.
    unknown = bytes(32).hex()
    asked = [b_hashes[1], a_hashes[2], unknown]
    found = client.query(hashes=",".join(url_b64(h) for h in asked), includeData="true")
    assert sorted(hex_of(e["message_hash"]) for e in found["messages"]) == sorted(asked[:2])
    payloads = {base64.b64decode(e["message"]["payload"]) for e in found["messages"]}
    assert payloads == {b"b1", b"a2"}

    # 5. Nothing found is an empty page; our refusal (400) is what go-waku's client reports.
    assert not client.by_topic("/sds/1/go-waku-store-none/proto").get("messages")
    with pytest.raises(urllib.error.HTTPError) as refused:
        client.by_topic(TOPIC_A, cursor=url_b64(unknown))
    assert "400 - unknown cursor" in refused.value.read().decode()
