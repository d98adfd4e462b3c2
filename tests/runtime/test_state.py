"""Durable channel state: what survives a restart, and what a stored channel refuses."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path

import pytest

from sdsync.core import (
    BloomParams,
    ChannelConfig,
    MessageChannel,
    MessageDelivered,
    MessageDeliveredEarly,
    MessageMissing,
    RepairConfig,
    SyncStatus,
)
from sdsync.errors import LocalProtocolError
from sdsync.runtime import (
    CatchUp,
    ChannelDriver,
    ChannelState,
    ReliableChannel,
    RuntimeConfig,
    Step,
)
from sdsync.runtime.event_log import DURABLE_EVENTS, Delivery
from sdsync.runtime.state import SCHEMA_VERSION, Synchronous, state_path
from sdsync.testing.memory import Faults, MemoryNetwork

START = 1_700_000_000_000
CONFIG = ChannelConfig(
    bloom=BloomParams(64, 0.01),  # small: rollovers happen within a test
    causal_history_size=3,
    max_log_entries=20,  # small: most of the log lives only in SQLite
    repair=RepairConfig(t_min_ms=100, t_max_ms=500),
)
# Without catch-ups: their wake-ups would interleave with the resends these tests count
# (the catch-up's own state is tested at the end).
RUNTIME = RuntimeConfig(
    resend_interval_ms=1_000, resend_jitter=0.0, resend_backoff=1.0, store_catchup=False
)


class Node:
    """A stored driver on a virtual clock, as the runtime uses it (commit, then act)."""

    def __init__(
        self,
        path: Path,
        name: str,
        now: int,
        config: ChannelConfig = CONFIG,
        runtime: RuntimeConfig = RUNTIME,
    ) -> None:
        channel = MessageChannel("chan", name, now_ms=now, config=config)
        self.driver = ChannelDriver(channel, runtime, random.Random(name), now)
        self.state = ChannelState(path, self.driver, synchronous="NORMAL")
        self.channel = channel

    def crash(self) -> None:
        """Drop the database without storing anything more, as a killed process would."""
        self.state._db.close()

    def record(self, step: Step) -> list[Delivery]:
        """Number the step's durable events and commit them with it, as the owner does."""
        numbered = self.state.events.record(e for e in step.events if isinstance(e, DURABLE_EVENTS))
        self.state.commit()
        return numbered

    def run(self, step: Step) -> list[bytes]:
        """Commit, then the application takes every event (acknowledged with the next
        commit)."""
        numbered = self.record(step)
        if numbered:
            self.state.events.ack(numbered[-1].seq or 0)
        return [a.data for a in step.actions if hasattr(a, "data")]

    def unacknowledged(self) -> list[Delivery]:
        return self.state.events.read(self.state.events.acked_seq, 1_000)


def test_restart_restores_log_bloom_buffers_and_clock(tmp_path: Path) -> None:
    a = Node(tmp_path / "a.sqlite", "a", START)
    b = Node(tmp_path / "b.sqlite", "b", START)
    now = START
    wires = []
    for i in range(150):  # > 2 bloom capacities and > the log window
        now += 10
        wires += a.run(a.driver.publish(f"m{i}".encode(), now).whole())
    held_back = wires.pop(100)  # b misses one: everything after it waits for it
    for data in wires:
        b.run(b.driver.receive(data, now))
    assert len(b.channel.incoming_ids()) > 0
    full_log = [r.message_id for r in b.state.history()]
    assert len(full_log) == 100
    expected = {
        "log": b.channel.log_ids(),  # the in-memory window: the newest 20
        "bloom": b.channel.bloom_bytes(),
        "incoming": b.channel.incoming_ids(),
        "missing": b.channel.missing_ids(),
        "lamport": b.channel.lamport_timestamp,
    }
    a_outgoing = [
        (mid, a.channel.outgoing_entry(mid).attempts)  # type: ignore[union-attr]
        for mid in a.channel.outgoing_ids()
    ]
    a_bloom = a.channel.bloom_bytes()
    b.state.close()
    a.state.close()

    b2 = Node(tmp_path / "b.sqlite", "b", START)
    assert b2.channel.log_ids() == expected["log"]
    assert b2.channel.bloom_bytes() == expected["bloom"]
    assert b2.channel.incoming_ids() == expected["incoming"]
    assert b2.channel.missing_ids() == expected["missing"]
    assert b2.channel.lamport_timestamp == expected["lamport"]
    assert [r.message_id for r in b2.state.history()] == full_log
    assert len(b2.channel.log) == CONFIG.max_log_entries
    assert b2.channel.log.get(full_log[0]) is None  # old entries: only in SQLite,
    assert full_log[0] in b2.channel.log  # yet known, and recognised as duplicates

    assert b2.driver.receive(wires[0], now).events[0].type == "message_dropped"
    # The missing message arrives after the restart: the buffered ones follow it.
    b2.run(b2.driver.receive(held_back, now))
    assert b2.channel.incoming_ids() == []
    assert len(b2.state.history()) == 150

    a2 = Node(tmp_path / "a.sqlite", "a", START)
    assert a2.channel.bloom_bytes() == a_bloom
    assert [
        (mid, a2.channel.outgoing_entry(mid).attempts)  # type: ignore[union-attr]
        for mid in a2.channel.outgoing_ids()
    ] == a_outgoing


def test_resends_continue_after_restart_with_their_attempts(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    a = Node(path, "a", START)
    a.run(a.driver.publish(b"hello", START).whole())
    mid = a.channel.outgoing_ids()[0]
    now = START
    for _ in range(3):  # three resends, nobody acknowledges
        now = a.driver.next_due()
        a.run(a.driver.tick(now))
    attempts = a.channel.outgoing_entry(mid).attempts  # type: ignore[union-attr]
    assert attempts == 4
    due = a.driver.resend_at(mid)
    assert due is not None
    a.state.close()

    a2 = Node(path, "a", now)
    assert a2.channel.outgoing_entry(mid).attempts == attempts  # type: ignore[union-attr]
    assert a2.driver.resend_at(mid) == due
    step = a2.driver.tick(due)
    assert [(t.message_id, t.kind) for t in step.actions] == [(mid, "resend")]  # type: ignore[union-attr]
    a2.run(step)
    a2.state.close()
    a3 = Node(path, "a", due)
    assert a3.channel.outgoing_entry(mid).attempts == attempts + 1  # type: ignore[union-attr]


EARLY = ChannelConfig(
    bloom=CONFIG.bloom, causal_history_size=3, deliver_early=True, repair=CONFIG.repair
)


def test_events_not_acknowledged_before_a_crash_are_reported_again_under_their_numbers(
    tmp_path: Path,
) -> None:
    a = MessageChannel("chan", "a", now_ms=START, config=CONFIG)
    first = a.send(b"first", START)
    second = a.send(b"second", START + 1)
    path = tmp_path / "b.sqlite"
    b = Node(path, "b", START, EARLY)
    # "second" arrives first: shown early, and the application takes that event (its
    # acknowledgement is stored with the next commit). Then "first" arrives: both are
    # delivered, committed, and the process dies before the application hears of them.
    shown = b.record(b.driver.receive(second.data, START))
    assert [(d.seq, type(d.event)) for d in shown] == [
        (1, MessageMissing),  # "first", named by "second"
        (2, MessageDeliveredEarly),
    ]
    b.state.events.ack(2)
    taken = b.record(b.driver.receive(first.data, START))
    assert [(d.seq, type(d.event)) for d in taken] == [(3, MessageDelivered), (4, MessageDelivered)]
    b.crash()

    expected = [
        (3, MessageDelivered, first.message_id, b"first"),
        (4, MessageDelivered, second.message_id, b"second"),
    ]

    def reported(node: Node) -> list[tuple[object, ...]]:
        return [
            (d.seq, type(d.event), d.event.message_id, getattr(d.event, "content", None))
            for d in node.unacknowledged()
        ]

    b2 = Node(path, "b", START, EARLY)
    assert reported(b2) == expected  # the early one was acknowledged: not again
    b2.crash()  # nothing acknowledged: the same events, under the same numbers
    b3 = Node(path, "b", START, EARLY)
    assert reported(b3) == expected
    b3.state.events.ack(3)  # "first" processed, then a clean close stores that
    b3.state.close()
    b4 = Node(path, "b", START, EARLY)
    assert reported(b4) == expected[1:]
    assert b4.state.events.last_seq == 4  # numbering continues where it stopped
    b4.state.events.ack(4)
    b4.state.close()
    b5 = Node(path, "b", START, EARLY)
    assert b5.unacknowledged() == []
    assert (b5.state.events.last_seq, b5.state.events.acked_seq) == (4, 4)


def test_early_delivery_is_re_offered_until_acknowledged(tmp_path: Path) -> None:
    a = MessageChannel("chan", "a", now_ms=START, config=CONFIG)
    a.send(b"first", START)
    second = a.send(b"second", START + 1)
    b = Node(tmp_path / "b.sqlite", "b", START, EARLY)
    b.record(b.driver.receive(second.data, START))
    b.crash()
    b2 = Node(tmp_path / "b.sqlite", "b", START, EARLY)
    missing, delivery = b2.unacknowledged()
    assert isinstance(missing.event, MessageMissing) and missing.seq == 1
    early = delivery.event
    assert isinstance(early, MessageDeliveredEarly) and delivery.seq == 2
    assert (early.message_id, early.content, early.missing_dependencies) == (
        second.message_id,
        b"second",
        1,
    )
    b2.state.events.ack(2)  # staged only: a crash before the next commit forgets it
    b2.crash()
    b3 = Node(tmp_path / "b.sqlite", "b", START, EARLY)
    assert b3.unacknowledged() == [missing, delivery]
    b3.state.events.ack(2)
    b3.state.commit()  # stored now: the crash that follows changes nothing
    b3.crash()
    assert Node(tmp_path / "b.sqlite", "b", START, EARLY).unacknowledged() == []


def test_participant_must_match_the_stored_one(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite"
    Node(path, "alice", START).state.close()
    with pytest.raises(LocalProtocolError, match="alice"):
        Node(path, "bob", START)


def test_a_state_is_used_by_one_process_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite"
    first = Node(path, "alice", START)
    with pytest.raises(LocalProtocolError, match="in use"):
        Node(path, "alice", START)
    first.state.close()
    Node(path, "alice", START).state.close()


def test_state_path_is_one_safe_file_per_channel(tmp_path: Path) -> None:
    assert state_path(tmp_path, "chat") == tmp_path / "chat.sqlite"
    assert state_path(tmp_path, "../a/b").parent == tmp_path


def test_failed_commit_stops_the_state(tmp_path: Path) -> None:
    a = Node(tmp_path / "a.sqlite", "a", START)
    a.state._db.execute("DROP TABLE log")  # the next step cannot be stored
    with pytest.raises(sqlite3.OperationalError):
        a.run(a.driver.publish(b"x", START).whole())
    with pytest.raises(LocalProtocolError, match="reopen"):
        a.run(Step())


FAST = RuntimeConfig(
    sync_interval_ms=200,
    resend_interval_ms=150,
    resend_possibly_acknowledged_ms=400,
    max_resend_interval_ms=1_000,
    incoming_sweep_ms=50,
)
PATIENCE_S = 60


def test_reliable_channel_with_state_dir_restarts_where_it_stopped(tmp_path: Path) -> None:
    async def scenario() -> None:
        net = MemoryNetwork(Faults(latency_ms=2, loss=0.2), seed=5)

        def member(name: str) -> ReliableChannel:
            return ReliableChannel(
                net.transport(name),
                "chat",
                name,
                config=ChannelConfig(
                    bloom=CONFIG.bloom, causal_history_size=30, repair=CONFIG.repair
                ),
                runtime=FAST,
                rng=random.Random(name),
                state_dir=tmp_path / name,
            )

        a, b = member("a"), member("b")
        await a.start()
        await b.start()
        sent = [await a.send(f"line {i}".encode()) for i in range(10)]
        await b.close()  # b leaves; a keeps sending and resending
        sent += [await a.send(f"later {i}".encode()) for i in range(10)]
        b = member("b")
        await b.start()
        statuses: list[SyncStatus] = []
        delivered: list[str] = []

        async def consume() -> None:
            async for event in b.events():
                if isinstance(event, MessageDelivered):
                    delivered.append(event.message_id)
                elif isinstance(event, SyncStatus):
                    statuses.append(event)
                if sorted(delivered) == sorted(sent):
                    return

        await asyncio.wait_for(consume(), PATIENCE_S)
        assert len(delivered) == len(set(delivered))
        assert [r.message_id for r in b.history()] == b.channel.log_ids()
        assert [r.content for r in b.history(2)] == [b"later 8", b"later 9"]
        await a.close()
        await b.close()

    asyncio.run(scenario())


def test_gaps_named_only_by_sync_messages_survive_a_crash(tmp_path: Path) -> None:
    """The known missing ids are durable: a restarted participant still asks for them."""
    a = Node(tmp_path / "a.sqlite", "a", START)
    b = Node(tmp_path / "b.sqlite", "b", START)
    lost = a.run(a.driver.publish(b"never arrives", START + 1).whole())
    sync = a.channel.send_sync(START + 2)
    assert lost and sync is not None
    b.run(b.driver.receive(sync.data, START + 3))
    gap = b.channel.missing_ids()
    assert len(gap) == 1
    b.crash()
    b2 = Node(tmp_path / "b.sqlite", "b", START + 10)
    assert b2.channel.missing_ids() == gap
    known = b2.channel.missing_dependency(gap[0])
    assert known is not None and (known.named_by, known.first_seen_ms) == ("a", START + 3)
    assert [e.message_id for e in b2.channel.sweep_incoming(START + 20).missing] == gap
    b2.run(b2.driver.receive(lost[0], START + 30))
    b2.crash()
    assert Node(tmp_path / "b.sqlite", "b", START + 40).channel.missing_ids() == []


def test_unacknowledged_wires_stay_on_disk_and_resend_unchanged(tmp_path: Path) -> None:
    """The outgoing buffer holds no wire bytes in memory once a step is committed."""
    a = Node(tmp_path / "a.sqlite", "a", START)
    sent = [a.run(a.driver.publish(f"m{i}".encode(), START + i).whole())[0] for i in range(5)]
    assert a.state._wires._uncommitted == {}
    mid = a.channel.outgoing_ids()[2]
    assert a.channel.resend(mid, START + 100) == sent[2]
    a.crash()
    a2 = Node(tmp_path / "a.sqlite", "a", START + 200)
    assert a2.channel.resend(mid, START + 300) == sent[2]


def downgrade(path: Path, version: int) -> None:
    """Make a closed schema-4 database look as schema ``version`` left it: schema 3 kept
    delivery numbers in the log and incoming rows and had no events, wraps, participants
    or closed flag; schema 2 had no caught-up time; schema 1 no hints, missing or peers."""
    db = sqlite3.connect(path)
    script = (
        "DROP TABLE events; DROP TABLE wrapped;"
        " ALTER TABLE channel DROP COLUMN participants; ALTER TABLE channel DROP COLUMN closed;"
        " ALTER TABLE log ADD COLUMN delivered_seq INTEGER;"
        " ALTER TABLE incoming ADD COLUMN early_seq INTEGER;"
        " CREATE INDEX log_delivered ON log (delivered_seq) WHERE delivered_seq IS NOT NULL;"
    )
    if version <= 2:
        script += " ALTER TABLE channel DROP COLUMN caught_up_ms;"
    if version <= 1:
        script += (
            " ALTER TABLE outgoing DROP COLUMN retrieval_hint; DROP TABLE missing;"
            " DROP TABLE peers;"
        )
    db.executescript(script + f" UPDATE channel SET schema_version = {version};")
    db.close()


def test_a_version_1_database_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    a = Node(path, "a", START)
    a.run(a.driver.publish(b"kept", START + 1).whole())
    a.state.close()
    downgrade(path, 1)
    a2 = Node(path, "a", START + 10)
    assert len(a2.channel.outgoing_ids()) == 1
    version = a2.state._db.execute("SELECT schema_version FROM channel").fetchone()[0]
    assert version == SCHEMA_VERSION == 4
    assert a2.unacknowledged() == []
    a2.state.close()
    assert Node(path, "a", START + 20).channel.outgoing_ids() == a2.channel.outgoing_ids()


def test_a_version_3_database_turns_deliveries_not_taken_into_events(tmp_path: Path) -> None:
    """Schema 3 numbered deliveries in the log (and early ones in incoming) and kept a
    cursor: those above it were never handed over and become events under their numbers;
    those at or below it were, and do not come back."""
    sender = MessageChannel("chan", "a", now_ms=START, config=CONFIG)
    sent = [sender.send(f"m{i}".encode(), START + i) for i in range(4)]
    held_back = sender.send(b"held back", START + 5)
    waiting = sender.send(b"waits", START + 10)  # names held_back, which b lacks
    path = tmp_path / "b.sqlite"
    b = Node(path, "b", START, EARLY)
    for out in sent:
        b.record(b.driver.receive(out.data, START + 20))
    b.record(b.driver.receive(waiting.data, START + 21))
    assert b.channel.incoming_ids() == [waiting.message.message_id]
    b.state.close()
    downgrade(path, 3)
    db = sqlite3.connect(path)
    for seq, out in enumerate(sent, start=1):
        db.execute(
            "UPDATE log SET delivered_seq = ? WHERE message_id = ?", (seq, out.message.message_id)
        )
    db.execute("UPDATE incoming SET early_seq = 5")
    db.execute("UPDATE channel SET event_seq = 5, delivered_cursor = 2")
    db.commit()
    db.close()

    b2 = Node(path, "b", START + 30, EARLY)
    assert b2.state._db.execute("SELECT schema_version FROM channel").fetchone()[0] == 4
    assert (b2.state.events.last_seq, b2.state.events.acked_seq) == (5, 2)
    reported = b2.unacknowledged()
    assert [d.seq for d in reported] == [3, 4, 5]
    for d, out in zip(reported[:2], sent[2:], strict=True):
        assert d.event == MessageDelivered(
            out.message.message_id,
            "a",
            out.message.lamport_timestamp or 0,
            out.message.content or b"",
            None,
        )
    early = reported[2].event
    assert isinstance(early, MessageDeliveredEarly)
    assert (early.message_id, early.sender_id, early.content) == (
        waiting.message.message_id,
        "a",
        b"waits",
    )
    # New events are numbered after the migrated ones.
    more = b2.record(b2.driver.receive(held_back.data, START + 40))
    assert [d.seq for d in more] == list(range(6, 6 + len(more)))
    assert {d.event.message_id for d in more if isinstance(d.event, MessageDelivered)} == {
        held_back.message.message_id,
        waiting.message.message_id,
    }


CATCHING_UP = RuntimeConfig(
    store_catchup_interval_ms=60_000,
    store_catchup_max_window_ms=3_600_000,
    store_catchup_margin_ms=20_000,
)


def test_the_caught_up_time_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    a = Node(path, "a", START, runtime=CATCHING_UP)
    (first,) = a.driver.tick(START).actions
    assert first == CatchUp(START - 20_000, START)
    a.run(a.driver.caught_up(first, START + 5))  # type: ignore[arg-type]
    later = START + 60_005
    (second,) = a.driver.tick(later).actions
    assert second == CatchUp(START - 20_000, later)  # from the last end, less the margin
    a.run(a.driver.caught_up(second, later + 5))  # type: ignore[arg-type]
    a.crash()  # the caught-up time was committed with the step that moved it

    back = START + 600_000
    a2 = Node(path, "a", back, runtime=CATCHING_UP)
    assert a2.driver.caught_up_ms == later
    (resumed,) = a2.driver.tick(back).actions
    assert resumed == CatchUp(later - 20_000, back)


def test_a_catch_up_not_reported_done_is_asked_again_after_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    a = Node(path, "a", START, runtime=CATCHING_UP)
    a.run(a.driver.tick(START))  # the catch-up starts; the process dies before it ends
    a.crash()
    a2 = Node(path, "a", START + 1_000, runtime=CATCHING_UP)
    assert a2.driver.caught_up_ms == START
    (again,) = a2.driver.tick(START + 1_000).actions
    assert again == CatchUp(START - 20_000, START + 1_000)


def test_a_version_2_database_catches_up_the_whole_window(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    a = Node(path, "a", START, runtime=CATCHING_UP)
    a.run(a.driver.publish(b"kept", START + 1).whole())
    a.state.close()
    downgrade(path, 2)
    back = START + 86_400_000
    a2 = Node(path, "a", back, runtime=CATCHING_UP)
    assert len(a2.channel.outgoing_ids()) == 1
    assert a2.state._db.execute("SELECT schema_version FROM channel").fetchone()[0] == 4
    assert a2.driver.caught_up_ms is None  # unknown: how long it was away
    catch_up = next(x for x in a2.driver.tick(back).actions if isinstance(x, CatchUp))
    assert catch_up == CatchUp(back - 3_600_000, back)


def open_state(
    path: Path, name: str, synchronous: Synchronous
) -> tuple[ChannelDriver, ChannelState]:
    channel = MessageChannel("chan", name, now_ms=START, config=CONFIG)
    driver = ChannelDriver(channel, RUNTIME, random.Random(name), START)
    return driver, ChannelState(path, driver, synchronous=synchronous)


def pragma(state: ChannelState, name: str) -> object:
    return state._db.execute(f"PRAGMA {name}").fetchone()[0]


def test_synchronous_full_is_applied_and_the_state_reopens_under_it(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    a, state = open_state(path, "a", "FULL")
    assert (pragma(state, "synchronous"), pragma(state, "journal_mode")) == (2, "wal")  # FULL
    b = MessageChannel("chan", "b", now_ms=START, config=CONFIG)
    a.receive(b.send(b"from b", START + 1).data, START + 1)
    state.commit()
    for i in range(3):
        a.publish(f"from a {i}".encode(), START + 2 + i)
        state.commit()
    log, outgoing = a.channel.log_ids(), a.channel.outgoing_ids()
    state.close()

    a2, state2 = open_state(path, "a", "FULL")
    assert pragma(state2, "synchronous") == 2
    assert (a2.channel.log_ids(), a2.channel.outgoing_ids()) == (log, outgoing)
    assert [r.content for r in state2.history()] == [b"from b"] + [
        f"from a {i}".encode() for i in range(3)
    ]
    state2.close()
    # The setting belongs to each open, not to the file: NORMAL reads back as 1.
    _, state3 = open_state(path, "a", "NORMAL")
    assert pragma(state3, "synchronous") == 1
    state3.close()


def test_synchronous_accepts_only_normal_or_full(tmp_path: Path) -> None:
    with pytest.raises(LocalProtocolError, match="synchronous"):
        open_state(tmp_path / "a.sqlite", "a", "OFF")  # type: ignore[arg-type]
    assert not (tmp_path / "a.sqlite").exists()  # refused before anything was created


def test_reliable_channel_passes_synchronous_full_to_its_state(tmp_path: Path) -> None:
    async def scenario() -> None:
        net = MemoryNetwork(Faults(), seed=1)

        def member() -> ReliableChannel:
            return ReliableChannel(
                net.transport("a"),
                "chat",
                "a",
                config=CONFIG,
                runtime=FAST,
                rng=random.Random(1),
                state_dir=tmp_path,
                synchronous="FULL",
            )

        a = member()
        assert a.state is not None and pragma(a.state, "synchronous") == 2
        async with a:
            mid = await a.send(b"kept through FULL")
        await a.close()
        again = member()
        assert again.state is not None and pragma(again.state, "synchronous") == 2
        assert [(r.message_id, r.content) for r in again.history()] == [(mid, b"kept through FULL")]
        await again.close()

    asyncio.run(scenario())
