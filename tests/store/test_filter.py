"""The Filter v2 subscription table, alone: who gets what, the limits, expiry, drops, the
fair share between hosts and liveness; and how LightClientServices drops a subscriber its
pushes cannot reach."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storetest import running

from sdsync.store import SqlArchive
from sdsync.store.light_clients import LightClientConfig
from sdsync.testing.memory import MemoryNetwork
from sdsync.waku.filter.rpc import (
    FILTER_PUSH_PROTOCOL,
    FILTER_SUBSCRIBE_PROTOCOL,
    FilterSubscribeRequest,
    FilterSubscribeResponse,
    FilterSubscribeType,
    MessagePush,
)
from sdsync.waku.filter.service import (
    FilterLimits,
    FilterRefused,
    FilterStatus,
    FilterSubscriptions,
    answer_filter_subscribe,
)
from sdsync.waku.lightpush.service import ServedTopics
from sdsync.wire.waku import WakuMessage

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
    subscriptions: FilterSubscriptions,
    peer: str,
    req: FilterSubscribeRequest,
    *,
    host: str | None = None,
) -> tuple[FilterStatus, str]:
    with pytest.raises(FilterRefused) as caught:
        subscriptions.answer(peer, req, 0.0, host=host)
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


def test_light_services_drop_a_subscriber_that_takes_no_pushes_and_count_it(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    """Three subscribers whose pushes fail or wait: "deaf" does not speak filter-push at
    all, "gone" went away, "slow" takes its pushes only once ``opened`` is set."""
    net = MemoryNetwork()
    store = net.waku_node("store")
    deaf, gone, slow = (net.waku_node(name) for name in ("deaf", "gone", "slow"))
    opened, pushed = asyncio.Event(), []  # the payloads slow took
    config = LightClientConfig(served=ServedTopics(((SHARD, None),)), push_queue=8)

    async def take(peer: str, frame: bytes) -> None:
        await opened.wait()
        message = MessagePush.from_bytes(frame).waku_message
        pushed.append(message.payload if message else None)

    async def scenario() -> None:
        async with running(
            sqlite_archive, tmp_path, waku=store, serve_light=True, light_clients=config
        ) as node:
            services = node.light_clients
            assert services is not None
            await slow.serve_pushes(FILTER_PUSH_PROTOCOL, take)
            for subscriber in (deaf, gone, slow):
                await subscriber.request(
                    store.listen_addrs[0],
                    FILTER_SUBSCRIBE_PROTOCOL,
                    request(SUBSCRIBE, X).to_bytes(),
                )
            await gone.close()
            for i in range(10):  # 8 queued for each, 2 over the bound
                assert services.offer(SHARD, WakuMessage(bytes([i]), X, timestamp=i + 1)) == 3
            opened.set()
            async with asyncio.timeout(10):
                while services._workers:
                    await asyncio.sleep(0.01)
            assert deaf.peer_id not in services.filters and gone.peer_id not in services.filters
            assert pushed == [bytes([i]) for i in range(8)]  # in order, the first 8
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


# -- fair share between hosts, liveness (issue 27, row 13)


def test_a_host_holds_at_most_max_peers_per_host_subscriptions() -> None:
    subscriptions = table(max_peers_per_host=2)
    for peer in ("a", "b"):
        subscriptions.answer(peer, request(SUBSCRIBE, X), 0.0, host="10.0.0.1")
    with pytest.raises(FilterRefused) as caught:
        subscriptions.answer("c", request(SUBSCRIBE, X), 0.0, host="10.0.0.1")
    assert caught.value.reason == "too_many_subscribers_per_host"
    subscriptions.answer("a", request(SUBSCRIBE, Y), 0.0, host="10.0.0.1")  # not a new one
    subscriptions.answer("c", request(SUBSCRIBE, X), 0.0, host="10.0.0.2")
    assert subscriptions.per_host() == {"10.0.0.1": 2, "10.0.0.2": 1}


def test_a_full_table_drops_the_stalest_subscriber_of_the_largest_host() -> None:
    drops: list[tuple[str, str]] = []
    subscriptions = table(max_peers=4)
    subscriptions.on_drop = lambda peer, reason: drops.append((peer, reason))
    for now, (peer, host) in enumerate([("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B")]):
        subscriptions.answer(peer, request(SUBSCRIBE, X), float(now), host=host)
    subscriptions.answer("a1", request(FilterSubscribeType.SUBSCRIBER_PING), 5.0, host="A")
    subscriptions.answer("c1", request(SUBSCRIBE, X), 6.0, host="C")
    assert drops == [("a2", "fair_share")]  # a1 pinged since
    # A holds 2, B 1: B's second would leave the shares as unequal as they are.
    assert refusal(subscriptions, "b2", request(SUBSCRIBE, X), host="B") == (
        FilterStatus.SERVICE_UNAVAILABLE,
        "too_many_subscribers",
    )
    subscriptions.answer("d1", request(SUBSCRIBE, X), 8.0, host="D")
    assert drops[-1] == ("a3", "fair_share")
    assert subscriptions.per_host() == {"A": 1, "B": 1, "C": 1, "D": 1}


def test_a_subscriber_disconnected_past_the_grace_is_dropped() -> None:
    drops: list[tuple[str, str]] = []
    subscriptions = table(disconnect_grace_s=30.0)
    subscriptions.on_drop = lambda peer, reason: drops.append((peer, reason))
    for peer in ("a", "b"):
        subscriptions.answer(peer, request(SUBSCRIBE, X), 0.0, host="h")
    assert subscriptions.connected({"a"}, 10.0) == []  # b is absent from now on
    assert subscriptions.connected({"a", "b"}, 20.0) == []  # b came back: forgiven
    assert subscriptions.connected({"a"}, 30.0) == []
    assert subscriptions.connected({"a"}, 60.0) == []  # exactly the grace
    assert subscriptions.connected({"a"}, 60.5) == ["b"]
    assert drops == [("b", "disconnected")] and "a" in subscriptions
    assert subscriptions.per_host() == {"h": 1}


def test_an_expired_subscription_is_reported() -> None:
    drops: list[tuple[str, str]] = []
    subscriptions = table(subscription_ttl_s=300.0)
    subscriptions.on_drop = lambda peer, reason: drops.append((peer, reason))
    subscriptions.answer("a", request(SUBSCRIBE, X), 0.0)
    assert subscriptions.expire(301.0) == ["a"]
    assert drops == [("a", "expired")] and subscriptions.per_host() == {}


PEERS = st.sampled_from([f"p{i}" for i in range(12)])
HOSTS = st.sampled_from(["A", "B", "C", "D"])
OPS = st.lists(
    st.tuples(st.sampled_from(["subscribe", "unsubscribe", "connected", "fail"]), PEERS, HOSTS),
    max_size=60,
)


@given(OPS)
@settings(max_examples=200, deadline=None)
def test_the_table_keeps_its_bounds_and_always_makes_room_for_a_new_host(
    ops: list[tuple[str, str, str]],
) -> None:
    subscriptions = table(max_peers=6, max_peers_per_host=3, disconnect_grace_s=1.0)
    for now, (op, peer, host) in enumerate(ops):
        with contextlib.suppress(FilterRefused):
            if op == "subscribe":
                subscriptions.answer(peer, request(SUBSCRIBE, X), float(now), host=host)
            elif op == "unsubscribe":
                subscriptions.answer(peer, request(UNSUBSCRIBE, X), float(now), host=host)
            elif op == "connected":
                subscriptions.connected({peer}, float(now))
            else:
                subscriptions.push_failed(peer)
        per_host = subscriptions.per_host()
        assert sum(per_host.values()) == len(subscriptions) <= 6
        assert all(0 < count <= 3 for count in per_host.values())
    # A host new to the table is refused only when no host holds two or more.
    fits = len(subscriptions) < 6 or max(subscriptions.per_host().values()) >= 2
    try:
        subscriptions.answer("newcomer", request(SUBSCRIBE, X), float(len(ops)), host="E")
    except FilterRefused:
        assert not fits
    else:
        assert fits and "newcomer" in subscriptions
