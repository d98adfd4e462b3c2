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
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from testdeps import require
from waku_drivers import LIGHT_DIR, WakuDriver, light_argv, require_driver

from sdsync.store import StoredMessage, StoreQuery, WakuStoreClient, open_archive
from sdsync.wire.waku import WakuMessage
from sdsync.wire.waku_protocols import (
    MAX_RPC_BYTES,
    MAX_STORE_RESPONSE_BYTES,
    STORE_QUERY_PROTOCOL,
    StoreQueryResponse,
    encode_frame,
)

libp2p = require("sdsync.transport.libp2p", "needs the 'p2p' extra")

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


@dataclass
class StoreProcess:
    process: subprocess.Popen[str]
    url: str
    relay_addrs: list[str]
    messages: list[StoredMessage]  # CONTENT_TOPIC's, in archive order
    stderr: list[str]  # its log, as it comes


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreProcess]:
    data_dir = tmp_path_factory.mktemp("store")
    ours, others = archive_messages(random.Random(14))
    archive = open_archive(str(data_dir / "store.sqlite3"))
    archive.insert([*ours, *others])
    archive.close()
    argv = [sys.executable, "-m", "sdsync.cli", "store", "serve", "--data-dir", str(data_dir)]
    argv += ["--listen", "127.0.0.1:0", "--retention", "none", "--relay-shard", "7"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(process.stderr or ()), daemon=True).start()
    try:
        assert process.stdout is not None
        listening, relay = process.stdout.readline(), process.stdout.readline()
        assert listening.startswith("sdsync store: listening on http://"), listening
        match = re.match(r"sdsync store: relay on (\S+), archiving (\S+) ", relay)
        assert match and match[2] == PUBSUB_TOPIC, relay
        assert STORE_QUERY_PROTOCOL in relay
        ordered = sorted(ours, key=lambda m: (m.timestamp, m.message_hash))
        yield StoreProcess(process, listening.split()[4], match[1].split(","), ordered, stderr)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def light(store: StoreProcess) -> Iterator[WakuDriver]:
    require_driver(LIGHT_DIR)
    # Only the store protocol: this node offers no LightPush or Filter.
    driver = WakuDriver("light", light_argv(store.relay_addrs[0], require=("store",)))
    try:
        assert driver.started["ok"], driver.started
        yield driver
    finally:
        driver.close()


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
    store: StoreProcess, light: WakuDriver, mode: str, forward: bool, page_size: int | None
) -> None:
    request = {"content_topic": CONTENT_TOPIC, "mode": mode, "forward": forward}
    if page_size is not None:
        request["page_size"] = page_size
    reply = light.ok("store_query", timeout=QUERY_TIMEOUT_S, **request)
    assert not reply["truncated"]
    hashes = reply["hashes"]
    assert len(hashes) == len(set(hashes)) == COUNT
    assert set(hashes) == set(hex_hashes(store.messages))
    assert hashes == expected_order(store.messages, page_size or 20, forward)
    if mode == "generator":
        sizes = {len(page) for page in reply["pages"]}
        assert sizes == {page_size or 20}
    assert all(m["pubsubTopic"] == PUBSUB_TOPIC for m in reply["messages"])


def test_a_query_by_hashes_returns_exactly_those(store: StoreProcess, light: WakuDriver) -> None:
    rng = random.Random(7)
    wanted = rng.sample(store.messages, 60)
    unknown = [rng.randbytes(32).hex() for _ in range(5)]
    reply = light.ok(
        "store_query",
        timeout=QUERY_TIMEOUT_S,
        content_topic=CONTENT_TOPIC,
        hashes=[*hex_hashes(wanted), *unknown],
    )
    in_order = sorted(wanted, key=lambda m: (m.timestamp, m.message_hash))
    assert reply["hashes"] == hex_hashes(in_order)


def test_bad_frames_are_refused_and_the_node_serves_on(store: StoreProcess) -> None:
    async def scenario() -> None:
        async with libp2p.Libp2pTransport(waku=libp2p.WakuRelayConfig()) as client:
            address = store.relay_addrs[0]
            await client.connect(address)
            server = address.rsplit("/", 1)[1]
            await raw_stream(client, server, encode_frame(b"\x42" * 40)[:20])  # truncated
            await raw_stream(client, server, encode_frame(b"\x00" * (MAX_RPC_BYTES + 1))[:16])
            # A frame that is not a StoreQueryRequest: answered with 400.
            answer = await client.request(server, STORE_QUERY_PROTOCOL, b"\xff\xff\xff")
            assert StoreQueryResponse.from_bytes(answer).status_code == 400
            query = StoreQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=(CONTENT_TOPIC,))

            async def request(protocol_id: str, payload: bytes) -> bytes:
                return await client.request(
                    server, protocol_id, payload, max_response_bytes=MAX_STORE_RESPONSE_BYTES
                )

            page = await WakuStoreClient(request).query(query)
            assert page.hashes == [m.message_hash for m in store.messages[:20]]

    asyncio.run(scenario())
    with urllib.request.urlopen(f"{store.url}/metrics") as response:
        metrics = response.read().decode().splitlines()
    counted = [
        line
        for line in metrics
        if line.startswith("sdsync_store_refused_total{")
        and f'route="{STORE_QUERY_PROTOCOL}"' in line
        and 'reason="malformed_rpc"' in line
    ]
    assert counted and counted[0].endswith(" 1.0"), metrics
    deadline = time.monotonic() + 10
    while len([line for line in store.stderr if "refused" in line]) < 2:
        assert time.monotonic() < deadline, "".join(store.stderr)
        time.sleep(0.05)


async def raw_stream(client: libp2p.Libp2pTransport, server: str, data: bytes) -> None:
    """Open a store-query stream to ``server``, write ``data`` as it is, and close it."""
    from libp2p.peer.id import ID

    trio_side = client._running()

    async def write() -> None:
        stream = await trio_side.host.new_stream(ID.from_base58(server), [STORE_QUERY_PROTOCOL])  # type: ignore[list-item]
        await stream.write(data)
        await stream.close()

    await client._call(write)
