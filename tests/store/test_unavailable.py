"""A failing database is ArchiveUnavailable everywhere above the archive, whatever the driver."""

from __future__ import annotations

import ast
import asyncio
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from storetest import HOUR, T0, TOKEN, make_messages, running, sync_now

import sdsync.store
from sdsync.store import ArchiveUnavailable, SqlArchive, StoreQuery, open_archive
from sdsync.store.rest import entry_json
from sdsync.store.sync import ArchiveKeeper, PeriodicSync, SyncConfig

STORE_SOURCES = Path(sdsync.store.__file__).parent
DRIVERS = {"sqlite3", "psycopg", "psycopg_pool"}
# backup.py: SQLite's own online backup API, a backend's tool (its errors become its own).
BACKENDS = {"sqlite.py", "postgres.py", "backup.py"}
CALLS: dict[str, Callable[[SqlArchive], Any]] = {
    "insert": lambda a: a.insert(make_messages(3)),
    "query": lambda a: a.query(StoreQuery()),
    "get": lambda a: a.get([b"\x00" * 32]),
    "items": lambda a: list(a.items(T0, T0 + HOUR)),
    "item_arrays": lambda a: a.item_arrays(T0, T0 + HOUR),
    "messages": lambda a: list(a.messages()),
    "count": lambda a: a.count(),
    "count_items": lambda a: a.count_items(T0, T0 + HOUR),
    "size_bytes": lambda a: a.size_bytes(),
    "delete_before": lambda a: a.delete_before(T0),
    "delete_oldest": lambda a: a.delete_oldest(1),
}


@pytest.mark.parametrize("call", CALLS)
def test_every_archive_call_on_a_closed_archive_is_unavailable(
    archive: SqlArchive, call: str
) -> None:
    archive.count()  # opens this thread's SQLite connection, which close() closes
    archive.close()
    with pytest.raises(ArchiveUnavailable) as raised:
        CALLS[call](archive)
    assert type(raised.value.__cause__).__module__.split(".")[0] in DRIVERS
    assert str(raised.value) == str(raised.value.__cause__)


def test_a_file_that_is_not_a_database_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    path.write_bytes(b"not a database, " * 512)
    with pytest.raises(ArchiveUnavailable) as raised:
        open_archive(str(path))
    assert isinstance(raised.value.__cause__, sqlite3.DatabaseError)


def broken(tmp_path: Path) -> SqlArchive:
    """A SQLite archive whose messages table someone dropped."""
    archive = open_archive(str(tmp_path / "store.sqlite3"))
    with sqlite3.connect(tmp_path / "store.sqlite3") as conn:
        conn.execute("DROP TABLE messages")
    return archive


def test_the_api_answers_a_failing_database_with_503(tmp_path: Path) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    # At this clock the Store Sync window is [T0, T0 + HOUR), and the messages are older.
    body = {"messages": [entry_json(m) for m in make_messages(2, span=HOUR)]}
    node_running = running(broken(tmp_path), tmp_path, clock_ns=sync_now)

    async def scenario() -> None:
        async with node_running as node, aiohttp.ClientSession() as http:
            async with http.get(f"{node.url}/store/v3/messages") as response:
                answer = await response.json()
                assert (response.status, answer["statusCode"]) == (503, 503)
                assert answer["statusDesc"] == "archive unavailable: no such table: messages"
            async with http.post(
                f"{node.url}/store/v3/messages", json=body, headers=auth
            ) as response:
                assert response.status == 503
                assert await response.text() == "archive unavailable: no such table: messages\n"
            window = {"start": str(T0), "end": str(T0 + HOUR)}
            async with http.post(f"{node.url}/sync/v1/rbsr", params=window) as response:
                assert response.status == 503
                assert "archive unavailable: no such table: messages" in await response.text()
            # The administrative routes too: 503, never a 500.
            for method, path in (("GET", "/admin/v1/info"), ("GET", "/metrics")):
                async with http.request(method, f"{node.url}{path}", headers=auth) as response:
                    assert response.status == 503, path
                    assert "archive unavailable" in await response.text()

    asyncio.run(scenario())


def test_a_periodic_round_over_a_failing_database_fails_and_is_counted(tmp_path: Path) -> None:
    archive = broken(tmp_path)
    peer = "http://127.0.0.1:9"  # never asked: the round fails on reading our own window
    sync = PeriodicSync(
        ArchiveKeeper(archive), [peer], SyncConfig(), clock_ns=sync_now, rng=random.Random(1)
    )
    try:
        assert asyncio.run(sync.round()) is None
    finally:
        archive.close()
    assert sync.failures == 1
    assert sync.last_error == f"{peer}: no such table: messages"


def driver_names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The drivers a module imports, and those it names in an ``except`` clause."""
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
    caught = {
        name.id
        for handler in ast.walk(tree)
        if isinstance(handler, ast.ExceptHandler) and handler.type is not None
        for name in ast.walk(handler.type)
        if isinstance(name, ast.Name)
    }
    return imported & DRIVERS, caught & DRIVERS


def test_only_the_backends_know_the_database_drivers() -> None:
    """Above the archive a failing database is ArchiveUnavailable: no other module catches
    a driver's error, and none imports a driver (the test clusters' helper, which creates
    databases with psycopg, is test tooling in sdsync.testing)."""
    offenders = []
    for path in sorted(STORE_SOURCES.rglob("*.py")):
        if path.name in BACKENDS:
            continue
        imported, caught = driver_names(ast.parse(path.read_text(), str(path)))
        if caught or imported:
            offenders.append(f"{path.relative_to(STORE_SOURCES)}: {sorted(imported | caught)}")
    assert offenders == []


def test_the_http_api_and_store_sync_do_not_import_the_node() -> None:
    for path in [STORE_SOURCES / "server.py", *sorted((STORE_SOURCES / "sync").glob("*.py"))]:
        tree = ast.parse(path.read_text(), str(path))
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "sdsync.store.node" not in modules, path
