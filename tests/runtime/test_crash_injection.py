"""Crash consistency, in process: a participant dies between any two SQL statements.

Three participants exchange messages over a seeded lossy network on a virtual clock. ``a``
keeps its state in SQLite through a connection that, when armed, raises at its k-th next
statement — inside a step's transaction, between transactions, or while the application
acknowledges events — and refuses everything after, as a killed process would. The test then
drops ``a`` (only what was committed survives), reopens it from the file and checks:

* the restored channel equals ``a`` as of its last committed step (log, bloom filter,
  incoming and outgoing buffers with attempts, lost ids, Lamport timestamp): a step is
  stored entirely or not at all;
* every message ``a`` accepted for sending (``publish`` committed) and every message
  handed to its application is in the stored log, whose order only ever grows by insertion;
* the Lamport clock never goes backwards, not even below what ``a`` already transmitted;
* events are delivered at least once under stable numbers: after a restart exactly the
  committed events above the stored acknowledgement are reported again, each under the
  number (and with the content) it had; an event whose acknowledgement was stored never
  comes back; a number never names two different events, nor a message two numbers.

At the end the network stops losing packets and everyone runs until nothing is left to
do: every log then holds every accepted message, and ``a``'s application has heard of
each message of the others, each under exactly one number.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sdsync.core import (
    BloomParams,
    ChannelConfig,
    MessageChannel,
    MessageDelivered,
    MessageSent,
    RepairConfig,
)
from sdsync.runtime import ChannelDriver, ChannelState, Delivery, QueryStore, RuntimeConfig, Step
from sdsync.runtime.event_log import DURABLE_EVENTS
from sdsync.wire import decode

START = 1_700_000_000_000
CONFIG = ChannelConfig(
    bloom=BloomParams(40, 0.01),  # rolls over several times
    causal_history_size=8,
    max_log_entries=30,  # most of the log only in SQLite
    lost_timeout_ms=None,
    repair=RepairConfig(t_min_ms=200, t_max_ms=1_000),
)
RUNTIME = RuntimeConfig(
    sync_interval_ms=300,
    resend_interval_ms=250,
    resend_possibly_acknowledged_ms=500,
    resend_backoff=1.0,
    max_attempts=1_000_000,  # never give up: everything accepted must arrive
    incoming_sweep_ms=100,
    store_query_ms=100,
    # The harness's store answers by id, as a by-hint store does; catch-ups (a time range)
    # and their crash story are tested in test_state.py and test_catch_up.py.
    store_catchup=False,
)
CRASHES = 40


class CrashError(Exception):
    """The process died."""


class FaultyConnection:
    """Forwards to a real connection until its armed statement; then every call fails."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.countdown: int | None = None
        self.dead = False

    def _tick(self) -> None:
        if self.dead:
            raise CrashError
        if self.countdown is not None:
            self.countdown -= 1
            if self.countdown < 0:
                self.dead = True
                raise CrashError

    def execute(self, *args: Any) -> Any:
        self._tick()
        return self.db.execute(*args)

    def executemany(self, *args: Any) -> Any:
        self._tick()
        return self.db.executemany(*args)

    @property
    def in_transaction(self) -> bool:
        return self.db.in_transaction

    def close(self) -> None:
        self.db.close()


@dataclass
class Peer:
    name: str
    driver: ChannelDriver
    state: ChannelState | None = None
    faulty: FaultyConnection | None = None

    @property
    def channel(self) -> MessageChannel:
        return self.driver.channel


@dataclass
class Truth:
    """What the test saw happen to ``a``, across all its lives."""

    accepted: set[str] = field(default_factory=set)
    transmitted_lamport: int = 0
    committed: dict[str, Any] = field(default_factory=dict)
    logged: set[str] = field(default_factory=set)  # what the committed steps put in the log
    # Every event a committed step numbered, by number (the current life's numbering of
    # events whose commit failed is forgotten with that life).
    events: dict[int, Delivery] = field(default_factory=dict)
    # The acknowledgement as of the last commit: what a restart starts from.
    stored_ack: int = 0
    # Every report to the application, in order, across lives.
    reported: list[Delivery] = field(default_factory=list)
    reported_seqs: set[int] = field(default_factory=set)
    # The number each delivered message was reported under.
    delivered_as: dict[str, int] = field(default_factory=dict)
    reports_again: int = 0  # events reported in an earlier life too


def fingerprint(peer: Peer) -> dict[str, Any]:
    chan = peer.channel
    return {
        "window": chan.log_ids(),
        "bloom": chan.bloom_bytes(),
        "incoming": sorted(chan.incoming_ids()),
        "outgoing": sorted(
            (mid, chan.outgoing_entry(mid).attempts)  # type: ignore[union-attr]
            for mid in chan.outgoing_ids()
        ),
        "missing": sorted(chan.missing_ids()),
        "lamport": chan.lamport_timestamp,
    }


def open_a(path: Path, now: int, seed: int) -> Peer:
    channel = MessageChannel("chan", "a", now_ms=now, config=CONFIG)
    driver = ChannelDriver(channel, RUNTIME, random.Random(seed), now)
    state = ChannelState(path, driver)
    faulty = FaultyConnection(state._db)
    state._db = faulty  # type: ignore[assignment]
    return Peer("a", driver, state, faulty)


def stored_log(state: ChannelState) -> list[str]:
    records = state.history()
    keys = [(r.lamport_timestamp, r.message_id) for r in records]
    assert keys == sorted(keys), "log out of (Lamport timestamp, id) order"
    return [r.message_id for r in records]


class World:
    def __init__(self, tmp_path: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now = START
        self.path = tmp_path / "a.sqlite"
        self.truth = Truth()
        self.lives = 0
        self.a = open_a(self.path, self.now, seed)
        self.others = [
            Peer(
                n,
                ChannelDriver(
                    MessageChannel("chan", n, now_ms=START, config=CONFIG),
                    RUNTIME,
                    random.Random(n),
                    START,
                ),
            )
            for n in ("b", "c")
        ]
        self.in_flight: list[tuple[str, bytes]] = []
        self.archive: dict[str, bytes] = {}
        self.sent_by_others: set[str] = set()
        self.loss = 0.15
        self.truth.committed = fingerprint(self.a)

    @property
    def peers(self) -> list[Peer]:
        return [self.a, *self.others]

    # -------------------------------------------------------------- carrying out

    def run(self, peer: Peer, step: Step) -> None:
        """Number and commit (for a), transmit, then report the events to the application,
        which acknowledges them (stored with the next commit)."""
        if peer.state is None:
            self._transmit(peer, step)
            return
        state = peer.state
        numbered = state.events.record(e for e in step.events if isinstance(e, DURABLE_EVENTS))
        state.commit()
        truth = self.truth
        truth.committed = fingerprint(peer)
        truth.stored_ack = state.events.acked_seq
        for delivery in numbered:
            assert delivery.seq is not None and delivery.seq not in truth.events
            truth.events[delivery.seq] = delivery
        for event in step.events:
            if isinstance(event, MessageSent):
                truth.accepted.add(event.message_id)  # send() would return now
                truth.logged.add(event.message_id)
            elif isinstance(event, MessageDelivered):
                truth.logged.add(event.message_id)
        self._transmit(peer, step)
        self._report(state, numbered)

    def _report(self, state: ChannelState, deliveries: list[Delivery]) -> None:
        truth = self.truth
        for d in deliveries:
            assert d.seq is not None
            assert truth.events[d.seq] == d, "a number named two different events"
            if d.seq in truth.reported_seqs:
                truth.reports_again += 1
            truth.reported_seqs.add(d.seq)
            truth.reported.append(d)
            if isinstance(d.event, MessageDelivered):
                seq = truth.delivered_as.setdefault(d.event.message_id, d.seq)
                assert seq == d.seq, "a message reported under two numbers"
        if deliveries:
            state.events.ack(deliveries[-1].seq or 0)  # may die: the acknowledgement reads

    def _transmit(self, peer: Peer, step: Step) -> None:
        for action in step.actions:
            if isinstance(action, QueryStore):
                # A store node that heard everything: old gaps are beyond any SDS-R cache.
                found = [
                    self.archive[e.message_id]
                    for e in action.entries
                    if e.message_id in self.archive
                ]
                self.in_flight += [(peer.name, data) for data in found]
                continue
            self.archive.setdefault(action.message_id, action.data)
            if peer is self.a:
                lamport = decode(action.data).lamport_timestamp or 0
                self.truth.transmitted_lamport = max(self.truth.transmitted_lamport, lamport)
            for other in self.peers:
                if other is not peer:
                    self.in_flight.append((other.name, action.data))

    # ----------------------------------------------------------------- moves

    def publish(self, peer: Peer) -> None:
        payload = f"{peer.name} {self.rng.random()}".encode()
        step = peer.driver.publish(payload, self.now)
        if peer is not self.a:
            self.sent_by_others.add(step.message_id)
        self.run(peer, step.whole())

    def deliver_one(self) -> None:
        dst, data = self.in_flight.pop(self.rng.randrange(len(self.in_flight)))
        if self.rng.random() < self.loss:
            return
        if self.rng.random() < 0.05:
            self.in_flight.append((dst, data))  # duplicated
        peer = next(p for p in self.peers if p.name == dst)
        self.run(peer, peer.driver.receive(data, self.now, retrieval_hint=None))

    def advance(self) -> None:
        self.now = min(p.driver.next_due() for p in self.peers)
        for peer in self.peers:
            if peer.driver.next_due() <= self.now:
                self.run(peer, peer.driver.tick(self.now))

    def move(self) -> None:
        roll = self.rng.random()
        if roll < 0.12:
            self.publish(self.rng.choice(self.peers))
        elif roll < 0.85 and self.in_flight:
            self.deliver_one()
        else:
            self.advance()

    # ------------------------------------------------------------------ crashes

    def arm(self) -> None:
        faulty = self.a.faulty
        assert faulty is not None
        if faulty.countdown is None and self.rng.random() < 0.03:
            faulty.countdown = self.rng.randrange(0, 25)

    def crash_and_restart(self) -> None:
        assert self.a.faulty is not None and self.a.state is not None
        self.a.faulty.close()  # uncommitted work is gone, as after kill -9
        # Frames queued for a died with it.
        self.in_flight = [(dst, data) for dst, data in self.in_flight if dst != "a"]
        self.lives += 1
        self.a = open_a(self.path, self.now, self.lives)
        self.check_restored()
        state = self.a.state
        assert state is not None
        self._report(state, self.unacknowledged(state))

    def unacknowledged(self, state: ChannelState) -> list[Delivery]:
        out: list[Delivery] = []
        after = state.events.acked_seq
        while batch := state.events.read(after, 7):  # small pages: the paging is attacked too
            out += batch
            after = batch[-1].seq or after
        return out

    def check_restored(self) -> None:
        """Just reopened: the state is the last commit's, and so are the events."""
        truth = self.truth
        state = self.a.state
        assert state is not None
        assert fingerprint(self.a) == truth.committed  # all of the last step, or none
        log = stored_log(state)
        assert set(log) == truth.logged
        assert truth.accepted <= set(log)
        assert set(truth.delivered_as) <= set(log)
        assert self.a.channel.lamport_timestamp >= truth.transmitted_lamport
        last = max(truth.events, default=0)
        assert (state.events.last_seq, state.events.acked_seq) == (last, truth.stored_ack)
        # Exactly the committed events not acknowledged in a commit, as they were numbered.
        expected = [truth.events[seq] for seq in sorted(truth.events) if seq > truth.stored_ack]
        assert self.unacknowledged(state) == expected
        assert state.events.unacknowledged == len(expected)

    def settle(self) -> None:
        """No more loss or crashes: run until every buffer is empty and logs agree."""
        self.loss = 0.0
        assert self.a.faulty is not None
        self.a.faulty.countdown = None
        for _ in range(50_000):
            if self.in_flight:
                self.deliver_one()
            elif self.converged():
                return
            else:
                self.advance()
        raise AssertionError("did not converge")

    def converged(self) -> bool:
        everything = self.truth.accepted | self.sent_by_others
        return all(mid in p.channel.log for p in self.peers for mid in everything) and not any(
            p.channel.outgoing_ids() or p.channel.incoming_ids() for p in self.peers
        )


@pytest.mark.parametrize("seed", [2024, 7])
def test_crashes_between_sql_statements_lose_nothing(tmp_path: Path, seed: int) -> None:
    world = World(tmp_path, seed)
    moves = 0
    while world.lives < CRASHES:
        world.arm()
        try:
            world.move()
        except CrashError:
            world.crash_and_restart()
        moves += 1
        assert moves < 100_000, "too few crashes: arm more often"
    world.settle()
    truth = world.truth
    state = world.a.state
    assert state is not None and world.a.faulty is not None
    world.a.faulty.close()  # one more death, with nothing in flight: the final state
    world.a = open_a(world.path, world.now, world.lives + 1)
    world.check_restored()
    # a's application heard of every message of the others, each under one number, and
    # of every event any committed step numbered.
    from_others = set(truth.delivered_as) & world.sent_by_others
    assert from_others == world.sent_by_others
    assert truth.reported_seqs == set(truth.events)
    assert truth.reports_again > 0  # crashes did fall between a commit and its acknowledgement
    assert len(truth.accepted) > 10  # a did send, despite dying again and again
