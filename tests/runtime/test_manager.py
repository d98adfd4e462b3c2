"""ReliabilityManager: the reliability API (seed 004) doing everything the protocol requires.

The managers here meet only through bytes the test carries: ``wrap_outgoing_message``'s
return value and ``on_transmit``. Time is a fake clock the test advances; nothing but
``tick`` (and the manager's own ``next_due``) decides when anything happens.
"""

from __future__ import annotations

import gc
import itertools
import logging
import random
import sqlite3
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from sdsync import ReliabilityManager as TopLevelManager
from sdsync.core import BloomParams, ChannelConfig, LogEntry, MessageDelivered
from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.runtime import Delivery, ReliabilityManager, RuntimeConfig, state_path
from sdsync.runtime import manager as manager_module
from sdsync.wire import decode

CONFIG = ChannelConfig(
    bloom=BloomParams(1_000, 0.01), causal_history_size=2, own_log_policy="on_ack"
)
# One sender's messages form a chain only when its own enter the log at once.
ON_SEND = replace(CONFIG, own_log_policy="on_send")
RUNTIME = RuntimeConfig(
    sync_interval_ms=4_000,
    resend_interval_ms=1_000,
    resend_possibly_acknowledged_ms=3_000,
    resend_backoff=2.0,
    max_resend_interval_ms=5_000,
    resend_jitter=0.25,
    max_attempts=5,
    incoming_sweep_ms=500,
)
START = 1_700_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = START

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


@dataclass
class Heard:
    """Every callback of one manager, in order."""

    ready: list[str] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)
    possibly: list[str] = field(default_factory=list)
    missing: list[list[str]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    transmits: list[tuple[int, str, str, bytes]] = field(default_factory=list)
    syncs: list[str] = field(default_factory=list)

    def kinds(self, kind: str) -> list[str]:
        return [mid for _, k, mid, _ in self.transmits if k == kind]


def manager(
    pid: str, clock: Clock, *, seed: int = 1, **kwargs: object
) -> tuple[ReliabilityManager, Heard]:
    options: dict[str, object] = {"config": CONFIG, "runtime": RUNTIME}
    options.update(kwargs)
    m = ReliabilityManager(pid, clock=clock, rng=random.Random(seed), **options)  # type: ignore[arg-type]
    heard = Heard()
    m.on_message_ready = lambda ch, mid: heard.ready.append(mid)
    m.on_message_sent = lambda ch, mid: heard.sent.append(mid)
    m.on_possibly_acknowledged = lambda ch, mid, n: heard.possibly.append(mid)
    m.on_missing_dependencies = lambda ch, ids: heard.missing.append(ids)
    m.on_send_failed = lambda ch, mid: heard.failed.append(mid)
    m.on_transmit = lambda ch, kind, mid, data: heard.transmits.append((clock.now, kind, mid, data))
    m.on_periodic_sync = heard.syncs.append
    return m, heard


# --------------------------------------------------------------- the old API


def test_wrap_unwrap_and_callbacks_across_channels() -> None:
    clock = Clock()
    (alice, alice_heard), (bob, bob_heard) = manager("alice", clock), manager("bob", clock)
    for channel_id in ("general", "random"):
        bob.open_channel(channel_id)

    w1 = alice.wrap_outgoing_message(b"hi general", "general")
    w2 = alice.wrap_outgoing_message(b"hi random", "random", message_id="r-1")
    assert alice.channels() == ["general", "random"]  # wrapping opened them
    assert alice_heard.transmits == []  # the first transmission is the caller's own
    r1, r2 = bob.unwrap_received_message(w1), bob.unwrap_received_message(w2)
    assert (r1.payload, r1.channel_id, r1.missing_dependencies) == (b"hi general", "general", [])
    assert (r2.payload, r2.channel_id, r2.message_id) == (b"hi random", "random", "r-1")
    assert r1.channel_open and r2.channel_open
    assert bob_heard.ready == [r1.message_id, "r-1"]

    alice.unwrap_received_message(bob.wrap_outgoing_message(b"hello", "general"))
    assert alice_heard.sent == [r1.message_id]
    assert bob.unwrap_received_message(w1).payload is None  # duplicate: nothing new
    assert TopLevelManager is ReliabilityManager


def test_missing_dependencies_found_in_application_history() -> None:
    clock = Clock()
    alice, _ = manager("alice", clock, config=ON_SEND)
    alice.wrap_outgoing_message(b"1", "c")  # never reaches bob
    second = alice.wrap_outgoing_message(b"2", "c")
    bob, heard = manager("bob", clock, config=ON_SEND)
    bob.open_channel("c")
    result = bob.unwrap_received_message(second)
    assert result.payload == b"2"  # shown at once, with a "missing before" marker
    first_id = result.missing_dependencies[0]
    assert heard.missing == [[first_id]] and heard.ready == []
    bob.mark_dependencies_met([first_id], "c")
    assert heard.ready == [result.message_id]


def test_dependencies_in_long_term_storage_count_as_met() -> None:
    clock = Clock()
    alice, _ = manager("alice", clock, config=ON_SEND)
    alice.wrap_outgoing_message(b"old", "c")
    new = alice.wrap_outgoing_message(b"new", "c")
    old_id = alice.channel("c").log_ids()[0]
    bob, _ = manager(
        "bob", clock, config=ON_SEND, history_store_factory=lambda _: IdStore({old_id})
    )
    bob.open_channel("c")
    assert bob.unwrap_received_message(new).missing_dependencies == []


def test_bad_bytes_raise_remote_error() -> None:
    m, _ = manager("x", Clock())
    with pytest.raises(RemoteProtocolError):
        m.unwrap_received_message(b"\x00\x01garbage")


def test_wrapping_the_same_payload_twice_gives_two_messages() -> None:
    """The default id covers sender and Lamport timestamp: "ok" twice is two messages."""
    clock = Clock()
    alice, _ = manager("alice", clock)
    bob, heard = manager("bob", clock)
    bob.open_channel("general")
    for _ in range(2):
        bob.unwrap_received_message(alice.wrap_outgoing_message(b"ok", "general"))
    assert len(set(heard.ready)) == 2


# ------------------------------------------------------------------- channels


def test_bytes_for_an_unopened_channel_change_nothing(tmp_path: Path) -> None:
    clock = Clock()
    alice, _ = manager("alice", clock)
    wire = alice.wrap_outgoing_message(b"hi", "elsewhere")
    bob, heard = manager("bob", clock, state_dir=tmp_path)
    result = bob.unwrap_received_message(wire)
    assert (result.payload, result.missing_dependencies, result.channel_open) == (None, [], False)
    assert (result.channel_id, result.message_id) == (
        "elsewhere",
        alice.channel("elsewhere").outgoing_ids()[0],
    )
    assert bob.channels() == [] and bob.next_due() is None
    assert list(tmp_path.iterdir()) == []  # no state for a channel a peer named
    assert heard == Heard()
    bob.open_channel("elsewhere")
    assert bob.unwrap_received_message(wire).payload == b"hi"


def test_channel_limits_and_misuse_raise_local_errors() -> None:
    clock = Clock()
    m, _ = manager("me", clock, max_channels=2)
    m.open_channel("a")
    m.open_channel("b")
    m.open_channel("a")  # idempotent
    for call in (
        lambda: m.open_channel("c"),
        lambda: m.wrap_outgoing_message(b"x", "c"),
        lambda: m.open_channel(""),
        lambda: m.mark_dependencies_met(["x"], "c"),
        lambda: m.build_sync_message("c"),
        lambda: m.set_participant_count("c", 3),
        lambda: m.history("a"),  # kept only with a state_dir
    ):
        with pytest.raises(LocalProtocolError):
            call()
    assert m.channels() == ["a", "b"]
    m.close_channel("b")
    m.close_channel("b")  # idempotent
    with pytest.raises(LocalProtocolError):
        m.mark_dependencies_met(["x"], "b")
    m.wrap_outgoing_message(b"x", "c")  # room again
    assert m.channels() == ["a", "c"]
    with pytest.raises(LocalProtocolError):
        ReliabilityManager("")
    with pytest.raises(LocalProtocolError):
        m.wrap_outgoing_message(b"x", "")


def test_own_messages_enter_the_log_once_acknowledged() -> None:
    assert ReliabilityManager("x").config.own_log_policy == "on_ack"  # seed 004's rule
    clock = Clock()
    (alice, heard), (bob, _) = manager("alice", clock), manager("bob", clock)
    bob.open_channel("c")
    wire = alice.wrap_outgoing_message(b"m", "c")
    mid = alice.channel("c").outgoing_ids()[0]
    assert alice.channel("c").log_ids() == []
    bob.unwrap_received_message(wire)
    assert alice.channel("c").log_ids() == [] and heard.sent == []
    sync = bob.build_sync_message("c")
    assert sync is not None
    alice.unwrap_received_message(sync)
    assert alice.channel("c").log_ids() == [mid] and heard.sent == [mid]
    assert alice.channel("c").outgoing_ids() == []


# -------------------------------------------------------------------- timers


def nominal_delay(attempts: int) -> float:
    delay = RUNTIME.resend_interval_ms * RUNTIME.resend_backoff ** (attempts - 1)
    return min(delay, RUNTIME.max_resend_interval_ms)


def run_until(members: list[ReliabilityManager], clock: Clock, until: int) -> None:
    """Tick when the managers say they have work: the application's only timer."""
    while True:
        due = min(d for m in members if (d := m.next_due()) is not None)
        if due > until:
            return
        clock.now = max(clock.now, due)
        for m in members:
            m.tick()


def test_unacknowledged_message_is_resent_on_the_schedule_then_fails() -> None:
    clock = Clock()
    alice, heard = manager("alice", clock)
    alice.wrap_outgoing_message(b"anyone?", "c")
    mid = alice.channel("c").outgoing_ids()[0]
    run_until([alice], clock, START + 60_000)

    resends = [(at, m) for at, kind, m, _ in heard.transmits if kind == "resend"]
    assert [m for _, m in resends] == [mid] * (RUNTIME.max_attempts - 1)
    times = [START] + [at for at, _ in resends]
    for attempts, (before, after) in enumerate(itertools.pairwise(times), start=1):
        nominal = nominal_delay(attempts)
        low, high = nominal * (1 - RUNTIME.resend_jitter), nominal * (1 + RUNTIME.resend_jitter)
        assert low - 1 <= after - before <= high
    assert heard.failed == [mid] and heard.sent == []
    assert alice.channel("c").outgoing_ids() == []


def test_syncs_go_out_through_on_transmit_at_the_sync_interval() -> None:
    clock = Clock()
    (alice, alice_heard), (bob, heard) = manager("alice", clock), manager("bob", clock)
    bob.open_channel("c")
    bob.unwrap_received_message(alice.wrap_outgoing_message(b"m", "c"))
    until = START + 20 * RUNTIME.sync_interval_ms
    run_until([alice, bob], clock, until)
    syncs = [at for at, kind, _, _ in heard.transmits if kind == "sync"]
    assert len(syncs) >= 5 and heard.syncs == ["c"] * len(syncs)
    # js-waku's draw: at most twice the interval after our own sync.
    gaps = [b - a for a, b in zip([START, *syncs], [*syncs, until], strict=True)]
    assert max(gaps) <= 2 * RUNTIME.sync_interval_ms
    assert alice_heard.syncs == []  # on_ack: no history of her own to sync yet


def test_sds_r_responses_are_transmitted_as_repairs() -> None:
    clock = Clock()
    members = {
        name: manager(name, clock, seed=i) for i, name in enumerate(("alice", "bob", "carol"))
    }
    for m, _ in members.values():
        m.open_channel("c")
    alice, bob, carol = (members[n][0] for n in ("alice", "bob", "carol"))
    first = alice.wrap_outgoing_message(b"only carol hears this", "c")
    carol.unwrap_received_message(first)
    first_id = carol.channel("c").log_ids()[0]
    names_it = carol.wrap_outgoing_message(b"reply", "c")
    assert bob.unwrap_received_message(names_it).missing_dependencies == [first_id]

    # From here on everything gets through: bob asks (on a sync), someone answers.
    relay = Relay({n: m for n, (m, _) in members.items()}, 0.0, random.Random(0))
    for n, (m, h) in members.items():
        relay.attach(n, m, h, clock)
    t_max = CONFIG.repair.t_max_ms
    while first_id not in members["bob"][1].ready and clock.now < START + 4 * t_max:
        relay.step(clock)
    repairs = [mid for _, h in members.values() for mid in h.kinds("repair")]
    assert first_id in repairs
    assert members["bob"][1].ready == [first_id, carol.channel("c").log_ids()[-1]]


# -------------------------------------------------------------- lossy group


class Relay:
    """A lossy broadcast medium: frames wait in a list until the test delivers them."""

    def __init__(self, members: dict[str, ReliabilityManager], loss: float, rng: random.Random):
        self.members = members
        self.loss = loss
        self.rng = rng
        self.pending: list[tuple[str, bytes]] = []
        self.frames = 0

    def attach(self, name: str, m: ReliabilityManager, heard: Heard, clock: Clock) -> None:
        def transmit(channel_id: str, kind: str, mid: str, data: bytes) -> None:
            heard.transmits.append((clock.now, kind, mid, data))
            self.broadcast(name, data)

        m.on_transmit = transmit

    def broadcast(self, sender: str, data: bytes) -> None:
        self.frames += 1
        for name in self.members:
            if name != sender and self.rng.random() >= self.loss:
                self.pending.append((name, data))

    def step(self, clock: Clock, latency_ms: int = 50) -> None:
        """Deliver what is in flight (reordered), else jump to the next due time; tick."""
        if self.pending:
            clock.now += latency_ms
            frames, self.pending = self.pending, []
            self.rng.shuffle(frames)
            for name, data in frames:
                self.members[name].unwrap_received_message(data)
        else:
            due = min(d for m in self.members.values() if (d := m.next_due()) is not None)
            clock.now = max(clock.now + 1, due)
        for m in self.members.values():
            m.tick()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lossy_group_converges_with_every_message_acknowledged(seed: int) -> None:
    clock = Clock()
    names = ("alice", "bob", "carol")
    config = replace(CONFIG, causal_history_size=20)
    runtime = replace(RUNTIME, max_attempts=20)
    members = {
        n: manager(n, clock, seed=seed * 10 + i, config=config, runtime=runtime)
        for i, n in enumerate(names)
    }
    rng = random.Random(seed)
    relay = Relay({n: m for n, (m, _) in members.items()}, 0.3, rng)
    for n, (m, h) in members.items():
        relay.attach(n, m, h, clock)
        m.open_channel("group")
    sends = sorted((START + rng.randrange(60_000), rng.choice(names), i) for i in range(30))
    sent_ids: dict[str, list[str]] = {n: [] for n in names}

    def converged() -> bool:
        logs = [m.channel("group").log_ids() for m, _ in members.values()]
        everyone_acked = all(sorted(h.sent) == sorted(sent_ids[n]) for n, (_, h) in members.items())
        return not sends and everyone_acked and logs[0] == logs[1] == logs[2]

    while not converged():
        assert clock.now < START + 3_600_000, "no convergence within an hour"
        while sends and sends[0][0] <= clock.now:
            _, sender, i = sends.pop(0)
            m = members[sender][0]
            relay.broadcast(sender, m.wrap_outgoing_message(f"{sender} {i}".encode(), "group"))
            sent_ids[sender].append(m.channel("group").outgoing_ids()[-1])
        relay.step(clock)
        if sends and not relay.pending:
            clock.now = min(clock.now, sends[0][0])

    everything = sorted(mid for ids in sent_ids.values() for mid in ids)
    assert sorted(members["alice"][0].channel("group").log_ids()) == everything
    for n, (_, heard) in members.items():
        others = sorted(mid for o, ids in sent_ids.items() if o != n for mid in ids)
        assert sorted(heard.ready) == others  # each exactly once
        assert heard.failed == []
    resent = sum(len(h.kinds("resend")) + len(h.kinds("repair")) for _, h in members.values())
    assert resent > 0  # with 30 % loss, recovery did real work


# ----------------------------------------------------------------- callbacks


def test_a_raising_callback_is_counted_logged_and_its_event_reported_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A raising callback never undoes committed state; its event (and every later one on
    the channel) waits and is reported again REDELIVER_MS later under the same number."""
    clock = Clock()
    (alice, heard), (bob, bob_heard) = manager("alice", clock), manager("bob", clock)
    bob.open_channel("c")
    numbers: list[tuple[int | None, str, str]] = []
    bob.on_event = lambda ch, d: numbers.append((d.seq, type(d.event).__name__, d.event.message_id))

    def boom(*_: object) -> None:
        raise RuntimeError("application bug")

    bob.on_message_ready = boom
    alice.on_transmit = boom
    caplog.set_level(logging.ERROR, logger="sdsync.runtime")
    first = alice.wrap_outgoing_message(b"one", "c")
    result = bob.unwrap_received_message(first)
    assert result.payload == b"one" and bob.callback_errors == 1
    assert bob.channel("c").log_ids() == [result.message_id]  # delivered all the same
    failed = [r for r in caplog.records if "callback raised" in r.getMessage()]
    assert failed and failed[0].exc_info is not None
    assert isinstance(failed[0].exc_info[1], RuntimeError)
    assert bob.event_positions("c") == (1, 0)  # numbered, not acknowledged

    bob.on_message_ready = lambda ch, mid: bob_heard.ready.append(mid)
    second = bob.unwrap_received_message(alice.wrap_outgoing_message(b"two", "c"))
    assert second.payload == b"two"
    assert bob_heard.ready == []  # "two" waits behind "one"
    assert bob.event_positions("c") == (2, 0)
    run_until([bob], clock, START + manager_module.REDELIVER_MS - 1)
    assert bob_heard.ready == []  # ticks before the redelivery time: still nothing
    run_until([bob], clock, START + manager_module.REDELIVER_MS)
    assert bob_heard.ready == [result.message_id, second.message_id]
    last, acked = bob.event_positions("c")
    assert last == acked  # everything reported and acknowledged by now
    one = (1, "MessageDelivered", result.message_id)
    assert numbers[:3] == [one, one, (2, "MessageDelivered", second.message_id)]
    assert [n[0] for n in numbers[2:]] == list(range(2, last + 1))
    assert bob.callback_errors == 1

    clock.now += 10 * RUNTIME.max_resend_interval_ms
    alice.tick()  # resends, whose on_transmit raises
    assert alice.callback_errors == 1
    failed_at = clock.now
    # alice's acknowledgements wait behind the transmission whose callback raised.
    sync = bob.build_sync_message("c")
    assert sync is not None
    alice.unwrap_received_message(sync)
    assert heard.sent == []
    alice.on_transmit = lambda ch, kind, mid, data: None
    run_until([alice], clock, failed_at + manager_module.REDELIVER_MS - 1)
    assert heard.sent == []
    run_until([alice], clock, failed_at + manager_module.REDELIVER_MS)
    assert sorted(heard.sent) == sorted([result.message_id, second.message_id])
    assert alice.callback_errors == 1


@pytest.mark.parametrize("durable", [False, True])
def test_concurrent_callers_and_a_tick_thread(tmp_path: Path, durable: bool) -> None:
    # Durable: every thread writes through the same SQLite connections, one at a time.
    m, heard = manager("me", Clock(), **({"state_dir": tmp_path} if durable else {}))
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            m.tick()

    def writer(k: int) -> None:
        for i in range(50):
            m.wrap_outgoing_message(f"{k}-{i}".encode(), "c")

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    tick_thread = threading.Thread(target=ticker)
    tick_thread.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    tick_thread.join()
    assert len(set(m.channel("c").outgoing_ids())) == 200
    assert m.callback_errors == 0 and heard.failed == []


# ------------------------------------------------------------------ restart


def test_restart_from_state_dir_restores_everything_and_reports_only_the_unacknowledged(
    tmp_path: Path,
) -> None:
    clock = Clock()
    runtime = replace(RUNTIME, resend_jitter=0.0)
    alice, alice_heard = manager("alice", clock, state_dir=tmp_path, runtime=runtime)
    before: list[Delivery] = []
    alice.on_event = lambda ch, d: before.append(d)
    bob, _ = manager("bob", clock, runtime=runtime)
    bob.open_channel("c")
    wires = [alice.wrap_outgoing_message(f"a{i}".encode(), "c") for i in range(3)]
    sent_at = clock.now
    bob.unwrap_received_message(wires[0])
    reply = bob.unwrap_received_message(
        bob.wrap_outgoing_message(b"b1", "c")
    )  # bob's own echo: nothing
    assert reply.payload is None
    clock.now += 100
    alice.unwrap_received_message(bob.wrap_outgoing_message(b"b2", "c"))
    assert len(alice_heard.ready) == 1 and len(alice_heard.sent) == 1
    log, outgoing = alice.channel("c").log_ids(), alice.channel("c").outgoing_ids()
    assert len(log) == 2 and len(outgoing) == 2
    assert [d.seq for d in before] == list(range(1, len(before) + 1))

    # kill -9: no close(); every step was committed when it happened, and so was every
    # acknowledgement but those of the last step's events (stored with the next commit).
    del alice
    gc.collect()
    db = sqlite3.connect(state_path(tmp_path, "c"))
    (stored_ack,) = db.execute("SELECT delivered_cursor FROM channel").fetchone()
    db.close()
    clock.now += 300
    alice2, heard2 = manager("alice", clock, state_dir=tmp_path, runtime=runtime)
    again: list[Delivery] = []
    alice2.on_event = lambda ch, d: again.append(d)
    alice2.open_channel("c")
    # At least once: what was not acknowledged comes again, the same events under the
    # same numbers (here the last step's: b2 ready, a0 acknowledged); nothing else.
    assert again == [d for d in before if (d.seq or 0) > stored_ack]
    assert {type(d.event) for d in again} >= {MessageDelivered}
    assert heard2.ready == alice_heard.ready
    assert alice2.event_positions("c") == (len(before), len(before))
    assert alice2.channel("c").log_ids() == log
    assert alice2.channel("c").outgoing_ids() == outgoing
    assert [r.content for r in alice2.history("c")] == [b"a0", b"b2"]
    # The planned resends survived: due one interval after the original send, not after
    # the restart (no jitter here).
    run_until([alice2], clock, sent_at + runtime.resend_interval_ms)
    assert sorted(heard2.kinds("resend")) == sorted(outgoing)
    assert {at for at, kind, _, _ in heard2.transmits if kind == "resend"} == {
        sent_at + runtime.resend_interval_ms
    }
    assert alice2.unwrap_received_message(wires[0]).payload is None  # own message, known
    reported = [d.seq for d in again]
    alice2.close()
    alice3, heard3 = manager("alice", clock, state_dir=tmp_path, runtime=runtime)
    third: list[Delivery] = []
    alice3.on_event = lambda ch, d: third.append(d)
    alice3.open_channel("c")
    assert third == [] and heard3 == Heard()  # acknowledged and closed: never again
    assert len(reported) == len(set(reported))
    alice3.close()


def test_deliveries_committed_but_never_reported_are_reported_on_reopen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    alice, _ = manager("alice", clock)
    bob, heard = manager("bob", clock, state_dir=tmp_path)
    bob.open_channel("c")
    wire = alice.wrap_outgoing_message(b"x", "c")

    class Died(BaseException):
        """The process died at the crash point: after the commit, before any callback."""

    def die(name: str) -> None:
        raise Died(name)

    monkeypatch.setattr(manager_module, "crash_point", die)
    with pytest.raises(Died):
        bob.unwrap_received_message(wire)
    del bob
    gc.collect()
    monkeypatch.undo()
    assert heard.ready == []  # the first life never reported it
    bob2, heard2 = manager("bob", clock, state_dir=tmp_path)
    seen: list[Delivery] = []
    bob2.on_event = lambda ch, d: seen.append(d)
    bob2.open_channel("c")
    [mid] = heard2.ready
    assert [(d.seq, d.event) for d in seen] == [
        (1, MessageDelivered(mid, "alice", decode(wire).lamport_timestamp or 0, b"x", None))
    ]
    assert bob2.unwrap_received_message(wire).duplicate  # committed before the death
    bob2.close()
    bob3, heard3 = manager("bob", clock, state_dir=tmp_path)
    bob3.open_channel("c")
    assert heard3.ready == []  # acknowledged once reported, stored at close: never again
    assert bob3.event_positions("c") == (1, 1)
    bob3.close()


def test_state_dir_and_history_store_factory_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(LocalProtocolError):
        ReliabilityManager("x", state_dir=tmp_path, history_store_factory=lambda _: IdStore(set()))
