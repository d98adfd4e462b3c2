"""A gRPC client hears of every message the incoming buffer evicts (issue 27, row 18):
``MessageEvicted`` on the ``Events`` stream, numbered and kept like every reported event,
so it comes again after a restart until acknowledged.

A real ``sdsync reliability serve`` on loopback with the smallest byte budget it accepts
(one message of the largest size peers may send, 5 MiB): :data:`WAITING` messages of
:data:`CONTENT_BYTES` each, every one waiting for a dependency that never arrives, are
more than it holds, so the oldest give way. Waits are liveness bounds only.
"""

from __future__ import annotations

from pathlib import Path

from reliabilityprocess import EventLog, ServerProcess

from sdsync.core import DropReason
from sdsync.core.config import incoming_charge
from sdsync.reliability import reliability_pb2 as pb
from sdsync.runtime import system_clock_ms
from sdsync.wire import DEFAULT_LIMITS, HistoryEntry, Message, encode

TOKEN = "s3cret"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
ROOM = "room"
QUIET = ("--resend-interval-ms", "86400000", "--sync-interval-ms", "86400000")
#: The smallest budget the server accepts.
BUDGET = incoming_charge(DEFAULT_LIMITS.max_message_bytes, DEFAULT_LIMITS.max_causal_history)
CONTENT_BYTES = 700_000  # charged ~1.4 MB waiting: three fit in 5 MiB, four do not
WAITING = 6


def waiting(i: int) -> bytes:
    """Message ``w<i>`` from mallory, waiting for ``gap<i>`` (never sent)."""
    message = Message(
        sender_id="mallory",
        message_id=f"w{i}",
        channel_id=ROOM,
        lamport_timestamp=system_clock_ms(),
        causal_history=(HistoryEntry(f"gap{i}", None, "mallory"),),
        content=bytes([i]) * CONTENT_BYTES,
    )
    return encode(message)


def test_evictions_reach_a_grpc_client_and_survive_a_restart(tmp_path: Path) -> None:
    state = ("--state-dir", str(tmp_path / "state"))
    budget = ("--max-incoming-buffer-bytes", str(BUDGET))
    server = ServerProcess(tmp_path / "server.log", *QUIET, *state, *budget, token=TOKEN)
    try:
        stub = server.stub
        stub.OpenChannel(pb.OpenChannelRequest(channel_id=ROOM), metadata=AUTH)
        events = EventLog(stub, AUTH, channel_ids=[ROOM])
        for i in range(WAITING):
            answer = stub.UnwrapReceivedMessage(
                pb.UnwrapReceivedMessageRequest(data=waiting(i)), metadata=AUTH
            )
            assert list(answer.missing_dependencies) == [f"gap{i}"]
        kept = BUDGET // incoming_charge(len(waiting(0)), 1)
        gone = [f"w{i}" for i in range(WAITING - kept)]
        events.wait_for(lambda: events.ids("message_evicted") == gone)
        seen = events.of("message_evicted")
        events.cancel()
        for event in seen:
            evicted = event.message_evicted
            assert event.channel_id == evicted.channel_id == ROOM and event.seq > 0
            assert evicted.reason == DropReason.INCOMING_BUFFER_BYTES.value
            assert evicted.sender_id == "mallory" and evicted.unmet_dependencies == 1
            assert evicted.size_bytes == incoming_charge(len(waiting(0)), 1)
        listed = stub.ListWaiting(pb.ListWaitingRequest(channel_id=ROOM), metadata=AUTH)
        assert [m.message_id for m in listed.messages] == [
            f"w{i}" for i in range(WAITING - kept, WAITING)
        ]
        assert server.stop() == 0

        # Not acknowledged: the same events, under the same numbers, after a restart.
        server = server.restart()
        stub = server.stub
        stub.OpenChannel(pb.OpenChannelRequest(channel_id=ROOM), metadata=AUTH)
        again = EventLog(server.stub, AUTH, channel_ids=[ROOM])
        again.wait_for(lambda: again.ids("message_evicted") == gone)
        assert again.of("message_evicted") == seen
        again.cancel()
    finally:
        if server.alive():
            server.stop()
