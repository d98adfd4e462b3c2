"""Upgrades: archives written by earlier commits open, upgraded in place, with every message.

The fixtures in ``fixtures/archives`` were made by the code of earlier commits
(``fixtures/make_archive.py``, ``fixtures/archives/README.md``): a SQLite file and a
PostgreSQL dump of each layout before the layouts had numbers.  What they hold is checked
against ``messages.json``, which that old code wrote as it archived them, never against
the code under test.  An archive written by a newer release, and an upgrade that fails
midway, must leave the database as it was: the SQLite file byte for byte, on PostgreSQL
the catalog and every row.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from sdsync.errors import LocalProtocolError
from sdsync.store import ArchiveUnavailable, SqlArchive, StoreQuery, migrations, open_archive
from sdsync.store.migrations import MIGRATIONS, ArchiveVersionError, Migration, NotAnArchiveError
from sdsync.store.schema import SCHEMA_VERSION
from sdsync.testing.pgcluster import TempCluster

FIXTURES = Path(__file__).parent / "fixtures" / "archives"
MANIFEST = json.loads((FIXTURES / "messages.json").read_text(encoding="utf-8"))
LAYOUTS = sorted(int(n) for n in MANIFEST["layouts"])
Row = tuple[bytes, int, str, str, bytes, bytes, int]
_databases = itertools.count()


def expected_rows() -> list[Row]:
    """What the old code archived, in archive order (timestamp, then hash)."""
    rows = [
        (
            bytes.fromhex(m["message_hash"]),
            m["timestamp"],
            m["pubsub_topic"],
            m["content_topic"],
            bytes.fromhex(m["payload"]),
            bytes.fromhex(m["meta"]),
            m["version"],
        )
        for m in MANIFEST["messages"]
    ]
    return sorted(rows, key=lambda r: (r[1], r[0]))


# -- where an archive lives, seen from outside the archive's code


class Place(ABC):
    """A database, read and written with its driver alone."""

    url: str

    @abstractmethod
    def query(self, sql: str) -> list[tuple[Any, ...]]: ...

    @abstractmethod
    def execute(self, *statements: str) -> None:
        """Run ``statements`` in one committed transaction."""

    @abstractmethod
    def tables(self) -> set[str]: ...

    @abstractmethod
    def layout(self) -> set[tuple[Any, ...]]:
        """The tables, columns, constraints and indexes an archive's queries rely on."""

    @abstractmethod
    def state(self) -> object:
        """Everything an archive left alone keeps unchanged."""

    def marked(self) -> int | None:
        """The number in ``sdsync_archive``, or None without one."""
        if "sdsync_archive" not in self.tables():
            return None
        return int(self.query("SELECT schema_version FROM sdsync_archive")[0][0])


@dataclass
class SqlitePlace(Place):
    path: Path

    def __post_init__(self) -> None:
        self.url = str(self.path)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.path)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def execute(self, *statements: str) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute("BEGIN")
            for statement in statements:
                conn.execute(statement)
            conn.execute("COMMIT")
        finally:
            conn.close()  # the last connection: the WAL is checkpointed into the file

    def tables(self) -> set[str]:
        return {r[0] for r in self.query("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def layout(self) -> set[tuple[Any, ...]]:
        rows = self.query("SELECT type, name, tbl_name, sql FROM sqlite_master")
        return {
            (kind, name, table, " ".join((sql or "").split())) for kind, name, table, sql in rows
        }

    def state(self) -> object:
        files = sorted(p.name for p in self.path.parent.iterdir())
        return hashlib.sha256(self.path.read_bytes()).hexdigest(), files


@dataclass
class PostgresPlace(Place):
    url: str

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.url) as conn:
            return conn.execute(sql).fetchall()

    def execute(self, *statements: str) -> None:
        import psycopg

        with psycopg.connect(self.url) as conn:  # committed when the block ends
            for statement in statements:
                conn.execute(statement)

    def tables(self) -> set[str]:
        rows = self.query(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
        )
        return {r[0] for r in rows}

    def layout(self) -> set[tuple[Any, ...]]:
        names = ", ".join(f"'{t}'" for t in sorted(self.tables()))
        columns = self.query(
            "SELECT 'column', table_name, column_name, data_type, is_nullable"
            f" FROM information_schema.columns WHERE table_name IN ({names})"
        )
        indexes = self.query(
            "SELECT 'index', tablename, indexname, indexdef FROM pg_indexes"
            f" WHERE schemaname = 'public' AND tablename IN ({names})"
        )
        constraints = self.query(
            "SELECT 'constraint', c.relname, k.conname, pg_get_constraintdef(k.oid)"
            " FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid"
            f" WHERE c.relname IN ({names})"
        )
        partitioning = self.query("SELECT 'partitioning', pg_get_partkeydef('messages'::regclass)")
        return {*columns, *indexes, *constraints, *partitioning}

    def state(self) -> object:
        relations = self.query(
            "SELECT c.relname, c.relkind,"
            " CASE WHEN c.relkind IN ('i', 'I') THEN pg_get_indexdef(c.oid) END FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
            " ORDER BY c.relname"
        )
        rows = self.query("SELECT * FROM messages ORDER BY timestamp, message_hash")
        return self.layout(), relations, rows, self.marked()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def places(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[int | None], Place]:
    """Where to open an archive: a copy of the fixture of layout n, or nothing (None)."""

    def make(layout: int | None) -> Place:
        if backend == "sqlite":
            path = tmp_path_factory.mktemp("archive") / "store.sqlite3"
            if layout is not None:
                shutil.copyfile(FIXTURES / f"layout{layout}.sqlite3", path)
            return SqlitePlace(path)
        cluster: TempCluster = request.getfixturevalue("pg_cluster")
        place = PostgresPlace(cluster.create_database(f"u{os.getpid()}_{next(_databases)}"))
        if layout is not None:
            dump = (FIXTURES / f"layout{layout}.postgresql.sql").read_text(encoding="utf-8")
            place.execute(dump)
        return place

    return make


@pytest.fixture
def new_layout(places: Callable[[int | None], Place]) -> set[tuple[Any, ...]]:
    """The layout of an archive made new by the code under test."""
    place = places(None)
    open_archive(place.url).close()
    return place.layout()


def opened(place: Place) -> SqlArchive:
    return open_archive(place.url)


# -- what must be found


def walk(archive: SqlArchive, query: StoreQuery) -> list[bytes]:
    """Every hash a query yields, page by page."""
    hashes: list[bytes] = []
    while True:
        page = archive.query(query)
        hashes += page.hashes
        if page.cursor is None:
            return hashes
        query = replace(query, pagination_cursor=page.cursor)


def assert_every_message_found(archive: SqlArchive) -> None:
    """Every message of the manifest, by every query shape (each reads its own index),
    and none of those the old code refused."""
    rows = expected_rows()
    found = [
        (
            m.message_hash,
            m.timestamp,
            m.pubsub_topic,
            m.message.content_topic,
            m.message.payload,
            m.message.meta,
            m.message.version,
        )
        for m in archive.messages()
    ]
    assert found == rows
    assert archive.count() == len(rows)
    hashes = [r[0] for r in rows]
    assert [m.message_hash for m in archive.get(hashes)] == hashes
    assert walk(archive, StoreQuery(pagination_limit=7)) == hashes
    for pubsub in {r[2] for r in rows}:
        want = [r[0] for r in rows if r[2] == pubsub]
        assert walk(archive, StoreQuery(pubsub_topic=pubsub, pagination_limit=7)) == want
    for content in {r[3] for r in rows}:
        want = [r[0] for r in rows if r[3] == content]
        query = StoreQuery(content_topics=(content,), pagination_limit=7)
        assert walk(archive, query) == want
        for pubsub in {r[2] for r in rows if r[3] == content}:
            mine = [r[0] for r in rows if r[2:4] == (pubsub, content)]
            assert walk(archive, replace(query, pubsub_topic=pubsub)) == mine
    refused = [bytes.fromhex(m["message_hash"]) for m in MANIFEST["refused"]]
    assert refused and archive.get(refused) == []


# -- the tests


def test_the_steps_lead_from_layout_1_to_the_current_one_by_one() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(2, SCHEMA_VERSION + 1))
    every = list(range(1, SCHEMA_VERSION + 1))
    assert every == LAYOUTS  # a fixture of every layout


def test_a_new_archive_is_made_at_the_current_version(
    places: Callable[[int | None], Place],
) -> None:
    place = places(None)
    archive = opened(place)
    try:
        assert archive.schema_version == SCHEMA_VERSION
        assert archive.count() == 0
    finally:
        archive.close()
    assert place.marked() == SCHEMA_VERSION
    if isinstance(place, SqlitePlace):  # still made before its first table, in the transaction
        assert place.query("PRAGMA auto_vacuum") == [(2,)]  # INCREMENTAL


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_archive_of_each_earlier_layout_is_upgraded_with_every_message(
    places: Callable[[int | None], Place],
    new_layout: set[tuple[Any, ...]],
    layout: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    place = places(layout)
    assert place.marked() is None  # made before the numbers
    with caplog.at_level(logging.INFO, logger=migrations.__name__):
        archive = opened(place)
    try:
        assert archive.schema_version == SCHEMA_VERSION
        assert_every_message_found(archive)
    finally:
        archive.close()
    # The layout was read from the indexes: the log names the one it came from.
    assert f"from schema version {layout} to {SCHEMA_VERSION}" in caplog.text
    assert place.marked() == SCHEMA_VERSION
    assert place.layout() == new_layout  # the steps make what a new archive has


@pytest.mark.parametrize("layout", LAYOUTS)
def test_opening_an_upgraded_archive_again_changes_nothing(
    places: Callable[[int | None], Place], layout: int, caplog: pytest.LogCaptureFixture
) -> None:
    place = places(layout)
    opened(place).close()
    upgraded = place.state()
    with caplog.at_level(logging.INFO, logger=migrations.__name__):
        archive = opened(place)
    try:
        assert archive.schema_version == SCHEMA_VERSION
        assert_every_message_found(archive)
    finally:
        archive.close()
    assert place.state() == upgraded
    assert "upgraded" not in caplog.text


@pytest.mark.parametrize("found", [SCHEMA_VERSION + 1, 99, 0])
def test_an_archive_at_a_version_this_release_does_not_know_is_refused_untouched(
    places: Callable[[int | None], Place], found: int
) -> None:
    place = places(LAYOUTS[-1])
    opened(place).close()
    # As a newer release would leave it: its number, and something this one cannot know.
    place.execute(
        f"UPDATE sdsync_archive SET schema_version = {found}",
        "CREATE TABLE sdsync_future (x INTEGER)",
    )
    before = place.state()
    with pytest.raises(ArchiveVersionError) as refused:
        opened(place)
    assert place.state() == before
    assert isinstance(refused.value, LocalProtocolError)
    assert not isinstance(refused.value, ArchiveUnavailable)  # retrying will not help
    assert (refused.value.found, refused.value.supported) == (found, SCHEMA_VERSION)
    message = str(refused.value)
    assert f"schema version is {found} and this sdsync's is {SCHEMA_VERSION}" in message
    if found > SCHEMA_VERSION:
        assert "written by a newer sdsync; upgrade sdsync or use another --db" in message
    else:
        assert "use another --db" in message


def _failing_last_step(how: str) -> tuple[Migration, ...]:
    """MIGRATIONS whose last step fails after the steps before it ran: in the database
    (a driver error) or in our code."""

    def fail(dialect: str) -> Sequence[str]:
        if how == "code":
            raise RuntimeError("a step that fails")
        return ("CREATE INDEX messages_broken ON no_such_table (x)",)

    return (*MIGRATIONS[:-1], replace(MIGRATIONS[-1], statements=fail))


@pytest.mark.parametrize("how", ["database", "code"])
def test_an_upgrade_that_fails_midway_leaves_the_archive_as_it_was(
    places: Callable[[int | None], Place], how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    place = places(1)  # every step runs: the last fails after the others succeeded
    before = place.state()
    monkeypatch.setattr(migrations, "MIGRATIONS", _failing_last_step(how))
    with pytest.raises(ArchiveUnavailable if how == "database" else RuntimeError):
        opened(place)
    assert place.state() == before  # one transaction: no step's index, no number
    assert place.marked() is None
    monkeypatch.undo()
    archive = opened(place)  # the next open starts again from layout 1
    try:
        assert archive.schema_version == SCHEMA_VERSION
        assert_every_message_found(archive)
    finally:
        archive.close()


def test_two_openers_at_once_upgrade_the_archive_once(
    places: Callable[[int | None], Place],
    new_layout: set[tuple[Any, ...]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    place = places(1)
    with caplog.at_level(logging.INFO, logger=migrations.__name__), ThreadPoolExecutor(2) as pool:
        archives = list(pool.map(lambda _: opened(place), range(2)))
    for archive in archives:
        assert archive.schema_version == SCHEMA_VERSION
        archive.close()
    assert caplog.text.count("archive upgraded") == 1
    assert place.layout() == new_layout


def test_a_messages_table_of_another_application_is_refused_untouched(tmp_path: Path) -> None:
    place = SqlitePlace(tmp_path / "chat.sqlite3")
    place.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT)")
    before = place.state()
    with pytest.raises(NotAnArchiveError, match="not an sdsync archive"):
        opened(place)
    assert place.state() == before


def test_the_fixtures_are_what_their_readme_says() -> None:
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    for path in FIXTURES.glob("layout*"):
        assert path.name in readme
    for layout, commit in MANIFEST["layouts"].items():
        assert f"layout{layout}" in readme and commit in readme
