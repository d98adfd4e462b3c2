"""``sdsync reliability serve`` over gRPC, as an application in another language uses it.

The test is the application: it carries wrapped bytes and ``Transmit`` events between
participants (dropping what it chooses), and reads their events. Servers run in processes
of their own on 127.0.0.1, so a kill -9 is a real crash.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from reliabilityprocess import PATIENCE_S, EventLog, ServerProcess

from sdsync.core import ChannelConfig
from sdsync.reliability import reliability_pb2 as pb
from sdsync.reliability import request_limit
from sdsync.runtime import RuntimeConfig
from sdsync.runtime.manager import ReliabilityManager
from sdsync.wire import decode

ROOM = "room"
# Short timers so that resends and syncs happen while the test runs.
FAST = ("--resend-interval-ms", "200", "--sync-interval-ms", "500")


class Participant:
    """One server, its event stream, and what its application received."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.stub = server.stub
        self.events = EventLog(server.stub)
        self.received: list[bytes] = []
        self.forwarded = 0  # transmits already carried to the other participant
        self.stub.OpenChannel(pb.OpenChannelRequest(channel_id=ROOM))

    def wrap(self, payload: bytes) -> pb.WrapOutgoingMessageResponse:
        request = pb.WrapOutgoingMessageRequest(channel_id=ROOM, payload=payload)
        return self.stub.WrapOutgoingMessage(request)

    def unwrap(self, data: bytes) -> pb.UnwrapReceivedMessageResponse:
        answer = self.stub.UnwrapReceivedMessage(pb.UnwrapReceivedMessageRequest(data=data))
        if answer.HasField("payload"):
            self.received.append(answer.payload)
        return answer

    def forward_transmits(self, to: Participant) -> None:
        transmits = self.events.of("transmit")
        for event in transmits[self.forwarded :]:
            to.unwrap(event.transmit.data)
        self.forwarded = len(transmits)


def pump_until(done: Callable[[], bool], *pairs: tuple[Participant, Participant]) -> None:
    """Carry every transmit until ``done`` (a liveness bound, not a timing assertion)."""
    deadline = time.monotonic() + PATIENCE_S
    while not done():
        assert time.monotonic() < deadline, "the participants did not converge"
        for source, target in pairs:
            source.forward_transmits(target)
        time.sleep(0.05)


def test_two_participants_converge_through_a_lossy_application(tmp_path: Path) -> None:
    alice = Participant(ServerProcess(tmp_path / "alice.log", "--participant", "alice", *FAST))
    bob = Participant(ServerProcess(tmp_path / "bob.log", "--participant", "bob", *FAST))
    try:
        lost = alice.wrap(b"a1")  # the application loses these bytes: only a resend helps
        a2 = alice.wrap(b"a2")
        bob.unwrap(a2.data)
        b1 = bob.wrap(b"b1")
        alice.unwrap(b1.data)
        pump_until(lambda: b"a1" in bob.received, (alice, bob), (bob, alice))
        a3 = alice.wrap(b"a3")  # names b1 in its causal history: acknowledges it
        bob.unwrap(a3.data)
        b2 = bob.wrap(b"b2")
        alice.unwrap(b2.data)

        mine = {lost.message_id, a2.message_id, a3.message_id}
        pump_until(
            lambda: (
                mine <= set(alice.events.ids("message_sent"))
                and b1.message_id in bob.events.ids("message_sent")
            ),
            (alice, bob),
            (bob, alice),
        )
        assert sorted(bob.received) == [b"a1", b"a2", b"a3"]
        assert sorted(alice.received) == [b"b1", b"b2"]
        assert set(bob.events.ids("message_ready")) == mine
        assert set(alice.events.ids("message_ready")) == {b1.message_id, b2.message_id}
        resent = [e.transmit for e in alice.events.of("transmit") if e.transmit.kind == "resend"]
        assert lost.message_id in {t.message_id for t in resent}
        assert all(t.channel_id == ROOM for t in resent)
    finally:
        alice.server.stop()
        bob.server.stop()


def _refused(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error = caught.value
    assert isinstance(error, grpc.Call)
    assert error.details()  # a message for people, whatever the code
    code: grpc.StatusCode = error.code()
    return code


def _foreign_bytes(channel_id: str) -> bytes:
    """A well-formed message of another participant on ``channel_id``."""
    return ReliabilityManager("carol").wrap_outgoing_message(b"hello", channel_id)


def test_bad_requests_get_a_status_and_the_server_keeps_serving(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "server.log", "--max-channels", "2", token="s3cret")
    auth = (("authorization", "Bearer s3cret"),)
    stub = server.stub

    def unwrap(data: bytes) -> pb.UnwrapReceivedMessageResponse:
        return stub.UnwrapReceivedMessage(pb.UnwrapReceivedMessageRequest(data=data), metadata=auth)

    def wrap(channel_id: str, payload: bytes) -> pb.WrapOutgoingMessageResponse:
        request = pb.WrapOutgoingMessageRequest(channel_id=channel_id, payload=payload)
        return stub.WrapOutgoingMessage(request, metadata=auth)

    def mark(channel_id: str) -> pb.MarkDependenciesMetResponse:
        request = pb.MarkDependenciesMetRequest(channel_id=channel_id, message_ids=["m"])
        return stub.MarkDependenciesMet(request, metadata=auth)

    def open_channel(channel_id: str) -> pb.OpenChannelResponse:
        return stub.OpenChannel(pb.OpenChannelRequest(channel_id=channel_id), metadata=auth)

    try:
        # Tokens: none, wrong, a bare token without its scheme; unary and streaming.
        opening = pb.OpenChannelRequest(channel_id=ROOM)
        assert _refused(lambda: stub.OpenChannel(opening)) == grpc.StatusCode.UNAUTHENTICATED
        for wrong in ("Bearer nope", "s3cret"):
            metadata = (("authorization", wrong),)
            refused = _refused(lambda m=metadata: stub.OpenChannel(opening, metadata=m))
            assert refused == grpc.StatusCode.UNAUTHENTICATED
        assert _refused(lambda: EventLog(stub)) == grpc.StatusCode.UNAUTHENTICATED
        events = EventLog(stub, auth)

        # Bytes that are no SDS message, or empty.
        for garbage in (b"\xff\x00garbage", b"", b"\x0a\x05ab"):
            assert _refused(lambda g=garbage: unwrap(g)) == grpc.StatusCode.INVALID_ARGUMENT
        # Empty channel ids and payloads.
        assert _refused(lambda: open_channel("")) == grpc.StatusCode.INVALID_ARGUMENT
        assert _refused(lambda: wrap("", b"x")) == grpc.StatusCode.INVALID_ARGUMENT
        assert _refused(lambda: wrap(ROOM, b"")) == grpc.StatusCode.INVALID_ARGUMENT
        assert _refused(lambda: mark("")) == grpc.StatusCode.INVALID_ARGUMENT

        # A channel that is not open: well-formed bytes are a normal answer that says so,
        # and leave no state behind (the channel is still not open afterwards).
        answer = unwrap(_foreign_bytes("elsewhere"))
        assert not answer.channel_open
        assert not answer.HasField("payload")
        assert answer.channel_id == "elsewhere"
        assert _refused(lambda: mark("elsewhere")) == grpc.StatusCode.NOT_FOUND

        # Oversized: refused by gRPC before any of the server's code.
        huge = b"x" * (request_limit(ChannelConfig().limits) + 1)
        assert _refused(lambda: wrap(ROOM, huge)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _refused(lambda: unwrap(huge)) == grpc.StatusCode.RESOURCE_EXHAUSTED

        # More channels than --max-channels.
        open_channel(ROOM)
        open_channel("second")
        assert _refused(lambda: open_channel("third")) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _refused(lambda: wrap("third", b"x")) == grpc.StatusCode.RESOURCE_EXHAUSTED

        # Still serving, with the state it had: an open channel's bytes are processed.
        assert server.alive()
        answer = unwrap(_foreign_bytes(ROOM))
        assert answer.channel_open
        assert answer.payload == b"hello"
        events.wait_for(lambda: events.ids("message_ready"))
        mark(ROOM)
        assert wrap(ROOM, b"still here").data
        events.cancel()
    finally:
        assert server.stop() == 0
    assert "Traceback" not in server.stderr()


def test_kill9_mid_stream_loses_nothing_acknowledged_and_delivers_nothing_twice(
    tmp_path: Path,
) -> None:
    state = tmp_path / "alice-state"
    args = ("--state-dir", str(state), *FAST)  # participant id: kept in the state dir
    bob = ReliabilityManager(
        "bob", runtime=RuntimeConfig(resend_interval_ms=200, sync_interval_ms=500)
    )
    bob.open_channel(ROOM)

    alice = Participant(ServerProcess(tmp_path / "alice.log", *args))
    a1 = alice.wrap(b"a1")
    assert bob.unwrap_received_message(a1.data).payload == b"a1"
    b1 = bob.wrap_outgoing_message(b"b1", ROOM)
    b1_id = decode(b1).message_id
    assert alice.unwrap(b1).payload == b"b1"
    alice.events.wait_for(lambda: a1.message_id in alice.events.ids("message_sent"))
    alice.events.wait_for(lambda: b1_id in alice.events.ids("message_ready"))
    a2 = alice.wrap(b"a2")  # never carried to bob: unacknowledged at the crash
    alice.server.kill9()  # while alice.events is streaming

    alice = Participant(ServerProcess(tmp_path / "alice.log", *args))
    # b1 was delivered before the crash: offered again, it is a duplicate.
    assert not alice.unwrap(b1).HasField("payload")
    b2 = bob.wrap_outgoing_message(b"b2", ROOM)
    b2_id = decode(b2).message_id
    assert alice.unwrap(b2).payload == b"b2"
    # Events come in order: once b2 is ready, a second b1 would have come before it.
    alice.events.wait_for(lambda: b2_id in alice.events.ids("message_ready"))
    assert alice.events.ids("message_ready") == [b2_id]

    # The unacknowledged a2 is still resent after the restart.
    resend = alice.events.wait_for(
        lambda: [e for e in alice.events.of("transmit") if e.transmit.message_id == a2.message_id]
    )
    assert bob.unwrap_received_message(resend[0].transmit.data).payload == b"a2"

    # Same participant, and its log kept the acknowledged a1 and the delivered b1.
    a3 = alice.wrap(b"a3")
    wrapped = decode(a3.data)
    assert wrapped.sender_id == decode(a1.data).sender_id
    named = {entry.message_id for entry in wrapped.causal_history}
    assert {a1.message_id, b1_id, b2_id} <= named
    assert alice.server.stop() == 0

    stored = ReliabilityManager(wrapped.sender_id, state_dir=state)
    stored.open_channel(ROOM)
    logged = [record.message_id for record in stored.history(ROOM)]
    stored.close()
    assert {a1.message_id, b1_id, b2_id} <= set(logged)
    assert len(logged) == len(set(logged))
