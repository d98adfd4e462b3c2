"""ChannelDriver's store catch-up on a virtual clock: when it is due, which window it
asks for, what happens to what it finds, and a failure; and a ReliableChannel whose store
goes away in the middle of one."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest

from sdsync.core import BloomParams, ChannelConfig, MessageChannel, MessageDelivered, SyncStatus
from sdsync.runtime import (
    CatchUp,
    ChannelDriver,
    ReliableChannel,
    RuntimeConfig,
    Step,
    Transmit,
)
from sdsync.testing.memory import MemoryNetwork
from sdsync.testing.memory_store import MemoryStore
from sdsync.waku.node import Received
from sdsync.wire import HistoryEntry, decode

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


def test_back_online_during_a_catch_up_catches_up_again_as_soon_as_it_ends() -> None:
    d = driver("a")
    (window,) = catch_ups(d.tick(START))
    d.back_online(START + 1_000)  # the running one may be failing because we were away
    assert catch_ups(d.tick(START + 1_000)) == []  # still one at a time
    d.catch_up_failed(START + 10_000)
    assert d.next_due() == START + 10_000
    assert catch_ups(d.tick(START + 10_000)) == [CatchUp(window.start_ms, START + 10_000)]
    # Only once: the one after that waits its interval again.
    d.caught_up(CatchUp(window.start_ms, START + 10_000), START + 11_000)
    assert d.next_due() == START + 41_000


def test_no_store_or_catch_up_off_means_no_catch_up() -> None:
    for d in (driver("a", stores=False), driver("b", runtime=RuntimeConfig(store_catchup=False))):
        assert catch_ups(d.tick(START)) == []
        assert catch_ups(d.tick(START + 10**7)) == []


def test_what_a_catch_up_finds_is_received_once_in_causal_order() -> None:
    alice, bob = driver("alice", stores=False), driver("bob")
    sent = [alice.publish(f"m{i}".encode(), START + i).transmit for i in range(4)]
    wires = [a.data for a in sent]
    ids = [a.message_id for a in sent]
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
    own = bob.publish(b"mine", START + 50).transmit.data
    assert bob.receive_found(decode(own), START + 60, data=own).events == []
    bob.caught_up(window, START + 70)
    assert bob.caught_up_ms == START + 20


def test_a_message_evicted_from_the_incoming_buffer_is_fetched_by_the_next_catch_up() -> None:
    """Simulator, 50 participants at 30 % loss, seed 7: a message heard, then evicted from
    a full incoming buffer, was never fetched again — its hash was seen — and no later
    history named it: one participant lacked it for good."""
    small = replace(CONFIG, max_incoming_buffer=1)
    alice = driver("alice", stores=False)
    bob = ChannelDriver(
        MessageChannel("c", "bob", now_ms=START, config=small), RUNTIME, random.Random(1), START
    )
    sent = [alice.publish(f"m{i}".encode(), START + i).transmit.data for i in range(4)]
    hints = [hashlib.sha256(data).digest() for data in sent]
    # Both wait for m0, which bob never heard; the second evicts the first.
    bob.receive(sent[2], START + 10, retrieval_hint=hints[2])
    step = bob.receive(sent[3], START + 11, retrieval_hint=hints[3])
    evicted = [e for e in step.events if e.type == "message_evicted"]
    assert [e.retrieval_hint for e in evicted] in ([hints[2]], [hints[3]])
    kept = hints[3] if evicted[0].retrieval_hint == hints[2] else hints[2]
    assert bob.unseen(hints) == [h for h in hints if h != kept]  # m0, m1 and the evicted


# -- a ReliableChannel whose store fails midway, on a controlled clock


class Store:
    """A StoreClient holding alice's frames (timestamped, hashed); a catch-up lists each
    page's hashes, then fetches the unseen ones as a real store does — except that the
    fetch of page ``fail_at_page`` finds the store gone (once)."""

    def __init__(self, frames: list[tuple[int, Received]], fail_at_page: int) -> None:
        self.frames = frames
        self.fail_at_page: int | None = fail_at_page
        self.windows: list[tuple[int, int]] = []
        self.fetched: list[bytes] = []

    async def fetch(self, channel_id: str, entries: tuple[HistoryEntry, ...]) -> list[Received]:
        raise AssertionError("nothing is missing by id: only a catch-up can find them")

    async def catch_up(
        self,
        content_topic: str,
        start_ms: int,
        end_ms: int,
        page_size: int,
        unseen: Callable[[list[bytes]], list[bytes]],
    ) -> AsyncIterator[list[Received]]:
        self.windows.append((start_ms, end_ms))
        listed = [f for t, f in self.frames if start_ms <= t <= end_ms]
        for number, first in enumerate(range(0, len(listed), page_size)):
            page = listed[first : first + page_size]
            wanted = unseen([f.retrieval_hint for f in page if f.retrieval_hint is not None])
            if number == self.fail_at_page:
                self.fail_at_page = None
                raise ConnectionResetError("the store went away")
            found = [f for f in page if f.retrieval_hint in wanted]
            self.fetched += [f.retrieval_hint for f in found if f.retrieval_hint is not None]
            if found:
                yield found


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(60):  # a liveness bound, not a performance assertion
        while not condition():
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("fail_at_page", [0, 1])
def test_a_store_gone_midway_fails_the_catch_up_and_the_next_one_recovers(
    fail_at_page: int,
) -> None:
    """Four messages bob never heard, two a page. The store lists a page and is gone
    before its fetch (the first page: nothing came; the second: the first page's two
    were delivered). The driver hears catch_up_failed, the caught-up time stays, nothing
    is asked before the interval has passed on bob's clock; then the same window again,
    which fetches only what bob has not seen, and every message is delivered once."""
    alice = MessageChannel("c", "alice", now_ms=START - 10_000, config=CONFIG)
    wires = [alice.send(f"m{i}".encode(), START - 10_000 + i) for i in range(4)]
    frames = [
        (START - 10_000 + i, Received(w.data, hashlib.sha256(w.data).digest()))
        for i, w in enumerate(wires)
    ]
    store = Store(frames, fail_at_page)
    now = [START]
    runtime = replace(RUNTIME, store_catchup_interval_ms=100, store_catchup_page_size=2)

    async def scenario() -> None:
        bob = ReliableChannel(
            MemoryNetwork().transport("bob"),
            "c",
            "bob",
            config=CONFIG,
            runtime=runtime,
            store=store,
            rng=random.Random(2),
            clock=lambda: now[0],
        )
        bob.driver.restore_caught_up(START - 15_000)
        await bob.start()
        try:
            await until(lambda: store.fail_at_page is None and not catching_up(bob))
            assert store.windows == [(START - 35_000, START)]
            assert bob.catch_ups == 0 and bob.driver.caught_up_ms == START - 15_000
            first = delivered(bob)
            assert first == [w.message_id for w in wires[: 2 * fail_at_page]]
            # Bob's clock stands still: the next catch-up is an interval away, however
            # long the timer loop runs.
            await asyncio.sleep(0.3)
            assert len(store.windows) == 1
            now[0] = START + 100
            await until(lambda: bob.catch_ups == 1)
            assert store.windows[1] == (START - 35_000, START + 100)
            assert bob.driver.caught_up_ms == START + 100
            assert store.fetched == [f.retrieval_hint for _, f in frames]  # each once
            assert first + delivered(bob) == [w.message_id for w in wires]
        finally:
            await bob.close()

    asyncio.run(scenario())


def catching_up(channel: ReliableChannel) -> bool:
    return channel.driver.sync_status().catching_up


def delivered(channel: ReliableChannel) -> list[str]:
    return [e.message_id for e in channel.pending_events() if isinstance(e, MessageDelivered)]


def test_the_memory_store_hands_over_only_what_unseen_keeps() -> None:
    alice = MessageChannel("c", "alice", now_ms=START, config=CONFIG)
    wires = [alice.send(b"m%d" % i, START + i).data for i in range(3)]
    listed: list[list[bytes]] = []

    def unseen(hashes: list[bytes]) -> list[bytes]:
        listed.append(hashes)
        return hashes[1:]  # the first of each page was heard

    async def scenario() -> tuple[MemoryStore, list[bytes | None], list[list[Received]]]:
        net = MemoryNetwork()
        store = MemoryStore(net.transport("store"), ["/sds/1/c"])
        await store.start()
        hints = [await net.transport("alice").publish("/sds/1/c", data) for data in wires]
        await until(lambda: len(store.by_id) == 3)
        pages = [p async for p in store.catch_up("/sds/1/c/proto", 0, 2**62, 2, unseen)]
        await store.stop()
        return store, hints, pages

    store, hints, pages = asyncio.run(scenario())
    assert listed == [hints[:2], hints[2:]]
    # The second page had nothing unseen: nothing yielded for it.
    assert pages == [[Received(wires[1], hints[1])]] and store.fetched == 1


def test_back_online_resends_now_what_nobody_heard_and_waits_for_what_someone_did() -> None:
    """Published while away, a message's resends back off (into minutes after a few);
    back online, the ones nobody may have heard are due at once, and the clock of one a
    peer possibly acknowledged is left alone."""
    d = driver("a", stores=False)
    unheard = d.publish(b"while away", START).message_id
    heard = d.publish(b"heard by someone", START).message_id
    now = START
    for _ in range(4):  # resends into the void, each later than the one before
        now = d.next_due()
        d.tick(now)
    assert d.resend_at(unheard) - now > 4 * RUNTIME.resend_interval_ms
    entry = d.channel.outgoing_entry(heard)
    assert entry is not None
    entry.possible_ackers = 1  # as a peer's bloom filter would have said
    planned = d.resend_at(heard)
    back = now + 1_000
    d.back_online(back)
    assert d.resend_at(unheard) == back and d.resend_at(heard) == planned
    resent = d.tick(back)
    transmits = [a for a in resent.actions if isinstance(a, Transmit)]
    assert [(a.message_id, a.kind) for a in transmits] == [(unheard, "resend")]
