"""The Waku node contract (sdsync.waku.node): who keeps which part of it, and
MemoryWakuNode, the in-memory node, failing as the libp2p host fails. mypy checks the
implementations against the protocols (the ``_CONTRACT`` assignments in src); here the
members are checked at run time too, and the memory node's behaviour."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from sdsync.errors import (
    LocalProtocolError,
    ProtocolNotSupportedError,
    RejectReason,
    RemoteProtocolError,
)
from sdsync.testing.memory import MemoryNetwork
from sdsync.testing.memory_waku import MemoryWakuNode, memory_peer_id
from sdsync.transport import Transport, WakuClient, WakuCounters, WakuHost, WakuNode, WakuRequester
from sdsync.waku.node import Envelope, Received
from sdsync.waku.rpc import MAX_RPC_BYTES, encode_frame
from sdsync.wire.waku import WakuMessage

SHARD = "/waku/2/rs/1/7"  # /sds/1/chan/proto autoshards here on cluster 1
ECHO = "/test/echo/1"
PUSH = "/test/push/1"


def members(protocol: type) -> set[str]:
    """The names a Protocol class and the protocols it extends declare."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (object,) or not getattr(cls, "_is_protocol", False):
            continue
        names |= {n for n in vars(cls) if not n.startswith("_")}
        names |= set(getattr(cls, "__annotations__", {}))
    return names


def test_the_contract_nests_and_each_node_keeps_its_part() -> None:
    from sdsync.transport.libp2p import Libp2pTransport
    from sdsync.transport.waku_light import WakuLightTransport

    assert members(WakuRequester) == {"request"}
    assert members(Transport) | members(WakuRequester) < members(WakuClient)
    assert members(WakuClient) | members(WakuHost) | members(WakuCounters) < members(WakuNode)
    assert members(WakuNode) - members(WakuClient) - members(WakuHost) - members(WakuCounters) == {
        "subscribe_envelopes",
        "publish_message",
    }
    memory, libp2p = MemoryNetwork().waku_node("a"), Libp2pTransport()  # not started
    for name in members(WakuNode):
        assert hasattr(memory, name) and hasattr(libp2p, name), name
    # A light client is a WakuClient, not a host: it serves nothing (its push is LightPush).
    light = set(dir(WakuLightTransport))
    assert members(WakuClient) <= light
    assert not {"serve", "serve_pushes", "peer_ip", "subscribe_envelopes"} & light


def run(scenario: Callable[[MemoryNetwork], Awaitable[Any]]) -> Any:
    return asyncio.run(scenario(MemoryNetwork()))


async def echo(peer: str, request: bytes) -> bytes:
    return b"from " + peer.encode()[:8] + b": " + request


# -- relay


def test_relay_hands_each_other_node_the_message_with_its_waku_hash() -> None:
    async def scenario(net: MemoryNetwork) -> None:
        a, b, store = net.waku_node("a"), net.waku_node("b"), net.waku_node("store")
        mine, frames = a.subscribe("/sds/1/chan"), b.subscribe("/sds/1/chan")
        envelopes = store.subscribe_envelopes(SHARD)
        assert set(await a.mesh_peers("/sds/1/chan")) == {b.peer_id, store.peer_id}
        hint = await a.publish("/sds/1/chan", b"sds bytes")
        heard = await anext(frames)
        assert heard == Received(b"sds bytes", hint)
        envelope = await anext(envelopes)
        assert envelope.pubsub_topic == SHARD
        assert envelope.message.content_topic == "/sds/1/chan/proto"
        assert envelope.message_hash == envelope.message.hash(SHARD) == hint
        # Others' content topics reach the envelope subscriber only.
        other = WakuMessage(b"x", "/other/1/x/proto", timestamp=1)
        await b.publish_message(SHARD, other)
        assert (await anext(envelopes)) == Envelope(SHARD, other, other.hash(SHARD))
        await a.close()
        assert [r async for r in mine] == []  # not its own; ended by close

    run(scenario)


def test_a_node_without_relay_refuses_to_relay() -> None:
    async def scenario(net: MemoryNetwork) -> None:
        host = net.waku_node("light", relay=False)
        with pytest.raises(LocalProtocolError, match="relay=False"):
            await host.publish("/sds/1/chan", b"x")
        with pytest.raises(LocalProtocolError):
            host.subscribe_envelopes(SHARD)

    run(scenario)


# -- request/response


def test_a_request_dials_by_address_and_then_both_ends_are_connected() -> None:
    async def scenario(net: MemoryNetwork) -> None:
        server, client = net.waku_node("server", ip="10.0.0.1"), net.waku_node("client")
        client.ip = "192.0.2.7"
        await server.serve(ECHO, echo)
        with pytest.raises(ConnectionError, match="no connection"):
            await client.request(server.peer_id, ECHO, b"hi")  # by id, not connected
        answer = await client.request(server.listen_addrs[0], ECHO, b"hi")
        assert answer == b"from " + client.peer_id.encode()[:8] + b": hi"
        assert await client.request(server.peer_id, ECHO, b"again")  # now by id
        assert await server.connected_peers() == [client.peer_id]
        assert await server.peer_ip(client.peer_id) == "192.0.2.7"
        client.disconnect(server.peer_id)
        assert await server.connected_peers() == []
        assert await server.peer_ip(client.peer_id) is None

    run(scenario)


def test_requests_fail_as_the_libp2p_hosts_do() -> None:
    async def scenario(net: MemoryNetwork) -> None:
        server, client = net.waku_node("server"), net.waku_node("client")
        address = server.listen_addrs[0]

        async def silent(peer: str, request: bytes) -> None:
            return None

        async def broken(peer: str, request: bytes) -> bytes:
            raise ValueError("a bug")

        async def slow(peer: str, request: bytes) -> bytes:
            await asyncio.sleep(10)
            return b""

        await server.serve(ECHO, echo, max_request_bytes=100)
        await server.serve("/silent", silent)
        await server.serve("/broken", broken)
        await server.serve("/slow", slow, timeout_s=0.01)
        with pytest.raises(ProtocolNotSupportedError):
            await client.request(address, "/unserved", b"")
        gone = f"/ip4/127.0.0.1/tcp/1/p2p/{memory_peer_id('nobody')}"
        with pytest.raises(ConnectionError, match="cannot reach"):
            await client.request(gone, ECHO, b"")
        with pytest.raises(RemoteProtocolError) as oversized:
            await client.request(address, ECHO, b"x" * 50, max_response_bytes=20)
        assert oversized.value.reason is RejectReason.OVERSIZED
        with pytest.raises(ConnectionError, match="reset"):
            await client.request(address, ECHO, b"x" * 101)
        assert server.rejected == {RejectReason.OVERSIZED: 1}
        with pytest.raises(RemoteProtocolError) as unanswered:
            await client.request(address, "/silent", b"")
        assert unanswered.value.reason is RejectReason.TRUNCATED_FRAME
        with pytest.raises(ConnectionError):
            await client.request(address, "/broken", b"")
        assert server.stream_failures == {"/broken": 1}
        with pytest.raises(ConnectionError):
            await client.request(address, "/slow", b"")
        assert server.stream_timeouts == {"/slow": 1}
        with pytest.raises(TimeoutError):
            await client.request(address, "/slow", b"", timeout_s=0.001)
        await server.close()
        with pytest.raises(ConnectionError):
            await client.request(address, ECHO, b"")
        with pytest.raises(LocalProtocolError):
            await server.request(client.listen_addrs[0], ECHO, b"")

    run(scenario)


def test_pushes_arrive_in_order_and_a_refused_one_is_counted_where_it_arrives() -> None:
    async def scenario(net: MemoryNetwork) -> None:
        sender, receiver = net.waku_node("sender"), net.waku_node("receiver")
        got: list[tuple[str, bytes]] = []

        async def take(peer: str, frame: bytes) -> None:
            got.append((peer, frame))

        await receiver.serve_pushes(PUSH, take, max_frame_bytes=10)
        address = receiver.listen_addrs[0]
        with pytest.raises(ProtocolNotSupportedError):
            await sender.push(address, "/other", b"")
        for i in range(3):
            await sender.push(address, PUSH, bytes([i]))
        await sender.push(receiver.peer_id, PUSH, b"x" * 11)
        assert got == [(sender.peer_id, bytes([i])) for i in range(3)]
        assert receiver.rejected == {RejectReason.OVERSIZED: 1}
        assert sender.push_streams == {PUSH: 1}  # one lane

    run(scenario)


def test_frames_are_the_real_frames() -> None:
    """A request at the bound passes, one byte over is refused: the bound is the frame
    body's, as read_frame counts it for the libp2p host."""

    async def ok(peer: str, request: bytes) -> bytes:
        return b"ok"

    async def scenario(net: MemoryNetwork) -> None:
        server, client = net.waku_node("server"), net.waku_node("client")
        await server.serve(ECHO, ok)
        address = server.listen_addrs[0]
        assert len(encode_frame(b"x" * MAX_RPC_BYTES)) > MAX_RPC_BYTES
        assert await client.request(address, ECHO, b"x" * MAX_RPC_BYTES)
        with pytest.raises(ConnectionError):
            await client.request(address, ECHO, b"x" * (MAX_RPC_BYTES + 1))

    run(scenario)


def test_node_names_are_unique_in_a_network() -> None:
    net = MemoryNetwork()
    node: MemoryWakuNode = net.waku_node("a")
    with pytest.raises(LocalProtocolError):
        net.waku_node("a")
    assert node.listen_addrs[0].endswith("/p2p/" + node.peer_id)
