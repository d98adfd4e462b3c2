"""ReliabilityManager's events: at least once, under stable numbers, across raising
callbacks and kill -9 — and the API that came with them.

Attacked here:

* a callback that raises holds its channel's events (that event and every later one) and
  they are reported again REDELIVER_MS later under the same numbers; other channels are
  not held;
* a process SIGKILLed inside a callback (before and after the application processed the
  event, at every event of a workload) or at the ``commit`` crash point
  (SDSYNC_CRASH_AT=commit:N, at every step) loses nothing: on restart the event it died
  in and every later committed one are reported again, each under its number with its
  payload, exactly as a run without a kill numbered them;
* ``wrap`` under an explicit id is idempotent for the same payload (same bytes, nothing
  changes, also after a restart) and refuses another payload;
* a payload whose message would exceed ``max_message_bytes`` is refused and changes
  nothing, while one just under the limit goes through and is accepted by a peer;
* ``close_channel`` / ``reopen_channels``, ``unacknowledged`` / ``waiting``,
  ``set_participant_count`` across restarts, and the ``explicit`` acknowledge mode.

Time is a fake clock; processes are killed at chosen points, never at a lucky moment.
"""

from __future__ import annotations

import gc
import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from manager_events_peer import CHANNEL, CONFIG, RUNTIME, START, Clock, bob, describe

from sdsync.core import MessageChannel, MessageDelivered, MessageMissing
from sdsync.errors import LocalProtocolError, MessageTooLargeError
from sdsync.runtime import (
    Delivery,
    OwnMessage,
    ReliabilityManager,
    Transmit,
    WaitingMessage,
    Wrapped,
    state_path,
)
from sdsync.runtime.manager import REDELIVER_MS
from sdsync.wire import WireLimits, decode

PEER = Path(__file__).parent / "manager_events_peer.py"
PATIENCE_S = 300  # liveness bound for the subprocess only


def make(
    name: str, clock: Clock, state_dir: Path | None = None, **options: object
) -> ReliabilityManager:
    settings: dict[str, object] = {"config": CONFIG, "runtime": RUNTIME}
    settings.update(options)
    return ReliabilityManager(
        name,
        rng=random.Random(name),
        clock=clock,
        state_dir=state_dir,
        **settings,  # type: ignore[arg-type]
    )


def crash(m: ReliabilityManager) -> None:
    """Gone without close(): only what each step committed remains (the SQLite
    connections are dropped without another statement)."""
    for opened in m._channels.values():
        if opened.state is not None:
            opened.state._db.close()
    m._channels.clear()
    del m
    gc.collect()


def tick_until(m: ReliabilityManager, clock: Clock, until: int) -> None:
    """The application's timer: tick whenever the manager says it has work."""
    while (due := m.next_due()) is not None and due <= until:
        clock.now = max(clock.now, due)
        m.tick()


def alice_channel() -> MessageChannel:
    return MessageChannel(CHANNEL, "alice", now_ms=START, config=CONFIG)


# -------------------------------------------------------------- raising callbacks


@pytest.mark.parametrize("durable", [False, True])
def test_a_raising_callback_holds_its_channel_and_is_reported_again_under_its_number(
    tmp_path: Path, durable: bool
) -> None:
    clock = Clock()
    m = make("bob", clock, tmp_path if durable else None)
    calls: list[tuple[str, Delivery]] = []
    failing = {"c": 1}  # channel -> calls still to fail

    def on_event(channel_id: str, delivery: Delivery) -> None:
        calls.append((channel_id, delivery))
        if failing.get(channel_id):
            failing[channel_id] -= 1
            raise RuntimeError("application bug")

    m.on_event = on_event
    m.open_channel("c")
    m.open_channel("d")
    alice = alice_channel()
    other = MessageChannel("d", "alice", now_ms=START, config=CONFIG)
    wires = [alice.send(f"m{i}".encode(), START + i).data for i in range(3)]

    m.unwrap_received_message(wires[0])
    assert m.callback_errors == 1 and len(calls) == 1
    first = calls[0][1]
    assert first.seq == 1 and isinstance(first.event, MessageDelivered)
    for data in wires[1:]:
        assert m.unwrap_received_message(data).payload is not None  # state moves on
    assert len(calls) == 1  # ... but nothing more is reported on "c"
    assert m.event_positions("c") == (3, 0)
    m.unwrap_received_message(other.send(b"elsewhere", START).data)
    assert [(ch, d.seq) for ch, d in calls[1:]] == [("d", 1)]  # "d" is not held

    tick_until(m, clock, START + REDELIVER_MS - 1)
    assert [ch for ch, _ in calls].count("c") == 1
    tick_until(m, clock, START + REDELIVER_MS)
    again = [d for ch, d in calls if ch == "c"]
    assert again[0] == again[1] == first  # the same event under the same number
    assert [d.seq for d in again[1:]] == list(range(1, m.event_positions("c")[0] + 1))
    assert [d.event.content for d in again[1:4]] == [b"m0", b"m1", b"m2"]  # type: ignore[union-attr]
    last, acked = m.event_positions("c")
    assert last == acked and m.callback_errors == 1

    # A later event that raises: those before it are not reported again.
    failing["c"] = 1
    before = len(calls)
    m.unwrap_received_message(alice.send(b"m3", START + 10).data)
    failed = calls[before][1]
    assert failed.seq == last + 1 and m.callback_errors == 2
    if durable:  # the process dies while the event waits: it comes back under its number
        crash(m)
        calls.clear()
        m = make("bob", clock, tmp_path)
        m.on_event = on_event
        assert m.reopen_channels() == ["c", "d"]
        after = [d for ch, d in calls if ch == "c"]
    else:
        tick_until(m, clock, clock.now + REDELIVER_MS)
        after = [d for ch, d in calls[before + 1 :] if ch == "c"]
    assert after[0] == failed
    assert [d.seq for d in after] == list(range(failed.seq, m.event_positions("c")[0] + 1))
    assert m.event_positions("c")[1] == m.event_positions("c")[0]


def test_tick_with_an_explicit_time_reports_held_events_again() -> None:
    clock = Clock()
    m = make("bob", clock)
    seen: list[int | None] = []
    fail = [True]

    def on_event(channel_id: str, delivery: Delivery) -> None:
        if fail[0]:
            raise RuntimeError("application bug")
        seen.append(delivery.seq)

    m.on_event = on_event
    m.open_channel(CHANNEL)
    m.unwrap_received_message(alice_channel().send(b"x", START).data)
    fail[0] = False
    m.tick(START + REDELIVER_MS)  # the application's own time; the clock is not read
    assert seen[:1] == [1]


# ------------------------------------------------------------ killed processes


Line = tuple[int, str, str, str]


def parse(line: str) -> Line:
    seq, kind, mid, payload = line.split()
    return int(seq), kind, mid, payload


def as_line(delivery: Delivery) -> Line:
    return parse(describe(delivery))


def run_peer(root: Path, plans: list[str], env: dict[str, str] | None = None) -> dict[str, str]:
    answer = subprocess.run(
        [sys.executable, str(PEER), str(root), *plans],
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
        env={**os.environ, **(env or {})},
        check=True,
    )
    return json.loads(answer.stdout)  # type: ignore[no-any-return]


def printed(root: Path, plan: str) -> tuple[list[Line], int | None, list[str]]:
    """The events a life's callback had written, the number it died in, other lines."""
    events, dying, rest = [], None, []
    for line in (root / f"{plan}.txt").read_text().splitlines():
        if line.startswith("dying "):
            dying = int(line.split()[1])
        elif line[0].isdigit():
            events.append(parse(line))
        else:
            rest.append(line)
    return events, dying, rest


def restart(root: Path, plan: str) -> tuple[list[Line], tuple[int, int]]:
    """Reopen a dead life's state as its restart would: what is reported, and the event
    positions afterwards."""
    reported: list[Delivery] = []
    m = bob(root / plan, Clock(START + 3_600_000))
    m.on_event = lambda channel_id, d: reported.append(d)
    assert m.reopen_channels() == [CHANNEL]
    positions = m.event_positions(CHANNEL)
    m.close()
    again = bob(root / plan, Clock(START + 3_600_000))
    again.on_event = lambda channel_id, d: pytest.fail(f"reported after acknowledged: {d}")
    again.reopen_channels()
    assert again.event_positions(CHANNEL) == positions
    again.close()
    return [as_line(d) for d in reported], positions


def check_life(root: Path, plan: str, reference: list[Line]) -> tuple[int, int]:
    """A killed life lost nothing: what its callbacks saw, then what its restart reports,
    is the reference run's numbering up to the last committed event, without a gap; the
    event it died in is among those reported again. Returns (first reported again, last)."""
    seen, dying, _ = printed(root, plan)
    assert seen == reference[: len(seen)], "numbered differently from the run without a kill"
    reported, (last, acked) = restart(root, plan)
    assert last == acked  # the restart reported and acknowledged everything
    assert len(seen) <= last <= len(reference)
    first = reported[0][0] if reported else last + 1
    assert reported == reference[first - 1 : last], "reported again under other numbers"
    assert first <= len(seen) + 1, "committed events neither seen nor reported again"
    if dying is not None:
        assert first <= dying <= last, "the event the process died in was not reported again"
    return first, last


def test_a_process_killed_at_any_event_or_commit_loses_no_event(tmp_path: Path) -> None:
    root = tmp_path / "lives"
    root.mkdir()
    assert run_peer(root, ["ref"]) == {"ref": "exited 0"}
    reference, _, tail = printed(root, "ref")
    commits = int(tail[0].split()[1])
    assert tail == [f"commits {commits}", "done"]
    assert [seq for seq, *_ in reference] == list(range(1, len(reference) + 1))
    kinds = {kind for _, kind, _, _ in reference}
    assert kinds >= {"MessageDelivered", "MessageMissing", "MessageAcknowledged"}
    assert kinds >= {"Transmit", "PeriodicSync", "SendFailed"}  # the workload covers them
    # Every event: killed in its callback before and after the application processed it;
    # every step: killed between its commit and its callbacks; one step more: no kill.
    plans = [f"{when}:{k}" for k in range(1, len(reference) + 1) for when in ("before", "after")]
    plans += [f"commit:{n}" for n in range(1, commits + 2)]
    fates = run_peer(root, plans)
    assert fates == {p: "killed" for p in plans[:-1]} | {plans[-1]: "exited 0"}

    redelivered = 0
    for plan in plans[:-1]:
        first, last = check_life(root, plan, reference)
        redelivered += last - first + 1
        if plan.startswith("after:"):
            seen, dying, _ = printed(root, plan)
            assert dying == seen[-1][0]  # processed, then killed: reported a second time
    assert redelivered > len(plans)  # kills did fall where events were not acknowledged
    # The run that was not killed left nothing to report.
    assert check_life(root, plans[-1], reference) == (len(reference) + 1, len(reference))


def test_the_crash_point_armed_from_the_environment_at_start(tmp_path: Path) -> None:
    """SDSYNC_CRASH_AT set when the interpreter starts (not re-armed after a fork)."""
    root = tmp_path / "lives"
    root.mkdir()
    run_peer(root, ["ref", "commit:7"])
    reference, _, _ = printed(root, "ref")
    assert run_peer(root, ["inherited"], {"SDSYNC_CRASH_AT": "commit:7"}) == {"inherited": "killed"}
    assert printed(root, "inherited")[0] == printed(root, "commit:7")[0]
    assert check_life(root, "inherited", reference) == check_life(root, "commit:7", reference)
    with pytest.raises(subprocess.CalledProcessError):
        run_peer(root, ["nonsense"], {"SDSYNC_CRASH_AT": "commit:0"})  # refused at import


# --------------------------------------------------------------- idempotent wraps


def snapshot(m: ReliabilityManager, channel_id: str) -> tuple[object, ...]:
    channel = m.channel(channel_id)
    return (
        channel.lamport_timestamp,
        channel.outgoing_ids(),
        channel.log_ids(),
        channel.bloom_bytes(),
        m.event_positions(channel_id),
        m.unacknowledged(channel_id),
    )


@pytest.mark.parametrize("durable", [False, True])
def test_a_repeated_wrap_under_an_explicit_id_returns_the_same_bytes(
    tmp_path: Path, durable: bool
) -> None:
    clock = Clock()
    state_dir = tmp_path if durable else None
    m = make("bob", clock, state_dir)
    first = m.wrap(b"payload", "c", message_id="id-1")
    assert (first.message_id, first.repeated) == ("id-1", False)
    assert decode(first.data).content == b"payload"
    before = snapshot(m, "c")
    clock.now += 50
    assert m.wrap(b"payload", "c", message_id="id-1") == Wrapped(first.data, "id-1", True)
    assert m.wrap_outgoing_message(b"payload", "c", message_id="id-1") == first.data
    assert snapshot(m, "c") == before  # nothing changed: no second message, no event
    with pytest.raises(LocalProtocolError, match="another payload"):
        m.wrap(b"other payload", "c", message_id="id-1")
    assert snapshot(m, "c") == before
    second = m.wrap(b"payload", "c", message_id="id-2")  # a new id is a new message
    assert not second.repeated and second.data != first.data

    # Once acknowledged (out of the outgoing buffer) the id still answers the same.
    peer = make("alice", clock)
    peer.open_channel("c")
    peer.unwrap_received_message(first.data)
    peer.unwrap_received_message(second.data)
    sync = peer.build_sync_message("c")
    assert sync is not None
    m.unwrap_received_message(sync)
    assert m.unacknowledged("c") == []
    assert m.wrap(b"payload", "c", message_id="id-1") == Wrapped(first.data, "id-1", True)
    if not durable:
        return
    crash(m)  # the wrap was kept by the step's commit
    m = make("bob", clock, tmp_path)
    m.open_channel("c")
    before = snapshot(m, "c")
    assert m.wrap(b"payload", "c", message_id="id-2") == Wrapped(second.data, "id-2", True)
    with pytest.raises(LocalProtocolError):
        m.wrap(b"different", "c", message_id="id-1")
    assert snapshot(m, "c") == before


def test_the_payload_id_scheme_makes_every_wrap_of_a_payload_a_repeat(tmp_path: Path) -> None:
    clock = Clock()
    config = replace(CONFIG, message_id_scheme="payload")
    m = make("bob", clock, tmp_path, config=config)
    first = m.wrap(b"same", "c")
    assert m.wrap(b"same", "c") == replace(first, repeated=True)
    assert len(m.unacknowledged("c")) == 1
    crash(m)
    m = make("bob", clock, tmp_path, config=config)
    assert m.wrap(b"same", "c") == replace(first, repeated=True)
    assert not m.wrap(b"another", "c").repeated


# ------------------------------------------------------------------ the size limit

LIMIT = 2_000
SMALL_WIRE = replace(CONFIG, limits=WireLimits(max_message_bytes=LIMIT))


def busy(clock: Clock, state_dir: Path | None = None) -> ReliabilityManager:
    """A manager with some history (causal history and bloom filter are not empty)."""
    m = make("bob", clock, state_dir, config=SMALL_WIRE)
    alice = MessageChannel(CHANNEL, "alice", now_ms=START, config=SMALL_WIRE)
    m.open_channel(CHANNEL)
    for i in range(4):
        m.unwrap_received_message(alice.send(f"a{i}".encode(), START + i).data)
        m.wrap(f"b{i}".encode(), CHANNEL)
    return m


def largest_payload_that_fits() -> int:
    """By bisection, each probe on a fresh identical manager."""
    low, high = 1, LIMIT  # fits, does not fit
    while high - low > 1:
        middle = (low + high) // 2
        try:
            busy(Clock()).wrap(b"x" * middle, CHANNEL, message_id="big")
            low = middle
        except MessageTooLargeError:
            high = middle
    return low


@pytest.mark.parametrize("durable", [False, True])
def test_an_oversize_payload_is_refused_and_changes_nothing(tmp_path: Path, durable: bool) -> None:
    fits = largest_payload_that_fits()
    assert 100 < fits < LIMIT  # the rest is metadata (the bloom filter, mostly)
    clock = Clock()
    m = busy(clock, tmp_path if durable else None)
    before = snapshot(m, CHANNEL)
    for size in (fits + 1, 2 * LIMIT, 1 << 20):
        with pytest.raises(MessageTooLargeError, match="max_message_bytes"):
            m.wrap(b"x" * size, CHANNEL, message_id="big")
        assert snapshot(m, CHANNEL) == before
    assert issubclass(MessageTooLargeError, LocalProtocolError)
    if durable:
        crash(m)
        m = busy_reopened(clock, tmp_path)
        assert snapshot(m, CHANNEL) == before  # nothing was stored either
    # The refused id was not used up; just under the limit goes through.
    wrapped = m.wrap(b"y" * fits, CHANNEL, message_id="big")
    assert not wrapped.repeated and LIMIT - 2 <= len(wrapped.data) <= LIMIT
    peer = make("carol", Clock(), config=SMALL_WIRE)
    peer.open_channel(CHANNEL)
    result = peer.unwrap_received_message(wrapped.data)
    assert (result.message_id, result.payload) == ("big", b"y" * fits)


def test_an_oversize_wrap_on_a_channel_not_open_leaves_it_unopened(tmp_path: Path) -> None:
    m = make("bob", Clock(), tmp_path, config=SMALL_WIRE)
    with pytest.raises(MessageTooLargeError):
        m.wrap(b"x" * LIMIT, "fresh")
    assert m.channels() == [] and list(tmp_path.iterdir()) == []
    assert m.reopen_channels() == []


def busy_reopened(clock: Clock, state_dir: Path) -> ReliabilityManager:
    m = make("bob", clock, state_dir, config=SMALL_WIRE)
    m.open_channel(CHANNEL)
    return m


# --------------------------------------------------------------- closing channels


def test_closed_channels_stay_closed_and_the_others_reopen_with_their_events(
    tmp_path: Path,
) -> None:
    clock = Clock()
    m = make("bob", clock, tmp_path)
    held: list[Delivery] = []

    def on_event(channel_id: str, delivery: Delivery) -> None:
        if channel_id == "room/2":
            held.append(delivery)
            raise RuntimeError("not now")  # its events stay unacknowledged

    m.on_event = on_event
    senders = {c: MessageChannel(c, "alice", now_ms=START, config=CONFIG) for c in ("a", "b")}
    senders["room/2"] = MessageChannel("room/2", "alice", now_ms=START, config=CONFIG)
    for channel_id, sender in senders.items():
        m.open_channel(channel_id)
        m.unwrap_received_message(sender.send(channel_id.encode(), START).data)
    m.close_channel("b")
    m.close_channel("b")  # idempotent
    m.close_channel("never opened")
    assert m.channels() == ["a", "room/2"]
    assert state_path(tmp_path, "room/2").parent == tmp_path
    crash(m)

    reported: list[tuple[str, Delivery]] = []
    m = make("bob", clock, tmp_path)
    m.on_event = lambda channel_id, d: reported.append((channel_id, d))
    assert m.reopen_channels() == ["a", "room/2"]  # name order; "b" was closed
    assert m.channels() == ["a", "room/2"]
    assert [d for ch, d in reported if ch == "room/2"][: len(held)] == held[:1]
    assert m.reopen_channels() == []  # all open already
    m.open_channel("b")  # opened on purpose: its state is all there
    assert [r.content for r in m.history("b")] == [b"b"]
    m.close()  # closing the manager is not closing its channels
    m = make("bob", clock, tmp_path)
    assert m.reopen_channels() == ["a", "b", "room/2"]
    m.close()


# ---------------------------------------------------- what is outstanding, waiting


@pytest.mark.parametrize("durable", [False, True])
def test_unacknowledged_and_waiting_say_what_is_outstanding(tmp_path: Path, durable: bool) -> None:
    clock = Clock()
    state_dir = tmp_path if durable else None
    m = make("bob", clock, state_dir)
    alice = alice_channel()
    mine = [m.wrap(f"mine {i}".encode(), CHANNEL) for i in range(2)]
    lamports = [decode(w.data).lamport_timestamp for w in mine]
    assert m.unacknowledged(CHANNEL) == [
        OwnMessage(w.message_id, ts or 0, f"mine {i}".encode(), 1, 0, START)
        for i, (w, ts) in enumerate(zip(mine, lamports, strict=True))
    ]
    lost = alice.send(b"lost for now", START + 1)
    later = alice.send(b"depends on it", START + 2)
    clock.now = START + 5
    result = m.unwrap_received_message(later.data)
    assert result.missing_dependencies == [lost.message.message_id]
    expected_waiting = [
        WaitingMessage(
            later.message.message_id,
            "alice",
            later.message.lamport_timestamp or 0,
            b"depends on it",
            [lost.message.message_id],
            START + 5,
        )
    ]
    assert m.waiting(CHANNEL) == expected_waiting
    tick_until(m, clock, START + RUNTIME.resend_interval_ms)  # both resent once
    outstanding = m.unacknowledged(CHANNEL)
    assert [(o.message_id, o.attempts) for o in outstanding] == [(w.message_id, 2) for w in mine]
    if durable:
        crash(m)
        m = make("bob", clock, tmp_path)
        m.open_channel(CHANNEL)
        assert m.unacknowledged(CHANNEL) == outstanding
        assert m.waiting(CHANNEL) == expected_waiting

    m.unwrap_received_message(lost.data)
    assert m.waiting(CHANNEL) == []
    alice.receive(mine[0].data, clock.now)
    m.unwrap_received_message(alice.send(b"ack", clock.now).data)
    assert [o.message_id for o in m.unacknowledged(CHANNEL)] == [mine[1].message_id]
    with pytest.raises(LocalProtocolError):
        m.waiting("not open")


# ------------------------------------------------------------- participant count


def test_the_participant_count_is_stored_with_the_channel(tmp_path: Path) -> None:
    runtime = replace(RUNTIME, sync_ms_per_participant=1_000)  # 10 participants: 10 s syncs
    clock = Clock()
    m = make("bob", clock, tmp_path, runtime=runtime)
    m.open_channel(CHANNEL)
    m.open_channel("other")
    assert m.participant_count(CHANNEL) is None
    with pytest.raises(LocalProtocolError):
        m.set_participant_count(CHANNEL, 0)
    m.set_participant_count(CHANNEL, 10)
    assert m.participant_count(CHANNEL) == 10
    crash(m)

    def first_sync_after_a_received_one(channel_id: str) -> int:
        """After a received sync ours waits a whole interval (and up to one more)."""
        m = make("bob", clock, tmp_path, runtime=runtime)
        transmits: list[tuple[int, str]] = []
        m.on_transmit = lambda ch, kind, mid, data: transmits.append((clock.now, kind))
        m.open_channel(channel_id)
        alice = MessageChannel(channel_id, "alice", now_ms=clock.now, config=CONFIG)
        m.unwrap_received_message(alice.send(b"history", clock.now).data)
        # Bob owes alice an acknowledgement first, which no received sync defers.
        tick_until(m, clock, clock.now + 30_000)
        assert any(kind == "sync" for _, kind in transmits)
        transmits.clear()
        sync = alice.send_sync(clock.now)
        assert sync is not None
        m.unwrap_received_message(sync.data)
        received = clock.now
        tick_until(m, clock, received + 30_000)
        count = m.participant_count(channel_id)
        m.close()
        (at, _) = next(t for t in transmits if t[1] == "sync")
        assert count == (10 if channel_id == CHANNEL else None)
        return at - received

    assert first_sync_after_a_received_one(CHANNEL) >= 10_000  # the count was restored
    assert first_sync_after_a_received_one("other") < 2 * RUNTIME.sync_interval_ms
    m = make("bob", clock)
    m.open_channel(CHANNEL)
    m.set_participant_count(CHANNEL, 3)  # without a state_dir: kept in memory only
    assert m.participant_count(CHANNEL) == 3


# ------------------------------------------------------------------ explicit mode


def test_explicit_mode_keeps_events_until_acknowledged_across_restarts(tmp_path: Path) -> None:
    clock = Clock()
    m = make("bob", clock, tmp_path, acknowledge="explicit")
    heard: list[Delivery] = []
    ready: list[str] = []
    m.on_event = lambda ch, d: heard.append(d)
    m.on_message_ready = lambda ch, mid: ready.append(mid)
    alice = alice_channel()
    m.open_channel(CHANNEL)
    lost = alice.send(b"m0", START)
    for i in range(1, 4):
        m.unwrap_received_message(alice.send(f"m{i}".encode(), START + i).data)
    m.unwrap_received_message(lost.data)
    kinds = [type(d.event) for d in heard]
    assert kinds[0] is MessageMissing and kinds.count(MessageDelivered) == 4
    assert [d.seq for d in heard] == list(range(1, len(heard) + 1))  # each notified once
    assert len(ready) == 4
    assert m.read_events(CHANNEL, 0) == heard  # still there: nothing acknowledged
    assert m.read_events(CHANNEL, 2, limit=2) == heard[2:4]
    assert m.event_positions(CHANNEL) == (len(heard), 0)

    m.ack_events(CHANNEL, 2)  # stored at once
    assert m.read_events(CHANNEL, 0) == heard[2:]
    crash(m)
    m = make("bob", clock, tmp_path, acknowledge="explicit")
    again: list[Delivery] = []
    m.on_event = lambda ch, d: again.append(d)
    m.open_channel(CHANNEL)
    assert again == []  # explicit: reopening notifies nobody; the events wait to be read
    assert m.read_events(CHANNEL, 0) == heard[2:]  # same numbers, same events
    assert m.event_positions(CHANNEL) == (len(heard), 2)
    m.ack_events(CHANNEL, 10_000)  # beyond the last: everything there is
    assert m.read_events(CHANNEL, 0) == []
    crash(m)
    m = make("bob", clock, tmp_path, acknowledge="explicit")
    m.open_channel(CHANNEL)
    assert m.read_events(CHANNEL, 0) == []
    assert m.event_positions(CHANNEL) == (len(heard), len(heard))

    # A raising callback in explicit mode: counted, not retried, the event stays readable.
    notified: list[Delivery] = []

    def boom(channel_id: str, delivery: Delivery) -> None:
        notified.append(delivery)
        if isinstance(delivery.event, MessageDelivered):
            raise RuntimeError("application bug")

    m.on_event = boom
    m.unwrap_received_message(alice.send(b"m4", START + 10).data)
    assert m.callback_errors == 1
    [late] = [d for d in m.read_events(CHANNEL, 0) if isinstance(d.event, MessageDelivered)]
    assert late.seq is not None and late.seq > len(heard)
    tick_until(m, clock, clock.now + 2 * REDELIVER_MS)
    assert m.callback_errors == 1 and notified.count(late) == 1
    assert late in m.read_events(CHANNEL, 0)
    with pytest.raises(LocalProtocolError):
        ReliabilityManager("x", acknowledge="sometimes")  # type: ignore[arg-type]


def test_transmits_are_events_with_their_bytes(tmp_path: Path) -> None:
    """on_transmit's bytes are the numbered Transmit's, and a restart re-reports them."""
    clock = Clock()
    m = make("bob", clock, tmp_path, acknowledge="explicit")
    wire = m.wrap(b"resend me", CHANNEL)
    tick_until(m, clock, START + RUNTIME.resend_interval_ms)
    resends = [d for d in m.read_events(CHANNEL, 0) if isinstance(d.event, Transmit)]
    assert resends and resends[0].event.data == wire.data  # type: ignore[union-attr]
    assert resends[0].event.kind == "resend"  # type: ignore[union-attr]
    crash(m)
    m = make("bob", clock, tmp_path, acknowledge="explicit")
    m.open_channel(CHANNEL)
    assert [d for d in m.read_events(CHANNEL, 0) if isinstance(d.event, Transmit)] == resends
