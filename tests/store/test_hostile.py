"""A store node under attack: hostile input is refused with a 4xx and a reason, never a 500.

Every refusal is counted in ``sdsync_store_refused_total{route, reason}``; ingestion is
parsed off the event loop; implausible timestamps are refused on every ingestion path.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from storetest import HOUR, PUBSUB, T0, TOKEN, make_messages, running

from sdsync.store import Page, SqlArchive, StoredMessage, open_archive, rest, server
from sdsync.store.metrics import StoreMetrics
from sdsync.store.node import StoreNode
from sdsync.store.rest import entry_json, page_json
from sdsync.store.resume import LastOnline
from sdsync.testing.memory import MemoryNetwork
from sdsync.waku.messages import InvalidMessageError, check_ingestible, check_timestamp
from sdsync.wire.waku import DEFAULT_TIMESTAMP_VARIANCE_S, WakuMessage

AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUERY = "GET /store/v3/messages"
INGEST = "POST /store/v3/messages"
NOW = T0 + 4 * HOUR  # the node's clock: every message of make_messages() is older
SECOND = 10**9
PATIENCE_S = 10.0  # a liveness bound for the tests that wait on each other, not a timing


def refused(node: StoreNode, route: str, reason: str) -> float:
    value = node.metrics.registry.get_sample_value(
        "sdsync_store_refused_total", {"route": route, "reason": reason}
    )
    return value or 0.0


async def get(url: str, **params: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url, params=params) as response:
        return response.status, await response.json(content_type=None)


async def post_raw(
    url: str,
    data: bytes,
    *,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/store/v3/messages",
            data=data,
            params=params,
            headers={"Content-Type": "application/json", **AUTH, **(headers or {})},
        ) as response,
    ):
        return response.status, await response.text()


async def post_json(url: str, body: Any) -> tuple[int, str]:
    return await post_raw(url, json.dumps(body).encode())


async def raw_http(url: str, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as it is (aiohttp's client would refuse to send such headers)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def one_line(text: str) -> bool:
    return "\n" not in text.strip() and 0 < len(text.strip()) <= 400


# -- 1. no 500 on bad input: queries


BAD_QUERIES: list[tuple[dict[str, str], str]] = [
    ({"startTime": str(2**63)}, "bad_time"),
    ({"endTime": str(2**63)}, "bad_time"),
    ({"startTime": str(2**64 + 5)}, "bad_time"),
    ({"startTime": str(-(2**63) - 1)}, "bad_time"),
    ({"endTime": "9" * 5000}, "bad_time"),
    ({"startTime": "1.5e18"}, "bad_time"),
    ({"endTime": "1_700_000_000"}, "bad_time"),
    ({"startTime": "\u0661\u0662\u0663"}, "bad_time"),  # Arabic-Indic digits: int() takes them
    ({"pageSize": str(2**63)}, "bad_page_size"),
    ({"pageSize": "ten"}, "bad_page_size"),
    ({"pubsubTopic": "/waku/2/\x00"}, "bad_topic"),
    ({"pubsubTopic": PUBSUB, "contentTopics": "/a/1/\x00/proto"}, "bad_topic"),
    ({"pubsubTopic": "/waku/2/" + "x" * 1100}, "bad_topic"),
    ({"hashes": "zz"}, "bad_hash"),
    ({"cursor": "0x" + "11" * 31}, "bad_cursor"),
    ({"cursor": "0x" + "11" * 32}, "unknown_cursor"),
    ({"contentTopics": ",".join(f"/a/1/t{i}/proto" for i in range(11))}, "too_many_content_topics"),
    ({"includeData": "maybe"}, "bad_include_data"),
]


def test_bad_query_parameters_are_400_with_a_counted_reason(
    archive: SqlArchive, tmp_path: Path
) -> None:
    archive.insert(make_messages(5))

    async def scenario() -> None:
        async with running(archive, tmp_path) as node:
            for params, _reason in BAD_QUERIES:
                status, body = await get(f"{node.url}/store/v3/messages", **params)
                assert (status, body["statusCode"]) == (400, 400), (params, body)
                assert one_line(body["statusDesc"]), body
                assert body["messages"] == []
            expected: dict[str, int] = {}
            for _, reason in BAD_QUERIES:
                expected[reason] = expected.get(reason, 0) + 1
            for reason, count in expected.items():
                assert refused(node, QUERY, reason) == count, reason
            # The bounds themselves are fine: int64 in full, and <= 0 means "no bound".
            for edge in (str(2**63 - 1), str(-(2**63)), "0", "-5"):
                status, body = await get(
                    f"{node.url}/store/v3/messages", startTime=edge, endTime=str(2**63 - 1)
                )
                assert status == 200, (edge, body)

    asyncio.run(scenario())


NASTY = [
    "",
    " ",
    ",",
    ",,,",
    "0x",
    "\x00",
    "\ufffd\ufffd",
    "-1",
    "0",
    str(2**63),
    str(-(2**64)),
    "9" * 4400,
    "1e3",
    "true",
    "\u0967",
    "0x" + "ab" * 32 + "," + "zz",
    ",".join(["/t/1/x/proto"] * 150),
    "a" * 3000,
]
PARAMS = (
    "includeData",
    "pubsubTopic",
    "contentTopics",
    "startTime",
    "endTime",
    "hashes",
    "cursor",
    "ascending",
    "pageSize",
)


def test_no_query_parameter_value_makes_a_500(archive: SqlArchive, tmp_path: Path) -> None:
    archive.insert(make_messages(5))

    async def scenario() -> None:
        async with running(archive, tmp_path) as node:
            for name in PARAMS:
                for value in NASTY:
                    params = {name: value}
                    if name == "contentTopics":
                        params["pubsubTopic"] = PUBSUB
                    status, body = await get(f"{node.url}/store/v3/messages", **params)
                    assert status in (200, 400), (name, value[:40], status, body)
                    assert body["statusCode"] == status
                    if status == 400:
                        assert one_line(body["statusDesc"])

    asyncio.run(scenario())


# -- 1. no 500 on bad input: authorization


def test_an_undecodable_authorization_header_is_401(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path) as node:
            for path in (b"POST /store/v3/messages", b"GET /admin/v1/info"):
                status, body = await raw_http(
                    node.url,
                    path + b" HTTP/1.1\r\nHost: store\r\nContent-Length: 2\r\n"
                    b"Authorization: Bearer \xff\xfe\r\nConnection: close\r\n\r\n{}",
                )
                assert status == 401, body
                assert one_line(body.decode())
            status, _ = await raw_http(
                node.url,
                b"POST /store/v3/messages HTTP/1.1\r\nHost: store\r\nContent-Length: 2\r\n"
                b"Authorization: \xc3\x28 " + TOKEN.encode() + b"\r\nConnection: close\r\n\r\n{}",
            )
            assert status == 401
            assert refused(node, INGEST, "bad_token") == 2
            assert refused(node, "GET /admin/v1/info", "bad_token") == 1
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{node.url}/store/v3/messages", json={}) as response,
            ):
                assert response.status == 401
            assert refused(node, INGEST, "missing_token") == 1
        async with running(open_archive(str(tmp_path / "x.sqlite3")), tmp_path, token=None) as node:
            assert (await post_json(node.url, {"messages": []}))[0] == 403
            assert refused(node, INGEST, "writes_disabled") == 1

    asyncio.run(scenario())


# -- 1. no 500 on bad input: the ingestion body


def test_deeply_nested_json_is_400_not_a_recursion_error(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    bodies = [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        b"[" * 100_000,  # not even closed
        b'["]]]]",' * 10 + b"[" * 5_000 + b"]" * 5_000 + b"]",  # brackets in strings do not hide it
    ]

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path) as node:
            for body in bodies:
                status, text = await post_raw(node.url, body)
                assert status == 400, text[:200]
                assert "too deep" in text and one_line(text)
            assert refused(node, INGEST, "json_too_deep") == len(bodies)
            # Strings full of brackets are not structure.
            entries = [entry_json(m) for m in make_messages(2)]
            deep_topic = "/app/1/" + "[{" * 500 + "/proto"
            odd = StoredMessage.of(PUBSUB, WakuMessage(b"x", deep_topic, timestamp=T0))
            body = {"messages": [*entries, entry_json(odd)], "note": '\\"[[[[[[[[[[[[[[['}
            status, text = await post_json(node.url, body)
            assert status == 200, text

    asyncio.run(scenario())


def nesting(value: Any) -> int:
    children = value.values() if isinstance(value, dict) else value
    if not isinstance(value, (dict, list)):
        return 0
    return 1 + max((nesting(child) for child in children), default=0)


TRICKY = st.text(alphabet='[]{},:"\\ab\u00e9\n', max_size=8)
DOCUMENTS = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
    max_leaves=40,
)


def wrapped(doc: Any, keys: list[str]) -> Any:
    """``doc`` inside one array (empty key) or object (that key) per key, outermost last."""
    for key in keys:
        doc = {key: doc} if key else [doc, key]
    return doc


@settings(max_examples=400, deadline=None)
@given(DOCUMENTS, st.lists(st.one_of(st.just(""), TRICKY), max_size=10), st.booleans())
def test_the_structure_check_sees_the_nesting_the_decoder_sees(
    inner: Any, keys: list[str], ascii_only: bool
) -> None:
    doc = wrapped(inner, keys)
    body = json.dumps(doc, ensure_ascii=ascii_only).encode()
    if nesting(doc) > rest.MAX_JSON_DEPTH:
        with pytest.raises(InvalidMessageError) as caught:
            rest.check_json_structure(body)
        assert caught.value.reason == "json_too_deep"
    else:
        rest.check_json_structure(body)


def hostile_entries() -> list[tuple[str, Any, str]]:
    """(what, request body, expected reason): each must be a 400, nothing stored."""
    good = entry_json(make_messages(1)[0])

    def entry(**message: Any) -> dict[str, Any]:
        return {**good, "message": {**good["message"], **message}}

    nul_topic = StoredMessage.of(PUBSUB, WakuMessage(b"x", "/app/1/\x00/proto", timestamp=T0))
    # Incompressible and above PostgreSQL's 2,704-byte index entries: it used to be a 503.
    long_topic = StoredMessage.of(
        PUBSUB, WakuMessage(b"x", "/app/1/" + random.Random(3).randbytes(1500).hex(), timestamp=T0)
    )
    return [
        (
            "lone surrogate pubsub topic",
            {"messages": [{**good, "pubsubTopic": "\ud800"}]},
            "bad_topic",
        ),
        (
            "lone surrogate content topic",
            {"messages": [entry(contentTopic="/a/\udfff")]},
            "bad_topic",
        ),
        ("NUL in the content topic", {"messages": [entry_json(nul_topic)]}, "bad_topic"),
        ("a 3 KB content topic", {"messages": [entry_json(long_topic)]}, "bad_topic"),
        ("boolean timestamp", {"messages": [entry(timestamp=True)]}, "malformed"),
        ("boolean version", {"messages": [entry(version=True)]}, "malformed"),
        ("timestamp beyond int64", {"messages": [entry(timestamp=2**64)]}, "malformed"),
        ("float timestamp", {"messages": [entry(timestamp=1.5)]}, "malformed"),
        ("hash of another message", {"messages": [entry(payload="AAAA")]}, "hash_mismatch"),
        ("not a list", {"messages": {"a": 1}}, "malformed"),
        ("not an object", [1, 2, 3], "malformed"),
        ("entry not an object", {"messages": [[good]]}, "malformed"),
        ("null message", {"messages": [{**good, "message": None}]}, "malformed"),
        ("payload not base64", {"messages": [entry(payload="***")]}, "malformed"),
        (
            "payload non-ASCII",
            {"messages": [entry(payload="\u00e9\u00e9\u00e9\u00e9")]},
            "malformed",
        ),
        ("hash non-ASCII", {"messages": [{**good, "messageHash": "\u0661" * 64}]}, "malformed"),
    ]


def test_hostile_entries_are_400_with_a_reason(archive: SqlArchive, tmp_path: Path) -> None:
    cases = hostile_entries()

    async def scenario() -> None:
        async with running(archive, tmp_path) as node:
            for what, body, reason in cases:
                status, text = await post_json(node.url, body)
                assert status == 400, (what, status, text[:300])
                assert one_line(text), what
                assert refused(node, INGEST, reason) >= 1, (what, reason)
            for what, data in [
                ("not UTF-8", b'{"messages": ["\xff\xfe"]}'),
                ("UTF-16", json.dumps({"messages": []}).encode("utf-16")),
                ("huge integer", b'{"messages": [' + b"9" * 5000 + b"]}"),
                ("NaN", b'{"messages": [NaN]}'),
                ("empty", b""),
            ]:
                status, text = await post_raw(node.url, data)
                assert status == 400, (what, status, text[:300])
                assert one_line(text), what
            # One WakuMessage as protobuf, on a pubsub topic PostgreSQL cannot store.
            waku = WakuMessage(b"x", "/app/1/chat/proto", timestamp=T0)
            status, text = await post_raw(
                node.url,
                waku.to_bytes(),
                headers={"Content-Type": "application/x-protobuf"},
                params={"pubsubTopic": "/waku/\x00"},
            )
            assert status == 400 and one_line(text), text
            status, text = await post_raw(
                node.url,
                b"\xff\xff\xff\xff",
                headers={"Content-Type": "application/x-protobuf"},
                params={"pubsubTopic": PUBSUB},
            )
            assert status == 400 and one_line(text), text
            assert await node.in_archive(archive.count) == 0

    asyncio.run(scenario())


def test_no_field_value_of_an_entry_makes_a_500(archive: SqlArchive, tmp_path: Path) -> None:
    good = entry_json(make_messages(1)[0])
    values: list[Any] = [
        None,
        True,
        0,
        -1,
        1.5,
        2**64,
        -(2**64),
        "",
        "\x00",
        "\ud800",
        "zz",
        [],
        {},
        "0x",
        10**30,
    ]

    async def scenario() -> None:
        async with running(archive, tmp_path) as node:
            for field in ("messageHash", "pubsubTopic", "message"):
                for value in values:
                    status, text = await post_json(node.url, {"messages": [{**good, field: value}]})
                    assert status == 400, (field, value, text)
            for field in ("payload", "contentTopic", "meta", "version", "timestamp", "ephemeral"):
                for value in values:
                    entry = {**good, "message": {**good["message"], field: value}}
                    status, text = await post_json(node.url, {"messages": [entry]})
                    assert status in (200, 400), (field, value, status, text)
                    assert one_line(text)

    asyncio.run(scenario())


def test_a_body_above_the_limit_is_413_and_counted(
    sqlite_archive: SqlArchive, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "MAX_BODY_BYTES", 4096)

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path) as node:
            status, _ = await post_raw(node.url, b" " * 10_000)
            assert status == 413
            assert refused(node, INGEST, "body_too_large") == 1

    asyncio.run(scenario())


def test_the_refused_counter_is_there_for_other_routes() -> None:
    metrics = StoreMetrics()
    metrics.refuse("POST /sync/v1/sessions/{session}", "timestamp_in_future")
    metrics.refuse("POST /sync/v1/sessions/{session}", "timestamp_in_future")
    labels = {"route": "POST /sync/v1/sessions/{session}", "reason": "timestamp_in_future"}
    assert metrics.registry.get_sample_value("sdsync_store_refused_total", labels) == 2


# -- 2. JSON ingestion off the event loop


def test_json_ingestion_is_parsed_off_the_event_loop(
    sqlite_archive: SqlArchive, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = make_messages(200)
    entered = threading.Event()
    release = threading.Event()
    parse_threads: list[int] = []
    released: list[bool] = []
    original = rest.read_entries

    def held_read_entries(body: Any) -> list[StoredMessage]:
        parse_threads.append(threading.get_ident())
        entered.set()
        # The test releases it once /health has answered; on the loop thread it could not.
        released.append(release.wait(PATIENCE_S))
        return original(body)

    monkeypatch.setattr(rest, "read_entries", held_read_entries)

    async def scenario() -> None:
        loop_thread = threading.get_ident()
        async with running(sqlite_archive, tmp_path) as node:
            posting = asyncio.create_task(
                post_json(node.url, {"messages": [entry_json(m) for m in messages]})
            )
            assert await asyncio.to_thread(entered.wait, PATIENCE_S)
            status, body = await get(f"{node.url}/health")
            # /health answered while the parse was still held: the loop was free.
            assert (status, body) == (200, {"status": "ok"})
            assert not release.is_set() and not posting.done()
            release.set()
            status, text = await posting
            assert status == 200 and '"stored": 200' in text
        assert released == [True]
        assert parse_threads and loop_thread not in parse_threads

    asyncio.run(scenario())


# -- 3. timestamp plausibility


def test_the_timestamp_check() -> None:
    variance = int(DEFAULT_TIMESTAMP_VARIANCE_S * SECOND)
    assert DEFAULT_TIMESTAMP_VARIANCE_S == 20.0  # nwaku's MaxMessageTimestampVariance
    check_timestamp(1, NOW, variance)  # old is fine
    check_timestamp(NOW + variance, NOW, variance)
    for bad, reason in [
        (0, "timestamp_not_positive"),
        (-1, "timestamp_not_positive"),
        (NOW + variance + 1, "timestamp_in_future"),
    ]:
        with pytest.raises(InvalidMessageError) as caught:
            check_timestamp(bad, NOW, variance)
        assert caught.value.reason == reason and one_line(str(caught.value))
    nul = StoredMessage.of(PUBSUB, WakuMessage(b"x", "/a/\x00", timestamp=T0))
    with pytest.raises(InvalidMessageError) as caught:
        check_ingestible(nul, NOW, variance)
    assert caught.value.reason == "bad_topic"


def at(offset_ns: int, payload: bytes = b"x") -> StoredMessage:
    return StoredMessage.of(PUBSUB, WakuMessage(payload, "/app/1/chat/proto", timestamp=offset_ns))


def test_http_ingestion_refuses_future_and_nonpositive_timestamps(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    old, near = at(T0), at(NOW + 19 * SECOND)
    future = at(NOW + 21 * SECOND)

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path, clock_ns=lambda: NOW) as node:
            for bad, reason in [
                (future, "timestamp_in_future"),
                (at(0), "timestamp_not_positive"),
                (at(-5), "timestamp_not_positive"),
            ]:
                status, text = await post_json(
                    node.url, {"messages": [entry_json(m) for m in [old, bad]]}
                )
                assert status == 400 and f"[{reason}]" in text, text
                assert refused(node, INGEST, reason) >= 1
            assert sqlite_archive.count() == 0  # the whole request is refused
            status, text = await post_json(
                node.url, {"messages": [entry_json(old), entry_json(near)]}
            )
            assert status == 200 and '"stored": 2' in text
            # Protobuf ingestion is checked too.
            status, text = await post_raw(
                node.url,
                future.message.to_bytes(),
                headers={"Content-Type": "application/x-protobuf"},
                params={"pubsubTopic": PUBSUB},
            )
            assert status == 400 and "future" in text
        reopened = open_archive(str(tmp_path / "store.sqlite3"))
        async with running(
            reopened, tmp_path, clock_ns=lambda: NOW, timestamp_variance_s=60.0
        ) as node:
            status, text = await post_json(node.url, {"messages": [entry_json(future)]})
            assert status == 200, text

    asyncio.run(scenario())


def test_the_relay_refuses_future_and_nonpositive_timestamps(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    net = MemoryNetwork()
    store, relay = net.waku_node("store"), net.waku_node("relay")
    keep = [at(T0, b"old"), at(NOW - HOUR), at(NOW + 19 * SECOND)]
    drop = [
        (at(NOW + 21 * SECOND), "timestamp_in_future"),
        (at(NOW + 365 * 24 * HOUR), "timestamp_in_future"),
        (at(0), "timestamp_not_positive"),
        (at(-(2**63)), "timestamp_not_positive"),
    ]
    last = at(NOW, b"last")

    async def scenario() -> None:
        async with running(
            sqlite_archive, tmp_path, clock_ns=lambda: NOW, waku=store, relay_topics=(PUBSUB,)
        ) as node:
            for stored in [keep[0], drop[0][0], keep[1], *[m for m, _ in drop[1:]], keep[2], last]:
                await relay.publish_message(PUBSUB, stored.message)
            await relay.publish_message(PUBSUB, WakuMessage(b"none", "/app/1/chat/proto"))
            async with asyncio.timeout(PATIENCE_S):  # a liveness bound
                while refused(node, "relay", "no_timestamp") < 1:  # the last one relayed
                    await asyncio.sleep(0.01)
            assert refused(node, "relay", "timestamp_in_future") == 2
            assert refused(node, "relay", "timestamp_not_positive") == 2
            hashes = {m.message_hash for m in sqlite_archive.messages()}
        assert hashes == {m.message_hash for m in [*keep, last]}

    asyncio.run(scenario())


def test_store_resume_keeps_old_messages_and_drops_future_ones(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    now = T0 + 8 * HOUR
    old = make_messages(30, start=now - 5 * HOUR, span=4 * HOUR)
    future = [at(now + HOUR), at(now + 30 * SECOND)]
    served = sorted([*old, *future], key=lambda m: (m.timestamp, m.message_hash))

    async def hostile_page(request: web.Request) -> web.Response:
        # A peer that answers any window with messages from the future among the old ones.
        page = Page(hashes=[m.message_hash for m in served], messages=served)
        return web.json_response(page_json(page, "r"))

    app = web.Application()
    app.router.add_get("/store/v3/messages", hostile_page)
    LastOnline(tmp_path / "last_online").write(now - 6 * HOUR)

    async def scenario() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with running(
                sqlite_archive, tmp_path, peers=(f"http://127.0.0.1:{port}",), clock_ns=lambda: now
            ) as node:
                async with asyncio.timeout(PATIENCE_S):
                    while node.resume_report is None:
                        await asyncio.sleep(0.01)
                assert refused(node, "resume", "timestamp_in_future") == 2
        finally:
            await runner.cleanup()
        assert {m.message_hash for m in sqlite_archive.messages()} == {m.message_hash for m in old}

    asyncio.run(scenario())
