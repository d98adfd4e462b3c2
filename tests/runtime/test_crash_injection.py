"""Crash consistency, in process: a participant dies between any two SQL statements.

Three participants exchange messages over a seeded lossy network on a virtual clock. ``a``
keeps its state in SQLite through a connection that, when armed, raises at its k-th next
statement — inside a step's transaction, between transactions, or while moving the
delivered cursor — and refuses everything after, as a killed process would. The test then
drops ``a`` (only what was committed survives), reopens it from the file and checks:

* the restored channel equals ``a`` as of its last committed step (log, bloom filter,
  incoming and outgoing buffers with attempts, lost ids, Lamport timestamp): a step is
  stored entirely or not at all;
* every message ``a`` accepted for sending (``publish`` committed) and every message
  handed to its application is in the stored log, whose order only ever grows by insertion;
* the Lamport clock never goes backwards, not even below what ``a`` already transmitted;
* nothing is handed to the application twice, and deliveries committed but not handed
  over are offered again.

At the end the network stops losing packets and everyone runs until nothing is left to
do: every log then holds every accepted message, and ``a``'s application has seen each
message of the others exactly once.
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
from sdsync.runtime import ChannelDriver, ChannelState, QueryStore, RuntimeConfig, Step
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
    handed: list[str] = field(default_factory=list)
    transmitted_lamport: int = 0
    committed: dict[str, Any] = field(default_factory=dict)
    logged: set[str] = field(default_factory=set)  # what the committed steps put in the log


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
        """Commit (for a), transmit, then hand deliveries to the application."""
        if peer.state is None:
            self._transmit(peer, step)
            return
        deliveries = peer.state.commit(step)
        truth = self.truth
        truth.committed = fingerprint(peer)
        for event in step.events:
            if isinstance(event, MessageSent):
                truth.accepted.add(event.message_id)  # send() would return now
                truth.logged.add(event.message_id)
            elif isinstance(event, MessageDelivered):
                truth.logged.add(event.message_id)
        self._transmit(peer, step)
        for d in deliveries:
            if d.seq is not None:
                self._hand(peer.state, d.seq, d.event.message_id)

    def _hand(self, state: ChannelState, seq: int, message_id: str) -> None:
        state.handed_off(seq)
        self.truth.handed.append(message_id)

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
            self.sent_by_others.add(step.actions[0].message_id)  # type: ignore[union-attr]
        self.run(peer, step)

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
        for d in state.pending:
            assert d.seq is not None
            self._hand(state, d.seq, d.event.message_id)

    def check_restored(self) -> None:
        truth = self.truth
        state = self.a.state
        assert state is not None
        assert fingerprint(self.a) == truth.committed  # all of the last step, or none
        log = stored_log(state)
        assert set(log) == truth.logged
        assert truth.accepted <= set(log)
        assert set(truth.handed) <= set(log)
        assert self.a.channel.lamport_timestamp >= truth.transmitted_lamport
        assert len(truth.handed) == len(set(truth.handed))
        pending = [d.event.message_id for d in state.pending]
        assert not set(pending) & set(truth.handed)

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
    world.check_restored()
    # a's application saw every message of the others exactly once, across all its lives.
    from_others = [mid for mid in world.truth.handed if mid in world.sent_by_others]
    assert sorted(from_others) == sorted(world.sent_by_others)
    assert len(world.truth.accepted) > 10  # a did send, despite dying again and again
