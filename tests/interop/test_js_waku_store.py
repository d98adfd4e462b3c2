"""js-waku's store client reads our store node over ``/vac/waku/store-query/3.0.0``.

`sdsync store serve --relay-shard 7`, a real process, serves a 2,000-message archive
(bulk-inserted before it starts) on its Waku relay host; the js-waku light node of
waku_light/ (``@waku/sdk`` 0.0.36, requiring only the store protocol of it) reads every
message with ``queryGenerator`` and ``queryWithOrderedCallback``, forward and backward,
in pages of 20 (its default) and 100: nothing missing, nothing twice, in the order its
paging implies. A query by hashes returns exactly the archived ones among them. Bad
frames sent straight at the node's store handler are refused and logged, and it serves on.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator

import pytest
from storeprocess import StoreProcess, store_serve
from testdeps import require
from waku_drivers import WakuDriver, connected_client, light_node, send_cut_frames

from sdsync.store import StoredMessage, StoreQuery, WakuStoreClient, open_archive
from sdsync.waku.store.rpc import (
    MAX_STORE_RESPONSE_BYTES,
    STORE_QUERY_PROTOCOL,
    StoreQueryResponse,
)
from sdsync.wire.waku import WakuMessage

require("sdsync.transport.libp2p", "needs the 'p2p' extra")

pytestmark = pytest.mark.interop

CONTENT_TOPIC = "/sds/1/store-interop/proto"
PUBSUB_TOPIC = "/waku/2/rs/1/7"  # CONTENT_TOPIC autosharded on cluster 1
OTHER_CONTENT_TOPIC = "/other/1/x/proto"  # on the same shard, never asked for
COUNT = 2_000
QUERY_TIMEOUT_S = 120.0  # a liveness bound: a whole read normally takes a few seconds


def archive_messages(rng: random.Random) -> tuple[list[StoredMessage], list[StoredMessage]]:
    """COUNT messages on CONTENT_TOPIC over the last hour (some sharing a timestamp, so
    the hash breaks ties), and 100 of another application on the same shard."""
    start = time.time_ns() - 3_600 * 10**9

    def message(content_topic: str) -> StoredMessage:
        timestamp = start + rng.randrange(3_600) * 10**9
        waku = WakuMessage(rng.randbytes(rng.randrange(1, 80)), content_topic, timestamp=timestamp)
        return StoredMessage.of(PUBSUB_TOPIC, waku)

    ours = [message(CONTENT_TOPIC) for _ in range(COUNT)]
    return ours, [message(OTHER_CONTENT_TOPIC) for _ in range(100)]


@pytest.fixture(scope="module")
def archived() -> tuple[list[StoredMessage], list[StoredMessage]]:
    return archive_messages(random.Random(14))


@pytest.fixture(scope="module")
def messages(archived: tuple[list[StoredMessage], list[StoredMessage]]) -> list[StoredMessage]:
    """CONTENT_TOPIC's messages, in archive order."""
    return sorted(archived[0], key=lambda m: (m.timestamp, m.message_hash))


@pytest.fixture(scope="module")
def store(
    tmp_path_factory: pytest.TempPathFactory,
    archived: tuple[list[StoredMessage], list[StoredMessage]],
) -> Iterator[StoreProcess]:
    data_dir = tmp_path_factory.mktemp("store")
    archive = open_archive(str(data_dir / "store.sqlite3"))
    archive.insert([*archived[0], *archived[1]])
    archive.close()
    with store_serve(data_dir, PUBSUB_TOPIC, STORE_QUERY_PROTOCOL) as store:
        yield store


@pytest.fixture(scope="module")
def light(store: StoreProcess) -> Iterator[WakuDriver]:
    # Only the store protocol: this node offers no LightPush or Filter.
    yield from light_node(store, "light", require=("store",))


def hex_hashes(messages: list[StoredMessage]) -> list[str]:
    return [m.message_hash.hex() for m in messages]


def expected_order(messages: list[StoredMessage], page_size: int, forward: bool) -> list[str]:
    """What js-waku reads: every page is chronological; going backward the pages come
    newest first."""
    ends = range(len(messages), 0, -page_size)
    pages = [messages[max(0, end - page_size) : end] for end in ends]
    if forward:
        pages = [messages[i : i + page_size] for i in range(0, len(messages), page_size)]
    return [h for page in pages for h in hex_hashes(page)]


@pytest.mark.parametrize("mode", ["generator", "ordered_callback"])
@pytest.mark.parametrize("forward", [True, False], ids=["forward", "backward"])
@pytest.mark.parametrize("page_size", [None, 100], ids=["default_pages", "pages_of_100"])
def test_js_waku_reads_every_message_once(
    messages: list[StoredMessage],
    light: WakuDriver,
    mode: str,
    forward: bool,
    page_size: int | None,
) -> None:
    request = {"content_topic": CONTENT_TOPIC, "mode": mode, "forward": forward}
    if page_size is not None:
        request["page_size"] = page_size
    reply = light.ok("store_query", timeout=QUERY_TIMEOUT_S, **request)
    assert not reply["truncated"]
    hashes = reply["hashes"]
    assert len(hashes) == len(set(hashes)) == COUNT
    assert set(hashes) == set(hex_hashes(messages))
    assert hashes == expected_order(messages, page_size or 20, forward)
    if mode == "generator":
        sizes = {len(page) for page in reply["pages"]}
        assert sizes == {page_size or 20}
    assert all(m["pubsubTopic"] == PUBSUB_TOPIC for m in reply["messages"])


def test_a_query_by_hashes_returns_exactly_those(
    messages: list[StoredMessage], light: WakuDriver
) -> None:
    rng = random.Random(7)
    wanted = rng.sample(messages, 60)
    unknown = [rng.randbytes(32).hex() for _ in range(5)]
    reply = light.ok(
        "store_query",
        timeout=QUERY_TIMEOUT_S,
        content_topic=CONTENT_TOPIC,
        hashes=[*hex_hashes(wanted), *unknown],
    )
    in_order = sorted(wanted, key=lambda m: (m.timestamp, m.message_hash))
    assert reply["hashes"] == hex_hashes(in_order)


def test_bad_frames_are_refused_and_the_node_serves_on(
    store: StoreProcess, messages: list[StoredMessage]
) -> None:
    async def scenario() -> None:
        async with connected_client(store) as (client, server):
            await send_cut_frames(client, server, STORE_QUERY_PROTOCOL)
            # A frame that is not a StoreQueryRequest: answered with 400.
            answer = await client.request(server, STORE_QUERY_PROTOCOL, b"\xff\xff\xff")
            assert StoreQueryResponse.from_bytes(answer).status_code == 400
            query = StoreQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=(CONTENT_TOPIC,))

            async def request(protocol_id: str, payload: bytes) -> bytes:
                return await client.request(
                    server, protocol_id, payload, max_response_bytes=MAX_STORE_RESPONSE_BYTES
                )

            page = await WakuStoreClient(request).query(query)
            assert page.hashes == [m.message_hash for m in messages[:20]]

    asyncio.run(scenario())
    refused = store.metric(
        "sdsync_store_refused_total", route=STORE_QUERY_PROTOCOL, reason="malformed_rpc"
    )
    assert refused == 1.0
    store.wait_logged("refused", 2)
