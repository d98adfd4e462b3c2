"""Store Sync's HTTP protocol at its edges: transfer admission, bad input, bounds, expiry,
peers that do not speak it, metrics, periodic rounds, and `sdsync store sync`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import pytest
from storetest import HOUR, T0, make_messages, running, sync_now

from sdsync.reconcile import METHODS, MemoryItemStore, RbsrSession
from sdsync.store import SqlArchive, StoredMessage, StoreNode, open_archive
from sdsync.store.sync import (
    PeriodicSync,
    SyncConfig,
    SyncUnsupportedError,
    responder_app,
    sync_with_peer,
)
from sdsync.store.sync import responder as responder_module
from sdsync.store.sync.wire import (
    BATCH_TYPE,
    NEXT_HEADER,
    SESSION_HEADER,
    encode_entry,
    messages_path,
    open_path,
    session_path,
)

WINDOW = (T0, T0 + HOUR)
WINDOW_PARAMS = {"start": str(WINDOW[0]), "end": str(WINDOW[1])}
SHARED = make_messages(200, seed=21, span=HOUR)
EXTRA = make_messages(5, seed=22, span=HOUR)


def items(messages: Sequence[StoredMessage]) -> MemoryItemStore:
    return MemoryItemStore((m.timestamp, m.message_hash) for m in messages)


async def post(
    http: aiohttp.ClientSession, url: str, body: bytes, **params: str
) -> tuple[int, bytes, str | None]:
    async with http.post(url, data=body, params=params) as response:
        return response.status, await response.read(), response.headers.get(SESSION_HEADER)


async def reconcile_by_hand(
    http: aiohttp.ClientSession, base: str, ours: Sequence[StoredMessage]
) -> tuple[str, RbsrSession]:
    """Run an RBSR session against the node at ``base`` as its initiator; return its id."""
    initiator = RbsrSession(items(ours), initiator=True, window=WINDOW)
    status, reply, session_id = await post(
        http, base + open_path("rbsr"), initiator.initiate(), **WINDOW_PARAMS
    )
    assert status == 200 and session_id
    while reply and (frame := initiator.receive(reply)) is not None:
        status, reply, _ = await post(http, base + session_path(session_id), frame)
        assert status == 200
    assert initiator.done
    return session_id, initiator


def test_a_push_may_carry_only_what_the_session_found_missing(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    sqlite_archive.insert(SHARED)
    stranger = make_messages(1, seed=23, span=HOUR)[0]

    async def scenario() -> None:
        async with (
            running(sqlite_archive, tmp_path, clock_ns=sync_now) as node,
            aiohttp.ClientSession() as http,
        ):
            session_id, initiator = await reconcile_by_hand(http, node.url, [*SHARED, *EXTRA])
            assert {h for _, h in initiator.have} == {m.message_hash for m in EXTRA}
            push = node.url + messages_path(session_id)
            smuggled = b"".join(encode_entry(m) for m in [EXTRA[0], stranger])
            status, _, _ = await post(http, push, smuggled)
            assert status == 400
            assert sqlite_archive.get([EXTRA[0].message_hash, stranger.message_hash]) == []
            status, _, _ = await post(http, push, encode_entry(EXTRA[0]))
            assert status == 404  # a rejected push ends the session

            session_id, _ = await reconcile_by_hand(http, node.url, [*SHARED, *EXTRA])
            push = node.url + messages_path(session_id)
            status, answer, _ = await post(http, push, b"".join(map(encode_entry, EXTRA)))
            assert status == 200 and json.loads(answer) == {"received": 5, "stored": 5}
            assert len(sqlite_archive.get([m.message_hash for m in EXTRA])) == 5

    asyncio.run(scenario())


def test_pulls_page_through_what_the_initiator_lacks(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    big = make_messages(40, seed=24, span=HOUR)
    sqlite_archive.insert(big)

    async def scenario() -> None:
        async with (
            running(sqlite_archive, tmp_path, clock_ns=sync_now) as node,
            aiohttp.ClientSession() as http,
        ):
            session_id, initiator = await reconcile_by_hand(http, node.url, [])
            assert len(initiator.need) == 40
            url = node.url + messages_path(session_id)
            async with http.get(url, params={"from": "41"}) as response:
                assert response.status == 400
            async with http.get(url, params={"from": "38"}) as response:
                assert response.status == 200 and response.content_type == BATCH_TYPE
                assert NEXT_HEADER not in response.headers
                tail = await response.read()
            assert tail == b"".join(map(encode_entry, sorted(big, key=_key)[38:]))

    asyncio.run(scenario())


def _key(m: StoredMessage) -> tuple[int, bytes]:
    return m.timestamp, m.message_hash


def test_bad_frames_unknown_sessions_and_early_transfers(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    sqlite_archive.insert(SHARED)

    async def scenario() -> None:
        async with (
            running(sqlite_archive, tmp_path, clock_ns=sync_now) as node,
            aiohttp.ClientSession() as http,
        ):
            opening = node.url + open_path("rbsr")
            first = RbsrSession(items(EXTRA), initiator=True, window=WINDOW).initiate()
            assert (await post(http, opening, b"\x07garbage", **WINDOW_PARAMS))[0] == 400
            assert (await post(http, opening, first))[0] == 400  # no window
            assert (await post(http, opening, first, start="5", end="5"))[0] == 400
            assert (await post(http, node.url + "/sync/v1/minisketch", first))[0] == 404
            assert (await post(http, node.url + session_path("nope"), first))[0] == 404

            status, reply, session_id = await post(http, opening, first, **WINDOW_PARAMS)
            assert status == 200 and reply and session_id
            # Reconciliation is not over: no transfer yet.
            assert (await post(http, node.url + messages_path(session_id), b""))[0] == 409
            assert (await post(http, node.url + session_path(session_id), b"\x01\xff"))[0] == 400
            assert (await post(http, node.url + session_path(session_id), first))[0] == 404

            status, _, session_id = await post(http, opening, first, **WINDOW_PARAMS)
            async with http.delete(node.url + session_path(session_id or "")) as response:
                assert response.status == 204
            assert (await post(http, node.url + session_path(session_id or ""), first))[0] == 404

    asyncio.run(scenario())


def test_sessions_are_bounded_and_idle_ones_expire(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    sqlite_archive.insert(SHARED)  # 200 items in the window
    now = [0.0]
    config = SyncConfig(max_sessions=2, max_items=300, idle_timeout_s=10.0)
    # The initiator lacks some: sessions stay open for the pull (a complete one is closed).
    first = RbsrSession(items(SHARED[:150]), initiator=True, window=WINDOW).initiate()

    async def scenario() -> None:
        mounts = {"/sync/": responder_app(config, clock=lambda: now[0], wall_clock_ns=sync_now)}
        async with (
            running(sqlite_archive, tmp_path, mounts=mounts) as node,
            aiohttp.ClientSession() as http,
        ):
            opening = node.url + open_path("rbsr")
            tiny = {"start": str(T0), "end": str(T0 + 1)}  # an empty window
            one = await post(http, opening, first, **WINDOW_PARAMS)
            assert one[0] == 200
            # 200 + 200 items would exceed the budget of 300.
            async with http.post(opening, data=first, params=WINDOW_PARAMS) as response:
                assert response.status == 503 and response.headers["Retry-After"]
            # Nothing to transfer: the session is over at once and holds no slot.
            assert (await post(http, opening, _empty_first(), **tiny))[0] == 200
            part = (T0, T0 + HOUR // 10)  # a few items to pull
            empty = RbsrSession(MemoryItemStore(), initiator=True, window=part).initiate()
            bounds = {"start": str(part[0]), "end": str(part[1])}
            assert (await post(http, opening, empty, **bounds))[0] == 200
            assert (await post(http, opening, empty, **bounds))[0] == 503  # 2 open
            now[0] += 11.0
            assert (await post(http, opening, first, **WINDOW_PARAMS))[0] == 200
            assert (await post(http, node.url + session_path(one[2] or ""), first))[0] == 404

        small = {"/sync/": responder_app(SyncConfig(max_items=100), wall_clock_ns=sync_now)}
        async with (
            running(sqlite_archive, tmp_path, mounts=small) as node,
            aiohttp.ClientSession() as http,
        ):
            status, _, _ = await post(http, node.url + open_path("rbsr"), first, **WINDOW_PARAMS)
            assert status == 413

    asyncio.run(scenario())


def _empty_first() -> bytes:
    return RbsrSession(MemoryItemStore(), initiator=True, window=(T0, T0 + 1)).initiate()


def test_peers_without_store_sync_are_skipped_and_remembered(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    other = open_archive(str(tmp_path / "other.sqlite3"))
    plain = open_archive(str(tmp_path / "plain.sqlite3"))
    other.insert(EXTRA)
    clock = T0 + HOUR + 20 * 10**9  # the default window is then exactly WINDOW

    async def scenario() -> None:
        async with (
            running(sqlite_archive, tmp_path / "a", clock_ns=sync_now) as node,
            running(other, tmp_path / "b", clock_ns=sync_now) as good,
            running(plain, tmp_path / "c", sync=SyncConfig(serve=False)) as bad,
        ):
            with pytest.raises(SyncUnsupportedError):
                await sync_with_peer(node, bad.url, WINDOW)
            dead = f"http://127.0.0.1:{_closed_port()}"
            rounds = PeriodicSync(
                node,
                [bad.url, good.url, dead],
                SyncConfig(),
                clock_ns=lambda: clock,
                rng=random.Random(4),
            )
            reports = [await rounds.round() for _ in range(6)]
            assert rounds.unsupported == {bad.url}
            successes = [r for r in reports if r is not None]
            assert successes and {r.peer for r in successes} == {good.url}
            assert rounds.failures == 6 - len(successes) > 0  # the dead peer's rounds
            # info() lists the rounds newest first: each success and each failure, by peer.
            recent = rounds.info()["recent"]
            assert [r["outcome"] == "ok" for r in recent] == [r is not None for r in reports][::-1]
            assert {r["peer"] for r in recent if r["outcome"] != "ok"} == {dead}
            assert len(sqlite_archive.get([m.message_hash for m in EXTRA])) == 5

            only_bad = PeriodicSync(
                node, [bad.url], SyncConfig(), clock_ns=lambda: clock, rng=random.Random(1)
            )
            assert await only_bad.round() is None
            assert "no configured peer" in (only_bad.last_error or "")

    asyncio.run(scenario())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metric(text: str, name: str, label: str) -> float:
    match = re.search(rf"^sdsync_store_{name}_total{{{label}}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@contextlib.asynccontextmanager
async def overlapping_nodes(
    ours: SqlArchive, theirs: SqlArchive, tmp: Path
) -> AsyncIterator[tuple[StoreNode, StoreNode]]:
    """Two running nodes on the sync clock: ours holds SHARED[:150], theirs SHARED[100:]
    (each lacks 50 or 100 of the other's)."""
    ours.insert(SHARED[:150])
    theirs.insert(SHARED[100:])
    async with (
        running(ours, tmp / "a", clock_ns=sync_now) as a,
        running(theirs, tmp / "b", clock_ns=sync_now) as b,
    ):
        yield a, b


def test_metrics_count_rounds_bytes_and_differences(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    other = open_archive(str(tmp_path / "other.sqlite3"))

    async def scenario() -> None:
        async with (
            overlapping_nodes(sqlite_archive, other, tmp_path) as (a, b),
            aiohttp.ClientSession() as http,
        ):
            report = await sync_with_peer(a, b.url, WINDOW, method="prolly")
            scraped = []
            for node in (a, b):
                async with http.get(f"{node.url}/metrics") as response:
                    scraped.append(await response.text())
        ma, mb = scraped
        assert _metric(ma, "sync_rounds", 'role="initiator"') == 1
        assert _metric(mb, "sync_rounds", 'role="responder"') == 1
        # a holds 0..149 and b 100..199: a lacked 50, b lacked 100.
        for text, lacked, peer_lacked in [(ma, 50, 100), (mb, 100, 50)]:
            assert _metric(text, "sync_differences", 'side="we_lacked"') == lacked
            assert _metric(text, "sync_differences", 'side="peer_lacked"') == peer_lacked
            assert _metric(text, "ingested_messages", 'source="sync"') == lacked
        sent = 'direction="sent"'
        received = 'direction="received"'
        assert _metric(ma, "sync_bytes", sent) == _metric(mb, "sync_bytes", received)
        assert _metric(ma, "sync_bytes", received) == _metric(mb, "sync_bytes", sent)
        assert _metric(ma, "sync_bytes", sent) == report.bytes_sent > 0

    asyncio.run(scenario())


async def _scrape(http: aiohttp.ClientSession, node: StoreNode) -> str:
    async with http.get(f"{node.url}/metrics") as response:
        return await response.text()


def test_riblt_reconciles_in_two_round_trips(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    other = open_archive(str(tmp_path / "other.sqlite3"))

    async def scenario() -> None:
        async with (
            overlapping_nodes(sqlite_archive, other, tmp_path) as (a, b),
            aiohttp.ClientSession() as http,
        ):
            report = await sync_with_peer(a, b.url, WINDOW, method="riblt")
            # One request reads the stream of symbols, one posts DONE and reads TAILS.
            assert report.round_trips == 2
            assert (report.have, report.need) == (100, 50)
            assert (report.peer_stored, report.stored) == (100, 50)
            again = await sync_with_peer(a, b.url, WINDOW, method="riblt")
            assert (again.have, again.need, again.round_trips) == (0, 0, 2)
            before = [await _scrape(http, node) for node in (a, b)]
            assert _metric(before[1], "sync_rounds", 'role="responder"') == 2
            assert _metric(before[1], "sync_differences", 'side="we_lacked"') == 100
            # Nothing changed since: each side's snapshot reuses every bucket it cached.
            await sync_with_peer(a, b.url, WINDOW, method="riblt")
            for node, earlier in zip((a, b), before, strict=True):
                now = await _scrape(http, node)
                encoded, reused = 'outcome="encoded"', 'outcome="reused"'
                assert _metric(now, "sync_symbol_buckets", encoded) == _metric(
                    earlier, "sync_symbol_buckets", encoded
                )
                fresh = _metric(now, "sync_symbol_buckets", reused)
                fresh -= _metric(earlier, "sync_symbol_buckets", reused)
                assert fresh == len(node.riblt_symbols) > 0
        assert sqlite_archive.count() == other.count() == 200

    asyncio.run(scenario())


def test_a_riblt_node_syncs_peers_without_riblt_by_rbsr(
    sqlite_archive: SqlArchive, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = open_archive(str(tmp_path / "other.sqlite3"))
    # An older peer: its responder knows every method but RIBLT (404 for /sync/v1/riblt).
    older = {name: kind for name, kind in METHODS.items() if name != "riblt"}
    monkeypatch.setattr(responder_module, "METHODS", older)

    async def scenario() -> None:
        async with (
            overlapping_nodes(sqlite_archive, other, tmp_path) as (a, b),
        ):
            config = SyncConfig(method="riblt")
            periodic = PeriodicSync(a, [b.url], config, clock_ns=sync_now, rng=random.Random(1))
            for _ in range(2):
                report = await periodic.round()
                assert report is not None and report.method == "rbsr"
            assert periodic.rbsr_peers == {b.url} and not periodic.unsupported
            assert periodic.info()["rbsr_peers"] == [b.url]
        assert sqlite_archive.count() == other.count() == 200

    asyncio.run(scenario())


def test_periodic_rounds_fill_the_gaps(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    recent = make_messages(60, seed=25, start=time.time_ns() - HOUR // 2, span=HOUR // 4)
    sqlite_archive.insert(recent[:30])
    other = open_archive(str(tmp_path / "other.sqlite3"))
    other.insert(recent[30:])

    async def scenario() -> None:
        async with running(other, tmp_path / "b") as b:
            sync = SyncConfig(interval_s=0.1)
            async with running(sqlite_archive, tmp_path / "a", peers=(b.url,), sync=sync) as a:
                for _ in range(300):  # a guard against hanging, not a timing assertion
                    if a.sync is not None and a.sync.last is not None:
                        break
                    await asyncio.sleep(0.05)
                # Store Resume pulls b's messages at start; sync is what pushes a's to b.
                assert a.sync is not None and a.sync.last is not None
                assert (await a.info())["sync"]["last"]["peer_stored"] == 30
                assert other.count() == sqlite_archive.count() == 60

    asyncio.run(scenario())


async def _cli(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sdsync.cli",
        "store",
        "sync",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def test_sync_command(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    messages = make_messages(80, seed=26, start=time.time_ns() - HOUR // 2, span=HOUR // 4)
    local = tmp_path / "local.sqlite3"
    archive = open_archive(str(local))
    archive.insert(messages[:50])
    archive.close()
    sqlite_archive.insert(messages[30:])
    plain = open_archive(str(tmp_path / "plain.sqlite3"))

    async def scenario() -> None:
        async with (
            running(sqlite_archive, tmp_path / "peer") as peer,
            running(plain, tmp_path / "plain", sync=SyncConfig(serve=False)) as bad,
        ):
            code, out, err = await _cli("--peer", peer.url, "--db", str(local), "--json")
            assert code == 0, err
            report = json.loads(out)
            assert (report["sent"], report["received"], report["stored"]) == (30, 30, 30)
            assert report["bytes_sent"] > 0 and report["round_trips"] >= 1
            code, out, err = await _cli(
                "--peer", peer.url, "--db", str(local), "--method", "prolly"
            )
            assert code == 0, err
            assert "we lacked 0, the peer lacked 0" in out and "round trips" in out
            code, out, err = await _cli("--peer", peer.url, "--db", str(local), "--method", "riblt")
            assert code == 0, err
            assert "we lacked 0, the peer lacked 0" in out
            code, _, err = await _cli("--peer", bad.url, "--db", str(local))
            assert code == 1 and "does not speak Store Sync" in err
            dead = f"http://127.0.0.1:{_closed_port()}"
            code, _, err = await _cli("--peer", dead, "--db", str(local))
            assert code == 1 and "sync with" in err
            assert len(sqlite_archive.get([m.message_hash for m in messages])) == 80

    asyncio.run(scenario())
    archive = open_archive(str(local))
    assert archive.count() == 80
    archive.close()
