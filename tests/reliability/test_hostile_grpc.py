"""Hostile clients of ``sdsync reliability serve`` (issue 27, rows 19 and 20), against a real
server process on loopback, each with the token (the service trusts nobody without it).

Row 19: twenty subscribers that never read. The server holds eight streams at most (the
rest are refused, counted), cancels each whose write waited longer than the write timeout
(counted), and meanwhile answers an honest caller within :data:`HONEST_BOUND_S`; once they
are cut, an honest subscriber gets every event. Row 20: ids beyond 256 bytes (UTF-8), a
channel id too long for its state file, an empty message id and an oversized payload are
each ``INVALID_ARGUMENT`` (counted) and store nothing: the channels, the unacknowledged
messages and the events (no Transmit of what was refused) are as before.
Bounds are liveness bounds, generous for a loaded machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from reliabilityprocess import PATIENCE_S, EventLog, ServerProcess

from sdsync.reliability import reliability_pb2 as pb
from sdsync.reliability import reliability_pb2_grpc as pb_grpc
from sdsync.runtime.manager import ReliabilityManager

TOKEN = "s3cret"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
ROOM = "room"
QUIET = ("--resend-interval-ms", "86400000", "--sync-interval-ms", "86400000")
#: An honest unary call is answered within this while the attack goes on.
HONEST_BOUND_S = 5.0
ATTACKERS = 20
STREAMS = 8  # the server's default total cap
WRITE_TIMEOUT_S = 2.0
#: Channels of one process share a connection unless told otherwise.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def _until(found: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not found():
        assert time.monotonic() < deadline, f"not within {PATIENCE_S} s: {what}"
        time.sleep(0.05)


def _timed(call: Callable[[], object]) -> float:
    start = time.monotonic()
    call()
    return time.monotonic() - start


def test_subscribers_that_never_read_are_cut_and_hold_no_worker(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "server.log",
        *QUIET,
        "--event-write-timeout-s",
        str(WRITE_TIMEOUT_S),
        token=TOKEN,
    )
    stub = server.stub
    attackers: list[tuple[grpc.Channel, grpc.Future]] = []
    try:
        stub.OpenChannel(pb.OpenChannelRequest(channel_id=ROOM), metadata=AUTH)
        for _ in range(ATTACKERS):  # each on its own connection, never iterated
            channel = grpc.insecure_channel(server.address, options=OWN_CONNECTION)
            call = pb_grpc.ReliabilityStub(channel).Events(pb.EventsRequest(), metadata=AUTH)
            attackers.append((channel, call))
        calls = [call for _, call in attackers]
        _until(lambda: sum(c.done() for c in calls) >= ATTACKERS - STREAMS, "refusals")
        refused = [c for c in calls if c.done()]
        assert {c.code() for c in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        held = [c for c in calls if not c.done()]
        assert len(held) == STREAMS

        # Events far beyond any flow-control window (8 MB for each stream), while an
        # honest caller is answered in time.
        bob = ReliabilityManager("bob")
        slowest = 0.0
        for round_ in range(10):
            datas = [
                bob.wrap_outgoing_message(bytes([round_]) * 10_000 + f"{i}".encode(), ROOM)
                for i in range(80)
            ]
            requests = [pb.UnwrapReceivedMessageRequest(data=d) for d in datas]
            stub.UnwrapReceivedMessages(
                pb.UnwrapReceivedMessagesRequest(messages=requests), metadata=AUTH
            )
            slowest = max(
                slowest,
                _timed(
                    lambda: stub.ListChannels(
                        pb.ListChannelsRequest(), metadata=AUTH, timeout=HONEST_BOUND_S
                    )
                ),
                _timed(
                    lambda: stub.WrapOutgoingMessage(
                        pb.WrapOutgoingMessageRequest(channel_id=ROOM, payload=b"honest"),
                        metadata=AUTH,
                        timeout=HONEST_BOUND_S,
                    )
                ),
            )
        assert slowest < HONEST_BOUND_S

        # Every stalled stream is cut, its slot and its worker free again; its client sees
        # CANCELLED once it reads what its window had taken.
        def streams() -> pb.StatsResponse:
            return stub.Stats(pb.StatsRequest(), metadata=AUTH)

        _until(lambda: streams().event_streams_cut == STREAMS, "the stalled streams cut")
        assert streams().event_streams == 0
        for call in held:
            with pytest.raises(grpc.RpcError) as cut:
                for _ in call:
                    pass
            assert cut.value.code() == grpc.StatusCode.CANCELLED
        honest = EventLog(stub, AUTH, channel_ids=[ROOM])
        last = stub.ListChannels(pb.ListChannelsRequest(), metadata=AUTH).channels[0].last_seq
        honest.wait_for(lambda: last in honest.numbered(ROOM))
        assert len(honest.of("message_ready")) == 800  # nothing lost to the cuts

        # Per connection: four streams, the fifth refused.
        one = grpc.insecure_channel(server.address, options=OWN_CONNECTION)
        own = [EventLog(pb_grpc.ReliabilityStub(one), AUTH) for _ in range(4)]
        with pytest.raises(grpc.RpcError) as fifth:
            EventLog(pb_grpc.ReliabilityStub(one), AUTH)
        assert fifth.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "connection" in (fifth.value.details() or "")

        stats = stub.Stats(pb.StatsRequest(), metadata=AUTH)
        assert stats.event_streams == 5
        assert stats.event_streams_cut == STREAMS
        assert stats.event_streams_refused == ATTACKERS - STREAMS + 1
        assert stats.refusals["RESOURCE_EXHAUSTED"] == ATTACKERS - STREAMS + 1
        for events in (*own, honest):
            events.cancel()
        one.close()
    finally:
        for channel, _ in attackers:
            channel.close()
        assert server.stop() == 0
    assert "cut: a write waited" in server.stderr()
    assert "Traceback" not in server.stderr()


def _refused(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value.code()


@pytest.mark.parametrize("stored", [False, True], ids=["in-memory", "state-dir"])
def test_bad_ids_and_sizes_are_refused_and_store_nothing(tmp_path: Path, stored: bool) -> None:
    state = ("--state-dir", str(tmp_path / "state")) if stored else ()
    # Resends every 200 ms: a message stored despite its refusal would be transmitted.
    fast = ("--resend-interval-ms", "200", "--sync-interval-ms", "86400000")
    server = ServerProcess(tmp_path / "server.log", *fast, *state, token=TOKEN)
    stub = server.stub

    def wrap(channel_id: str, payload: bytes = b"p", message_id: str | None = None) -> object:
        request = pb.WrapOutgoingMessageRequest(channel_id=channel_id, payload=payload)
        if message_id is not None:
            request.message_id = message_id
        return stub.WrapOutgoingMessage(request, metadata=AUTH)

    def snapshot() -> tuple[list[str], list[tuple[str, bytes]]]:
        channels = stub.ListChannels(pb.ListChannelsRequest(), metadata=AUTH).channels
        listed = stub.ListUnacknowledged(
            pb.ListUnacknowledgedRequest(channel_id=ROOM), metadata=AUTH
        )
        return [c.channel_id for c in channels], [
            (m.message_id, m.payload) for m in listed.messages
        ]

    long_ids = ["c" * 300, "é" * 200]  # 300 characters; 200 characters but 400 bytes
    bad: list[Callable[[], object]] = [
        *(lambda c=c: wrap(c) for c in long_ids),
        *(
            lambda c=c: stub.OpenChannel(pb.OpenChannelRequest(channel_id=c), metadata=AUTH)
            for c in long_ids
        ),
        lambda: wrap(ROOM, message_id="m" * 300),
        lambda: wrap(ROOM, message_id=""),
        lambda: wrap(ROOM, b"y" * 1_040_000),
        lambda: wrap("fresh", b"y" * 1_040_000),
    ]
    if stored:
        bad.append(lambda: wrap("q" * 250))  # 256 bytes, but no file name is that long
    try:
        wrap(ROOM, b"honest", "h1")
        events = EventLog(stub, AUTH)
        before = snapshot()
        assert before == ([ROOM], [("h1", b"honest")])
        for call in bad:
            assert _refused(call) == grpc.StatusCode.INVALID_ARGUMENT
        batch = stub.WrapOutgoingMessages(
            pb.WrapOutgoingMessagesRequest(
                messages=[
                    pb.WrapOutgoingMessageRequest(channel_id=long_ids[0], payload=b"b1"),
                    pb.WrapOutgoingMessageRequest(channel_id=ROOM, payload=b"b2", message_id=""),
                ]
            ),
            metadata=AUTH,
        ).results
        assert [r.refused.code for r in batch] == [grpc.StatusCode.INVALID_ARGUMENT.value[0]] * 2

        # The honest message is resent meanwhile; nothing refused ever is.
        seen = len(events.of("transmit"))
        events.wait_for(lambda: len(events.of("transmit")) >= seen + 3)
        assert snapshot() == before
        assert {(t.transmit.channel_id, t.transmit.message_id) for t in events.of("transmit")} == {
            (ROOM, "h1")
        }
        stats = stub.Stats(pb.StatsRequest(), metadata=AUTH)
        assert dict(stats.refusals) == {"INVALID_ARGUMENT": len(bad) + 2}
        events.cancel()
    finally:
        assert server.stop() == 0
    assert "Traceback" not in server.stderr()
    if stored:  # nor is anything stored to be reopened
        restarted = server.restart()
        try:
            listed = restarted.stub.ListChannels(pb.ListChannelsRequest(), metadata=AUTH)
            assert [c.channel_id for c in listed.channels] == [ROOM]
        finally:
            restarted.stop()
