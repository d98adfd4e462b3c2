"""Two applications exchange messages through the ReliabilityManager facade.

Alice's second message reaches Bob before her first one (a reordering transport). Bob
shows it at once with a "messages missing" marker, and learns it is ready once the first
one arrives. Alice learns both were received from Bob's reply.

Run: python examples/reliability_manager.py
"""

from __future__ import annotations

from sdsync import ReliabilityManager


def main() -> None:
    clock = iter(range(1_000, 100_000, 10))
    alice = ReliabilityManager("alice", clock=lambda: next(clock))
    bob = ReliabilityManager("bob", clock=lambda: next(clock))
    bob.on_message_ready = lambda channel, mid: print(f"bob: {mid[:8]}… is ready in #{channel}")
    alice.on_message_sent = lambda channel, mid: print(f"alice: {mid[:8]}… acknowledged")

    first = alice.wrap_outgoing_message(b"hello bob", "general")
    second = alice.wrap_outgoing_message(b"are you there?", "general")

    early = bob.unwrap_received_message(second)
    print(f"bob shows {early.payload!r} with {len(early.missing_dependencies)} missing before it")
    bob.unwrap_received_message(first)

    reply = bob.wrap_outgoing_message(b"yes, got both", "general")
    alice.unwrap_received_message(reply)
    log = bob.channel("general").log_ids()
    assert log == alice.channel("general").log_ids(), "logs diverged"
    print(f"both logs hold the same {len(log)} messages in the same order")


if __name__ == "__main__":
    main()
