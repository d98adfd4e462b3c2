"""SqliteHistoryStore: the application's long-term storage behind the ReliabilityManager."""

from __future__ import annotations

from pathlib import Path

from sdsync.core import BloomParams, ChannelConfig, LogEntry
from sdsync.runtime import ReliabilityManager, SqliteHistoryStore

CONFIG = ChannelConfig(bloom=BloomParams(100, 0.01), causal_history_size=2, max_log_entries=5)


def test_store_keeps_entries_per_channel_in_log_order(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    general, random_ = SqliteHistoryStore(db, "general"), SqliteHistoryStore(db, "random")
    general.append(LogEntry("b", 2, "bob", b"\x01"))
    general.append(LogEntry("a", 2, "alice"))
    general.append(LogEntry("z", 1, "alice"))
    general.append(LogEntry("a", 2, "alice"))  # again: ignored
    random_.append(LogEntry("x", 1, "carol"))
    assert [e.message_id for e in general] == ["z", "a", "b"]
    assert len(general) == 3 and len(random_) == 1
    assert "x" in random_ and "x" not in general
    assert general.get("b") == LogEntry("b", 2, "bob", b"\x01")
    assert general.get("nope") is None
    general.close()
    random_.close()


def test_manager_recognises_evicted_messages_across_restarts(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    now = [1_000]

    def clock() -> int:
        now[0] += 1
        return now[0]

    alice = ReliabilityManager("alice", config=CONFIG, clock=clock)
    wires = [alice.wrap_outgoing_message(f"m{i}".encode(), "chat") for i in range(12)]

    def bob_manager() -> ReliabilityManager:
        return ReliabilityManager(
            "bob",
            config=CONFIG,
            clock=clock,
            history_store_factory=lambda channel_id: SqliteHistoryStore(db, channel_id),
        )

    bob = bob_manager()
    bob.open_channel("chat")
    ready: list[str] = []
    bob.on_message_ready = lambda _, mid: ready.append(mid)
    for wire in wires:
        assert bob.unwrap_received_message(wire).payload is not None
    assert len(ready) == 12
    assert len(bob.channel("chat").log) == 5  # the rest went to SQLite
    assert bob.unwrap_received_message(wires[0]).payload is None  # evicted, still known

    # A restarted application: the in-memory window is gone, the store is not.
    bob = bob_manager()
    bob.open_channel("chat")
    store = bob.channel("chat").log.history_store
    assert isinstance(store, SqliteHistoryStore)
    assert [e.message_id for e in store] == ready[:7]
    assert bob.unwrap_received_message(wires[3]).payload is None
