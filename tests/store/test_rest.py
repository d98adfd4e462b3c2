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
            pagination_cursor=b"\x07" * 32,
            pagination_forward=False,
            pagination_limit=55,
        ),
        StoreQuery(message_hashes=(b"\x01" * 32, b"\x02" * 32), include_data=True),
    ],
)
def test_query_parameters_round_trip(query: StoreQuery) -> None:
    assert parse_query(query_params(query)) == query


def test_nwaku_defaults_for_absent_or_non_positive_values() -> None:
    query = parse_query({"pageSize": "0", "startTime": "0", "endTime": "-5"})
    assert query == StoreQuery(pagination_limit=DEFAULT_PAGE_SIZE)
    assert parse_query({"pageSize": "500"}).pagination_limit == 100


def test_query_rules_are_enforced_on_construction() -> None:
    with pytest.raises(QueryError, match="at most 10 content topics"):
        StoreQuery(content_topics=tuple(f"/a/1/t{i}/proto" for i in range(11)))
    with pytest.raises(QueryError, match="no content topics or time range"):
        StoreQuery(message_hashes=(bytes(32),), time_start=T0)
    StoreQuery(message_hashes=(bytes(32),), pubsub_topic="/waku/2/rs/1/7")  # a filter
    with pytest.raises(QueryError, match="positive"):
        StoreQuery(pagination_limit=0)


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


@pytest.mark.parametrize(
    ("value", "forward"),
    [(None, True), ("true", True), ("false", False), ("TRUE", False), ("1", False), ("", False)],
)
def test_ascending_is_true_only_when_absent_or_exactly_true(
    value: str | None, forward: bool
) -> None:
    params = {} if value is None else {"ascending": value}
    assert parse_query(params).pagination_forward is forward


def test_content_topics_need_no_pubsub_topic_and_are_at_most_ten() -> None:
    topics = tuple(f"/a/1/t{i}/proto" for i in range(11))
    assert parse_query({"contentTopics": ",".join(topics[:10])}).content_topics == topics[:10]
    with pytest.raises(QueryError, match="at most 10") as refused:
        parse_query({"contentTopics": ",".join(topics)})
    assert refused.value.reason == "too_many_content_topics"


def test_a_proof_is_read_and_checked_but_not_kept() -> None:
    """nwaku's messages may carry an RLN ``proof``: accepted, not archived (nwaku's
    archive has no column for it either), and a proof that is not base64 is refused."""
    entry = page_json(Page([], make_messages(1)), "r")["messages"][0]
    with_proof = {**entry, "message": {**entry["message"], "proof": "cHJvb2Y="}}
    assert read_entries({"messages": [with_proof]}) == read_entries({"messages": [entry]})
    bad = {**entry, "message": {**entry["message"], "proof": "***"}}
    with pytest.raises(RemoteProtocolError, match="proof"):
        read_entries({"messages": [bad]})
