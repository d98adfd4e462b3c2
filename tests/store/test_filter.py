"""The Filter v2 subscription table, alone: who gets what, the limits, expiry, drops; and
how LightServices drops a subscriber its pushes cannot reach."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from storetest import running

from sdsync.errors import ProtocolNotSupportedError
from sdsync.store import SqlArchive
from sdsync.store.filter import (
    FilterLimits,
    FilterRefused,
    FilterStatus,
    FilterSubscriptions,
    answer_filter_subscribe,
)
from sdsync.store.light import LightConfig
from sdsync.store.lightpush import ServedTopics
from sdsync.wire.waku import WakuMessage
from sdsync.wire.waku_protocols import (
    FILTER_SUBSCRIBE_PROTOCOL,
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


class PushFailingHost:
    """A LightHost whose pushes fail: "deaf" does not speak filter-push at all, "gone"
    cannot be reached; "slow" takes its pushes only once ``opened`` is set."""

    def __init__(self) -> None:
        self.handlers: dict[str, object] = {}
        self.opened = asyncio.Event()
        self.pushed: list[str] = []

    async def serve(self, protocol_id: str, handler: object) -> None:
        self.handlers[protocol_id] = handler

    async def push(self, peer: str, protocol_id: str, payload: bytes, *, timeout_s: float) -> None:
        if peer == "deaf":
            raise ProtocolNotSupportedError(peer, protocol_id)
        await self.opened.wait()
        if peer == "gone":
            raise ConnectionError(f"{peer} is gone")
        self.pushed.append(peer)

    async def publish_message(self, pubsub_topic: str, message: WakuMessage) -> bytes:
        return message.hash(pubsub_topic)

    async def mesh_peers(self, topic: str) -> list[str]:
        return []


def test_light_services_drop_a_subscriber_that_takes_no_pushes_and_count_it(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    host = PushFailingHost()
    config = LightConfig(served=ServedTopics(((SHARD, None),)), push_queue=8)

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path, light_host=host, light=config) as node:
            services = node.light
            assert services is not None
            handler = host.handlers[FILTER_SUBSCRIBE_PROTOCOL]
            for peer in ("deaf", "gone", "slow"):
                await handler(peer, request(SUBSCRIBE, X).to_bytes())  # type: ignore[operator]
            for i in range(10):  # 8 queued for each, 2 over the bound
                assert services.offer(SHARD, WakuMessage(bytes([i]), X, timestamp=i + 1)) == 3
            host.opened.set()
            async with asyncio.timeout(10):
                while services._workers:
                    await asyncio.sleep(0.01)
            assert "deaf" not in services.filters and "gone" not in services.filters
            assert host.pushed == ["slow"] * 8
            sample = node.metrics.registry.get_sample_value
            drops = "sdsync_store_filter_subscriptions_dropped_total"
            assert sample(drops, {"reason": "no_push_protocol"}) == 1
            assert sample(drops, {"reason": "push_failures"}) == 1
            pushes = "sdsync_store_filter_pushes_total"
            assert sample(pushes, {"outcome": "sent"}) == 8
            # deaf: 1 failed, 7 queued dropped; gone: 3 failed (max_push_failures), 5
            # queued dropped; 2 over the queue bound for each of the three.
            assert sample(pushes, {"outcome": "failed"}) == 1 + 3
            assert sample(pushes, {"outcome": "dropped"}) == 7 + 5 + 3 * 2

    asyncio.run(scenario())
