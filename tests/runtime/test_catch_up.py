"""ChannelDriver's store catch-up on a virtual clock: when it is due, which window it
asks for, what happens to what it finds, and a failure."""

from __future__ import annotations

import random

from sdsync.core import BloomParams, ChannelConfig, MessageChannel, MessageDelivered, SyncStatus
from sdsync.runtime import CatchUp, ChannelDriver, RuntimeConfig, Step
from sdsync.wire import decode

START = 1_700_000_000_000
CONFIG = ChannelConfig(bloom=BloomParams(50, 0.01), causal_history_size=2)
RUNTIME = RuntimeConfig(
    sync_interval_ms=10**9,  # no syncs: only catch-ups wake the driver
    incoming_sweep_ms=10**9,
    store_catchup_interval_ms=30_000,
    store_catchup_max_window_ms=3_600_000,
    store_catchup_margin_ms=20_000,
)


def driver(name: str, *, stores: bool = True, runtime: RuntimeConfig = RUNTIME) -> ChannelDriver:
    channel = MessageChannel("c", name, now_ms=START, config=CONFIG)
    return ChannelDriver(channel, runtime, random.Random(name), START, query_stores=stores)


def catch_ups(step: Step) -> list[CatchUp]:
    return [a for a in step.actions if isinstance(a, CatchUp)]


def statuses(step: Step) -> list[bool]:
    return [e.catching_up for e in step.events if isinstance(e, SyncStatus)]


def test_a_catch_up_runs_at_start_then_every_interval_one_at_a_time() -> None:
    d = driver("a")
    assert d.next_due() == START
    first = d.tick(START)
    assert catch_ups(first) == [CatchUp(START - 20_000, START)]
    assert statuses(first) == [True]
    # Running: nothing more is due for it, however late it gets.
    assert d.next_due() > START + 10**8
    assert catch_ups(d.tick(START + 100_000)) == []
    done = d.caught_up(CatchUp(START - 20_000, START), START + 100_000)
    assert statuses(done) == [False] and d.caught_up_ms == START
    assert d.next_due() == START + 130_000
    assert catch_ups(d.tick(START + 129_999)) == []
    assert catch_ups(d.tick(START + 130_000)) == [CatchUp(START - 20_000, START + 130_000)]


def test_the_window_reaches_back_at_most_the_maximum() -> None:
    d = driver("a")
    d.restore_caught_up(START - 86_400_000)  # a day away
    assert catch_ups(d.tick(START)) == [CatchUp(START - 3_600_000, START)]
    d = driver("b")
    d.restore_caught_up(None)  # unknown: the whole window
    assert catch_ups(d.tick(START)) == [CatchUp(START - 3_600_000, START)]


def test_a_failed_catch_up_asks_the_same_window_again_at_the_next_interval() -> None:
    d = driver("a")
    d.restore_caught_up(START - 600_000)
    (window,) = catch_ups(d.tick(START))
    assert statuses(d.catch_up_failed(START + 2_000)) == [False]
    assert d.caught_up_ms == START - 600_000  # nothing lost: the time did not move
    assert d.next_due() == START + 32_000
    assert catch_ups(d.tick(START + 32_000)) == [CatchUp(window.start_ms, START + 32_000)]


def test_no_store_or_catch_up_off_means_no_catch_up() -> None:
    for d in (driver("a", stores=False), driver("b", runtime=RuntimeConfig(store_catchup=False))):
        assert catch_ups(d.tick(START)) == []
        assert catch_ups(d.tick(START + 10**7)) == []


def test_what_a_catch_up_finds_is_received_once_in_causal_order() -> None:
    alice, bob = driver("alice", stores=False), driver("bob")
    sent = [alice.publish(f"m{i}".encode(), START + i).actions[0] for i in range(4)]
    wires = [a.data for a in sent]  # type: ignore[union-attr]
    ids = [a.message_id for a in sent]  # type: ignore[union-attr]
    # Bob heard only the last one live; with history 2 it names m1 and m2, never m0.
    bob.receive(wires[3], START + 10)
    assert set(bob.channel.missing_ids()) == {ids[1], ids[2]}
    (window,) = catch_ups(bob.tick(START + 20))
    delivered: list[str] = []
    # The store answers oldest first, and has what bob holds too, and a sync.
    sync = alice.channel.send_sync(START + 15)
    assert sync is not None
    for data in [*wires, sync.data]:
        step = bob.receive_found(decode(data), START + 30, retrieval_hint=b"h", data=data)
        delivered += [e.message_id for e in step.events if isinstance(e, MessageDelivered)]
    assert delivered == ids
    assert bob.channel.log_ids() == ids
    assert bob.channel.missing_ids() == []
    # Found again (the next window overlaps): nothing happens, nothing is reported.
    assert bob.receive_found(decode(wires[0]), START + 40, data=wires[0]).events == []
    # Our own messages come back from the store too: not news either.
    own = bob.publish(b"mine", START + 50).actions[0].data  # type: ignore[union-attr]
    assert bob.receive_found(decode(own), START + 60, data=own).events == []
    bob.caught_up(window, START + 70)
    assert bob.caught_up_ms == START + 20
