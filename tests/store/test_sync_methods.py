"""Every method of the reconciliation table is offered wherever a method is chosen: the
command line's choices, Store Sync's configuration, wire routes and responder. So a new
row cannot be forgotten in one of them; and a method outside the table is refused
plainly, not served by another."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from storetest import HOUR, T0, make_messages, running, sync_now
from typer.testing import CliRunner

import sdsync.store.sync
from sdsync.cli.main import app
from sdsync.errors import LocalProtocolError
from sdsync.reconcile import METHODS, MemoryItemStore, session_class
from sdsync.store import SqlArchive
from sdsync.store.sync import (
    ArchiveKeeper,
    SyncConfig,
    SyncReport,
    SyncUnsupportedError,
    sync_with_peer,
)
from sdsync.store.sync import responder as responder_module
from sdsync.store.sync.wire import (
    FRAME_TYPE,
    FRAMES_TYPE,
    SESSION_HEADER,
    open_path,
    session_path,
)

WINDOW = (T0, T0 + HOUR)
PARAMS = {"start": str(WINDOW[0]), "end": str(WINDOW[1])}
UNKNOWN = "minisketch"


def test_the_command_line_offers_every_method(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def fake_sync(_host: Any, peer: str, window: tuple[int, int], **kw: Any) -> SyncReport:
        return SyncReport(peer, kw["method"], window)

    # `store sync` imports it when it runs: the round is replaced, the choice is real.
    monkeypatch.setattr(sdsync.store.sync, "sync_with_peer", fake_sync)
    peer = "http://127.0.0.1:9"
    for method in METHODS:
        sync = ["store", "sync", "--peer", peer, "--method", method, "--json"]
        result = CliRunner().invoke(app, [*sync, "--data-dir", str(tmp_path)])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["method"] == method
        # `serve` parses the choice and stops at a later check (a shard of another cluster).
        serve = ["store", "serve", "--data-dir", str(tmp_path), "--sync-method", method]
        result = CliRunner().invoke(app, [*serve, "--pubsub-topic", "/waku/2/rs/2/0"])
        assert result.exit_code == 2 and "not on cluster 1" in result.output, result.output
    for option in (
        ["store", "sync", "--peer", peer, "--method"],
        ["store", "serve", "--sync-method"],
    ):
        result = CliRunner().invoke(app, [*option, UNKNOWN])
        assert result.exit_code == 2 and "Invalid value" in result.output


def test_configuration_and_initiator_take_exactly_the_table(sqlite_archive: SqlArchive) -> None:
    for method in METHODS:
        assert SyncConfig(method=method).method == method
        assert session_class(method).name == method
    with pytest.raises(LocalProtocolError, match="unknown sync method"):
        SyncConfig(method=UNKNOWN)
    with pytest.raises(LocalProtocolError, match="unknown reconciliation method"):
        host = ArchiveKeeper(sqlite_archive)
        asyncio.run(sync_with_peer(host, "http://127.0.0.1:9", WINDOW, method=UNKNOWN))


async def _refused(http: aiohttp.ClientSession, base: str, reason: str) -> float:
    async with http.get(base + "/metrics") as response:
        text = await response.text()
    lines = [line for line in text.splitlines() if line.startswith("sdsync_store_refused_total")]
    return sum(float(line.split()[-1]) for line in lines if f'reason="{reason}"' in line)


def test_a_node_answers_every_method_and_refuses_others(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    messages = make_messages(40, seed=71, span=HOUR)
    sqlite_archive.insert(messages)
    ours = MemoryItemStore((m.timestamp, m.message_hash) for m in messages[:30])

    async def scenario() -> None:
        async with (
            running(sqlite_archive, tmp_path, clock_ns=sync_now) as node,
            aiohttp.ClientSession() as http,
        ):
            for method, kind in METHODS.items():
                first = kind(ours, initiator=True, window=WINDOW).initiate()
                url = node.url + open_path(method)
                async with http.post(url, data=first, params=PARAMS) as response:
                    assert response.status == 200, (method, await response.text())
                    session_id = response.headers[SESSION_HEADER]
                    assert response.content_type == (FRAMES_TYPE if kind.streaming else FRAME_TYPE)
                async with http.delete(node.url + session_path(session_id)) as response:
                    assert response.status == 204
            # Another name: a counted 404 (the initiator's sign to use another method),
            # before the open rate is charged: more than a burst of them are all 404.
            burst = SyncConfig().session_burst
            for _ in range(burst + 2):
                async with http.post(
                    node.url + open_path(UNKNOWN), data=b"\x01", params=PARAMS
                ) as response:
                    assert response.status == 404
                    assert f"does not reconcile by '{UNKNOWN}'" in await response.text()
            assert await _refused(http, node.url, "sync_method") == burst + 2

    asyncio.run(scenario())


def test_an_initiator_asking_a_method_the_peer_lacks_learns_it_is_unsupported(
    sqlite_archive: SqlArchive, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sqlite_archive.insert(make_messages(10, seed=72, span=HOUR))
    ours = ArchiveKeeper(sqlite_archive)

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path, clock_ns=sync_now) as node:
            for lacking in METHODS:
                fewer = {name: kind for name, kind in METHODS.items() if name != lacking}
                monkeypatch.setattr(responder_module, "METHODS", fewer)
                with pytest.raises(SyncUnsupportedError, match=lacking):
                    await sync_with_peer(ours, node.url, WINDOW, method=lacking)

    asyncio.run(scenario())
