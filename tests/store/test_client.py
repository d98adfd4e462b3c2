"""HttpStoreClient against a real node on loopback: queries, ingestion, the runtime's fetch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
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
from sdsync.store.pgcluster import free_port
from sdsync.wire import HistoryEntry, Message, decode, encode
from sdsync.wire.waku import WakuMessage


def sds_message(i: int) -> StoredMessage:
    """An SDS content message wrapped in a WakuMessage, as a Waku transport publishes it."""
    sds = Message("alice", f"m{i}", "chan", lamport_timestamp=i, content=f"hello {i}".encode())
    waku = WakuMessage(encode(sds), "/sds/1/chan/proto", timestamp=T0 + i)
    return StoredMessage.of(PUBSUB, waku)


def test_fetch_returns_the_sds_bytes_with_their_hash_as_hint(
    archive: SqlArchive, tmp_path: Path
) -> None:
    stored = [sds_message(i) for i in range(120)]
    archive.insert(stored[:110])  # the last ten were never archived

    async def scenario() -> None:
        async with running(archive, tmp_path) as node, HttpStoreClient(node.url) as client:
            store: StoreClient = client  # the runtime's protocol
            wanted = (
                *(HistoryEntry(f"m{i}", stored[i].message_hash) for i in range(0, 120, 2)),
                HistoryEntry("no-hint"),  # cannot be asked for by hash: skipped
            )
            found = await store.fetch("chan", wanted)
        # 60 hints (more than one request's worth), 55 of them archived.
        assert sorted(f.retrieval_hint or b"" for f in found) == sorted(
            m.message_hash for m in stored[0:110:2]
        )
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
            query = StoreQuery(include_data=True, pubsub_topic=PUBSUB, page_size=50)
            pages = [page async for page in client.pages(query)]
        assert [len(p.messages) for p in pages] == [50, 50, 30]
        assert [m for p in pages for m in p.messages] == in_order(messages)

    asyncio.run(scenario())


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
                await client.query(StoreQuery(cursor=b"\x02" * 32))

    asyncio.run(scenario())
