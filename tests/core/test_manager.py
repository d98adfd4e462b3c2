from __future__ import annotations

import pytest

from sdsync.core import BloomParams, ChannelConfig, LogEntry, ReliabilityManager
from sdsync.errors import RemoteProtocolError

CONFIG = ChannelConfig(bloom=BloomParams(100, 0.01), causal_history_size=2)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


class IdStore:
    """An application's long-term storage that already holds some ids."""

    def __init__(self, ids: set[str]) -> None:
        self.ids = ids

    def append(self, entry: LogEntry) -> None:
        self.ids.add(entry.message_id)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self.ids


def manager(pid: str, clock: Clock, **kwargs: object) -> ReliabilityManager:
    return ReliabilityManager(pid, config=CONFIG, clock=clock, **kwargs)  # type: ignore[arg-type]


def test_wrap_unwrap_and_callbacks_across_channels() -> None:
    clock = Clock()
    alice, bob = manager("alice", clock), manager("bob", clock)
    ready: list[tuple[str, str]] = []
    sent: list[tuple[str, str]] = []
    bob.on_message_ready = lambda ch, mid: ready.append((ch, mid))
    alice.on_message_sent = lambda ch, mid: sent.append((ch, mid))

    w1 = alice.wrap_outgoing_message(b"hi general", "general")
    w2 = alice.wrap_outgoing_message(b"hi random", "random", message_id="r-1")
    r1, r2 = bob.unwrap_received_message(w1), bob.unwrap_received_message(w2)
    assert (r1.payload, r1.channel_id, r1.missing_dependencies) == (b"hi general", "general", [])
    assert (r2.payload, r2.channel_id, r2.message_id) == (b"hi random", "random", "r-1")
    assert [ch for ch, _ in ready] == ["general", "random"]

    reply = bob.wrap_outgoing_message(b"hello", "general")
    alice.unwrap_received_message(reply)
    assert sent == [("general", r1.message_id)]
    assert bob.unwrap_received_message(w1).payload is None  # duplicate: nothing new


def test_missing_dependencies_found_in_application_history() -> None:
    clock = Clock()
    alice = manager("alice", clock)
    alice.wrap_outgoing_message(b"1", "c")  # never reaches bob
    second = alice.wrap_outgoing_message(b"2", "c")
    bob = manager("bob", clock)
    missing: list[list[str]] = []
    bob.on_missing_dependencies = lambda ch, ids: missing.append(ids)
    result = bob.unwrap_received_message(second)
    assert result.payload == b"2"  # shown at once, with a "missing before" marker
    first_id = result.missing_dependencies[0]
    assert missing == [[first_id]]
    ready: list[str] = []
    bob.on_message_ready = lambda ch, mid: ready.append(mid)
    bob.mark_dependencies_met([first_id], "c")
    assert ready == [result.message_id]


def test_dependencies_in_long_term_storage_count_as_met() -> None:
    clock = Clock()
    alice = manager("alice", clock)
    alice.wrap_outgoing_message(b"old", "c")
    new = alice.wrap_outgoing_message(b"new", "c")
    old_id = alice.channel("c").log_ids()[0]
    bob = manager("bob", clock, history_store_factory=lambda ch: IdStore({old_id}))
    assert bob.unwrap_received_message(new).missing_dependencies == []


def test_periodic_sync_signal_for_quiet_channels() -> None:
    clock = Clock()
    alice = manager("alice", clock, sync_interval_ms=30_000)
    signals: list[str] = []
    alice.on_periodic_sync = signals.append
    alice.wrap_outgoing_message(b"x", "c")
    clock.now += 10_000
    alice.tick()
    assert signals == []
    clock.now += 30_000
    alice.tick()
    assert signals == ["c"]
    sync = alice.build_sync_message("c")
    assert sync is not None and manager("bob", clock).unwrap_received_message(sync).payload is None


def test_bad_bytes_raise_remote_error() -> None:
    with pytest.raises(RemoteProtocolError):
        manager("x", Clock()).unwrap_received_message(b"\x00\x01garbage")


def test_wrapping_the_same_payload_twice_gives_two_messages() -> None:
    """The default id covers sender and Lamport timestamp: "ok" twice is two messages."""
    clock = Clock()
    alice, bob = manager("alice", clock), manager("bob", clock)
    ready: list[str] = []
    bob.on_message_ready = lambda ch, mid: ready.append(mid)
    for _ in range(2):
        bob.unwrap_received_message(alice.wrap_outgoing_message(b"ok", "general"))
    assert len(set(ready)) == 2
