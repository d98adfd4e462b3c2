"""Store v3 over libp2p (``/vac/waku/store-query/3.0.0``), sans-I/O of the transport.

The libp2p answers are checked against the REST answers of the same node for the same
queries (one query engine behind both), over a 2,000-message archive on both backends;
js-waku's paging rule reads every message once in both directions; hostile requests are
400 and counted; :class:`WakuStoreClient` fetches by hash through a request callable that
calls :func:`answer_store_query` directly.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from storetest import HOUR, PUBSUB, T0, in_order, make_messages, running
from test_client import archive_all_but_ten, fetch_every_other, hints

from sdsync.store import SqlArchive, StoredMessage, StoreNode, StoreUnavailableError
from sdsync.store.rest import entry_json, query_params
from sdsync.waku.rpc import MAX_RPC_BYTES, encode_frame
from sdsync.waku.store.client import WakuStoreClient
from sdsync.waku.store.rpc import STORE_QUERY_PROTOCOL, StoreQueryRequest, StoreQueryResponse
from sdsync.waku.store.service import ROUTE, answer_store_query, serve_store_stream, store_query
from sdsync.wire import HistoryEntry

OTHER = "/waku/2/rs/1/5"
TOPICS = ("/app/1/chat/proto", "/app/1/acks/proto", "/other/1/x/proto")


def dataset() -> list[StoredMessage]:
    """2,000 messages: 1,800 on PUBSUB, 200 on OTHER, over three content topics."""
    main = make_messages(1_800, seed=3)
    other = [StoredMessage.of(OTHER, m.message) for m in make_messages(200, seed=4)]
    return in_order([*main, *other])


MESSAGES = dataset()


@asynccontextmanager
async def serving(archive: SqlArchive, tmp: Path, **config: Any) -> AsyncIterator[StoreNode]:
    archive.insert(MESSAGES)
    async with running(archive, tmp, **config) as node:
        yield node


async def ask(node: StoreNode, request: StoreQueryRequest) -> StoreQueryResponse:
    return StoreQueryResponse.from_bytes(await answer_store_query(node.queries, request.to_bytes()))


def refused(node: StoreNode, reason: str) -> float:
    value = node.metrics.registry.get_sample_value(
        "sdsync_store_refused_total", {"route": ROUTE, "reason": reason}
    )
    return value or 0.0


# -- the same answers as REST


def requests() -> list[StoreQueryRequest]:
    """Every filter, both directions, page sizes 1, 20 (absent), 100 and 150 (capped)."""
    rng = random.Random(5)
    hashes = (*(m.message_hash for m in rng.sample(MESSAGES, 60)), b"\x00" * 32)
    middle = MESSAGES[1000].timestamp
    filters: list[dict[str, Any]] = [
        {},
        {"pubsub_topic": OTHER},
        {"pubsub_topic": PUBSUB, "content_topics": TOPICS[:1]},
        {"pubsub_topic": PUBSUB, "content_topics": TOPICS[1:]},
        {"content_topics": TOPICS[2:]},  # nwaku serves content topics without a pubsub topic
        {"time_start": T0 + HOUR, "time_end": middle},
        {"pubsub_topic": PUBSUB, "content_topics": TOPICS[:2], "time_start": middle},
        {"message_hashes": hashes},
    ]
    return [
        StoreQueryRequest(
            request_id=f"r{i}",
            include_data=i % 2 == 0,
            pagination_forward=forward,
            pagination_limit=size,
            **kw,
        )
        for i, (kw, forward, size) in enumerate(
            itertools.product(filters, (True, False), (1, None, 100, 150))
        )
    ]


def rest_params(request: StoreQueryRequest) -> dict[str, str]:
    params = query_params(store_query(request))
    if request.pagination_limit is not None:
        params["pageSize"] = str(request.pagination_limit)  # unclamped: the server clamps
    return params


def from_rest(body: dict[str, Any]) -> tuple[Any, ...]:
    return (
        body["statusCode"],
        [(e["messageHash"], e.get("pubsubTopic"), e.get("message")) for e in body["messages"]],
        body.get("paginationCursor"),
    )


def from_libp2p(response: StoreQueryResponse) -> tuple[Any, ...]:
    def message(entry: Any) -> dict[str, Any] | None:
        if entry.message is None:
            return None
        stored = StoredMessage(entry.message_hash, entry.pubsub_topic, entry.message)
        return dict(entry_json(stored)["message"])

    cursor = response.pagination_cursor
    return (
        response.status_code,
        [("0x" + e.message_hash.hex(), e.pubsub_topic, message(e)) for e in response.messages],
        None if cursor is None else "0x" + cursor.hex(),
    )


def test_libp2p_answers_equal_rest_answers(archive: SqlArchive, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(archive, tmp_path) as node, aiohttp.ClientSession() as http:
            for first in requests():
                request = first
                for _page in range(3):
                    url = f"{node.url}/store/v3/messages"
                    async with http.get(url, params=rest_params(request)) as answer:
                        rest = from_rest(await answer.json())
                    response = await ask(node, request)
                    assert response.request_id == request.request_id
                    assert from_libp2p(response) == rest, request
                    assert len(response.messages) <= (min(request.pagination_limit or 20, 100)), (
                        request
                    )
                    if response.pagination_cursor is None:
                        break
                    request = replace(request, pagination_cursor=response.pagination_cursor)

    asyncio.run(scenario())


# -- js-waku's paging rule


@pytest.mark.parametrize("size", [None, 100])
def test_the_js_client_paging_rule_reads_every_message_once(
    archive: SqlArchive, tmp_path: Path, size: int | None
) -> None:
    """js-waku pages with the hash of the page's last message (its first, going
    backward) until it gets an empty page, and expects chronological pages."""

    async def walk(node: StoreNode, forward: bool) -> list[bytes]:
        seen: list[bytes] = []
        cursor = None
        while True:
            request = StoreQueryRequest(
                request_id="js",
                include_data=True,
                pagination_forward=forward,
                pagination_limit=size,
                pagination_cursor=cursor,
            )
            response = await ask(node, request)
            assert response.status_code == 200, response.status_desc
            page = [e.message_hash for e in response.messages if e.message_hash]
            if not page:
                return seen
            stamps = [e.message.timestamp for e in response.messages if e.message]
            assert stamps == sorted(stamps)  # chronological in both directions
            seen = [*seen, *page] if forward else [*page, *seen]
            cursor = page[-1] if forward else page[0]

    async def scenario() -> None:
        async with serving(archive, tmp_path) as node:
            expected = [m.message_hash for m in MESSAGES]
            assert await walk(node, forward=True) == expected
            assert await walk(node, forward=False) == expected

    asyncio.run(scenario())


# -- hostile requests


def test_malformed_truncated_and_oversized_requests_answer_400_and_count(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    valid = StoreQueryRequest(request_id="ok", pubsub_topic=PUBSUB).to_bytes()
    bad_bytes = {
        "malformed_rpc": [b"\xff\xff\xff", valid[:-3], b"\x0a\xff", b"\x42" * 40],
        "oversized": [b"\x00" * (MAX_RPC_BYTES + 1)],
    }
    bad_queries = {
        "hashes_with_filter": StoreQueryRequest(
            request_id="h",
            pubsub_topic=PUBSUB,
            content_topics=TOPICS[:1],
            message_hashes=(b"\x01" * 32,),
        ),
        "too_many_content_topics": StoreQueryRequest(
            request_id="t",
            pubsub_topic=PUBSUB,
            content_topics=tuple(f"/a/1/{i}/p" for i in "abcdefghijk"),
        ),
        "unknown_cursor": StoreQueryRequest(request_id="c", pagination_cursor=b"\x11" * 32),
        "bad_topic": StoreQueryRequest(request_id="n", pubsub_topic="/waku/\x00"),
    }

    async def scenario() -> None:
        async with serving(sqlite_archive, tmp_path) as node:
            for reason, payloads in bad_bytes.items():
                for payload in payloads:
                    response = StoreQueryResponse.from_bytes(
                        await answer_store_query(node.queries, payload)
                    )
                    assert (response.status_code, response.request_id) == (400, ""), payload[:9]
                    assert response.status_desc and not response.messages
                assert refused(node, reason) == len(payloads)
            for reason, request in bad_queries.items():
                response = await ask(node, request)
                assert (response.status_code, response.request_id) == (400, request.request_id)
                assert refused(node, reason) == 1, reason
            # And the node keeps serving.
            assert (await ask(node, StoreQueryRequest(request_id="x"))).status_code == 200

    asyncio.run(scenario())


async def _stream(node: StoreNode, data: bytes) -> bytes:
    """What :func:`serve_store_stream` writes back on a stream that carries ``data``."""
    offset = 0
    written = bytearray()

    async def read(n: int) -> bytes:
        nonlocal offset
        chunk = data[offset : offset + min(n, 7)]  # a few bytes at a time, as streams do
        offset += len(chunk)
        return chunk

    async def write(chunk: bytes) -> None:
        written.extend(chunk)

    await serve_store_stream(node.queries, read, write)
    return bytes(written)


def test_streams_are_framed_and_bad_frames_answered(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    request = StoreQueryRequest(request_id="s", include_data=True, pagination_limit=5)

    async def scenario() -> None:
        async with serving(sqlite_archive, tmp_path) as node:
            answer = await _stream(node, encode_frame(request.to_bytes()))
            body = answer[2:] if answer[0] & 0x80 else answer[1:]
            assert encode_frame(body) == answer
            response = StoreQueryResponse.from_bytes(body)
            assert response.status_code == 200 and len(response.messages) == 5
            assert await _stream(node, b"") == b""  # opened and closed unused: no answer
            for data, reason in [
                (encode_frame(request.to_bytes())[:-2], "truncated_frame"),
                (b"\xff\xff\xff\x7f", "oversized"),
                (b"\x80" * 11, "malformed_rpc"),  # a prefix of 11 bytes,
            ]:
                answer = await _stream(node, data)
                assert StoreQueryResponse.from_bytes(answer[1:]).status_code == 400
                assert refused(node, reason) >= 1, reason

    asyncio.run(scenario())


def test_busy_node_answers_429(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(sqlite_archive, tmp_path, max_concurrent_queries=0) as node:
            response = await ask(node, StoreQueryRequest(request_id="b"))
            assert (response.status_code, response.request_id) == (429, "b")
            assert refused(node, "too_many_queries") == 1

    asyncio.run(scenario())


# -- the client


def direct(node: StoreNode) -> Callable[[str, bytes], Awaitable[bytes]]:
    """A request callable that answers on ``node`` itself: no libp2p in between."""

    async def request(protocol_id: str, payload: bytes) -> bytes:
        assert protocol_id == STORE_QUERY_PROTOCOL
        return await answer_store_query(node.queries, payload)

    return request


def test_waku_store_client_fetches_missing_messages_by_hash(
    archive: SqlArchive, tmp_path: Path
) -> None:
    stored = archive_all_but_ten(archive, 250)

    async def scenario() -> None:
        async with running(archive, tmp_path) as node:
            found = await fetch_every_other(WakuStoreClient(direct(node)), stored)
        # 125 hints (more than one query's worth), 120 of them archived.
        assert hints(found) == sorted(m.message_hash for m in stored[0:240:2])
        assert {f.data for f in found} == {m.message.payload for m in stored[0:240:2]}

    asyncio.run(scenario())


def test_waku_store_client_reports_an_unavailable_peer(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def unreachable(protocol_id: str, payload: bytes) -> bytes:
        raise ConnectionResetError("peer went away")

    async def busy(protocol_id: str, payload: bytes) -> bytes:
        request = StoreQueryRequest.from_bytes(payload)
        return StoreQueryResponse(request.request_id, 503, "archive unavailable").to_bytes()

    async def stranger(protocol_id: str, payload: bytes) -> bytes:
        return StoreQueryResponse("someone else", 200, "OK").to_bytes()

    entries = (HistoryEntry("m", b"\x01" * 32),)

    async def scenario() -> None:
        for request in (unreachable, busy):
            with pytest.raises(StoreUnavailableError):
                await WakuStoreClient(request).fetch("chan", entries)
        # A peer that answers another request is dropped (logged), not trusted.
        assert await WakuStoreClient(stranger).fetch("chan", entries) == []

    asyncio.run(scenario())
