"""A hostile peer against the SDS incoming buffer, through a real ``sdsync reliability
serve`` process on loopback (issue 27, row 18).

The application unwraps whatever it receives, so a peer in the channel chooses the bytes:
here :data:`FORGED` messages of :data:`CONTENT_BYTES` each naming :data:`DEPENDENCIES`
ids that never arrive — the row's attack, at ~3.3 MB held per message before the byte
budget (the count cap alone, 10,000 messages, let it reach ~30 GB). Meanwhile an honest
message waits for one dependency. Asserted: the server's RSS stays under
:data:`RSS_BUDGET` above where it started (the 64 MiB default byte budget plus generous
room for the event log, the known-missing set, allocator slack and a loaded machine);
the evictions are reported (the core's warning on the server's log); each honest call is
answered within :data:`HONEST_BOUND_S` while the attack goes on; and the honest message
is still waiting when its dependency arrives, and then both are delivered (MessageReady).
Bounds are liveness bounds, generous for a loaded machine.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import grpc
from reliabilityprocess import EventLog, ServerProcess

from sdsync.reliability import reliability_pb2 as pb
from sdsync.reliability import reliability_pb2_grpc as pb_grpc
from sdsync.runtime import system_clock_ms
from sdsync.testing.hostile import process_rss
from sdsync.wire import HistoryEntry, Message, encode

TOKEN = "s3cret"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
ROOM = "room"
QUIET = ("--resend-interval-ms", "86400000", "--sync-interval-ms", "86400000")
FORGED = 200
CONTENT_BYTES = 455_000
DEPENDENCIES = 4_096
#: The default byte budget (64 MiB) plus room for everything else the attack grows.
RSS_BUDGET = (64 << 20) + (300 << 20)
#: An honest call is answered within this while the attack goes on.
HONEST_BOUND_S = 10.0
#: The waiting messages are listed with their payloads and dependencies: many MB.
BIG_ANSWERS = [("grpc.max_receive_message_length", 256 << 20)]


def _forged(i: int) -> bytes:
    history = tuple(
        HistoryEntry(hashlib.sha256(f"never-{i}-{j}".encode()).hexdigest(), None, "mallory")
        for j in range(DEPENDENCIES)
    )
    message = Message(
        sender_id="mallory",
        message_id=f"forged-{i}",
        channel_id=ROOM,
        lamport_timestamp=system_clock_ms(),
        causal_history=history,
        content=os.urandom(CONTENT_BYTES),
    )
    return encode(message)


def _honest(mid: str, deps: list[str]) -> bytes:
    message = Message(
        sender_id="alice",
        message_id=mid,
        channel_id=ROOM,
        lamport_timestamp=system_clock_ms(),
        causal_history=tuple(HistoryEntry(dep, None, "alice") for dep in deps),
        content=f"honest {mid}".encode(),
    )
    return encode(message)


def test_forged_histories_cannot_grow_the_incoming_buffer_past_its_budget(
    tmp_path: Path,
) -> None:
    server = ServerProcess(tmp_path / "server.log", *QUIET, token=TOKEN)
    stub = server.stub
    pid = server.process.pid

    def unwrap(data: bytes) -> tuple[pb.UnwrapReceivedMessageResponse, float]:
        start = time.monotonic()
        answer = stub.UnwrapReceivedMessage(
            pb.UnwrapReceivedMessageRequest(data=data), metadata=AUTH
        )
        return answer, time.monotonic() - start

    try:
        stub.OpenChannel(pb.OpenChannelRequest(channel_id=ROOM), metadata=AUTH)
        baseline = process_rss(pid)
        waiting, _ = unwrap(_honest("h2", ["h1"]))
        assert list(waiting.missing_dependencies) == ["h1"]

        peak, slowest = baseline, 0.0
        for i in range(FORGED):
            unwrap(_forged(i))
            peak = max(peak, process_rss(pid))
            if i % 20 == 10:  # an honest peer's message, with nothing missing
                answer, took = unwrap(_honest(f"ok{i}", []))
                assert answer.payload and not answer.missing_dependencies
                slowest = max(slowest, took)
        grown = peak - baseline
        print(f"RSS {baseline >> 20} MB -> peak {peak >> 20} MB; slowest honest {slowest:.2f} s")
        assert grown < RSS_BUDGET, f"RSS grew {grown >> 20} MB for {FORGED} forged messages"
        assert slowest < HONEST_BOUND_S

        # The evictions are reported (the first at WARNING on the server's log) ...
        assert "incoming buffer over its byte budget" in server.stderr()
        assert "evicted forged-" in server.stderr()
        # ... and the honest message survived them: it gave way to none of the forgeries.
        with grpc.insecure_channel(server.address, options=BIG_ANSWERS) as channel:
            listed = pb_grpc.ReliabilityStub(channel).ListWaiting(
                pb.ListWaitingRequest(channel_id=ROOM), metadata=AUTH
            )
        ids = [m.message_id for m in listed.messages]
        assert "h2" in ids
        assert len(ids) < FORGED // 4

        last = stub.OpenChannel(pb.OpenChannelRequest(channel_id=ROOM), metadata=AUTH).last_seq
        stub.AckEvents(
            pb.AckEventsRequest(acks=[pb.EventPosition(channel_id=ROOM, seq=last)]),
            metadata=AUTH,
        )
        events = EventLog(stub, AUTH, channel_ids=[ROOM])
        answer, took = unwrap(_honest("h1", []))
        assert answer.payload and took < HONEST_BOUND_S
        events.wait_for(lambda: {"h1", "h2"} <= set(events.ids("message_ready")))
        events.cancel()
    finally:
        server.stop()
