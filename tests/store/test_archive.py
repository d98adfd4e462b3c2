"""The archive contract, run on SQLite and PostgreSQL alike (the ``archive`` fixture)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from storetest import HOUR, PUBSUB, T0, in_order, make_message, make_messages

from sdsync.errors import RemoteProtocolError
from sdsync.store import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    QueryError,
    RetentionPolicy,
    SqlArchive,
    StatusCode,
    StoredMessage,
    StoreQuery,
)
from sdsync.wire.waku import WakuMessage


def walk(archive: SqlArchive, query: StoreQuery) -> tuple[list[bytes], int]:
    """Every hash a paginated query yields, in chronological order, and the page count."""
    hashes: list[bytes] = []
    pages = 0
    while True:
        page = archive.query(query)
        pages += 1
        hashes = hashes + page.hashes if query.pagination_forward else page.hashes + hashes
        if page.cursor is None:
            return hashes, pages
        query = replace(query, pagination_cursor=page.cursor)


def test_insert_is_idempotent_and_counts_only_new(archive: SqlArchive) -> None:
    messages = make_messages(50)
    assert archive.insert(messages[:30]) == 30
    assert archive.insert(messages) == 20
    assert archive.insert(messages) == 0
    assert archive.count() == 50
    assert archive.insert([]) == 0


def test_a_message_whose_hash_does_not_match_cannot_be_stored() -> None:
    good = make_messages(1)[0]
    with pytest.raises(RemoteProtocolError, match="does not match"):
        StoredMessage(bytes(32), good.pubsub_topic, good.message)
    tampered = replace(good.message, payload=good.message.payload + b"!")
    with pytest.raises(RemoteProtocolError, match="does not match"):
        StoredMessage(good.message_hash, good.pubsub_topic, tampered)
    with pytest.raises(RemoteProtocolError, match="timestamp"):
        StoredMessage.of(PUBSUB, WakuMessage(b"x", "/a/1/b/proto"))
    with pytest.raises(RemoteProtocolError, match="ephemeral"):
        StoredMessage.of(PUBSUB, WakuMessage(b"x", "/a/1/b/proto", timestamp=1, ephemeral=True))


def test_round_trip_keeps_every_field(archive: SqlArchive) -> None:
    rng = random.Random(3)
    stored = make_message(rng, T0 + 5, meta=b"\x00meta")
    versioned = StoredMessage.of(
        "/waku/2/rs/1/7", WakuMessage(b"\x00\xff", "/a/1/b/proto", timestamp=T0, version=1)
    )
    archive.insert([stored, versioned])
    assert archive.get([stored.message_hash, versioned.message_hash, bytes(32)]) == [
        versioned,
        stored,
    ]


@pytest.mark.parametrize("forward", [True, False])
def test_pagination_visits_everything_once_in_order(archive: SqlArchive, forward: bool) -> None:
    messages = make_messages(230, seed=forward)
    archive.insert(messages)
    hashes, pages = walk(archive, StoreQuery(pagination_limit=25, pagination_forward=forward))
    assert hashes == [m.message_hash for m in in_order(messages)]
    assert pages == 10  # 9 full pages and 5 left over; no empty trailing page


def test_backward_page_is_the_newest_in_chronological_order(archive: SqlArchive) -> None:
    messages = in_order(make_messages(40))
    archive.insert(messages)
    page = archive.query(
        StoreQuery(pagination_limit=10, pagination_forward=False, include_data=True)
    )
    assert page.hashes == [m.message_hash for m in messages[-10:]]
    assert page.messages == messages[-10:]
    assert page.cursor == messages[-10].message_hash  # the last one visited going back


def test_page_size_defaults_to_20_and_is_clamped_to_100(archive: SqlArchive) -> None:
    archive.insert(make_messages(150))
    assert len(archive.query(StoreQuery()).hashes) == DEFAULT_PAGE_SIZE
    assert len(archive.query(StoreQuery(pagination_limit=1000)).hashes) == MAX_PAGE_SIZE


def test_without_data_a_page_has_hashes_only(archive: SqlArchive) -> None:
    archive.insert(make_messages(5))
    page = archive.query(StoreQuery(include_data=False))
    assert len(page.hashes) == 5
    assert page.messages == []
    assert page.cursor is None


def test_content_filter_and_inclusive_time_range(archive: SqlArchive) -> None:
    messages = make_messages(300)
    other_pubsub = [
        make_message(random.Random(i), T0 + i * HOUR // 10, pubsub_topic="/waku/2/rs/1/9")
        for i in range(20)
    ]
    archive.insert(messages + other_pubsub)
    topics = ("/app/1/chat/proto", "/app/1/acks/proto")
    start, end = in_order(messages)[40].timestamp, in_order(messages)[250].timestamp
    expected = [
        m.message_hash
        for m in in_order(messages)
        if m.message.content_topic in topics and start <= m.timestamp <= end
    ]
    query = StoreQuery(
        pubsub_topic=PUBSUB,
        content_topics=topics,
        time_start=start,
        time_end=end,
        pagination_limit=33,
    )
    assert walk(archive, query)[0] == expected
    assert walk(archive, replace(query, pagination_forward=False))[0] == expected
    only_pubsub = walk(archive, StoreQuery(pubsub_topic="/waku/2/rs/1/9", pagination_limit=100))[0]
    assert only_pubsub == [m.message_hash for m in in_order(other_pubsub)]


def test_query_by_hashes_returns_only_those_held(archive: SqlArchive) -> None:
    messages = make_messages(60)
    archive.insert(messages[:40])
    wanted = [m.message_hash for m in messages[30:50]]
    page = archive.query(StoreQuery(message_hashes=tuple(wanted), include_data=True))
    assert page.hashes == [m.message_hash for m in in_order(messages[30:40])]
    assert all(m.message_hash in wanted[:10] for m in page.messages)


def test_a_query_by_hashes_may_name_its_pubsub_topic(archive: SqlArchive) -> None:
    # js-waku's store client sends its decoder's pubsub topic with the hashes.
    here = make_messages(10)
    elsewhere = [StoredMessage.of("/waku/2/rs/1/5", m.message) for m in make_messages(10, 2)]
    archive.insert([*here, *elsewhere])
    hashes = tuple(m.message_hash for m in [*here, *elsewhere])
    page = archive.query(StoreQuery(message_hashes=hashes, pubsub_topic=PUBSUB))
    assert page.hashes == [m.message_hash for m in in_order(here)]


def test_unknown_cursor_is_a_bad_request(archive: SqlArchive) -> None:
    archive.insert(make_messages(3))
    with pytest.raises(QueryError) as err:
        archive.query(StoreQuery(pagination_cursor=b"\x01" * 32))
    assert err.value.status == StatusCode.BAD_REQUEST


def test_items_are_sorted_and_half_open(
    archive: SqlArchive, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sdsync.store.archive.SCAN_BATCH", 7)  # cross many batch boundaries
    messages = in_order(make_messages(120))
    archive.insert(messages)
    start, end = messages[10].timestamp, messages[100].timestamp
    assert list(archive.items(start, end)) == [
        (m.timestamp, m.message_hash) for m in messages[10:100]
    ]
    assert list(archive.messages()) == messages
    assert list(archive.messages(end, None)) == messages[100:]


def test_same_timestamp_orders_by_hash(archive: SqlArchive) -> None:
    rng = random.Random(9)
    twins = [make_message(rng, T0) for _ in range(30)]
    archive.insert(twins)
    hashes, _ = walk(archive, StoreQuery(pagination_limit=4))
    assert hashes == sorted(m.message_hash for m in twins)
    assert [h for _, h in archive.items(T0, T0 + 1)] == hashes


def test_delete_before_and_delete_oldest(archive: SqlArchive) -> None:
    messages = in_order(make_messages(200, span=5 * HOUR))
    archive.insert(messages)
    cutoff = messages[70].timestamp
    assert archive.delete_before(cutoff) == 70
    assert next(archive.messages()) == messages[70]
    assert archive.delete_oldest(30) == 30
    assert list(archive.messages()) == messages[100:]
    assert archive.delete_oldest(1_000) == 100
    assert archive.count() == 0


def test_time_and_capacity_retention(archive: SqlArchive) -> None:
    messages = in_order(make_messages(100, span=4 * HOUR))
    archive.insert(messages)
    now = T0 + 4 * HOUR
    time_policy = RetentionPolicy.parse("time:7200")
    assert time_policy.apply(archive, now) == sum(m.timestamp < now - 2 * HOUR for m in messages)
    assert all(m.timestamp >= now - 2 * HOUR for m in archive.messages())
    kept = archive.count()
    assert RetentionPolicy.parse("capacity:10").apply(archive, now) == kept - 10
    assert list(archive.messages()) == messages[-10:]
    assert RetentionPolicy.parse("capacity:10").apply(archive, now) == 0


def test_size_retention_brings_the_archive_under_the_limit(archive: SqlArchive) -> None:
    rng = random.Random(5)
    big = [
        StoredMessage.of(
            PUBSUB, WakuMessage(rng.randbytes(4_000), "/a/1/b/proto", timestamp=T0 + i * HOUR // 50)
        )
        for i in range(500)  # ten hours: PostgreSQL can drop whole partitions
    ]
    archive.insert(big)
    before = archive.size_bytes()
    limit = before // 2
    deleted = RetentionPolicy.parse(f"size:{limit}").apply(archive, T0)
    assert 0 < deleted < 500
    assert archive.size_bytes() <= limit
    # What is left is the newest messages.
    assert list(archive.messages()) == in_order(big)[deleted:]
