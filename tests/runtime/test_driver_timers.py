"""ChannelDriver timers on a virtual clock: resend backoff, jitter, cap and give-up, and the
sync timer. Every bound is derived from the RuntimeConfig in use, never written out."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import replace

from sdsync.core import (
    BloomParams,
    ChannelConfig,
    Event,
    MessageChannel,
    MessagePossiblyAcknowledged,
    SendFailed,
)
from sdsync.runtime import ChannelDriver, RuntimeConfig, Step, Transmit
from sdsync.runtime.policy import SyncTimer
from sdsync.wire import HistoryEntry, Message, encode

START = 1_700_000_000_000
CONFIG = ChannelConfig(bloom=BloomParams(64, 0.01), causal_history_size=1)
RUNTIME = RuntimeConfig(
    sync_interval_ms=4_000,
    resend_interval_ms=1_000,
    resend_possibly_acknowledged_ms=3_000,
    resend_backoff=2.0,
    max_resend_interval_ms=5_000,
    resend_jitter=0.25,
    max_attempts=7,
    incoming_sweep_ms=500,
)


def driver(name: str, runtime: RuntimeConfig = RUNTIME, seed: int = 1) -> ChannelDriver:
    channel = MessageChannel("c", name, now_ms=START, config=CONFIG)
    return ChannelDriver(channel, runtime, random.Random(seed), START)


def nominal_delay(runtime: RuntimeConfig, attempts: int, possibly: bool = False) -> float:
    """The delay before attempt ``attempts + 1`` without jitter: backoff, then the cap."""
    base = runtime.resend_possibly_acknowledged_ms if possibly else runtime.resend_interval_ms
    return min(base * runtime.resend_backoff ** (attempts - 1), runtime.max_resend_interval_ms)


def within_jitter(runtime: RuntimeConfig, delay: int, nominal: float) -> bool:
    low = int(nominal * (1 - runtime.resend_jitter))
    return low <= delay <= nominal * (1 + runtime.resend_jitter)


def transmits(step: Step, kind: str) -> list[str]:
    return [a.message_id for a in step.actions if isinstance(a, Transmit) and a.kind == kind]


def run(d: ChannelDriver, until: int) -> Iterator[tuple[int, Step]]:
    """Tick exactly when the driver says it has work, as the runtime and simulator do."""
    now, idle_ticks = d.next_due(), 0
    while now <= until:
        yield now, d.tick(now)
        due = d.next_due()
        idle_ticks = idle_ticks + 1 if due <= now else 0
        assert idle_ticks < 100, f"the driver keeps asking for a tick at {now}"
        now = max(due, now)


def resend_history(d: ChannelDriver, mid: str) -> tuple[list[int], list[Event]]:
    """Delays between consecutive transmissions of ``mid`` until it is given up on."""
    delays: list[int] = []
    events: list[Event] = []
    last_sent = START
    while (due := d.resend_at(mid)) is not None:
        assert transmits(d.tick(due - 1), "resend") == []  # never early
        step = d.tick(due)
        events += step.events
        if transmits(step, "resend") == [mid]:
            delays.append(due - last_sent)
            last_sent = due
    return delays, events


def test_resend_delays_back_off_to_the_cap_exactly_without_jitter() -> None:
    runtime = replace(RUNTIME, resend_jitter=0.0)
    d = driver("a", runtime)
    mid = d.publish(b"anyone?", START).message_id
    delays, events = resend_history(d, mid)
    expected = [nominal_delay(runtime, n) for n in range(1, runtime.max_attempts)]
    assert delays == expected
    # The cap is reached within the attempts, so the test covers it.
    assert expected[0] < runtime.max_resend_interval_ms == expected[-1]
    assert [e for e in events if isinstance(e, SendFailed)] == [SendFailed(mid)]


def test_resends_stop_after_max_attempts_with_send_failed() -> None:
    d = driver("a")
    mid = d.publish(b"anyone?", START).message_id
    delays, events = resend_history(d, mid)
    assert len(delays) == RUNTIME.max_attempts - 1  # the first send is attempt 1
    assert [e for e in events if isinstance(e, SendFailed)] == [SendFailed(mid)]
    assert d.channel.outgoing_ids() == [] and d.resend_at(mid) is None
    later = START + 100 * RUNTIME.max_resend_interval_ms
    assert all(transmits(step, "resend") == [] for _, step in run(d, later))


def test_jittered_delays_stay_within_bounds_of_the_backoff() -> None:
    d = driver("a")
    mid = d.publish(b"anyone?", START).message_id
    delays, _ = resend_history(d, mid)
    for attempts, delay in enumerate(delays, start=1):
        assert within_jitter(RUNTIME, delay, nominal_delay(RUNTIME, attempts)), (attempts, delay)


def first_resend_delays(seed: int, count: int = 40) -> list[int]:
    d = driver("a", seed=seed)
    sent = {}
    for i in range(count):
        now = START + i
        sent[d.publish(f"m{i}".encode(), now).message_id] = now
    return [d.resend_at(mid) - at for mid, at in sent.items()]  # type: ignore[operator]


def test_jitter_spreads_over_its_band_and_is_seeded() -> None:
    delays = first_resend_delays(seed=7)
    nominal = nominal_delay(RUNTIME, 1)
    assert all(within_jitter(RUNTIME, delay, nominal) for delay in delays)
    band = nominal * RUNTIME.resend_jitter
    # Drawn across the band, not pinned to the nominal delay or to one edge.
    assert min(delays) < nominal - band / 2 and max(delays) > nominal + band / 2
    assert first_resend_delays(seed=7) == delays
    assert first_resend_delays(seed=8) != delays


def test_possibly_acknowledged_messages_wait_their_own_longer_period() -> None:
    a, b, c = driver("a"), driver("b", seed=2), driver("c", seed=3)
    for other in (b, c):  # a hears from two peers: one bloom filter is not enough
        hello = other.publish(f"hello from {other.channel.participant_id}".encode(), START)
        for receiver in (a, b):
            if receiver is not other:
                receiver.receive(hello.transmit.data, START)
    target = a.publish(b"target", START).transmit
    newer = a.publish(b"newer", START).transmit
    for wire in (target, newer):
        b.receive(wire.data, START)
    sync = b.channel.send_sync(START + 1)  # names only `newer`: `target` is in its bloom
    assert sync is not None
    got = a.receive(sync.data, START + 1)
    assert [e.message_id for e in got.events if isinstance(e, MessagePossiblyAcknowledged)] == [
        target.message_id
    ]
    resent_at = next(
        now
        for now, step in run(a, START + RUNTIME.max_resend_interval_ms * 2)
        if target.message_id in transmits(step, "resend")  # type: ignore[union-attr]
    )
    possibly = nominal_delay(RUNTIME, 1, possibly=True)
    assert within_jitter(RUNTIME, resent_at - START, possibly)
    # Longer than an unacknowledged message could ever have waited.
    assert resent_at - START > nominal_delay(RUNTIME, 1) * (1 + RUNTIME.resend_jitter)


# ------------------------------------------------------------------------- sync timer


def draws(reset: str, *, suppress: bool = True, n: int = 300, **args: bool) -> list[int]:
    """Offsets of the due time from ``now`` after ``n`` calls of one SyncTimer reset."""
    timer = SyncTimer(RUNTIME.sync_interval_ms, random.Random(5), START, suppress=suppress)
    offsets = []
    for i in range(n):
        now = START + i * RUNTIME.sync_interval_ms
        getattr(timer, reset)(now, **args)
        offsets.append(timer.due_ms - now)
    return offsets


def spread_over(offsets: list[int], low: float, high: float) -> bool:
    """All in [low, high], and covering most of it (a random draw, not a constant)."""
    quarter = (high - low) / 4
    return (
        low <= min(offsets) < low + quarter
        and high - quarter < max(offsets) <= high
        and all(low <= o <= high for o in offsets)
    )


def test_sync_timer_draws_follow_js_waku_multipliers() -> None:
    interval = RUNTIME.sync_interval_ms
    assert spread_over(draws("after_own_sync"), 0, 2 * interval)
    assert spread_over(draws("after_own_content"), 0, interval)
    assert spread_over(draws("after_received_sync", owing=False), interval, 2 * interval)
    assert spread_over(draws("after_received_sync", suppress=False, owing=False), 0, interval)
    timer = SyncTimer(interval, random.Random(5), START)
    assert START <= timer.due_ms <= START + interval
    # Received content only ever brings the sync forward, to within half an interval.
    for i in range(100):
        now, before = START + i * 10, timer.due_ms
        timer.after_received_content(now)
        assert timer.due_ms <= min(before, now + interval // 2)


def sync_times(seed: int, until: int) -> list[int]:
    d = driver("a", replace(RUNTIME, max_attempts=1), seed=seed)  # no resends in between
    d.publish(b"history", START)
    return [now for now, step in run(d, until) if transmits(step, "sync")]


def test_syncs_are_sent_at_randomized_intervals_on_the_virtual_clock() -> None:
    interval = RUNTIME.sync_interval_ms
    times = sync_times(seed=11, until=START + 400 * interval)
    assert START <= times[0] <= START + interval  # after our own content: multiplier 1
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert spread_over(gaps, 0, 2 * interval)  # after our own sync: multiplier 2
    assert 0.8 * interval < sum(gaps) / len(gaps) < 1.2 * interval
    assert sync_times(seed=11, until=START + 400 * interval) == times
    assert sync_times(seed=12, until=START + 400 * interval) != times


def test_no_sync_without_history() -> None:
    d = driver("a")
    assert not any(
        transmits(step, "sync") for _, step in run(d, START + 50 * RUNTIME.sync_interval_ms)
    )


def next_sync_after(d: ChannelDriver, now: int) -> int:
    return next(
        at for at, step in run(d, now + 10 * RUNTIME.sync_interval_ms) if transmits(step, "sync")
    )


def test_received_content_brings_the_sync_forward_and_a_received_sync_defers_it() -> None:
    interval = RUNTIME.sync_interval_ms
    for seed in range(20):
        a, b = driver("a", replace(RUNTIME, max_attempts=1), seed=seed), driver("b", seed=seed)
        a.publish(b"history", START)
        now = next_sync_after(a, START) + 1  # after our own sync: due within 2 intervals
        a.receive(b.publish(f"content {seed}".encode(), now).transmit.data, now)
        synced = next_sync_after(a, now)
        assert synced <= now + interval // 2
        now = synced + 1
        sync = b.channel.send_sync(now)
        assert sync is not None
        a.receive(sync.data, now)
        assert now + interval <= next_sync_after(a, now) <= now + 2 * interval


def test_a_due_repair_request_sends_a_sync_before_the_timer() -> None:
    a = driver("a", replace(RUNTIME, sync_interval_ms=10**9))  # the timer never fires here
    gap = HistoryEntry("never-arrived", sender_id="b")
    waiting = Message("b", "waiting", "c", START, (gap,), None, b"x")
    a.receive(encode(waiting), START)
    due = a.channel.next_repair_request_due()
    assert due is not None and due > START
    syncs = [(now, step) for now, step in run(a, due) if transmits(step, "sync")]
    assert [now for now, _ in syncs] == [due]
    assert [e.message_id for e in syncs[0][1].events if e.type == "repair_request_sent"] == [
        gap.message_id
    ]


def test_received_syncs_never_defer_an_acknowledgement_we_owe() -> None:
    """Issue 39: with suppression, each received sync pushed ours back by an interval or
    more, so in a talkative group received content went unacknowledged for as long as
    the others synced. Now the sync received content made due stays due while we owe an
    acknowledgement; once nothing is owed, suppression applies again."""
    interval = RUNTIME.sync_interval_ms
    timer = SyncTimer(interval, random.Random(5), START)
    timer.after_received_content(START)
    timer.owe()  # it was delivered
    owed = timer.due_ms
    assert owed <= START + interval // 2
    for i in range(1, 50):  # others keep syncing, more often than we would
        timer.after_received_sync(START + i * (interval // 10), owing=True)
        assert timer.due_ms <= owed
    timer.after_own_sync(owed)
    timer.after_received_sync(owed + 1, owing=False)
    assert timer.due_ms >= owed + 1 + interval  # nothing owed: suppressed again
    timer.after_received_content(owed + 2)
    timer.owe()
    timer.after_received_sync(owed + 3, owing=False)  # another's history settled it
    assert timer.due_ms >= owed + 3 + interval


def test_a_third_participants_sync_settles_what_we_owe_and_the_senders_own_does_not() -> None:
    """Every recipient of a message used to sync within half an interval of it, though
    the first of their syncs acknowledged it to its sender for all: a group of 50 sent
    76 % more bytes per message. A sync naming the message settles our debt — unless it
    is the sender's own, which tells the sender nothing about us."""
    interval = RUNTIME.sync_interval_ms
    for seed in range(20):
        a, c = driver("a", replace(RUNTIME, max_attempts=1), seed=seed), driver("c", seed=seed)
        content = a.publish(b"hello", START).transmit.data
        c.receive(content, START + 1)
        syncs = {"a": a.channel.send_sync(START + 2), "c": c.channel.send_sync(START + 2)}
        assert c.channel.acknowledgements_owed() == 0  # c's own sync settled c's debt
        for syncer, sync in syncs.items():
            assert sync is not None
            b = driver("b", seed=seed + 100)
            b.receive(content, START + 1)
            assert b.channel.acknowledgements_owed() == 1
            b.receive(sync.data, START + 3)
            if syncer == "a":  # the sender's history names its own message to nobody but b
                assert b.channel.acknowledgements_owed() == 1
                assert next_sync_after(b, START + 3) <= START + 1 + interval // 2
            else:
                assert b.channel.acknowledgements_owed() == 0
                assert next_sync_after(b, START + 3) >= START + 3 + interval  # suppressed


def test_js_wakus_rule_lets_a_received_sync_defer_what_we_owe() -> None:
    """RuntimeConfig.defer_owed_acknowledgements: the comparison bench/sync_policy.py runs."""
    interval = RUNTIME.sync_interval_ms
    js_waku = replace(RUNTIME, defer_owed_acknowledgements=True)
    for seed in range(20):
        a = driver("a", replace(RUNTIME, max_attempts=1), seed=seed)
        content = a.publish(b"hello", START).transmit.data
        own = a.channel.send_sync(START + 2)
        assert own is not None
        deferred = driver("b", js_waku, seed=seed + 100)
        deferred.receive(content, START + 1)
        deferred.receive(own.data, START + 3)  # names only the sender's own message
        assert next_sync_after(deferred, START + 3) >= START + 3 + interval
