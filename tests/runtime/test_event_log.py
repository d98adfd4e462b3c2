"""Numbered events kept until acknowledged: EventLog (memory) and StoredEventLog (SQLite).

Attacks the promise of :mod:`sdsync.runtime.event_log`: every event is numbered 1, 2, 3,
... per channel and read back under its number until acknowledged; an acknowledged event
never comes back; a stored log survives a crash (what was committed, with the
acknowledgement as of the last commit); at the bound (a count and a byte total) the oldest
events give way to an EventsDiscarded that names exactly which numbers went and how many
of them were deliveries, and later discards merge into it — nothing is ever lost silently.
The last part is a hypothesis state machine running both logs side by side (the stored one
crashing and reopening at random) against a model that remembers every recorded event.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from sdsync.core import (
    DropReason,
    MessageAcknowledged,
    MessageChannel,
    MessageDelivered,
    MessageDeliveredEarly,
    MessageEvicted,
    MessageLost,
    MessageMissing,
    MessagePossiblyAcknowledged,
    SendFailed,
    SyncStatus,
)
from sdsync.errors import LocalProtocolError
from sdsync.runtime import (
    ChannelDriver,
    ChannelState,
    Delivery,
    EventLimits,
    EventsDiscarded,
    PeriodicSync,
    RuntimeConfig,
    Transmit,
)
from sdsync.runtime import state as state_module
from sdsync.runtime.event_log import EventLog, Reported, from_row, to_row

START = 1_700_000_000_000


def delivered(i: int, size: int = 3) -> MessageDelivered:
    return MessageDelivered(f"m{i}", "peer", i, b"x" * size, None)


def transmit(i: int, size: int) -> Transmit:
    return Transmit(b"t" * size, f"t{i}", "resend")


def every_kind() -> list[Reported]:
    """One of each event that is kept, with every field set to something telling."""
    return [
        MessageDelivered("d", "alice", 7, b"payload", b"hint"),
        MessageDeliveredEarly("e", "bob", 8, b"early", None, 3),
        MessageAcknowledged("a", True, "carol"),
        MessageAcknowledged("a2", False, ""),
        MessagePossiblyAcknowledged("p", 2, "dave"),
        MessageMissing("x", b"where", "erin"),
        MessageMissing("y", None, None),
        MessageEvicted("v", DropReason.INCOMING_BUFFER_BYTES, "frank", 4_096, 3_300_000),
        MessageEvicted("w", DropReason.INCOMING_BUFFER_FULL, "", 0, 0),
        MessageLost("l"),
        SendFailed("f"),
        Transmit(b"\x00bytes", "t", "sync"),
        PeriodicSync("t"),
    ]


class Stored:
    """A ChannelState on a file, opened and crashed as a process would."""

    def __init__(self, path: Path, limits: EventLimits | None = None) -> None:
        self.path = path
        self.limits = limits
        self.state = self._open()

    def _open(self) -> ChannelState:
        channel = MessageChannel("chan", "me", now_ms=START)
        driver = ChannelDriver(channel, RuntimeConfig(), random.Random(0), START)
        return ChannelState(self.path, driver, event_limits=self.limits)

    @property
    def events(self) -> state_module.StoredEventLog:
        return self.state.events

    def record(self, events: list[Reported]) -> list[Delivery]:
        numbered = self.state.events.record(events)
        self.state.commit()  # with the step that caused them
        return numbered

    def crash(self) -> None:
        """Gone without storing anything more (staged acknowledgements are lost)."""
        self.state._db.close()
        self.state = self._open()

    def restart(self) -> None:
        self.state.close()
        self.state = self._open()


def read_all(log: EventLog, page: int = 3) -> list[Delivery]:
    out: list[Delivery] = []
    after = log.acked_seq
    while batch := log.read(after, page):
        out += batch
        after = batch[-1].seq or after
    return out


# ------------------------------------------------------------------ numbering


def test_events_are_numbered_in_order_and_read_back_until_acknowledged() -> None:
    log = EventLog()
    assert (log.last_seq, log.acked_seq, log.unacknowledged) == (0, 0, 0)
    first = log.record([delivered(1), delivered(2)])
    assert [d.seq for d in first] == [1, 2]
    assert log.record([]) == []
    second = log.record([delivered(3)])
    assert [d.seq for d in second] == [3]
    everything = first + second
    assert (log.last_seq, log.unacknowledged) == (3, 3)
    assert log.read(0, 10) == everything
    assert log.read(0, 2) == everything[:2]
    assert log.read(1, 10) == everything[1:]
    assert log.read(3, 10) == [] and log.read(0, 0) == []

    assert log.ack(2) is True
    assert (log.acked_seq, log.unacknowledged) == (2, 1)
    assert log.read(0, 10) == everything[2:]  # an acknowledged event never comes back
    assert log.ack(1) is False and log.ack(2) is False  # nothing moved
    assert log.ack(99) is True  # beyond the last: acknowledges what there is
    assert (log.acked_seq, log.unacknowledged, log.read(0, 10)) == (3, 0, [])
    assert [d.seq for d in log.record([delivered(4)])] == [4]  # numbering goes on


def test_every_kept_kind_survives_the_database_unchanged(tmp_path: Path) -> None:
    events = every_kind()
    for event in events:
        assert from_row(5, to_row(event)) == Delivery(5, event)
    marker = EventsDiscarded("", 2, 9, 4)
    assert from_row(9, to_row(marker)) == Delivery(9, marker)
    with pytest.raises(LocalProtocolError):
        to_row(SyncStatus("s", 0, 0, 0, False))  # live only: never kept

    stored = Stored(tmp_path / "s.sqlite")
    numbered = stored.record(events)
    stored.crash()
    assert read_all(stored.events) == numbered
    assert [d.event for d in numbered] == events


def test_an_eviction_is_kept_until_acknowledged_in_memory_and_stored(tmp_path: Path) -> None:
    evicted = MessageEvicted("v", DropReason.INCOMING_BUFFER_BYTES, "frank", 2, 1_234)
    memory, stored = EventLog(), Stored(tmp_path / "s.sqlite")
    for log, record in ((memory, memory.record), (stored.events, stored.record)):
        assert record([delivered(1), evicted]) == [Delivery(1, delivered(1)), Delivery(2, evicted)]
        log.ack(1)
        assert read_all(log) == [Delivery(2, evicted)]
    stored.state.commit()
    stored.restart()
    assert read_all(stored.events) == [Delivery(2, evicted)]  # the same, under its number
    stored.events.ack(2)
    stored.restart()
    assert read_all(stored.events) == []


def test_a_stored_log_keeps_what_is_unacknowledged_across_crashes(tmp_path: Path) -> None:
    stored = Stored(tmp_path / "s.sqlite")
    numbered = stored.record([delivered(i) for i in range(1, 6)])
    stored.events.ack(2)  # staged: stored with the next commit
    stored.crash()
    assert (stored.events.last_seq, stored.events.acked_seq) == (5, 0)
    assert read_all(stored.events) == numbered  # the acknowledgement was lost, not events

    stored.events.ack(2)
    more = stored.record([delivered(6)])  # this commit stores the acknowledgement
    assert [d.seq for d in more] == [6]
    stored.crash()
    assert stored.events.acked_seq == 2
    assert read_all(stored.events) == numbered[2:] + more
    assert stored.events.unacknowledged == 4

    stored.events.ack(4)
    stored.state.commit()  # an acknowledgement alone is stored too
    stored.crash()
    assert read_all(stored.events) == numbered[4:] + more
    stored.events.ack(6)
    stored.restart()  # a clean close stores the acknowledgement too
    assert (stored.events.last_seq, stored.events.acked_seq, stored.events.unacknowledged) == (
        6,
        6,
        0,
    )
    assert read_all(stored.events) == []
    assert [d.seq for d in stored.record([delivered(7)])] == [7]  # never a number again


def test_a_stored_log_reads_pages_across_what_it_holds_and_what_is_only_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_module, "HELD_EVENTS", 4)  # hold few: most reads hit SQLite
    stored = Stored(tmp_path / "s.sqlite")
    numbered: list[Delivery] = []
    for i in range(0, 30, 3):
        numbered += stored.record([delivered(i + k) for k in range(3)])
    for page in (1, 2, 5, 100):
        assert read_all(stored.events, page) == numbered
    for after in range(31):
        assert stored.events.read(after, 4) == numbered[after : after + 4]
    stored.events.ack(17)
    assert read_all(stored.events, 2) == numbered[17:]
    assert stored.events.unacknowledged == 13


# ------------------------------------------------------------------ the bound


@pytest.mark.parametrize("where", ["memory", "stored"])
def test_the_count_bound_discards_the_oldest_into_one_marker(tmp_path: Path, where: str) -> None:
    limits = EventLimits(max_events=8, max_bytes=1 << 20)
    log: EventLog
    if where == "memory":
        log = EventLog(limits)
        record = log.record
    else:
        stored = Stored(tmp_path / "s.sqlite", limits)
        log, record = stored.events, stored.record
    events = [delivered(1), MessageLost("lost"), *[delivered(i) for i in range(3, 10)]]
    record(events[:8])
    assert log.unacknowledged == 8 and all(
        not isinstance(d.event, EventsDiscarded) for d in log.read(0, 99)
    )
    record(events[8:])  # the ninth: down to 7/8 of the bound, the marker included
    kept = log.read(0, 99)
    assert kept[0] == Delivery(2, EventsDiscarded("", 1, 2, 1))  # one of the two was ready
    assert [(d.seq, d.event) for d in kept[1:]] == list(enumerate(events, start=1))[2:]
    assert log.unacknowledged == len(kept) == 8

    # Later discards merge into the marker while it is unacknowledged.
    record([delivered(10), delivered(11)])
    kept = log.read(0, 99)
    assert kept[0] == Delivery(4, EventsDiscarded("", 1, 4, 3))
    assert [d.seq for d in kept] == [4, *range(5, 12)]
    assert log.unacknowledged == 8

    # Acknowledged part way into the marker's range: it stays, the range as it was.
    log.ack(3)
    assert log.read(0, 1) == [Delivery(4, EventsDiscarded("", 1, 4, 3))]
    log.ack(4)
    assert log.read(0, 1)[0].seq == 5 and log.unacknowledged == 7
    if where == "stored":
        stored.restart()
        assert stored.events.read(0, 99) == kept[1:]
        assert stored.events.unacknowledged == 7


@pytest.mark.parametrize("where", ["memory", "stored"])
def test_the_byte_bound_counts_content_and_transmissions(tmp_path: Path, where: str) -> None:
    limits = EventLimits(max_events=1_000, max_bytes=100)
    log: EventLog
    if where == "memory":
        log = EventLog(limits)
        record = log.record
    else:
        stored = Stored(tmp_path / "s.sqlite", limits)
        log, record = stored.events, stored.record
    record([transmit(1, 40), MessageAcknowledged("a", True, "x"), transmit(2, 40)])
    record([delivered(4, 40)])  # 120 bytes: down to 88 at most
    kept = log.read(0, 99)
    assert kept[0] == Delivery(1, EventsDiscarded("", 1, 1, 0))  # not a delivery
    assert [d.seq for d in kept] == [1, 2, 3, 4]
    assert log.unacknowledged == 4
    record([delivered(5, 40), delivered(6, 40)])  # 160 bytes
    kept = log.read(0, 99)
    assert kept[0] == Delivery(4, EventsDiscarded("", 1, 4, 1))  # merged; 4 was ready
    assert [d.seq for d in kept] == [4, 5, 6]
    # One event larger than the bound: everything before it goes, never the newest.
    record([delivered(7, 500)])
    kept = log.read(0, 99)
    assert kept == [Delivery(6, EventsDiscarded("", 1, 6, 3)), Delivery(7, delivered(7, 500))]
    if where == "stored":
        stored.crash()
        assert stored.events.read(0, 99) == kept
        assert stored.events.unacknowledged == 2


def test_a_stored_bound_counts_what_earlier_lives_left(tmp_path: Path) -> None:
    limits = EventLimits(max_events=16, max_bytes=1 << 20)
    stored = Stored(tmp_path / "s.sqlite", limits)
    stored.record([delivered(i) for i in range(1, 17)])
    stored.crash()
    assert stored.events.unacknowledged == 16
    stored.record([delivered(17)])  # over the bound with what the database holds
    kept = read_all(stored.events)
    assert kept[0] == Delivery(3, EventsDiscarded("", 1, 3, 3))
    assert [d.seq for d in kept] == list(range(3, 18))
    assert stored.events.unacknowledged == 15


def test_event_limits_refuse_a_bound_that_cannot_hold_a_marker_and_an_event() -> None:
    for bad in ({"max_events": 1}, {"max_bytes": 0}):
        with pytest.raises(LocalProtocolError):
            EventLimits(**bad)  # type: ignore[arg-type]


# ------------------------------------------------------- known defects (src)


def test_a_small_count_bound_is_never_exceeded() -> None:
    log = EventLog(EventLimits(max_events=2, max_bytes=1 << 20))
    for i in range(1, 6):
        log.record([delivered(i)])
        assert log.unacknowledged == len(log.read(0, 99)) <= 2


def test_a_step_with_more_events_than_are_held_is_bounded_like_any_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_module, "HELD_EVENTS", 4)
    limits = EventLimits(max_events=8, max_bytes=1 << 20)
    stored = Stored(tmp_path / "s.sqlite", limits)
    memory = EventLog(limits)
    batches = [[delivered(i) for i in range(1, 4)], [delivered(i) for i in range(4, 12)]]
    for batch in batches:
        stored.record(batch)
        memory.record(batch)
    # Eleven events, eight at most: numbers 1..4 give way to one marker, 5..11 stay.
    assert memory.read(0, 99)[0] == Delivery(4, EventsDiscarded("", 1, 4, 4))
    assert read_all(stored.events) == read_all(memory)
    assert stored.events.unacknowledged == memory.unacknowledged == 8


# -------------------------------------------------- the state machine (model)

MIDS = st.sampled_from(["a", "b", "c"])
SMALL = st.binary(max_size=40)
HINTS = st.none() | st.binary(max_size=4)
EVENTS: st.SearchStrategy[Reported] = st.one_of(
    st.builds(MessageDelivered, MIDS, st.sampled_from(["", "s"]), st.integers(0, 9), SMALL, HINTS),
    st.builds(
        MessageDeliveredEarly,
        MIDS,
        st.just("s"),
        st.integers(0, 9),
        SMALL,
        HINTS,
        st.integers(0, 3),
    ),
    st.builds(Transmit, SMALL, MIDS, st.sampled_from(["content", "resend", "sync", "repair"])),
    st.builds(MessageAcknowledged, MIDS, st.booleans(), st.sampled_from(["", "x"])),
    st.builds(MessagePossiblyAcknowledged, MIDS, st.integers(0, 3), st.just("x")),
    st.builds(MessageMissing, MIDS, HINTS, st.none() | st.just("s")),
    st.builds(
        MessageEvicted,
        MIDS,
        st.sampled_from(DropReason),
        st.just("s"),
        st.integers(0, 9),
        st.integers(0, 99),
    ),
    st.builds(MessageLost, MIDS),
    st.builds(SendFailed, MIDS),
    st.builds(PeriodicSync, MIDS),
)


def size(event: Reported) -> int:
    if isinstance(event, Transmit):
        return len(event.data)
    if isinstance(event, MessageDelivered | MessageDeliveredEarly):
        return len(event.content)
    return 0


class EventLogs(RuleBasedStateMachine):
    """EventLog and StoredEventLog fed the same events and acknowledgements; the stored one
    also crashes (staged acknowledgements lost) and restarts. Both are checked against the
    model after every step, and against each other while their acknowledgements agree."""

    # The bound's count, and whether the test avoids the known defects (see above).
    min_events = 8
    max_batch = 8

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="event-log-"))
        self.recorded: dict[int, Reported] = {}
        self.acked = {"memory": 0, "stored": 0}
        self.stored_ack = 0  # as of the last commit
        # A crash lost an acknowledgement: from then on the stored log bounds a different
        # set of events than the memory one, and their discards differ.
        self.diverged = False

    @initialize(max_events=st.integers(2, 12), max_bytes=st.integers(1, 200))
    def open_logs(self, max_events: int, max_bytes: int) -> None:
        self.limits = EventLimits(max(max_events, self.min_events), max_bytes)
        self.memory = EventLog(self.limits)
        self.stored = Stored(self.dir / "s.sqlite", self.limits)

    def teardown(self) -> None:
        if hasattr(self, "stored"):
            self.stored.state.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def last(self) -> int:
        return len(self.recorded)

    def logs(self) -> list[tuple[str, EventLog]]:
        return [("memory", self.memory), ("stored", self.stored.events)]

    @rule(data=st.data())
    def record(self, data: st.DataObject) -> None:
        events = data.draw(st.lists(EVENTS, max_size=self.max_batch))
        first = self.last + 1
        numbers = list(range(first, first + len(events)))
        assert [d.seq for d in self.memory.record(events)] == numbers
        assert [d.seq for d in self.stored.record(events)] == numbers
        self.recorded.update(zip(numbers, events, strict=True))
        self.stored_ack = self.acked["stored"]  # the commit stored it
        for _, log in self.logs():  # the bound holds after every record
            kept = read_all(log)
            assert log.unacknowledged <= self.limits.max_events
            real = [d for d in kept if not isinstance(d.event, EventsDiscarded)]
            held = sum(size(d.event) for d in real)
            assert held <= self.limits.max_bytes or [d.seq for d in real] == [self.last]

    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        through = data.draw(st.integers(0, self.last + 2))
        for name, log in self.logs():
            before = self.acked[name]
            after = max(before, min(through, self.last))
            assert log.ack(through) is (after > before)
            self.acked[name] = after

    @rule()
    def flush(self) -> None:
        self.stored.state.commit()
        self.stored_ack = self.acked["stored"]

    @rule()
    def crash(self) -> None:
        self.stored.crash()
        self.diverged |= self.acked["stored"] != self.stored_ack
        self.acked["stored"] = self.stored_ack

    @rule()
    def restart(self) -> None:
        self.stored.restart()
        self.stored_ack = self.acked["stored"]

    @precondition(lambda self: hasattr(self, "memory"))
    @rule(data=st.data())
    def read_a_page(self, data: st.DataObject) -> None:
        after = data.draw(st.integers(0, self.last + 1))
        limit = data.draw(st.integers(0, 5))
        for _, log in self.logs():
            everything = read_all(log, 100)
            expected = [d for d in everything if (d.seq or 0) > after][:limit]
            assert log.read(after, limit) == expected

    @invariant()
    def nothing_is_lost_silently(self) -> None:
        if not hasattr(self, "memory"):
            return
        listings = {}
        for name, log in self.logs():
            acked = self.acked[name]
            assert (log.last_seq, log.acked_seq) == (self.last, acked)
            kept = read_all(log, 3)
            listings[name] = kept
            assert log.unacknowledged == len(kept)
            covered: list[int] = []
            for d in kept:
                assert d.seq is not None and acked < d.seq <= self.last
                event = d.event
                if isinstance(event, EventsDiscarded):
                    assert event.last_seq == d.seq and 1 <= event.first_seq <= d.seq
                    gone = range(event.first_seq, d.seq + 1)
                    ready = sum(isinstance(self.recorded[s], MessageDelivered) for s in gone)
                    assert event.ready == ready
                    covered += [s for s in gone if s > acked]
                else:
                    assert event == self.recorded[d.seq]  # its number, its content
                    covered.append(d.seq)
            # Every unacknowledged number is read back, or named discarded, exactly once.
            assert covered == list(range(acked + 1, self.last + 1))
        if not self.diverged:
            assert listings["memory"] == listings["stored"]


def run_machine(machine: type[EventLogs], examples: int) -> None:
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=40,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_nothing_is_lost_silently_memory_and_stored_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hold few events in memory, so that reads, acknowledgements and discards cross from
    # the held tail into what only the database has.
    monkeypatch.setattr(state_module, "HELD_EVENTS", 2 * EventLogs.max_batch)
    run_machine(EventLogs, 150)
