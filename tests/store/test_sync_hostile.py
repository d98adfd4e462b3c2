"""Store Sync against an attacker: what a peer without the write token can and cannot do.

Each test reproduces an attack that worked before the sync policy (src/sdsync/store/sync/
policy.py): writing arbitrary messages through a crafted window or crafted items, on any
topic; holding every session slot; keeping finished or stalled sessions alive.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import pytest
from storetest import HOUR, PUBSUB, T0, make_message, make_messages, running, sync_now

from sdsync.errors import RemoteProtocolError
from sdsync.reconcile import MemoryItemStore, RbsrSession, varint
from sdsync.reconcile.riblt import RIBLT_VERSION, RibltSession
from sdsync.store import SqlArchive, StoredMessage, open_archive
from sdsync.store.sync import ArchiveKeeper, SyncConfig, responder_app, sync_with_peer
from sdsync.store.sync.wire import (
    FRAMES_TYPE,
    SESSION_HEADER,
    encode_entry,
    encode_frames,
    messages_path,
    open_path,
    session_path,
)

WINDOW = (T0, T0 + HOUR)
YEAR_2200 = 7_258_118_400 * 10**9


async def post(
    http: aiohttp.ClientSession, url: str, body: bytes, **params: str
) -> tuple[int, bytes, str | None]:
    async with http.post(url, data=body, params=params) as response:
        return response.status, await response.read(), response.headers.get(SESSION_HEADER)


async def reconcile(
    http: aiohttp.ClientSession,
    base: str,
    claimed: Sequence[tuple[int, bytes]],
    window: tuple[int, int] = WINDOW,
) -> str:
    """Reconcile ``claimed`` items (whatever messages they stand for) as an initiator."""
    initiator = RbsrSession(MemoryItemStore(claimed), initiator=True, window=window)
    params = {"start": str(window[0]), "end": str(window[1])}
    status, reply, session_id = await post(
        http, base + open_path("rbsr"), initiator.initiate(), **params
    )
    assert status == 200 and session_id, reply
    while reply and (frame := initiator.receive(reply)) is not None:
        status, reply, _ = await post(http, base + session_path(session_id), frame)
        assert status == 200, reply
    return session_id


def keys(messages: Sequence[StoredMessage]) -> list[tuple[int, bytes]]:
    return [(m.timestamp, m.message_hash) for m in messages]


@pytest.mark.parametrize(
    "window", [(YEAR_2200, YEAR_2200 + HOUR), (T0 - 10 * HOUR, T0), (0, (1 << 63) - 1)]
)
def test_a_crafted_window_is_refused_and_nothing_is_archived(
    sqlite_archive: SqlArchive, tmp_path: Path, window: tuple[int, int]
) -> None:
    """The attack that archived 2,001 messages dated 2200 (or any other time), no token."""
    attacker = open_archive(str(tmp_path / "attacker.sqlite3"))
    attacker.insert(make_messages(2_001, seed=31, start=window[0], span=HOUR))

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path / "node", clock_ns=sync_now) as node:
            with pytest.raises(RemoteProtocolError, match="HTTP 403"):
                await sync_with_peer(ArchiveKeeper(attacker), node.url, window)
            metrics = await _metrics(node.url)
            assert 'reason="window_' in metrics and "sdsync_store_refused_total" in metrics

    asyncio.run(scenario())
    assert sqlite_archive.count() == 0


def test_a_pushed_message_must_carry_the_timestamp_its_item_claimed(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    """Items are the initiator's claims: a hash claimed at T0 may not bring a 2200 message."""
    rng = random.Random(32)
    future = make_message(rng, YEAR_2200)
    honest = make_message(rng, T0 + 5)
    known = make_message(rng, T0 + 9)  # the node archives its topic
    sqlite_archive.insert([known])

    async def scenario() -> None:
        async with (
            running(sqlite_archive, tmp_path, clock_ns=sync_now) as node,
            aiohttp.ClientSession() as http,
        ):
            claims = [(T0 + 1, future.message_hash), *keys([honest, known])]
            session_id = await reconcile(http, node.url, claims)
            push = node.url + messages_path(session_id)
            status, body, _ = await post(http, push, encode_entry(honest) + encode_entry(future))
            assert status == 403 and b"timestamp" in body
            assert (await post(http, push, encode_entry(honest)))[0] == 404  # session ended

    asyncio.run(scenario())
    assert sqlite_archive.count() == 1


def test_pushes_only_on_topics_the_node_archives(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    """Configured topics, or without them the topics the archive already holds."""
    rng = random.Random(33)
    known = make_message(rng, T0 + 1)
    sqlite_archive.insert([known])
    on_known = make_message(rng, T0 + 2)
    stranger = make_message(rng, T0 + 3, pubsub_topic="/waku/2/rs/66/6")

    refusals: list[str] = []

    async def push(base: str, message: StoredMessage, http: aiohttp.ClientSession) -> int:
        session_id = await reconcile(http, base, keys([known, message]))
        status, body, _ = await post(http, base + messages_path(session_id), encode_entry(message))
        if status == 403:
            refusals.append(body.decode())
        return status

    async def scenario() -> None:
        async with (
            running(sqlite_archive, tmp_path / "a", clock_ns=sync_now) as node,
            aiohttp.ClientSession() as http,
        ):
            assert await push(node.url, stranger, http) == 403
            assert await push(node.url, on_known, http) == 200
        other = open_archive(str(tmp_path / "b.sqlite3"))
        only = {
            "/sync/": responder_app(SyncConfig(pubsub_topics=(PUBSUB,)), wall_clock_ns=sync_now)
        }
        async with (
            running(other, tmp_path / "b", mounts=only) as node,
            aiohttp.ClientSession() as http,
        ):
            assert await push(node.url, stranger, http) == 403  # on an empty archive too
            assert await push(node.url, on_known, http) == 200

    asyncio.run(scenario())
    assert sqlite_archive.get([stranger.message_hash]) == []
    assert len(sqlite_archive.get([on_known.message_hash])) == 1
    # Issue 39: the pushing node's operator learns why, and what either side can do.
    held, given = refusals
    for refusal in refusals:
        assert "topic_not_archived" in refusal and "/waku/2/rs/66/6" in refusal
        assert "--pubsub-topic /waku/2/rs/66/6" in refusal and "store sync` on its side" in refusal
    assert "topics it holds already" in held and "its --pubsub-topic and" in given


def test_one_client_cannot_hold_every_session(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    """Four slots held by one address locked everyone out; now it gets two of them."""
    sqlite_archive.insert(make_messages(20, seed=38, span=HOUR))  # sessions stay open to pull
    first = RbsrSession(MemoryItemStore(), initiator=True, window=WINDOW).initiate()
    params = {"start": str(WINDOW[0]), "end": str(WINDOW[1])}

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path, clock_ns=sync_now) as node:
            opening = node.url + open_path("rbsr")
            async with aiohttp.ClientSession() as greedy:
                assert (await post(greedy, opening, first, **params))[0] == 200
                assert (await post(greedy, opening, first, **params))[0] == 200
                assert (await post(greedy, opening, first, **params))[0] == 503
            other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
            async with aiohttp.ClientSession(connector=other) as polite:
                assert (await post(polite, opening, first, **params))[0] == 200

    asyncio.run(scenario())


def test_only_progress_keeps_a_session_alive(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    """A session that is not done answers transfers 409; those no longer refresh it."""
    sqlite_archive.insert(make_messages(50, seed=34, span=HOUR))
    now = [0.0]
    config = SyncConfig(idle_timeout_s=30.0)
    first = RbsrSession(MemoryItemStore(), initiator=True, window=WINDOW).initiate()

    async def scenario() -> None:
        mounts = {"/sync/": responder_app(config, clock=lambda: now[0], wall_clock_ns=sync_now)}
        async with (
            running(sqlite_archive, tmp_path, mounts=mounts) as node,
            aiohttp.ClientSession() as http,
        ):
            params = {"start": str(WINDOW[0]), "end": str(WINDOW[1])}
            status, _, session_id = await post(http, node.url + open_path("rbsr"), first, **params)
            assert status == 200 and session_id
            for _ in range(3):  # a request every 20 s, each answered 409
                now[0] += 20.0
                async with http.get(node.url + messages_path(session_id)) as response:
                    assert response.status in (409, 404)
            async with http.get(node.url + messages_path(session_id)) as response:
                assert response.status == 404

    asyncio.run(scenario())


def test_a_session_is_closed_once_its_transfer_is_complete(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    rng = random.Random(35)
    theirs = [make_message(rng, T0 + i) for i in range(3)]
    ours = [make_message(rng, T0 + 10 + i) for i in range(4)]
    sqlite_archive.insert(theirs)

    async def scenario() -> None:
        async with (
            running(sqlite_archive, tmp_path, clock_ns=sync_now) as node,
            aiohttp.ClientSession() as http,
        ):
            session_id = await reconcile(http, node.url, keys(ours))
            transfer = node.url + messages_path(session_id)
            batch = b"".join(map(encode_entry, ours))
            assert (await post(http, transfer, batch))[0] == 200
            async with http.get(transfer, params={"from": "0"}) as response:
                assert response.status == 200  # the last (only) batch of what we lack
            async with http.get(transfer, params={"from": "0"}) as response:
                assert response.status == 404  # closed by the responder

    asyncio.run(scenario())
    assert sqlite_archive.count() == 7


def test_the_transfer_budget_ends_a_session(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    rng = random.Random(36)
    known = make_message(rng, T0)
    sqlite_archive.insert([known])
    ours = [make_message(rng, T0 + 1 + i) for i in range(20)]
    config = SyncConfig(max_transfer_bytes=400)

    async def scenario() -> None:
        mounts = {"/sync/": responder_app(config, wall_clock_ns=sync_now)}
        async with (
            running(sqlite_archive, tmp_path, mounts=mounts) as node,
            aiohttp.ClientSession() as http,
        ):
            session_id = await reconcile(http, node.url, keys([known, *ours]))
            transfer = node.url + messages_path(session_id)
            status, body, _ = await post(http, transfer, b"".join(map(encode_entry, ours)))
            assert status == 403 and b"budget" in body

    asyncio.run(scenario())
    assert sqlite_archive.count() == 1


def test_a_sync_token_is_required_when_set(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    sqlite_archive.insert(make_messages(10, seed=37, span=HOUR))
    peer = open_archive(str(tmp_path / "peer.sqlite3"))
    config = SyncConfig(token="federation-secret")
    first = RbsrSession(MemoryItemStore(), initiator=True, window=WINDOW).initiate()
    params = {"start": str(WINDOW[0]), "end": str(WINDOW[1])}

    async def scenario() -> None:
        mounts = {"/sync/": responder_app(config, wall_clock_ns=sync_now)}
        async with (
            running(sqlite_archive, tmp_path, mounts=mounts) as node,
            aiohttp.ClientSession() as http,
        ):
            opening = node.url + open_path("rbsr")
            assert (await post(http, opening, first, **params))[0] == 401
            for header in (b"Bearer wrong", b"Bearer \xff\xfe", b"\xc3\x28"):
                reader, writer = await asyncio.open_connection(node.config.listen_host, node.port)
                path = f"/sync/v1/rbsr?start={WINDOW[0]}&end={WINDOW[1]}".encode()
                writer.write(
                    b"POST "
                    + path
                    + b" HTTP/1.1\r\nHost: x\r\nAuthorization: "
                    + header
                    + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                status_line = await reader.readline()
                writer.close()
                assert b" 401 " in status_line, (header, status_line)
            with pytest.raises(RemoteProtocolError, match="HTTP 401"):
                await sync_with_peer(ArchiveKeeper(peer), node.url, WINDOW)
            report = await sync_with_peer(
                ArchiveKeeper(peer), node.url, WINDOW, token="federation-secret"
            )
            assert report.stored == 10

    asyncio.run(scenario())


async def _metrics(base: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as response:
        return await response.text()


def test_a_window_over_the_budget_is_refused_before_it_is_loaded(
    sqlite_archive: SqlArchive, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot used to be read whole, then found too large (413)."""
    sqlite_archive.insert(make_messages(300, seed=39, span=HOUR))
    loaded: list[tuple[int, int]] = []
    real = sqlite_archive.item_arrays
    monkeypatch.setattr(
        sqlite_archive, "item_arrays", lambda s, e: loaded.append((s, e)) or real(s, e)
    )
    first = RbsrSession(MemoryItemStore(), initiator=True, window=WINDOW).initiate()

    async def scenario() -> None:
        mounts = {"/sync/": responder_app(SyncConfig(max_items=100), wall_clock_ns=sync_now)}
        async with (
            running(sqlite_archive, tmp_path, mounts=mounts) as node,
            aiohttp.ClientSession() as http,
        ):
            params = {"start": str(WINDOW[0]), "end": str(WINDOW[1])}
            assert (await post(http, node.url + open_path("rbsr"), first, **params))[0] == 413

    asyncio.run(scenario())
    assert loaded == []


def test_bad_riblt_frame_streams_answer_400_and_end_the_session(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    sqlite_archive.insert(make_messages(50, seed=41, span=HOUR))
    params = {"start": str(WINDOW[0]), "end": str(WINDOW[1])}
    headers = {"Content-Type": FRAMES_TYPE}

    async def scenario() -> None:
        async with (
            running(sqlite_archive, tmp_path / "a", clock_ns=sync_now) as node,
            aiohttp.ClientSession() as http,
        ):
            opening = node.url + open_path("riblt")
            # A frame length past the end of the body.
            async with http.post(opening, data=b"\x05ab", params=params, headers=headers) as r:
                assert r.status == 400
            initiator = RibltSession(MemoryItemStore([]), initiator=True, window=WINDOW)
            body = encode_frames([initiator.initiate()])
            async with http.post(opening, data=body, params=params, headers=headers) as r:
                assert r.status == 200 and r.content_type == FRAMES_TYPE
                session_id = r.headers[SESSION_HEADER]
                assert await r.read()  # the symbols, up to the stream's cap
            # DONE asking for an item the responder does not hold.
            reference = varint(2 * 5 + 1) + bytes([16]) + bytes(16)
            done = bytes([RIBLT_VERSION, 2, 1]) + varint(0) + varint(1) + reference
            url = node.url + session_path(session_id)
            async with http.post(url, data=encode_frames([done]), headers=headers) as r:
                assert r.status == 400 and "do not hold" in await r.text()
            async with http.post(url, data=encode_frames([done]), headers=headers) as r:
                assert r.status == 404
            assert sqlite_archive.count() == 50

    asyncio.run(scenario())
