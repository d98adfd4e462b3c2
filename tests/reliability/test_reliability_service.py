"""``sdsync reliability serve`` over gRPC, as an application in another language uses it.

The test is the application: it carries wrapped bytes and ``Transmit`` events between
participants (dropping what it chooses), and reads their events. Servers run in processes
of their own on 127.0.0.1, so a kill -9 is a real crash.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from reliabilityprocess import PATIENCE_S, EventLog, ServerProcess

from sdsync.core import ChannelConfig
from sdsync.reliability import reliability_pb2 as pb
from sdsync.reliability import reliability_pb2_grpc as pb_grpc
from sdsync.reliability import request_limit
from sdsync.runtime import RuntimeConfig
from sdsync.runtime.manager import ReliabilityManager
from sdsync.wire import decode

ROOM = "room"
# Short timers so that resends and syncs happen while the test runs.
FAST = ("--resend-interval-ms", "200", "--sync-interval-ms", "500")
# Items per batch call: a request holds at most about 1 MiB, and each SDS message carries
# an 18,752-byte bloom filter.
BATCH = 40


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
        theirs = {b1.message_id, b2.message_id}
        # The stream reports a delivery after the unwrap that answered it: wait for both.
        pump_until(
            lambda: (
                mine <= set(alice.events.ids("message_sent"))
                and b1.message_id in bob.events.ids("message_sent")
                and mine <= set(bob.events.ids("message_ready"))
                and theirs <= set(alice.events.ids("message_ready"))
            ),
            (alice, bob),
            (bob, alice),
        )
        assert sorted(bob.received) == [b"a1", b"a2", b"a3"]
        assert sorted(alice.received) == [b"b1", b"b2"]
        assert set(bob.events.ids("message_ready")) == mine
        assert set(alice.events.ids("message_ready")) == theirs
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
            refused = _refused(functools.partial(stub.OpenChannel, opening, metadata=metadata))
            assert refused == grpc.StatusCode.UNAUTHENTICATED
        assert _refused(lambda: EventLog(stub)) == grpc.StatusCode.UNAUTHENTICATED
        events = EventLog(stub, auth)

        # Bytes that are no SDS message, or empty.
        for garbage in (b"\xff\x00garbage", b"", b"\x0a\x05ab"):
            assert _refused(functools.partial(unwrap, garbage)) == grpc.StatusCode.INVALID_ARGUMENT
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


def _seqs_by_id(events: Iterable[pb.Event], kind: str) -> dict[str, set[int]]:
    """Per message id, the seqs under which ``kind`` events named it."""
    out: dict[str, set[int]] = defaultdict(set)
    for event in events:
        if event.WhichOneof("event") == kind:
            out[getattr(event, kind).message_id].add(event.seq)
    return out


@pytest.fixture
def started() -> Iterator[list[ServerProcess]]:
    """Servers a test started: whichever still runs at its end (a failed test's) is killed."""
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        if server.alive():
            server.kill9()


def test_kill9_reports_every_unacknowledged_event_again_under_the_same_seq(
    tmp_path: Path, started: list[ServerProcess]
) -> None:
    state = tmp_path / "alice-state"
    args = ("--state-dir", str(state), *FAST)  # participant id: kept in the state dir
    bob = ReliabilityManager(
        "bob", runtime=RuntimeConfig(resend_interval_ms=200, sync_interval_ms=500)
    )
    bob.open_channel(ROOM)

    started.append(ServerProcess(tmp_path / "alice.log", *args))
    alice = Participant(started[-1])
    a1 = alice.wrap(b"a1")
    assert bob.unwrap_received_message(a1.data).payload == b"a1"
    b1 = bob.wrap_outgoing_message(b"b1", ROOM)  # names a1: acknowledges it
    b1_id = decode(b1).message_id
    assert alice.unwrap(b1).payload == b"b1"
    alice.events.wait_for(lambda: a1.message_id in alice.events.ids("message_sent"))
    alice.events.wait_for(lambda: b1_id in alice.events.ids("message_ready"))
    acked = alice.events.ack()[ROOM]  # processed: never to be reported again

    a2 = alice.wrap(b"a2")  # never carried to bob: unacknowledged at the crash
    b2 = bob.wrap_outgoing_message(b"b2", ROOM)
    b2_id = decode(b2).message_id
    assert alice.unwrap(b2).payload == b"b2"
    alice.events.wait_for(lambda: b2_id in alice.events.ids("message_ready"))
    before = alice.events.numbered(ROOM)  # seen, not acknowledged after `acked`
    alice.server.kill9()  # while alice.events is streaming

    started.append(alice.server.restart())
    alice = Participant(started[-1])  # a stream without a resume point
    last_before = max(before)
    alice.events.wait_for(lambda: last_before in alice.events.numbered(ROOM))
    after = alice.events.numbered(ROOM)
    # Every unacknowledged event again, from the first one after the acknowledged ones,
    # under its own seq and identical (payloads included); no acknowledged one.
    assert min(after) == acked + 1
    for seq in range(acked + 1, last_before + 1):
        assert after[seq] == before[seq], f"event {seq} changed across the restart"
    ready = _seqs_by_id(after.values(), "message_ready")
    assert b1_id not in ready
    (b2_seq,) = ready[b2_id]
    assert after[b2_seq].message_ready.payload == b"b2"
    assert after[b2_seq] == before[b2_seq]
    # Offered again, both are duplicates: nothing reaches the application twice.
    for data in (b1, b2):
        answer = alice.unwrap(data)
        assert answer.duplicate
        assert not answer.HasField("payload")
    # No message reported under two seqs, across both lives.
    for kind in ("message_ready", "message_sent"):
        for mid, seqs in _seqs_by_id([*before.values(), *after.values()], kind).items():
            assert len(seqs) == 1, f"{kind} {mid} reported under seqs {sorted(seqs)}"

    # Once acknowledged, never again: a new stream without resume point starts after them.
    acked = alice.events.ack()[ROOM]
    alice.events.cancel()
    restarted = alice.events
    b3 = bob.wrap_outgoing_message(b"b3", ROOM)
    b3_id = decode(b3).message_id
    assert alice.unwrap(b3).payload == b"b3"
    alice.events = EventLog(alice.stub, channel_ids=[ROOM])
    alice.events.wait_for(lambda: b3_id in alice.events.ids("message_ready"))
    assert min(alice.events.numbered(ROOM)) == acked + 1

    # The unacknowledged a2 is still resent after the restart.
    def resends() -> list[pb.Event]:
        return [
            e
            for e in [*restarted.of("transmit"), *alice.events.of("transmit")]
            if e.transmit.message_id == a2.message_id
        ]

    resend = alice.events.wait_for(resends)
    assert bob.unwrap_received_message(resend[0].transmit.data).payload == b"a2"

    # Same participant, and its log kept the acknowledged a1 and the delivered b1..b3.
    a3 = alice.wrap(b"a3")
    wrapped = decode(a3.data)
    assert wrapped.sender_id == decode(a1.data).sender_id
    named = {entry.message_id for entry in wrapped.causal_history}
    assert {a1.message_id, b1_id, b2_id, b3_id} <= named
    alice.events.cancel()
    assert alice.server.stop() == 0

    stored = ReliabilityManager(wrapped.sender_id, state_dir=state)
    stored.open_channel(ROOM)
    logged = [record.message_id for record in stored.history(ROOM)]
    stored.close()
    assert {a1.message_id, b1_id, b2_id, b3_id} <= set(logged)
    assert len(logged) == len(set(logged))


def _serve(tmp_path: Path, name: str, *more: str, token: str | None = None) -> ServerProcess:
    """A server for participant ``name`` keeping its state in ``tmp_path / name``."""
    state = ("--state-dir", str(tmp_path / name))
    return ServerProcess(
        tmp_path / f"{name}.log", "--participant", name, *state, *more, token=token
    )


def _wrap_request(
    channel_id: str, payload: bytes, message_id: str
) -> pb.WrapOutgoingMessageRequest:
    return pb.WrapOutgoingMessageRequest(
        channel_id=channel_id, payload=payload, message_id=message_id
    )


def _wrap_all(
    stub: pb_grpc.ReliabilityStub, items: Sequence[tuple[str, bytes]]
) -> list[pb.WrapOutgoingMessageResponse]:
    """WrapOutgoingMessages calls over (message id, payload) pairs on ROOM; all wrapped."""
    out = []
    for start in range(0, len(items), BATCH):
        chunk = items[start : start + BATCH]
        request = pb.WrapOutgoingMessagesRequest(
            messages=[_wrap_request(ROOM, payload, mid) for mid, payload in chunk]
        )
        results = stub.WrapOutgoingMessages(request).results
        assert [r.WhichOneof("result") for r in results] == ["wrapped"] * len(chunk), results
        out += [r.wrapped for r in results]
    return out


def _unwrap_all(
    stub: pb_grpc.ReliabilityStub, datas: Sequence[bytes]
) -> list[pb.UnwrapReceivedMessageResponse]:
    """UnwrapReceivedMessages calls; every item unwrapped."""
    out = []
    for start in range(0, len(datas), BATCH):
        chunk = datas[start : start + BATCH]
        request = pb.UnwrapReceivedMessagesRequest(
            messages=[pb.UnwrapReceivedMessageRequest(data=d) for d in chunk]
        )
        results = stub.UnwrapReceivedMessages(request).results
        assert [r.WhichOneof("result") for r in results] == ["unwrapped"] * len(chunk), results
        out += [r.unwrapped for r in results]
    return out


def _seen_through_last(events: EventLog, stub: pb_grpc.ReliabilityStub) -> None:
    """Until ``events`` has seen every event ROOM had when this was called."""
    last = stub.OpenChannel(pb.OpenChannelRequest(channel_id=ROOM)).last_seq
    assert last > 0
    events.wait_for(lambda: last in events.numbered(ROOM))


def test_issue_25_every_ready_and_sent_event_survives_a_kill9_right_after_the_answer(
    tmp_path: Path,
) -> None:
    """The issue's repro: 100 messages wait for one; the unwrap that releases them is
    answered and the server is killed at once; after the restart all 101 MessageReady
    come (with their payloads). Then the message that acknowledges the 100 is unwrapped
    by their sender, killed at once: after its restart all 100 MessageSent come."""
    servers = {name: _serve(tmp_path, name, *FAST) for name in ("carol", "alice", "bob")}
    try:
        for server in servers.values():
            server.stub.OpenChannel(pb.OpenChannelRequest(channel_id=ROOM))
        carol, alice, bob = servers["carol"].stub, servers["alice"].stub, servers["bob"].stub
        r0 = carol.WrapOutgoingMessage(_wrap_request(ROOM, b"r0", "r0"))
        (answer,) = _unwrap_all(alice, [r0.data])
        assert answer.payload == b"r0"
        ids = [f"r{i}" for i in range(101)]
        wrapped = _wrap_all(alice, [(mid, mid.encode()) for mid in ids[1:]])
        for item in wrapped:
            assert "r0" in {entry.message_id for entry in decode(item.data).causal_history}
        for mid, answer in zip(ids[1:], _unwrap_all(bob, [w.data for w in wrapped]), strict=True):
            assert (answer.message_id, answer.payload) == (mid, mid.encode())
            assert list(answer.missing_dependencies) == ["r0"]
        assert len(bob.ListWaiting(pb.ListWaitingRequest(channel_id=ROOM)).messages) == 100
        answer = bob.UnwrapReceivedMessage(pb.UnwrapReceivedMessageRequest(data=r0.data))
        servers["bob"].kill9()  # at once: nobody read or acknowledged an event of bob's
        assert answer.payload == b"r0"
        assert not answer.missing_dependencies

        servers["bob"] = servers["bob"].restart()
        bob = servers["bob"].stub
        events = EventLog(bob, channel_ids=[ROOM])
        _seen_through_last(events, bob)
        ready = [e.message_ready for e in events.of("message_ready")]
        assert [r.message_id for r in ready] == ids  # each once, in causal order
        assert [r.payload for r in ready] == [mid.encode() for mid in ids]
        assert {r.sender_id for r in ready[1:]} == {"alice"}
        assert ready[0].sender_id == "carol"
        assert not bob.ListWaiting(pb.ListWaitingRequest(channel_id=ROOM)).messages
        events.cancel()

        # Bob's message names r0..r100: alice learns they are all acknowledged.
        streaming = EventLog(alice, channel_ids=[ROOM])  # a subscriber that dies with alice
        b1 = bob.WrapOutgoingMessage(_wrap_request(ROOM, b"b1", "b1"))
        assert set(ids) <= {entry.message_id for entry in decode(b1.data).causal_history}
        answer = alice.UnwrapReceivedMessage(pb.UnwrapReceivedMessageRequest(data=b1.data))
        servers["alice"].kill9()  # at once
        assert answer.payload == b"b1"
        streaming.cancel()

        servers["alice"] = servers["alice"].restart()
        alice = servers["alice"].stub
        events = EventLog(alice, channel_ids=[ROOM])
        _seen_through_last(events, alice)
        assert sorted(events.ids("message_sent")) == sorted(ids[1:])  # each once
        assert not alice.ListUnacknowledged(pb.ListUnacknowledgedRequest(channel_id=ROOM)).messages
        events.cancel()
    finally:
        for server in servers.values():
            if server.alive():
                server.stop()


# No resend and no sync while the test runs: every event comes from a call, but for the
# incoming sweep's reminder of a missing dependency (MissingDependencies every 5 s).
QUIET = ("--resend-interval-ms", "86400000", "--sync-interval-ms", "86400000")


def test_bad_input_is_refused_as_documented_and_changes_no_state(tmp_path: Path) -> None:
    server = _serve(tmp_path, "alice", *QUIET, token="s3cret")
    auth = (("authorization", "Bearer s3cret"),)
    stub = server.stub

    def call(method: str, request: Message, metadata: Sequence[tuple[str, str]] = auth) -> Any:
        return getattr(stub, method)(request, metadata=metadata)

    def refused(method: str, request: Message, **kwargs: Any) -> grpc.StatusCode:
        return _refused(lambda: call(method, request, **kwargs))

    def snapshot() -> list[bytes]:
        """Every channel's numbers (its last seq aside: the sweep's reminders), own messages
        awaiting acknowledgement and received messages waiting."""
        channels = call("ListChannels", pb.ListChannelsRequest()).channels
        out = []
        for c in channels:
            info = pb.ChannelInfo()
            info.CopyFrom(c)
            info.ClearField("last_seq")
            out.append(info.SerializeToString(deterministic=True))
            for method, request in (
                ("ListUnacknowledged", pb.ListUnacknowledgedRequest(channel_id=c.channel_id)),
                ("ListWaiting", pb.ListWaitingRequest(channel_id=c.channel_id)),
            ):
                out.append(call(method, request).SerializeToString(deterministic=True))
        return out

    def unwrap(data: bytes) -> pb.UnwrapReceivedMessageRequest:
        return pb.UnwrapReceivedMessageRequest(data=data)

    # Something in every list: one own message awaiting its ack, one received message
    # waiting for a dependency, and events (the waiting message's MissingDependencies).
    dave = ReliabilityManager("dave")
    d0 = dave.wrap_outgoing_message(b"d0", ROOM)
    carol = ReliabilityManager("carol")
    carol.open_channel(ROOM)
    carol.unwrap_received_message(d0)
    c1 = carol.wrap_outgoing_message(b"c1", ROOM)  # names d0
    try:
        call("OpenChannel", pb.OpenChannelRequest(channel_id=ROOM))
        first = call("WrapOutgoingMessage", _wrap_request(ROOM, b"first", "m1"))
        waiting = call("UnwrapReceivedMessage", unwrap(c1))
        assert list(waiting.missing_dependencies) == [decode(d0).message_id]
        events = EventLog(stub, auth, channel_ids=[ROOM])
        before = snapshot()
        last_seq = call("ListChannels", pb.ListChannelsRequest()).channels[0].last_seq
        assert last_seq > 0
        events.wait_for(lambda: last_seq in events.numbered(ROOM))

        invalid = grpc.StatusCode.INVALID_ARGUMENT
        # Bytes that are no SDS message, or part of one.
        for garbage in (b"\xff\x00garbage", c1[: len(c1) // 2], b"\x0a\x05ab"):
            assert refused("UnwrapReceivedMessage", unwrap(garbage)) == invalid
        # A payload whose message would exceed what peers accept: refused at wrap, with or
        # without an id (the id stays free).
        huge = b"y" * 1_040_000
        too_large = pb.WrapOutgoingMessageRequest(channel_id=ROOM, payload=huge)
        assert refused("WrapOutgoingMessage", too_large) == invalid
        assert refused("WrapOutgoingMessage", _wrap_request(ROOM, huge, "big")) == invalid
        # Another payload under a used id.
        assert refused("WrapOutgoingMessage", _wrap_request(ROOM, b"other", "m1")) == invalid
        # Without the token, or with a wrong one: nothing is done.
        unauthorized: tuple[tuple[str, Message], ...] = (
            ("WrapOutgoingMessage", _wrap_request(ROOM, b"sneaky", "m9")),
            ("UnwrapReceivedMessage", unwrap(d0)),
            ("AckEvents", pb.AckEventsRequest(acks=[pb.EventPosition(channel_id=ROOM)])),
            ("CloseChannel", pb.CloseChannelRequest(channel_id=ROOM)),
            ("OpenChannel", pb.OpenChannelRequest(channel_id="theirs")),
        )
        for metadata in ((), (("authorization", "Bearer nope"),)):
            for method, request in unauthorized:
                code = refused(method, request, metadata=metadata)
                assert code == grpc.StatusCode.UNAUTHENTICATED, method
        # A channel that is not open, alone or beside an open one.
        nowhere = [
            pb.EventPosition(channel_id=ROOM, seq=last_seq),
            pb.EventPosition(channel_id="x"),
        ]
        not_open: tuple[tuple[str, Message], ...] = (
            (
                "MarkDependenciesMet",
                pb.MarkDependenciesMetRequest(channel_id="x", message_ids=["d"]),
            ),
            ("AckEvents", pb.AckEventsRequest(acks=nowhere)),
            ("ListWaiting", pb.ListWaitingRequest(channel_id="x")),
            ("ListUnacknowledged", pb.ListUnacknowledgedRequest(channel_id="x")),
            ("SetParticipantCount", pb.SetParticipantCountRequest(channel_id="x", participants=3)),
        )
        for method, request in not_open:
            assert refused(method, request) == grpc.StatusCode.NOT_FOUND, method
        # The same id and payload again: the same bytes, and nothing changes either.
        again = call("WrapOutgoingMessage", _wrap_request(ROOM, b"first", "m1"))
        assert (again.data, again.message_id, again.repeated_wrap) == (first.data, "m1", True)
        assert not first.repeated_wrap

        assert snapshot() == before
        since = [e for e in events.events if e.seq > last_seq]
        reminders = [e for e in since if e.HasField("missing_dependencies")]
        assert since == reminders, f"events after refused requests: {since}"
        assert {mid for e in reminders for mid in e.missing_dependencies.message_ids} <= {
            decode(d0).message_id
        }

        # A batch with bad items: each is a Refusal with code 3, the others go ahead.
        wraps = call(
            "WrapOutgoingMessages",
            pb.WrapOutgoingMessagesRequest(
                messages=[
                    _wrap_request(ROOM, b"w1", "w1"),
                    _wrap_request(ROOM, b"", "w2"),
                    _wrap_request(ROOM, b"other", "m1"),
                    _wrap_request(ROOM, huge, "w4"),
                    _wrap_request(ROOM, b"w5", "w5"),
                    _wrap_request(ROOM, b"first", "m1"),
                ]
            ),
        ).results
        kinds = [r.WhichOneof("result") for r in wraps]
        assert kinds == ["wrapped", "refused", "refused", "refused", "wrapped", "wrapped"]
        assert {r.refused.code for r in wraps if r.HasField("refused")} == {invalid.value[0]}
        assert all(r.refused.message for r in wraps if r.HasField("refused"))
        assert (wraps[5].wrapped.data, wraps[5].wrapped.repeated_wrap) == (first.data, True)
        unacknowledged = call("ListUnacknowledged", pb.ListUnacknowledgedRequest(channel_id=ROOM))
        assert [(m.message_id, m.payload) for m in unacknowledged.messages] == [
            ("m1", b"first"),
            ("w1", b"w1"),
            ("w5", b"w5"),
        ]
        # Refused ids stay free.
        for mid in ("w2", "w4", "big"):
            fresh = call("WrapOutgoingMessage", _wrap_request(ROOM, mid.encode(), mid))
            assert not fresh.repeated_wrap

        unwraps = call(
            "UnwrapReceivedMessages",
            pb.UnwrapReceivedMessagesRequest(
                messages=[unwrap(b"\xff\x00garbage"), unwrap(d0), unwrap(c1[:-3]), unwrap(c1)]
            ),
        ).results
        kinds = [r.WhichOneof("result") for r in unwraps]
        assert kinds == ["refused", "unwrapped", "refused", "unwrapped"]
        assert [r.refused.code for r in unwraps if r.HasField("refused")] == [invalid.value[0]] * 2
        assert unwraps[1].unwrapped.payload == b"d0"
        assert unwraps[3].unwrapped.duplicate  # c1 was waiting: now ready, not new
        released = [decode(d0).message_id, decode(c1).message_id]
        events.wait_for(lambda: events.ids("message_ready") == released)
        assert not call("ListWaiting", pb.ListWaitingRequest(channel_id=ROOM)).messages
        events.cancel()
        assert server.alive()
    finally:
        assert server.stop() == 0
    assert "Traceback" not in server.stderr()


def test_a_refused_wrap_opens_no_channel(tmp_path: Path) -> None:
    server = _serve(tmp_path, "alice", *QUIET)
    try:
        huge = pb.WrapOutgoingMessageRequest(channel_id="fresh", payload=b"y" * 1_040_000)
        assert _refused(lambda: server.stub.WrapOutgoingMessage(huge)) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        assert not server.stub.ListChannels(pb.ListChannelsRequest()).channels
    finally:
        server.stop()
    restarted = server.restart()  # nor is one stored, to be reopened
    try:
        assert not restarted.stub.ListChannels(pb.ListChannelsRequest()).channels
    finally:
        restarted.stop()


def test_event_batches_carry_the_same_events_as_events_and_resume_alike(tmp_path: Path) -> None:
    """EventBatches: Subscribed alone first, then a channel's consecutive events several to
    a message, numbered as Events numbers them; a resume point acknowledges."""
    server = _serve(tmp_path, "alice", *QUIET)
    bob = ReliabilityManager("bob")
    bob.open_channel(ROOM)
    stub = server.stub
    try:
        stub.OpenChannel(pb.OpenChannelRequest(channel_id=ROOM))
        sent = [bob.wrap_outgoing_message(f"b{i}".encode(), ROOM) for i in range(20)]
        requests = [pb.UnwrapReceivedMessageRequest(data=data) for data in sent]
        stub.UnwrapReceivedMessages(pb.UnwrapReceivedMessagesRequest(messages=requests))

        def batches(*resume: pb.EventPosition) -> list[list[pb.Event]]:
            """The stream's batches until it holds the 20 MessageReady."""
            request = pb.EventsRequest(channel_ids=[ROOM], resume=resume)
            stream = stub.EventBatches(request, timeout=PATIENCE_S)
            out: list[list[pb.Event]] = []
            for batch in stream:
                out.append(list(batch.events))
                ready = [e for b in out for e in b if e.WhichOneof("event") == "message_ready"]
                if len(ready) == 20 - (resume[0].seq if resume else 0):
                    stream.cancel()
                    break
            return out

        first = batches()
        assert [e.WhichOneof("event") for e in first[0]] == ["subscribed"]
        events = [e for batch in first[1:] for e in batch]
        assert len(first) - 1 < len(events)  # several events to a stream message
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        ready = [e.message_ready.payload for e in events if e.message_ready.payload]
        assert ready == [f"b{i}".encode() for i in range(20)]
        single = EventLog(stub, channel_ids=[ROOM])  # Events: the same, one to a message
        single.wait_for(lambda: len(single.of("message_ready")) == 20)
        numbered = single.numbered(ROOM)
        assert [numbered[e.seq] for e in events] == events
        single.cancel()

        resumed = batches(pb.EventPosition(channel_id=ROOM, seq=5))
        again = [e for batch in resumed[1:] for e in batch]
        assert again[0].seq == 6 and again == events[5 : 5 + len(again)]
        info = stub.ListChannels(pb.ListChannelsRequest()).channels[0]
        assert info.acknowledged_seq == 5  # the resume point acknowledged
    finally:
        server.stop()
