"""Every query shape the v3 API serves is an index range scan in result order.

The shapes: no filter, ``pubsubTopic`` only, ``pubsubTopic`` with one or several content
topics, one or several content topics without ``pubsubTopic``, ``hashes``; each with and
without time bounds and cursor, in both directions.
The statement :meth:`SqlArchive.query` runs is captured and explained: on SQLite no
``USE TEMP B-TREE`` (no sort) and every table access a ``SEARCH``/``SCAN`` of the
shape's index; on PostgreSQL (statistics gathered, as autovacuum does) no ``Sort`` node,
no sequential scan, and every scan on the shape's index.  Pagination over every shape is
checked against a brute-force answer, and an archive made before an index existed gets
it on open.

The data fills four whole hours (PostgreSQL partitions of about 3,000 rows each): on a
partition of a dozen pages a sequential scan is cheaper than any index, and PostgreSQL
rightly takes it for hash lookups.  Time bounds fall inside hours: a bound on an hour
boundary leaves one partition whose rows at that very timestamp PostgreSQL rightly
reads through the primary key.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from storetest import HOUR, PUBSUB, T0, in_order, make_messages

from sdsync.store import SqlArchive, StoredMessage, StoreQuery, open_archive
from sdsync.testing.pgcluster import TempCluster

START = (T0 // HOUR + 1) * HOUR  # on an hour boundary
SPARSE = "/waku/2/rs/1/9"  # a pubsub topic with few messages among many
TOPICS = tuple(f"/app/1/t{i}/proto" for i in range(20))
ONE = ("/app/1/t1/proto",)
SEVERAL = ("/app/1/t1/proto", "/app/1/t2/proto", "/app/1/t3/proto")
BOUNDS = {
    "no bounds": (None, None),
    "start": (START + HOUR + 123, None),
    "end": (None, START + 3 * HOUR - 456),
    "start and end": (START + HOUR + 123, START + 3 * HOUR - 456),
}


def dataset() -> list[StoredMessage]:
    dense = make_messages(12_000, seed=1, start=START, span=4 * HOUR, topics=TOPICS)
    sparse = [
        StoredMessage.of(SPARSE, m.message)
        for m in make_messages(300, seed=2, start=START, span=4 * HOUR, topics=TOPICS[:6])
    ]
    return [*dense, *sparse]


@pytest.fixture(scope="module")
def messages() -> list[StoredMessage]:
    return in_order(dataset())


def load(url: str, messages: list[StoredMessage]) -> SqlArchive:
    archive = open_archive(url)
    archive.insert(messages)
    if archive.backend == "postgresql":
        with archive._write() as conn:  # what autovacuum does to every partition
            conn.execute("ANALYZE messages")
    return archive


@pytest.fixture(scope="module")
def sqlite_loaded(
    tmp_path_factory: pytest.TempPathFactory, messages: list[StoredMessage]
) -> Iterator[SqlArchive]:
    """A SQLite archive for the whole module, filled once (no ANALYZE: a node runs none)."""
    archive = load(str(tmp_path_factory.mktemp("plans") / "store.sqlite3"), messages)
    yield archive
    archive.close()


@pytest.fixture(scope="module")
def pg_loaded(pg_cluster: TempCluster, messages: list[StoredMessage]) -> Iterator[SqlArchive]:
    """A PostgreSQL archive for the whole module, filled once and analyzed."""
    archive = load(pg_cluster.create_database(f"plans{os.getpid()}"), messages)
    yield archive
    archive.close()


def shapes(messages: list[StoredMessage]) -> Iterator[tuple[str, str, StoreQuery]]:
    """(shape, description, query) for every shape x bounds x cursor x direction."""
    cursor = messages[len(messages) // 2].message_hash
    filters: dict[str, dict[str, Any]] = {
        "no filter": {},
        "pubsub": {"pubsub_topic": SPARSE},
        "one content topic": {"pubsub_topic": PUBSUB, "content_topics": ONE},
        "content topics": {"pubsub_topic": PUBSUB, "content_topics": SEVERAL},
        "one content topic, any pubsub": {"content_topics": ONE},
        "content topics, any pubsub": {"content_topics": SEVERAL},
        "hashes": {"message_hashes": tuple(m.message_hash for m in messages[::2500])},
    }
    for (shape, kw), (bounds, (start, end)), with_cursor, forward in itertools.product(
        filters.items(), BOUNDS.items(), (False, True), (True, False)
    ):
        if shape == "hashes" and (start or end):
            continue  # a hash query takes no content filter
        query = StoreQuery(
            include_data=True,
            time_start=start,
            time_end=end,
            pagination_cursor=cursor if with_cursor else None,
            pagination_forward=forward,
            **kw,
        )
        what = f"{shape}, {bounds}, {'cursor' if with_cursor else 'first page'}, " + (
            "ascending" if forward else "descending"
        )
        yield shape, what, query


def executed(archive: SqlArchive, query: StoreQuery) -> tuple[str, list[Any]]:
    """The page statement ``archive.query`` runs for ``query`` (its last statement)."""
    seen: list[tuple[str, list[Any]]] = []
    fetch = archive._fetch

    def spy(sql: str, args: Any) -> list[Any]:
        seen.append((sql, list(args)))
        return fetch(sql, args)

    archive._fetch = spy  # type: ignore[method-assign]
    try:
        archive.query(query)
    finally:
        del archive._fetch
    return seen[-1]


# -- SQLite

SQLITE_INDEX = {
    "no filter": ("messages_time", ""),
    "pubsub": ("messages_pubsub_time", "pubsub_topic=?"),
    "one content topic": ("messages_topics", "pubsub_topic=? AND content_topic=?"),
    "content topics": ("messages_topics", "pubsub_topic=? AND content_topic=?"),
    "one content topic, any pubsub": ("messages_content_time", "content_topic=?"),
    "content topics, any pubsub": ("messages_content_time", "content_topic=?"),
    "hashes": ("messages_hash", "message_hash=?"),
}


def sqlite_plan(archive: SqlArchive, sql: str, args: list[Any]) -> list[str]:
    with archive._read() as conn:
        return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args)]


def test_sqlite_plans_are_ordered_index_range_scans(
    sqlite_loaded: SqlArchive, messages: list[StoredMessage]
) -> None:
    for shape, what, query in shapes(messages):
        plan = sqlite_plan(sqlite_loaded, *executed(sqlite_loaded, query))
        assert not any("TEMP B-TREE" in step for step in plan), (what, plan)
        accesses = [step for step in plan if step.startswith(("SCAN", "SEARCH"))]
        index, constraint = SQLITE_INDEX[shape]
        assert accesses, (what, plan)
        for step in accesses:
            assert re.match(rf"(SCAN|SEARCH) messages USING (COVERING )?INDEX {index}\b", step), (
                what,
                plan,
            )
            assert step.startswith("SEARCH") or (
                shape == "no filter" and query.pagination_cursor is None
            )
            assert constraint in step, (what, plan)
        if shape.startswith("content topics"):
            assert len(accesses) == len(SEVERAL) and "MERGE (UNION ALL)" in plan, (what, plan)


# -- PostgreSQL

_PG_TOPICS = "_pubsub_topic_content_topic_timestamp_messa_idx"
_PG_CONTENT = "_content_topic_timestamp_message_hash_idx"
# With a pubsub topic and content topics, PostgreSQL may as well read (content_topic, ...)
# and filter the pubsub topic, which nearly every row there matches (a content topic is
# autosharded onto one pubsub topic): the same ordered range scan, on a smaller index.
PG_INDEX = {  # partition indexes are named by PostgreSQL after the parent's columns
    "no filter": (("_pkey",), ""),
    "pubsub": (("_pubsub_topic_timestamp_message_hash_idx",), "pubsub_topic ="),
    "one content topic": ((_PG_TOPICS, _PG_CONTENT), "content_topic ="),
    "content topics": ((_PG_TOPICS, _PG_CONTENT), "content_topic ="),
    "one content topic, any pubsub": ((_PG_CONTENT,), "content_topic ="),
    "content topics, any pubsub": ((_PG_CONTENT,), "content_topic ="),
    "hashes": (("_message_hash_idx",), "message_hash ="),
}


def pg_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from pg_nodes(child)


def pg_plan(archive: SqlArchive, sql: str, args: list[Any]) -> dict[str, Any]:
    with archive._read() as conn:
        row = conn.execute(archive._sql(f"EXPLAIN (FORMAT JSON) {sql}"), args).fetchone()
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    plan: dict[str, Any] = document[0]["Plan"]
    return plan


def test_postgresql_plans_are_ordered_index_range_scans(
    pg_loaded: SqlArchive, messages: list[StoredMessage]
) -> None:
    for shape, what, query in shapes(messages):
        plan = pg_plan(pg_loaded, *executed(pg_loaded, query))
        nodes = list(pg_nodes(plan))
        kinds = {node["Node Type"] for node in nodes}
        shown = json.dumps(plan)[:3000]
        assert not kinds & {"Sort", "Incremental Sort", "Seq Scan"}, (what, shown)
        scans = [node for node in nodes if "Relation Name" in node]
        assert scans, (what, shown)
        indexes, condition = PG_INDEX[shape]
        for scan in scans:
            if shape != "hashes":  # bitmap scans return rows out of order
                assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), (what, shown)
            name = scan.get("Index Name") or next(
                child["Index Name"] for child in scan.get("Plans", []) if "Index Name" in child
            )
            assert name.endswith(indexes), (what, shown)
            cond = scan.get("Index Cond") or scan.get("Recheck Cond") or ""
            assert condition in cond, (what, shown)
        if shape.startswith("content topics"):
            assert "Merge Append" in kinds, (what, shown)


# -- what the plans answer


def expected_page_walk(messages: list[StoredMessage], query: StoreQuery) -> list[bytes]:
    def matches(m: StoredMessage) -> bool:
        if query.message_hashes:
            return m.message_hash in query.message_hashes
        if query.pubsub_topic is not None and m.pubsub_topic != query.pubsub_topic:
            return False
        if query.content_topics and m.message.content_topic not in query.content_topics:
            return False
        if query.time_start is not None and m.timestamp < query.time_start:
            return False
        return query.time_end is None or m.timestamp <= query.time_end

    return [m.message_hash for m in messages if matches(m)]


def walk(archive: SqlArchive, query: StoreQuery) -> list[bytes]:
    seen: list[bytes] = []
    while True:
        page = archive.query(query)
        seen = [*seen, *page.hashes] if query.pagination_forward else [*page.hashes, *seen]
        if page.cursor is None:
            return seen
        query = replace(query, pagination_cursor=page.cursor)


@pytest.mark.parametrize("backend", ["sqlite_loaded", "pg_loaded"])
def test_every_shape_pages_through_exactly_its_matches(
    request: pytest.FixtureRequest, backend: str, messages: list[StoredMessage]
) -> None:
    loaded: SqlArchive = request.getfixturevalue(backend)
    hashes = tuple(m.message_hash for m in messages[::97])[:100]
    sparse = [m for m in messages if m.pubsub_topic == SPARSE]
    for filters in [
        {"pubsub_topic": SPARSE},
        {"pubsub_topic": SPARSE, "content_topics": ("/app/1/t1/proto", "/app/1/t1/proto")},
        {"pubsub_topic": SPARSE, "content_topics": TOPICS[:4]},
        {"pubsub_topic": SPARSE, "content_topics": ("/nobody/1/x/proto", TOPICS[5])},
        {"content_topics": (TOPICS[1],)},
        {"content_topics": ("/nobody/1/x/proto", *TOPICS[3:6])},
        {"message_hashes": hashes},
        {"message_hashes": (sparse[3].message_hash, sparse[3].message_hash, b"\x00" * 32)},
    ]:
        for (start, end), forward, size in itertools.product(
            list(BOUNDS.values()), (True, False), (7, 100)
        ):
            if "message_hashes" in filters and (start or end):
                continue
            query = StoreQuery(
                time_start=start,
                time_end=end,
                pagination_forward=forward,
                pagination_limit=size,
                **filters,
            )
            assert walk(loaded, query) == expected_page_walk(messages, query), (filters, start)


# -- archives made before an index existed

OLD_SQLITE = """
CREATE TABLE messages (
    message_hash BLOB NOT NULL, timestamp INTEGER NOT NULL, pubsub_topic TEXT NOT NULL,
    content_topic TEXT NOT NULL, payload BLOB NOT NULL, meta BLOB, version INTEGER NOT NULL
);
CREATE UNIQUE INDEX messages_hash ON messages (message_hash);
CREATE INDEX messages_time ON messages (timestamp, message_hash);
CREATE INDEX messages_topics ON messages (pubsub_topic, content_topic, timestamp, message_hash);
"""
OLD_POSTGRES = """
CREATE TABLE messages (
    message_hash bytea NOT NULL, timestamp bigint NOT NULL, pubsub_topic text NOT NULL,
    content_topic text NOT NULL, payload bytea NOT NULL, meta bytea, version bigint NOT NULL,
    PRIMARY KEY (timestamp, message_hash)
) PARTITION BY RANGE (timestamp);
CREATE INDEX messages_hash ON messages (message_hash);
CREATE INDEX messages_topics ON messages (pubsub_topic, content_topic, timestamp, message_hash);
"""


def test_an_existing_sqlite_archive_gets_the_new_index_on_open(tmp_path: Path) -> None:
    path = str(tmp_path / "old.sqlite3")
    old = sqlite3.connect(path)
    old.executescript(OLD_SQLITE)
    old.close()
    archive = open_archive(path)
    try:
        archive.insert(make_messages(50))
        with archive._read() as conn:
            names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert "messages_pubsub_time" in names
        plan = sqlite_plan(archive, *executed(archive, StoreQuery(pubsub_topic=PUBSUB)))
        assert plan == [
            "SEARCH messages USING COVERING INDEX messages_pubsub_time (pubsub_topic=?)"
        ]
        assert (
            len(archive.query(StoreQuery(pubsub_topic=PUBSUB, pagination_limit=100)).hashes) == 50
        )
    finally:
        archive.close()


def test_an_existing_postgresql_archive_gets_the_new_index_on_open(
    pg_cluster: TempCluster,
) -> None:
    import psycopg

    url = pg_cluster.create_database(f"old{os.getpid()}")
    hour = T0 // (3_600 * 10**9)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(OLD_POSTGRES)
        conn.execute(
            f"CREATE TABLE messages_h{hour} PARTITION OF messages "
            f"FOR VALUES FROM ({hour * 3_600 * 10**9}) TO ({(hour + 1) * 3_600 * 10**9})"
        )
    archive = open_archive(url)
    try:
        archive.insert(make_messages(50, span=HOUR // 2))  # T0 is 0.22 h into its hour
        with archive._read() as conn:
            indexes = {
                (table, index)
                for table, index in conn.execute("SELECT tablename, indexname FROM pg_indexes")
            }
        assert ("messages", "messages_pubsub_time") in indexes
        assert (
            f"messages_h{hour}",
            f"messages_h{hour}_pubsub_topic_timestamp_message_hash_idx",
        ) in indexes
        assert (
            len(archive.query(StoreQuery(pubsub_topic=PUBSUB, pagination_limit=100)).hashes) == 50
        )
    finally:
        archive.close()
