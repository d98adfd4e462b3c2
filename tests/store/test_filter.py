"""The Filter v2 subscription table, alone: who gets what, the limits, expiry, drops."""

from __future__ import annotations

import pytest

from sdsync.store.filter import (
    FilterLimits,
    FilterRefused,
    FilterStatus,
    FilterSubscriptions,
    answer_filter_subscribe,
)
from sdsync.wire.waku_protocols import (
    FilterSubscribeRequest,
    FilterSubscribeResponse,
    FilterSubscribeType,
)

SHARD = "/waku/2/rs/1/7"
OTHER_SHARD = "/waku/2/rs/1/3"
X, Y, Z = "/app/1/x/proto", "/app/1/y/proto", "/app/1/z/proto"
SUBSCRIBE, UNSUBSCRIBE = FilterSubscribeType.SUBSCRIBE, FilterSubscribeType.UNSUBSCRIBE
HASHES = (bytes([i]) * 32 for i in range(256))


def table(**limits: float) -> FilterSubscriptions:
    return FilterSubscriptions(lambda pubsub, _: pubsub == SHARD, FilterLimits(**limits))  # type: ignore[arg-type]


def request(
    kind: FilterSubscribeType, *topics: str, pubsub: str | None = SHARD
) -> FilterSubscribeRequest:
    return FilterSubscribeRequest("id", kind, pubsub, topics)


def refusal(
    subscriptions: FilterSubscriptions, peer: str, req: FilterSubscribeRequest
) -> tuple[FilterStatus, str]:
    with pytest.raises(FilterRefused) as caught:
        subscriptions.answer(peer, req, 0.0)
    return caught.value.status, caught.value.reason


def test_subscribers_get_their_content_topics_only_and_each_message_once() -> None:
    subscriptions = table()
    subscriptions.answer("a", request(SUBSCRIBE, X, Y), 0.0)
    subscriptions.answer("b", request(SUBSCRIBE, Y), 0.0)
    assert subscriptions.subscribers(SHARD, X, next(HASHES), 1.0) == ["a"]
    again = next(HASHES)
    assert subscriptions.subscribers(SHARD, Y, again, 1.0) == ["a", "b"]
    assert subscriptions.subscribers(SHARD, Y, again, 1.0) == []  # offered already
    assert subscriptions.subscribers(SHARD, Z, next(HASHES), 1.0) == []
    subscriptions.answer("a", request(UNSUBSCRIBE, Y), 2.0)
    assert subscriptions.subscribers(SHARD, Y, next(HASHES), 2.0) == ["b"]
    subscriptions.answer("b", request(FilterSubscribeType.UNSUBSCRIBE_ALL, pubsub=None), 2.0)
    assert subscriptions.subscribers(SHARD, Y, next(HASHES), 2.0) == []
    assert subscriptions.criteria("a") == {(SHARD, X)}


def test_requests_nwaku_refuses() -> None:
    subscriptions = table(max_content_topics_per_request=2)
    assert refusal(subscriptions, "a", request(SUBSCRIBE)) == (400, "missing_topics")
    assert refusal(subscriptions, "a", request(SUBSCRIBE, X, pubsub=None)) == (
        400,
        "missing_topics",
    )
    assert refusal(subscriptions, "a", request(SUBSCRIBE, X, Y, Z)) == (
        400,
        "too_many_content_topics",
    )
    assert refusal(subscriptions, "a", request(SUBSCRIBE, "not/a/topic")) == (
        400,
        "malformed_content_topic",
    )
    assert refusal(subscriptions, "a", request(SUBSCRIBE, X, pubsub=OTHER_SHARD)) == (
        400,
        "unsupported_topic",
    )
    # Nothing of a peer without a subscription to ping or drop.
    ping = request(FilterSubscribeType.SUBSCRIBER_PING, pubsub=None)
    assert refusal(subscriptions, "a", ping) == (404, "not_subscribed")
    assert refusal(subscriptions, "a", request(UNSUBSCRIBE, X)) == (404, "not_subscribed")
    assert len(subscriptions) == 0


def test_limits_on_subscribers_and_criteria() -> None:
    subscriptions = table(max_peers=2, max_criteria_per_peer=2)
    subscriptions.answer("a", request(SUBSCRIBE, X), 0.0)
    subscriptions.answer("b", request(SUBSCRIBE, X), 0.0)
    assert refusal(subscriptions, "c", request(SUBSCRIBE, X)) == (503, "too_many_subscribers")
    subscriptions.answer("a", request(SUBSCRIBE, X, Y), 0.0)  # X again costs nothing
    assert refusal(subscriptions, "a", request(SUBSCRIBE, Z)) == (503, "too_many_criteria")
    assert subscriptions.criteria("a") == {(SHARD, X), (SHARD, Y)}


def test_subscriptions_expire_unless_renewed_by_a_request() -> None:
    subscriptions = table(subscription_ttl_s=300)
    subscriptions.answer("a", request(SUBSCRIBE, X), 0.0)
    subscriptions.answer("b", request(SUBSCRIBE, X), 0.0)
    subscriptions.answer("a", request(FilterSubscribeType.SUBSCRIBER_PING, pubsub=None), 200.0)
    assert subscriptions.subscribers(SHARD, X, next(HASHES), 301.0) == ["a"]
    assert subscriptions.expire(501.0) == ["a"]
    assert len(subscriptions) == 0


def test_a_subscriber_is_dropped_after_pushes_fail_in_a_row() -> None:
    subscriptions = table(max_push_failures=3)
    subscriptions.answer("a", request(SUBSCRIBE, X), 0.0)
    assert not subscriptions.push_failed("a")
    assert not subscriptions.push_failed("a")
    subscriptions.push_succeeded("a")  # the count starts over
    assert not subscriptions.push_failed("a")
    assert not subscriptions.push_failed("a")
    assert subscriptions.push_failed("a")
    assert subscriptions.subscribers(SHARD, X, next(HASHES), 1.0) == []
    assert not subscriptions.push_failed("a")  # gone already
    assert "a" not in subscriptions


def test_a_subscriber_that_takes_no_pushes_at_all_is_dropped_at_once() -> None:
    subscriptions = table()
    subscriptions.answer("a", request(SUBSCRIBE, X), 0.0)
    assert "a" in subscriptions
    assert subscriptions.drop("a")
    assert "a" not in subscriptions
    assert subscriptions.subscribers(SHARD, X, next(HASHES), 1.0) == []
    assert not subscriptions.drop("a")


def test_the_answer_bytes_and_what_is_counted() -> None:
    subscriptions = table()
    counted: list[str] = []
    ok = answer_filter_subscribe(
        subscriptions, "a", request(SUBSCRIBE, X).to_bytes(), 0.0, counted.append
    )
    assert FilterSubscribeResponse.from_bytes(ok) == FilterSubscribeResponse("id", 200, "OK")
    bad = answer_filter_subscribe(subscriptions, "a", b"\xff\xff\xff", 0.0, counted.append)
    assert FilterSubscribeResponse.from_bytes(bad).status_code == 400
    assert FilterSubscribeResponse.from_bytes(bad).request_id == ""
    missing = answer_filter_subscribe(
        subscriptions, "b", request(UNSUBSCRIBE, X).to_bytes(), 0.0, counted.append
    )
    assert FilterSubscribeResponse.from_bytes(missing).status_code == 404
    assert counted == ["malformed_rpc", "not_subscribed"]
