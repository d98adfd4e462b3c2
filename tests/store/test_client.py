"""HttpStoreClient against a real node on loopback: queries, ingestion, the runtime's fetch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from storetest import PUBSUB, T0, TOKEN, in_order, make_messages, running

from sdsync.errors import RemoteProtocolError
from sdsync.runtime import StoreClient
from sdsync.store import (
    HttpStoreClient,
    SqlArchive,
    StoredMessage,
    StoreQuery,
    StoreUnavailableError,
)
from sdsync.store.rest import query_params
from sdsync.testing.pgcluster import free_port
from sdsync.transport import Received
from sdsync.wire import HistoryEntry, Message, decode, encode
from sdsync.wire.waku import WakuMessage


def sds_message(i: int) -> StoredMessage:
    """An SDS content message wrapped in a WakuMessage, as a Waku transport publishes it."""
    sds = Message("alice", f"m{i}", "chan", lamport_timestamp=i, content=f"hello {i}".encode())
    waku = WakuMessage(encode(sds), TOPIC, timestamp=T0 + i)
    return StoredMessage.of(PUBSUB, waku)


TOPIC = "/sds/1/chan/proto"


def archive_all_but_ten(archive: SqlArchive, count: int) -> list[StoredMessage]:
    """``count`` SDS messages (see sds_message), the last ten of them never archived."""
    stored = [sds_message(i) for i in range(count)]
    archive.insert(stored[:-10])
    return stored


async def fetch_every_other(store: StoreClient, stored: list[StoredMessage]) -> list[Received]:
    """What ``store`` (the runtime's protocol) finds of every second of ``stored``, asked
    for by its hash, and of an entry without a hint (which cannot be: skipped)."""
    wanted = (
        *(HistoryEntry(f"m{i}", stored[i].message_hash) for i in range(0, len(stored), 2)),
        HistoryEntry("no-hint"),
    )
    return await store.fetch("chan", wanted)


def hints(found: list[Received]) -> list[bytes]:
    return sorted(f.retrieval_hint or b"" for f in found)


def test_fetch_returns_the_sds_bytes_with_their_hash_as_hint(
    archive: SqlArchive, tmp_path: Path
) -> None:
    stored = archive_all_but_ten(archive, 120)

    async def scenario() -> None:
        async with running(archive, tmp_path) as node, HttpStoreClient(node.url) as client:
            found = await fetch_every_other(client, stored)
        # 60 hints (more than one request's worth), 55 of them archived.
        assert hints(found) == sorted(m.message_hash for m in stored[0:110:2])
        for frame in found:
            message = decode(frame.data)
            assert message.content == f"hello {message.lamport_timestamp}".encode()

    asyncio.run(scenario())


def test_pages_follow_the_cursor_and_post_ingests(archive: SqlArchive, tmp_path: Path) -> None:
    messages = make_messages(130)

    async def scenario() -> None:
        async with (
            running(archive, tmp_path) as node,
            HttpStoreClient(node.url, token=TOKEN) as client,
        ):
            assert await client.post(messages) == {"received": 130, "stored": 130, "duplicates": 0}
            query = StoreQuery(include_data=True, pubsub_topic=PUBSUB, pagination_limit=50)
            pages = [page async for page in client.pages(query)]
        assert [len(p.messages) for p in pages] == [50, 50, 30]
        assert [m for p in pages for m in p.messages] == in_order(messages)

    asyncio.run(scenario())


def test_a_catch_up_lists_hashes_then_fetches_only_what_unseen_keeps(
    archive: SqlArchive, tmp_path: Path
) -> None:
    """Phase one asks with includeData=false and the node answers hashes alone (read back
    as such); phase two asks by hash for what ``unseen`` kept of each page, and nothing else."""
    stored = archive_all_but_ten(archive, 130)  # 120 archived, T0 to T0 + 129 ns
    listed: list[list[bytes]] = []

    def unseen(hashes: list[bytes]) -> list[bytes]:
        listed.append(hashes)
        return hashes[::3]

    async def scenario() -> list[list[Received]]:
        async with (
            running(archive, tmp_path) as node,
            HttpStoreClient(node.url) as client,
            aiohttp.ClientSession() as http,
        ):
            listing = StoreQuery(include_data=False, content_topics=(TOPIC,), pagination_limit=50)
            async with http.get(f"{node.url}/store/v3/messages", params=query_params(listing)) as r:
                assert {k for e in (await r.json())["messages"] for k in e} == {"messageHash"}
            start = T0 // 10**6  # the runtime's window is in ms
            return [p async for p in client.catch_up(TOPIC, start, start + 1, 50, unseen)]

    pages = asyncio.run(scenario())
    assert [len(hashes) for hashes in listed] == [50, 50, 20]
    assert [h for hashes in listed for h in hashes] == [m.message_hash for m in stored[:120]]
    kept = [hashes[::3] for hashes in listed]
    assert [[f.retrieval_hint for f in page] for page in pages] == kept
    payloads = {m.message_hash: m.message.payload for m in stored}
    assert all(f.data == payloads.get(f.retrieval_hint or b"") for page in pages for f in page)


def test_an_unreachable_store_is_an_oserror() -> None:
    async def scenario() -> None:
        async with HttpStoreClient(f"http://127.0.0.1:{free_port()}") as client:
            with pytest.raises(StoreUnavailableError) as err:
                await client.fetch("chan", (HistoryEntry("m", b"\x01" * 32),))
        assert isinstance(err.value, OSError)  # what ReliableChannel retries on

    asyncio.run(scenario())


def test_a_store_error_status_is_a_remote_error(archive: SqlArchive, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(archive, tmp_path) as node, HttpStoreClient(node.url) as client:
            with pytest.raises(RemoteProtocolError, match="unknown cursor"):
                await client.query(StoreQuery(pagination_cursor=b"\x02" * 32))

    asyncio.run(scenario())


# -- nwaku's answers, as nwaku gives them


@asynccontextmanager
async def _fake_nwaku(reply: web.Response) -> AsyncIterator[HttpStoreClient]:
    """A client of a server that answers every store query with ``reply``, as an nwaku
    node might."""

    async def handler(request: web.Request) -> web.Response:
        return reply

    app = web.Application()
    app.router.add_get("/store/v3/messages", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        async with HttpStoreClient(f"http://127.0.0.1:{port}") as client:
            yield client
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (429, StoreUnavailableError),
        (503, StoreUnavailableError),
        (504, StoreUnavailableError),
        (300, RemoteProtocolError),
        (400, RemoteProtocolError),
    ],
)
def test_a_status_inside_a_200_is_read(status: int, error: type[Exception]) -> None:
    """nwaku answers a query it forwarded with HTTP 200 and the real status inside: 429,
    503 and 504 mean "not now" (an OSError the runtime retries later, or elsewhere), the
    others are the store's error."""
    body = {"requestId": "abc", "statusCode": status, "statusDesc": "peer said so", "messages": []}

    async def scenario() -> None:
        async with _fake_nwaku(web.json_response(body)) as client:
            with pytest.raises(error, match="peer said so"):
                await client.query(StoreQuery())

    asyncio.run(scenario())


def test_a_text_plain_error_is_an_error_with_its_text() -> None:
    reply = web.Response(status=400, text="Invalid pageSize: 'x'\n", content_type="text/plain")

    async def scenario() -> None:
        async with _fake_nwaku(reply) as client:
            with pytest.raises(RemoteProtocolError, match="HTTP 400: Invalid pageSize: 'x'"):
                await client.query(StoreQuery())

    asyncio.run(scenario())


def test_content_topics_without_a_pubsub_topic_are_served(
    archive: SqlArchive, tmp_path: Path
) -> None:
    messages = make_messages(60)  # over three content topics, one pubsub topic
    archive.insert(messages)
    topic = "/app/1/acks/proto"

    async def scenario() -> None:
        async with running(archive, tmp_path) as node, HttpStoreClient(node.url) as client:
            query = StoreQuery(content_topics=(topic,), pagination_limit=100)
            page = await client.query(query)
        assert page.hashes == [
            m.message_hash for m in in_order(messages) if m.message.content_topic == topic
        ]

    asyncio.run(scenario())
