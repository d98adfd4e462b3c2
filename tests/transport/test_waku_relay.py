"""Libp2pTransport as a Waku Relay node: the py-libp2p mends, the validator, sharding,
metadata and the request/response streams. Against js-waku's own relay node:
tests/interop/test_js_waku_relay.py."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.peer.envelope import consume_envelope
from libp2p.peer.id import ID
from libp2p.peer.peer_record import PEER_RECORD_ENVELOPE_DOMAIN
from libp2p.peer.peerstore import env_to_send_in_RPC
from libp2p.pubsub import gossipsub
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.mcache import MessageCache
from libp2p.pubsub.pb import rpc_pb2
from transporttest import PATIENCE_S, nothing_more, run, take, until

from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError
from sdsync.transport import libp2p_patches
from sdsync.transport.libp2p import Libp2pTransport, WakuRelayConfig
from sdsync.transport.libp2p_host import RelayTrioHost
from sdsync.transport.libp2p_patches import (
    PEER_RECORD_CHECK_S,
    SUBSCRIPTION_GRACE_S,
    KeyedMessageCache,
    WakuGossipSub,
    cached_peer_record,
)
from sdsync.waku.metadata.rpc import METADATA_PROTOCOL, WakuMetadata
from sdsync.waku.relay.topics import RELAY_PROTOCOL
from sdsync.waku.rpc import encode_frame
from sdsync.wire import WakuMessage

TOPIC = "/sds/1/probe"  # what a channel names
CONTENT_TOPIC = "/sds/1/probe/proto"
PUBSUB_TOPIC = "/waku/2/rs/1/7"  # CONTENT_TOPIC autosharded on cluster 1 (REFERENCE §7)
ECHO = "/sdsync/test/echo/1"
WAKU = WakuRelayConfig()


async def waku_node(*peers: str, **options: Any) -> Libp2pTransport:
    transport = Libp2pTransport(peers=peers, **options)
    await transport.start()
    return transport


def plain_router() -> GossipSub:
    return GossipSub(protocols=[PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12)


def waku_router() -> WakuGossipSub:
    return WakuGossipSub(
        protocols=[RELAY_PROTOCOL],
        relay_protocols=(RELAY_PROTOCOL,),
        degree=6,
        degree_low=4,
        degree_high=12,
    )


def unsigned(data: bytes) -> rpc_pb2.Message:
    return rpc_pb2.Message(data=data, topicIDs=[PUBSUB_TOPIC])


# --- the mends, each against the pinned py-libp2p -----------------------------------


def test_a_relay_peer_is_added_as_gossipsub_v11_where_py_libp2p_refuses_it() -> None:
    peer = ID(b"\x01" * 34)
    with pytest.raises(ValueError, match="not supported"):
        plain_router().add_peer(peer, RELAY_PROTOCOL)  # type: ignore[arg-type]
    router = waku_router()
    router.add_peer(peer, RELAY_PROTOCOL)  # type: ignore[arg-type]
    assert router.peer_protocol[peer] == PROTOCOL_ID_V11


def test_unsigned_messages_are_not_taken_for_equivocation() -> None:
    first, second = unsigned(b"one"), unsigned(b"two")
    plain = plain_router()
    assert plain._check_equivocation(first) is True
    assert plain._check_equivocation(second) is False  # py-libp2p: same (empty) from+seqno
    router = waku_router()
    assert router._check_equivocation(first) is True
    assert router._check_equivocation(second) is True


def test_the_message_cache_holds_every_unsigned_message_by_its_id() -> None:
    messages = [unsigned(b"one"), unsigned(b"two")]

    def message_id(msg: rpc_pb2.Message) -> bytes:
        return hashlib.sha256(msg.data).digest()

    plain = MessageCache(3, 5)
    keyed = KeyedMessageCache(3, 5, message_id)
    for msg in messages:
        plain.put(msg)
        keyed.put(msg)
    assert len(plain.msgs) == 1  # py-libp2p: keyed on the empty from+seqno
    assert [keyed.get(message_id(m)) for m in messages] == messages
    assert keyed.window(PUBSUB_TOPIC) == [message_id(m) for m in messages]


def test_the_message_cache_drops_its_oldest_entries_past_its_byte_budget() -> None:
    messages = [unsigned(b"%d" % n + bytes(99)) for n in range(10)]
    size = messages[0].ByteSize()
    evicted: list[int] = []
    cache = KeyedMessageCache(
        3, 5, lambda m: m.data[:1], max_bytes=4 * size + 1, on_evict=evicted.append
    )
    for n, msg in enumerate(messages):
        cache.put(msg)
        if n % 3 == 2:
            cache.shift()  # spread over windows: eviction crosses them, oldest first
    assert cache.bytes == 4 * size
    assert list(cache.msgs) == [b"6", b"7", b"8", b"9"]
    assert sum(evicted) == 6
    # Nothing evicted is announced (IHAVE) that IWANT could not answer.
    assert sorted(cache.window(PUBSUB_TOPIC)) == [b"6", b"7", b"8", b"9"]
    assert all(cache.get(mid) is not None for mid in cache.window(PUBSUB_TOPIC))
    for _ in range(5):
        cache.shift()
    assert (cache.msgs, cache.bytes) == ({}, 0)
    cache.put(unsigned(bytes(5 * size)))  # larger than the whole budget: not cached
    assert (cache.msgs, sum(evicted)) == ({}, 7)


def test_waku_publications_carry_neither_from_nor_seqno() -> None:
    async def scenario() -> None:
        node = await waku_node()
        try:
            trio_side = node._running()
            sent: list[rpc_pb2.Message] = []
            original = trio_side.router.publish

            async def spy(forwarder: ID, msg: rpc_pb2.Message) -> None:
                sent.append(msg)
                await original(forwarder, msg)

            trio_side.router.publish = spy  # type: ignore[method-assign,assignment]
            hint = await node.publish(TOPIC, b"sds")
            await until(lambda: len(sent) == 1)
            [msg] = sent
            assert (msg.from_id, msg.seqno, msg.signature, msg.key) == (b"", b"", b"", b"")
            assert list(msg.topicIDs) == [PUBSUB_TOPIC]
            assert trio_side.pubsub.get_message_id(msg) == hashlib.sha256(msg.data).digest()
            assert len(hint) == 32
        finally:
            await node.close()

    run(scenario)


def good_frame(**fields: Any) -> bytes:
    message: dict[str, Any] = dict(payload=b"sds", content_topic=CONTENT_TOPIC, timestamp=1)
    return WakuMessage(**{**message, **fields}).to_bytes()


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        pytest.param(unsigned(good_frame()), None, id="good"),
        pytest.param(unsigned(good_frame(content_topic="/other/2/app/json")), None, id="other app"),
        pytest.param(unsigned(good_frame(timestamp=None)), RejectReason.NO_TIMESTAMP, id="no ts"),
        pytest.param(
            unsigned(good_frame(content_topic="/sds/1/probe")),
            RejectReason.MALFORMED_CONTENT_TOPIC,
            id="bad content topic",
        ),
        pytest.param(
            unsigned(good_frame(payload=b"x" * 200_000)), RejectReason.OVERSIZED, id="oversized"
        ),
        pytest.param(unsigned(b"\xff\xff"), RejectReason.NOT_WAKU_MESSAGE, id="not waku"),
        pytest.param(
            rpc_pb2.Message(data=good_frame(), topicIDs=[PUBSUB_TOPIC], seqno=b"\x00" * 8),
            RejectReason.SIGNED_RELAY_MESSAGE,
            id="seqno",
        ),
    ],
)
def test_the_waku_validator_checks_14_waku2_message(
    msg: rpc_pb2.Message, reason: RejectReason | None
) -> None:
    transport = Libp2pTransport()
    host = RelayTrioHost(transport._shared)
    try:
        accepted = host._validate(ID(b"\x01" * 34), msg)
    finally:
        host.pubsub.seen_messages.stop()  # py-libp2p starts its sweeper thread at once
    assert accepted == (reason is None)
    assert transport.rejected == ({reason: 1} if reason is not None else {})
    assert all(type(key) is RejectReason for key in transport.rejected)


def test_waku_relay_config_maps_content_topics_to_shards() -> None:
    assert WAKU.pubsub_topic(CONTENT_TOPIC) == PUBSUB_TOPIC
    assert WakuRelayConfig(cluster_id=5, shard=3).pubsub_topic(CONTENT_TOPIC) == "/waku/2/rs/5/3"
    with pytest.raises(LocalProtocolError):
        WAKU.pubsub_topic("/sds/1/probe")
    with pytest.raises(LocalProtocolError):
        WakuRelayConfig(shard_count=0)


def test_only_a_new_peer_has_publications_queued_for_its_subscription() -> None:
    router = waku_router()
    stranger, newcomer = ID(b"\x01" * 34), ID(b"\x02" * 34)
    router.add_peer(newcomer, RELAY_PROTOCOL)  # type: ignore[arg-type]
    limit = router._max_pending_messages_per_peer
    for peer in (stranger, newcomer):  # not identified yet; identified just now
        for _ in range(limit + 5):
            router._prune_pending_messages(peer)
            router._pending_messages[peer].append((time.time(), rpc_pb2.RPC()))
        assert len(router._pending_messages[peer]) == limit + 1  # py-libp2p's cap, +1
    # Some time after it was added, its subscriptions are known: nothing is kept for it.
    router._added_at[newcomer] -= SUBSCRIPTION_GRACE_S
    router._prune_pending_messages(newcomer)
    assert newcomer not in router._pending_messages
    router._pending_messages[newcomer].append((time.time(), rpc_pb2.RPC()))
    assert newcomer not in router._pending_messages
    assert stranger in router._pending_messages  # still in identify: still queued


def test_a_relay_peer_of_another_shard_is_queued_nothing_and_no_warning_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """py-libp2p queued every publication for a settled pubsub peer not subscribed to
    its topic (100 kept per peer for 30 s), re-filtering that queue and logging a
    WARNING on every publish; a peer subscribing late still gets what was just sent."""

    async def scenario() -> None:
        publisher = await waku_node()
        other_shard = await waku_node(*publisher.listen_addrs)
        try:
            inbox = publisher.subscribe(TOPIC)
            other_shard.subscribe("/waku/2/rs/1/3")
            side = publisher._running()
            other = ID.from_base58(other_shard.peer_id)
            await until(lambda: other in side.router.peer_protocol)
            await until(lambda: other in side.pubsub.peer_topics.get("/waku/2/rs/1/3", ()))

            async def settle() -> None:  # as if added SUBSCRIPTION_GRACE_S ago
                side.router._added_at[other] -= SUBSCRIPTION_GRACE_S

            await publisher._call(settle)
            for i in range(side.router._max_pending_messages_per_peer + 20):
                await publisher.publish(TOPIC, b"%d" % i)
            await until(lambda: publisher._outbox.queued == 0)
            assert other not in side.router._pending_messages
            late = other_shard.subscribe(TOPIC)
            await publisher.publish(TOPIC, b"for the late subscriber")
            async with asyncio.timeout(PATIENCE_S):  # after a replay of recent ones
                async for received in late:
                    if received.data == b"for the late subscriber":
                        break
            assert await nothing_more(inbox)  # our own publications are not delivered to us
        finally:
            await other_shard.close()
            await publisher.close()

    with caplog.at_level(logging.WARNING, logger="libp2p"):
        run(scenario)
    assert not [r for r in caplog.records if "pending message queue" in r.getMessage()]


def test_the_signed_peer_record_is_cached_yet_follows_the_listen_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """py-libp2p rebuilt every listen address on every publish to check its cached
    record; gossipsub now asks :func:`cached_peer_record`, which checks once a while."""
    assert gossipsub.env_to_send_in_RPC is cached_peer_record
    listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
    moved = multiaddr.Multiaddr("/ip4/127.0.0.2/tcp/4001")

    def addrs_in(record: bytes) -> set[str]:
        _, peer_record = consume_envelope(record, PEER_RECORD_ENVELOPE_DOMAIN)
        assert peer_record.peer_id == host.get_id()  # and the signature checked
        return {str(a) for a in peer_record.addrs}

    async def scenario() -> None:
        async with host.run(listen):
            record, _ = cached_peer_record(host)
            assert record == env_to_send_in_RPC(host)[0]
            assert addrs_in(record) == {str(a) for a in host.get_addrs()}
            calls: list[object] = []
            real_get_addrs = host.get_addrs

            def moved_too() -> list[multiaddr.Multiaddr]:
                calls.append(None)
                return [*real_get_addrs(), moved]

            monkeypatch.setattr(host, "get_addrs", moved_too)
            assert cached_peer_record(host) == (record, False)
            assert calls == []  # not even looked at
            checked, cached = libp2p_patches._PEER_RECORDS[host]
            libp2p_patches._PEER_RECORDS[host] = (checked - PEER_RECORD_CHECK_S, cached)
            refreshed, fresh = cached_peer_record(host)
            assert fresh and refreshed != record
            assert str(moved) in addrs_in(refreshed)
            assert cached_peer_record(host) == (refreshed, False)

    host = new_host(listen_addrs=listen)
    trio.run(scenario)


# --- ours to ours ------------------------------------------------------------------


def test_three_waku_nodes_relay_every_message_once() -> None:
    """Through the middle node, from the second message on: the equivocation mend."""

    async def scenario() -> None:
        middle = await waku_node()
        left = await waku_node(*middle.listen_addrs)
        right = await waku_node(*middle.listen_addrs)
        nodes = [left, middle, right]
        try:
            inbox = right.subscribe(TOPIC)
            middle.subscribe(TOPIC)
            left.subscribe(TOPIC)
            for node, count in ((left, 1), (middle, 2), (right, 1)):
                assert await node.wait_for_mesh(TOPIC, count, PATIENCE_S)
            hints = [await left.publish(TOPIC, f"m{i}".encode()) for i in range(5)]
            got = await take(inbox, 5)
            assert [r.retrieval_hint for r in got] == hints
            assert await nothing_more(inbox)
            assert right.peer_id not in await left.connected_peers()
            assert await middle.metadata() == WakuMetadata(cluster_id=1, shards=(7,))
        finally:
            for node in nodes:
                await node.close()

    run(scenario)


def test_metadata_is_answered_and_an_unused_stream_tolerated() -> None:
    async def scenario() -> None:
        server = await waku_node(waku=WakuRelayConfig(cluster_id=1, shard=3))
        client = await waku_node()
        try:
            server.subscribe(TOPIC)
            ours = WakuMetadata(cluster_id=1, shards=(7,)).to_bytes()
            answer = await client.request(server.listen_addrs[0], METADATA_PROTOCOL, ours)
            assert WakuMetadata.from_bytes(answer) == WakuMetadata(cluster_id=1, shards=(3,))
            await client.push(server.peer_id, METADATA_PROTOCOL, b"")  # an empty frame
            await raw_stream(client, server, METADATA_PROTOCOL, b"")  # opened, closed unused
            await asyncio.sleep(0.2)
            assert sum(server.rejected.values()) == 0
            assert sum(server.stream_failures.values()) == 0
        finally:
            await client.close()
            await server.close()

    run(scenario)


async def raw_stream(
    client: Libp2pTransport,
    server: Libp2pTransport,
    protocol: str,
    data: bytes,
    *,
    hold_s: float = 0,
) -> None:
    """Open a stream to ``server``, write ``data`` as it is, wait, and close it."""
    trio_side = client._running()
    peer = ID.from_base58(server.peer_id)

    async def write() -> None:
        import trio

        stream = await trio_side.host.new_stream(peer, [protocol])  # type: ignore[list-item]
        if data:
            await stream.write(data)
        await trio.sleep(hold_s)
        await stream.close()

    await client._call(write)


def test_request_response_streams_refuse_bad_frames_and_keep_serving() -> None:
    async def scenario() -> None:
        server = await waku_node()
        client = await waku_node()
        seen: list[tuple[str, bytes]] = []

        async def echo(peer: str, request: bytes) -> bytes:
            seen.append((peer, request))
            return request[::-1]

        try:
            await server.serve(ECHO, echo, max_request_bytes=100, timeout_s=1.0)
            address = server.listen_addrs[0]
            assert await client.request(address, ECHO, b"hello") == b"olleh"
            assert seen == [(client.peer_id, b"hello")]
            # Too long an answer for the client: refused on its side.
            with pytest.raises(RemoteProtocolError) as caught:
                await client.request(server.peer_id, ECHO, b"x" * 50, max_response_bytes=10)
            assert caught.value.reason is RejectReason.OVERSIZED
            # A frame above the limit, a truncated one, one never sent: refused, counted.
            await raw_stream(client, server, ECHO, encode_frame(b"x" * 101))
            await raw_stream(client, server, ECHO, encode_frame(b"x" * 50)[:20])
            await raw_stream(client, server, ECHO, b"", hold_s=1.5)
            await until(
                lambda: (
                    server.rejected == {"oversized": 1, "truncated frame": 1}
                    and server.stream_timeouts == {ECHO: 1}
                )
            )
            # A peer that asks and never answers: the client times out.
            await client.serve(ECHO, never_answers, timeout_s=30)
            with pytest.raises(TimeoutError):
                await server.request(client.peer_id, ECHO, b"?", timeout_s=0.5)
            # A protocol nobody serves.
            with pytest.raises(ConnectionError):
                await client.request(server.peer_id, "/nobody/1", b"?", timeout_s=5)
            assert await client.request(server.peer_id, ECHO, b"still") == b"llits"
        finally:
            await client.close()
            await server.close()

    run(scenario)


async def never_answers(peer: str, request: bytes) -> bytes:
    await asyncio.sleep(3600)
    return b""


def test_a_protocol_served_before_start_is_answered_once_started() -> None:
    async def scenario() -> None:
        server = await waku_node()
        client = Libp2pTransport()

        async def echo(peer: str, request: bytes) -> bytes:
            return request

        await client.serve(ECHO, echo)
        await client.start()
        try:
            assert await server.request(client.listen_addrs[0], ECHO, b"hi") == b"hi"
        finally:
            await client.close()
            await server.close()

    run(scenario)
