"""The REST shapes: what the client writes the server reads back, and remote data is checked."""

from __future__ import annotations

import pytest
from storetest import PUBSUB, T0, make_messages

from sdsync.errors import RemoteProtocolError
from sdsync.store import DEFAULT_PAGE_SIZE, Page, QueryError, StoreQuery
from sdsync.store.rest import page_json, parse_query, query_params, read_entries, read_page


@pytest.mark.parametrize(
    "query",
    [
        StoreQuery(),
        StoreQuery(
            include_data=True,
            pubsub_topic=PUBSUB,
            content_topics=("/a/1/b/proto", "/a/1/c/proto"),
            time_start=T0,
            time_end=T0 + 5,
            cursor=b"\x07" * 32,
            forward=False,
            page_size=55,
        ),
        StoreQuery(message_hashes=(b"\x01" * 32, b"\x02" * 32), include_data=True),
    ],
)
def test_query_parameters_round_trip(query: StoreQuery) -> None:
    assert parse_query(query_params(query)) == query


def test_nwaku_defaults_for_absent_or_non_positive_values() -> None:
    query = parse_query({"pageSize": "0", "startTime": "0", "endTime": "-5"})
    assert query == StoreQuery(page_size=DEFAULT_PAGE_SIZE)
    assert parse_query({"pageSize": "500"}).page_size == 100


def test_query_rules_are_enforced_on_construction() -> None:
    with pytest.raises(QueryError, match="pubsub topic"):
        StoreQuery(content_topics=("/a/1/b/proto",))
    with pytest.raises(QueryError, match="no content filter"):
        StoreQuery(message_hashes=(bytes(32),), time_start=T0)
    with pytest.raises(QueryError, match="positive"):
        StoreQuery(page_size=0)


@pytest.mark.parametrize("include_data", [True, False])
def test_pages_round_trip(include_data: bool) -> None:
    messages = make_messages(3)
    page = Page(
        hashes=[m.message_hash for m in messages],
        messages=messages if include_data else [],
        cursor=messages[-1].message_hash,
    )
    assert read_page(page_json(page, "r1"), include_data=include_data) == page


def test_remote_garbage_is_a_remote_error() -> None:
    entry = page_json(Page([], make_messages(1)), "r")["messages"][0]
    bad_entries = [
        {**entry, "messageHash": "0x1234"},
        {**entry, "pubsubTopic": 5},
        {**entry, "message": {**entry["message"], "payload": "***"}},
        {**entry, "message": {**entry["message"], "timestamp": "soon"}},
        {**entry, "message": {**entry["message"], "contentTopic": ""}},
        {**entry, "pubsubTopic": "/waku/2/rs/1/1"},  # the hash covers the topic
    ]
    for bad in bad_entries:
        with pytest.raises(RemoteProtocolError):
            read_entries({"messages": [bad]})
    for body in ([], {"messages": "x"}, {"statusCode": 503, "statusDesc": "busy"}):
        with pytest.raises(RemoteProtocolError):
            read_page(body, include_data=True)
