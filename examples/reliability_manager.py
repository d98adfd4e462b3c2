"""Three applications exchange messages through the ReliabilityManager facade.

Bob's reply names Alice's first message in its causal history. Carol's transport
reorders: she gets the reply first, shows it at once with a "messages missing" marker,
and learns it is ready once Alice's message arrives. Our own messages enter the log once
acknowledged (the API proposal's rule): Alice's by Bob's reply, Bob's by Alice's sync.
A real application would also call ``tick()`` periodically and send what ``on_transmit``
hands it (resends, syncs, repairs); here every message gets through.

Run: python examples/reliability_manager.py
"""

from __future__ import annotations

from sdsync import ReliabilityManager


def main() -> None:
    clock = iter(range(1_000, 100_000, 10))
    alice, bob, carol = (
        ReliabilityManager(name, clock=lambda: next(clock)) for name in ("alice", "bob", "carol")
    )
    carol.on_message_ready = lambda channel, mid: print(f"carol: {mid[:8]}… is ready in #{channel}")
    alice.on_message_sent = lambda channel, mid: print(f"alice: {mid[:8]}… acknowledged")
    bob.on_message_sent = lambda channel, mid: print(f"bob: {mid[:8]}… acknowledged")
    for member in (bob, carol):
        member.open_channel("general")  # bytes for channels not opened change nothing

    hello = alice.wrap_outgoing_message(b"hello all", "general")
    bob.unwrap_received_message(hello)
    reply = bob.wrap_outgoing_message(b"hi alice", "general")

    early = carol.unwrap_received_message(reply)
    print(f"carol shows {early.payload!r} with {len(early.missing_dependencies)} missing before it")
    carol.unwrap_received_message(hello)

    alice.unwrap_received_message(reply)
    sync = alice.build_sync_message("general")
    assert sync is not None
    bob.unwrap_received_message(sync)
    logs = [member.channel("general").log_ids() for member in (alice, bob, carol)]
    assert logs[0] == logs[1] == logs[2], "logs diverged"
    print(f"all three logs hold the same {len(logs[0])} messages in the same order")


if __name__ == "__main__":
    main()
