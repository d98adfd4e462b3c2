"""Push lanes and the host API around them, between two real Libp2pTransports on 127.0.0.1.

A push lane is one long-lived outbound stream per (peer, protocol) carrying every push
(js-waku refuses a peer's 101st stream of a protocol); a one-frame reader (go-waku's
Filter client reads one MessagePush per stream and closes it) gets one stream per push.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest
import trio
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol
from libp2p.host.exceptions import StreamFailure
from transporttest import PATIENCE_S, run, until

from sdsync.errors import LocalProtocolError, ProtocolNotSupportedError, RejectReason
from sdsync.transport import Libp2pTransport
from sdsync.transport.libp2p_host import _MAX_INBOUND_STREAMS
from sdsync.transport.libp2p_streams import frame_reader
from sdsync.waku.metadata.rpc import METADATA_PROTOCOL, WakuMetadata
from sdsync.waku.rpc import encode_frame, read_frame

PUSH = "/test/push/1.0.0"
ECHO = "/test/echo/1.0.0"


async def pair(**receiver_options: object) -> tuple[Libp2pTransport, Libp2pTransport, str]:
    """A sender and a receiver, and the receiver's address."""
    receiver = Libp2pTransport(**receiver_options)  # type: ignore[arg-type]
    sender = Libp2pTransport()
    await receiver.start()
    await sender.start()
    return sender, receiver, f"{receiver.listen_addrs[0]}/p2p/{receiver.peer_id}"


async def closing(*transports: Libp2pTransport) -> None:
    for transport in transports:
        await transport.close()


def collector() -> tuple[list[bytes], Callable[[str, bytes], Awaitable[None]]]:
    frames: list[bytes] = []

    async def take(peer: str, frame: bytes) -> None:
        frames.append(frame)

    return frames, take


async def on_trio(transport: Libp2pTransport, work: Callable[[], object]) -> None:
    async def call() -> None:
        work()

    await transport._call(call)


async def raw_handler(
    transport: Libp2pTransport, protocol: str, handle: Callable[[INetStream], Awaitable[None]]
) -> None:
    """Serve ``protocol`` on ``transport`` with a bare py-libp2p stream handler (a peer
    with its own idea of push streams)."""
    host = transport._running().host
    await on_trio(transport, lambda: host.set_stream_handler(TProtocol(protocol), handle))


def test_many_pushes_share_one_stream_and_arrive_in_order() -> None:
    async def scenario() -> None:
        sender, receiver, address = await pair()
        frames, take = collector()
        await receiver.serve_pushes(PUSH, take)
        try:
            payloads = [b"push %d" % i for i in range(160)]
            for payload in payloads:
                await sender.push(address, PUSH, payload)
            await until(lambda: len(frames) == len(payloads))
            assert frames == payloads
            assert sender.push_streams[PUSH] == 1
            assert sender.push_retries[PUSH] == 0
        finally:
            await closing(sender, receiver)

    run(scenario)


def test_serve_pushes_registered_before_start_takes_pushes() -> None:
    async def scenario() -> None:
        receiver = Libp2pTransport()
        frames, take = collector()
        await receiver.serve_pushes(PUSH, take)
        await receiver.start()
        sender = Libp2pTransport()
        await sender.start()
        try:
            address = f"{receiver.listen_addrs[0]}/p2p/{receiver.peer_id}"
            await sender.push(address, PUSH, b"one")
            await sender.push(receiver.peer_id, PUSH, b"two")
            await until(lambda: frames == [b"one", b"two"])
        finally:
            await closing(sender, receiver)

    run(scenario)


def test_a_lane_the_remote_resets_is_reopened_and_the_push_delivered() -> None:
    async def scenario() -> None:
        sender, receiver, address = await pair()
        frames: list[bytes] = []
        streams: list[INetStream] = []

        async def keep(stream: INetStream) -> None:
            streams.append(stream)
            read = frame_reader(stream)
            with trio.move_on_after(PATIENCE_S):
                while (frame := await read_frame(read)) is not None:
                    frames.append(frame)

        await raw_handler(receiver, PUSH, keep)
        try:
            await sender.push(address, PUSH, b"before")
            await until(lambda: frames == [b"before"])
            await receiver._call(streams[0].reset)
            # The watcher sees the reset and the next push opens a fresh stream; had the
            # push come first, its write would fail and be retried once on a fresh one.
            await sender.push(address, PUSH, b"after")
            await until(lambda: frames == [b"before", b"after"])
            assert len(streams) == 2
            assert sender.push_streams[PUSH] == 2
        finally:
            await closing(sender, receiver)

    run(scenario)


def test_a_push_whose_write_fails_on_a_stale_lane_is_retried_on_a_fresh_stream() -> None:
    async def scenario() -> None:
        sender, receiver, address = await pair()
        frames, take = collector()
        await receiver.serve_pushes(PUSH, take)
        try:
            await sender.push(address, PUSH, b"first")
            await until(lambda: frames == [b"first"])
            trio_side = sender._running()
            (lane,) = trio_side.lanes._lanes.values()
            assert lane.current is not None
            stale = lane.current

            async def break_locally() -> None:
                # Our own side goes bad, unseen by the watcher: the write itself fails.
                await stale.stream.reset()
                stale.ended = trio.Event()

            await sender._call(break_locally)
            await sender.push(address, PUSH, b"second")
            await until(lambda: frames == [b"first", b"second"])
            assert sender.push_retries[PUSH] == 1
            assert sender.push_streams[PUSH] == 2
        finally:
            await closing(sender, receiver)

    run(scenario)


def test_a_one_frame_reader_gets_every_push_on_a_stream_each() -> None:
    """go-waku's Filter client: reads one frame, closes the stream."""

    async def scenario() -> None:
        sender, receiver, address = await pair()
        frames: list[bytes] = []
        streams = 0

        async def one_frame(stream: INetStream) -> None:
            nonlocal streams
            streams += 1
            frame = await read_frame(frame_reader(stream))
            await stream.close()
            if frame is not None:
                frames.append(frame)

        await raw_handler(receiver, PUSH, one_frame)
        try:
            payloads = [b"push %d" % i for i in range(150)]
            for payload in payloads:
                await sender.push(address, PUSH, payload)
            await until(lambda: len(frames) == len(payloads))
            assert frames == payloads
            assert streams == sender.push_streams[PUSH] == len(payloads)
        finally:
            await closing(sender, receiver)

    run(scenario)


def test_a_one_frame_reader_slower_to_close_than_the_probe_loses_no_push() -> None:
    """The race while learning: the reader's close comes after the probe gave up on it,
    so the lane was taken as reusable and frames after the first went unread."""

    async def scenario() -> None:
        sender, receiver, address = await pair()
        frames: list[bytes] = []
        slow = [True]

        async def one_frame(stream: INetStream) -> None:
            frame = await read_frame(frame_reader(stream))
            if slow[0]:
                slow[0] = False
                await trio.sleep(1.5)  # past the 0.5 s probe
            await stream.close()
            if frame is not None:
                frames.append(frame)

        await raw_handler(receiver, PUSH, one_frame)
        try:
            payloads = [b"push %d" % i for i in range(20)]
            for payload in payloads:
                await sender.push(address, PUSH, payload)
            await until(lambda: len(frames) >= len(payloads))
            assert sorted(frames) == sorted(payloads)
            assert sender.pushes_resent[PUSH] >= 1
        finally:
            await closing(sender, receiver)

    run(scenario)


def test_a_bad_frame_resets_its_stream_only_and_the_next_push_gets_through() -> None:
    async def scenario() -> None:
        sender, receiver, address = await pair()
        frames, take = collector()
        await receiver.serve_pushes(PUSH, take, max_frame_bytes=64)
        try:
            await sender.push(address, PUSH, b"small")
            # The receiver resets the lane at the length prefix; the write may fail
            # on the reset and be retried once on a fresh stream, refused again.
            with contextlib.suppress(ConnectionError):
                await sender.push(address, PUSH, b"x" * 100)
            await until(lambda: receiver.rejected[RejectReason.OVERSIZED] >= 1)
            await sender.push(address, PUSH, b"small again")
            await until(lambda: frames == [b"small", b"small again"])
        finally:
            await closing(sender, receiver)

    run(scenario)


def test_a_peer_that_does_not_speak_the_protocol_is_named_so() -> None:
    async def scenario() -> None:
        sender, receiver, address = await pair()
        try:
            for call in (
                sender.push(address, "/not/served/1.0.0", b"x"),
                sender.request(address, "/not/served/1.0.0", b"x"),
            ):
                with pytest.raises(ProtocolNotSupportedError) as caught:
                    await call
                assert caught.value.peer == receiver.peer_id
                assert caught.value.protocol_id == "/not/served/1.0.0"
                assert isinstance(caught.value, ConnectionError)
            # Unreachable is a plain ConnectionError, not this one.
            await receiver.close()
            with pytest.raises(ConnectionError) as gone:
                await sender.request(address, ECHO, b"x", timeout_s=5)
            assert not isinstance(gone.value, ProtocolNotSupportedError)
        finally:
            await closing(sender, receiver)

    run(scenario)


def test_announced_shards_are_answered_in_metadata_besides_relayed_ones() -> None:
    async def scenario() -> None:
        sender, receiver, address = await pair(announce_shards=(7, 3, 7))
        try:
            assert receiver.announce_shards == (3, 7)
            asked = WakuMetadata(cluster_id=1, shards=(5,)).to_bytes()
            answer = WakuMetadata.from_bytes(
                await sender.request(address, METADATA_PROTOCOL, asked)
            )
            assert answer == WakuMetadata(cluster_id=1, shards=(3, 7))
            receiver.subscribe("/waku/2/rs/1/5")
            async with asyncio.timeout(PATIENCE_S):
                while (await receiver.metadata()).shards != (3, 5, 7):
                    await asyncio.sleep(0.02)
        finally:
            await closing(sender, receiver)

    with pytest.raises(LocalProtocolError):
        Libp2pTransport(announce_shards=(-1,))
    run(scenario)


def test_streams_beyond_the_per_peer_bound_are_reset_and_counted_and_idle_ones_time_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        sender, receiver, address = await pair()

        async def echo(peer: str, request: bytes) -> bytes:
            return request

        await receiver.serve(ECHO, echo, timeout_s=1.0)
        try:
            assert await sender.request(address, ECHO, b"hi") == b"hi"
            host = sender._running().host
            opened: list[INetStream] = []

            async def open_idle() -> None:
                peer = host.get_connected_peers()[0]
                for _ in range(_MAX_INBOUND_STREAMS + 4):
                    # One reset at once may fail while it is being opened.
                    with contextlib.suppress(StreamFailure):
                        opened.append(await host.new_stream(peer, [TProtocol(ECHO)]))

            await sender._call(open_idle)  # never written to: idle streams
            await until(lambda: receiver.streams_refused[ECHO] == 4)
            await until(lambda: receiver.stream_timeouts[ECHO] == _MAX_INBOUND_STREAMS)
            # Slots freed at their deadline: the peer is served again.
            assert await sender.request(address, ECHO, b"again") == b"again"
        finally:
            await closing(sender, receiver)

    with caplog.at_level("WARNING", logger="sdsync.transport.libp2p"):
        run(scenario)
    summaries = [
        r for r in caplog.records if r.name == "sdsync.transport.libp2p" and ECHO in r.getMessage()
    ]
    # One summary per (protocol, reason) within the minute, not one per stream.
    assert len(summaries) == 2, [r.getMessage() for r in summaries]


def test_peer_ip_names_the_address_a_connected_peer_comes_from() -> None:
    async def scenario() -> None:
        sender, receiver, address = await pair()
        try:
            assert await receiver.peer_ip(sender.peer_id) is None  # not connected yet
            await sender.connect(address)
            async with asyncio.timeout(PATIENCE_S):
                while sender.peer_id not in await receiver.connected_peers():
                    await asyncio.sleep(0.02)
            assert await receiver.peer_ip(sender.peer_id) == "127.0.0.1"
            assert await sender.peer_ip(receiver.peer_id) == "127.0.0.1"
        finally:
            await closing(sender, receiver)

    run(scenario)


def test_a_burst_of_stream_per_push_waits_for_slots_instead_of_resets() -> None:
    """nwaku's Filter service opens a stream per push: a burst of 60 at once, each one
    frame then closed, against a receiver that takes 20 ms a frame. Streams beyond the
    per-peer bound wait for a slot; none is reset (nwaku drops the connection when one
    is) and every frame arrives."""
    burst = 60

    async def scenario() -> None:
        sender, receiver, address = await pair()
        frames: list[bytes] = []

        async def slow(peer: str, frame: bytes) -> None:
            await asyncio.sleep(0.02)
            frames.append(frame)

        await receiver.serve_pushes(PUSH, slow)
        try:
            await sender.connect(address)
            host = sender._running().host

            async def one(peer: object, index: int) -> None:
                stream = await host.new_stream(peer, [TProtocol(PUSH)])  # type: ignore[arg-type]
                await stream.write(encode_frame(b"push %d" % index))
                await stream.close()

            async def burst_of_streams() -> None:
                peer = host.get_connected_peers()[0]
                async with trio.open_nursery() as nursery:
                    for index in range(burst):
                        nursery.start_soon(one, peer, index)

            await sender._call(burst_of_streams)
            await until(lambda: len(frames) == burst)
            assert sorted(frames) == sorted(b"push %d" % i for i in range(burst))
            assert receiver.streams_refused[PUSH] == 0
        finally:
            await closing(sender, receiver)

    run(scenario)
