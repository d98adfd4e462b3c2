"""The HTTP API of a real node on loopback: nwaku's v3 shape, status codes, auth, metrics."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from storetest import T0, TOKEN, in_order, make_messages, running

from sdsync.store import RetentionPolicy, SqlArchive, StoredMessage, open_archive
from sdsync.store.rest import entry_json
from sdsync.store.resume import LastOnline
from sdsync.store.server import NODE
from sdsync.wire.waku import WakuMessage

AUTH = {"Authorization": f"Bearer {TOKEN}"}
VECTOR = StoredMessage.of(
    "/waku/2/default-waku/proto",
    WakuMessage(
        payload=bytes.fromhex("010203045445535405060708"),
        content_topic="/waku/2/default-content/proto",
        meta=bytes.fromhex("73757065722d736563726574"),
        timestamp=0x175789BFA23F8400,
    ),
)
VECTOR_HASH = "0x64cce733fed134e83da02b02c6f689814872b1a0ac97ea56b76095c3c72bfe05"


async def get(url: str, **params: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url, params=params) as response:
        return response.status, await response.json()


def test_v3_query_json_shape_matches_nwaku(archive: SqlArchive, tmp_path: Path) -> None:
    async def scenario() -> None:
        archive.insert([VECTOR])
        async with running(archive, tmp_path) as node:
            status, body = await get(
                f"{node.url}/store/v3/messages",
                includeData="true",
                pubsubTopic="/waku/2/default-waku/proto",
                contentTopics="/waku/2/default-content/proto",
            )
        assert status == 200
        assert body["statusCode"] == 200 and body["statusDesc"] == "OK"
        assert body["requestId"] == "" and "paginationCursor" not in body  # as nwaku, locally
        assert body["messages"] == [
            {
                "messageHash": VECTOR_HASH,
                "pubsubTopic": "/waku/2/default-waku/proto",
                "message": {
                    "payload": base64.b64encode(VECTOR.message.payload).decode(),
                    "contentTopic": "/waku/2/default-content/proto",
                    "meta": base64.b64encode(VECTOR.message.meta).decode(),
                    "version": 0,
                    "timestamp": 0x175789BFA23F8400,
                    "ephemeral": False,
                },
            }
        ]

    asyncio.run(scenario())


def test_pagination_over_http(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    messages = make_messages(45)
    sqlite_archive.insert(messages)

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path) as node:
            seen: list[str] = []
            params = {"pageSize": "20", "ascending": "false"}
            while True:
                status, body = await get(f"{node.url}/store/v3/messages", **params)
                assert status == 200
                assert all(set(m) == {"messageHash"} for m in body["messages"])  # no data
                seen = [m["messageHash"] for m in body["messages"]] + seen
                if "paginationCursor" not in body:
                    break
                params["cursor"] = body["paginationCursor"]
        assert seen == ["0x" + m.message_hash.hex() for m in in_order(messages)]

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"pageSize": "x"}, "pageSize"),
        ({"startTime": "yesterday"}, "startTime"),
        ({"hashes": "zz"}, "not hex"),
        ({"hashes": "0x" + "00" * 31}, "32 bytes"),
        ({"contentTopics": ",".join(f"/a/1/t{i}/proto" for i in range(11))}, "at most 10"),
        ({"hashes": "0x" + "00" * 32, "startTime": "1"}, "no content topics or time range"),
        ({"cursor": "0x" + "11" * 32}, "unknown cursor"),
        ({"includeData": "maybe"}, "includeData"),
    ],
)
def test_bad_queries_are_400_with_a_reason(
    sqlite_archive: SqlArchive, tmp_path: Path, params: dict[str, str], reason: str
) -> None:
    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path) as node:
            status, body = await get(f"{node.url}/store/v3/messages", **params)
        assert status == 400
        assert body["statusCode"] == 400 and reason in body["statusDesc"]
        assert body["messages"] == []

    asyncio.run(scenario())


def test_too_many_queries_in_flight_is_429(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path, max_concurrent_queries=0) as node:
            status, body = await get(f"{node.url}/store/v3/messages")
            assert (status, body["statusCode"]) == (429, 429)
            assert 'sdsync_store_queries_total{status="429"} 1.0' in await metrics(node.url)

    asyncio.run(scenario())


async def metrics(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        assert response.status == 200
        return await response.text()


async def post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/store/v3/messages", json=body, headers=headers or {}) as response,
    ):
        return response.status, await response.text()


def test_ingestion_needs_the_token(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    archive_url = str(tmp_path / "store.sqlite3")
    body = {"messages": [entry_json(m) for m in make_messages(3)]}

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path) as node:
            assert (await post(node.url, body))[0] == 401
            assert (await post(node.url, body, {"Authorization": "Bearer nope"}))[0] == 401
            status, text = await post(node.url, body, AUTH)
            assert status == 200 and '"stored": 3' in text
            status, text = await post(node.url, body, AUTH)
            assert '"stored": 0' in text and '"duplicates": 3' in text
            page = await metrics(node.url)
            assert 'sdsync_store_ingested_messages_total{source="http"} 3.0' in page
            assert "sdsync_store_messages 3.0" in page
        async with running(open_archive(archive_url), tmp_path, token=None) as node:
            assert (await post(node.url, body, AUTH))[0] == 403

    asyncio.run(scenario())


def test_a_tampered_message_rejects_the_whole_request(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    entries = [entry_json(m) for m in make_messages(3)]
    entries[1]["message"]["payload"] = base64.b64encode(b"swapped").decode()

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path) as node:
            status, text = await post(node.url, {"messages": entries}, AUTH)
            assert status == 400 and "does not match" in text
            assert 'sdsync_store_rejected_total{source="http"} 1.0' in await metrics(node.url)
        assert sqlite_archive.count() == 0

    asyncio.run(scenario())


def test_protobuf_ingestion_checks_the_claimed_hash(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def send(url: str, hash_hex: str) -> int:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{url}/store/v3/messages",
                data=VECTOR.message.to_bytes(),
                params={"pubsubTopic": VECTOR.pubsub_topic, "hash": hash_hex},
                headers={**AUTH, "Content-Type": "application/x-protobuf"},
            ) as response,
        ):
            return response.status

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path) as node:
            assert await send(node.url, "0x" + "00" * 32) == 400
            assert await send(node.url, VECTOR_HASH) == 200
        assert sqlite_archive.get([VECTOR.message_hash]) == [VECTOR]

    asyncio.run(scenario())


def test_admin_retention_and_info(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    sqlite_archive.insert(make_messages(30))
    policy = {"retention": (RetentionPolicy.parse("capacity:10"),)}

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path, retention_interval_s=3600, **policy) as node:
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{node.url}/admin/v1/retention") as response:
                    assert response.status == 401
                async with session.post(f"{node.url}/admin/v1/retention", headers=AUTH) as response:
                    assert response.status == 200
                    assert set((await response.json())["deleted"]) == {"capacity:10"}
                async with session.get(f"{node.url}/admin/v1/info", headers=AUTH) as response:
                    info = await response.json()
            assert info["backend"] == "sqlite" and info["retention"] == ["capacity:10"]
            assert info["messages"] == 10
            # Whether the periodic run at start or ours deleted them, 20 went in all.
            assert 'sdsync_store_retention_deleted_messages_total{policy="capacity"} 20.0' in (
                await metrics(node.url)
            )
            # Defined for Store Sync, which increments them once mounted.
            for name in ("sync_rounds", "sync_bytes", "sync_differences"):
                assert f"# TYPE sdsync_store_{name}_total counter" in await metrics(node.url)

    asyncio.run(scenario())


def test_sub_applications_mount_under_their_prefix(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def count(request: web.Request) -> web.Response:
        node = request.app[NODE]
        return web.json_response({"items": await node.in_archive(node.archive.count)})

    sync = web.Application()
    sync.router.add_get("/count", count)
    sqlite_archive.insert(make_messages(4))

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path, mounts={"/sync/": sync}) as node:
            status, body = await get(f"{node.url}/sync/count")
        assert (status, body) == (200, {"items": 4})

    asyncio.run(scenario())


def test_heartbeat_records_last_online(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path, clock_ns=lambda: T0 + 42):
            pass

    asyncio.run(scenario())
    assert LastOnline(tmp_path / "last_online").read() == T0 + 42
