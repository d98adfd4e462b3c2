"""Seeded lossy groups of four SDS peers, driven only through the `peer --stdio` contract.

One harness runs the same scenario with four @waku/sds peers (tests/interop/js/driver.mjs),
two of those and two of ours (`python -m sdsync.cli peer --stdio` processes, or its
PeerSession in-process), or four of ours. Every round each peer hears the same clock;
scheduled peers send content; every peer may send a sync, re-broadcasts what its outgoing
sweep lists, and broadcasts its SDS-R responses; the round's frames then cross a lossy,
reordering, duplicating network; last, each peer fetches from a store what its incoming
sweep lists as missing. Sending rounds are followed by quiet lossy rounds and then a few
lossless ones, stopping early once the group has converged.

Network decisions are a pure function of the seed and of *what* is sent (round, sender,
receiver, frame key), never of a peer's earlier replies, so every group kind meets the
same network wherever its peers send the same thing.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import random
import sys
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peers import Peer, ProcessPeer, SessionPeer

from sdsync.core import ChannelConfig, RepairConfig
from sdsync.peer import PeerSession
from sdsync.wire import decode

JS_DRIVER = Path(__file__).parent / "js" / "driver.mjs"
NAMES = ("alice", "bob", "carol", "dave")


@dataclass(frozen=True)
class Pacing:
    """How a scenario unfolds over rounds; the same for every group kind."""

    messages_per_peer: int = 10
    send_rounds: int = 15
    # Rounds before this one are lossy; the rest are lossless so that convergence is possible.
    lossy_rounds: int = 30
    total_rounds: int = 36
    round_ms: int = 1_000
    start_ms: int = 1_000_000
    sync_every: int = 3
    resend_unacknowledged_after: int = 2
    # Possibly acknowledged messages probably arrived: resending them often is wasted traffic.
    resend_possibly_acknowledged_after: int = 6
    duplicate: float = 0.1
    # Shorter than the library's 30 s / 120 s so SDS-R acts within the scenario; both
    # `sdsync peer` and the JS driver take these flags.
    repair_t_min_ms: int = 3_000
    repair_t_max_ms: int = 12_000

    def __post_init__(self) -> None:
        # The last round must come after the last send: its logs are the outcome.
        assert self.send_rounds <= self.lossy_rounds < self.total_rounds


@dataclass(frozen=True, order=True)
class Scenario:
    seed: int
    causal_history: int
    loss: float
    # Our peers as `python -m sdsync.cli peer --stdio` processes rather than in-process.
    cli: bool = False

    def __str__(self) -> str:
        name = f"seed{self.seed}-ch{self.causal_history}-loss{round(self.loss * 100)}"
        return name + "-cli" if self.cli else name


class GroupKind(enum.Enum):
    JS = "4 x @waku/sds"
    MIXED = "2 @waku/sds + 2 sdsync"
    SDSYNC = "4 x sdsync"

    @property
    def implementations(self) -> tuple[str, ...]:
        return {
            GroupKind.JS: ("js",) * 4,
            GroupKind.MIXED: ("js", "py", "js", "py"),
            GroupKind.SDSYNC: ("py",) * 4,
        }[self]


def start_peer(implementation: str, index: int, scenario: Scenario, pacing: Pacing) -> Peer:
    name = f"{implementation}:{NAMES[index]}"
    options = {
        "participant": NAMES[index],
        "causal-history": scenario.causal_history,
        "repair-t-min-ms": pacing.repair_t_min_ms,
        "repair-t-max-ms": pacing.repair_t_max_ms,
    }
    argv = [f"--{flag}={value}" for flag, value in options.items()]
    if implementation == "js":
        # Only the driver's Math.random (sync-message ids) depends on it; peers sharing a
        # seed would all send the same sync ids, which no real group does.
        seed = scenario.seed * len(NAMES) + index + 1
        return ProcessPeer(name, ["node", str(JS_DRIVER), *argv, f"--seed={seed}"])
    if scenario.cli:
        return ProcessPeer(name, [sys.executable, "-m", "sdsync.cli", "peer", "--stdio", *argv])
    # What `sdsync peer` builds from the same options (ids are always given on send, so
    # the default id scheme does not matter).
    repair = RepairConfig(t_min_ms=pacing.repair_t_min_ms, t_max_ms=pacing.repair_t_max_ms)
    config = ChannelConfig(causal_history_size=scenario.causal_history, repair=repair)
    return SessionPeer(name, PeerSession("0", NAMES[index], config))


@dataclass(frozen=True)
class WireFacts:
    message_id: str
    lamport: int
    history: frozenset[str]


@functools.lru_cache(maxsize=8192)
def wire_facts(wire_hex: str) -> WireFacts:
    message = decode(bytes.fromhex(wire_hex))
    return WireFacts(
        message.message_id,
        message.lamport_timestamp or 0,
        frozenset(e.message_id for e in message.causal_history),
    )


class Dice:
    """Uniform draws keyed by what they decide, so equal situations get equal outcomes."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def uniform(self, *key: object) -> float:
        digest = hashlib.blake2b(repr((self.seed, *key)).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64

    def chance(self, probability: float, *key: object) -> bool:
        return probability > 0 and self.uniform(*key) < probability


def send_plan(seed: int, pacing: Pacing) -> dict[int, list[int]]:
    """Round -> indexes of the peers sending one message in it (a peer may appear twice)."""
    rng = random.Random(seed)
    plan: dict[int, list[int]] = {}
    for index in range(len(NAMES)):
        for rnd in sorted(
            rng.randrange(pacing.send_rounds) for _ in range(pacing.messages_per_peer)
        ):
            plan.setdefault(rnd, []).append(index)
    return {rnd: sorted(senders) for rnd, senders in plan.items()}


@dataclass(frozen=True)
class Frame:
    sender: int
    # What the network dice see; independent of the implementation's choices of sync ids.
    key: str
    wire_hex: str


@dataclass
class Member:
    name: str
    implementation: str
    peer: Peer
    own_wire: dict[str, str] = field(default_factory=dict)
    last_broadcast: dict[str, int] = field(default_factory=dict)
    # Every id named in the causal history of a frame this peer accepted.
    heard: set[str] = field(default_factory=set)
    sent_count: int = 0


def logs_converged(logs: Sequence[Sequence[str]], sent: Collection[str]) -> bool:
    """Every peer holds the same log, and it is exactly the content that was sent."""
    first = list(logs[0])
    return all(list(log) == first for log in logs) and len(first) == len(sent) == len(
        set(first) & set(sent)
    )


@dataclass(frozen=True)
class GroupOutcome:
    kind: GroupKind
    rounds: int
    sent: frozenset[str]
    names: tuple[str, ...]
    implementations: tuple[str, ...]
    logs: tuple[tuple[str, ...], ...]
    heard: tuple[frozenset[str], ...]
    lamports: dict[str, int]

    @property
    def converged(self) -> bool:
        return logs_converged(self.logs, self.sent)

    def unheeded(self, implementation: str) -> dict[str, list[str]]:
        """Peers of that implementation that end without ids they heard of, and those ids."""
        out: dict[str, list[str]] = {}
        for name, impl, log, heard in zip(
            self.names, self.implementations, self.logs, self.heard, strict=True
        ):
            absent = sorted(heard - set(log))
            if impl == implementation and absent:
                out[name] = absent
        return out

    def disordered(self) -> list[str]:
        """Peers whose log is not in (Lamport timestamp, message id) order."""
        return [
            name
            for name, log in zip(self.names, self.logs, strict=True)
            if list(log) != sorted(log, key=lambda mid: (self.lamports[mid], mid))
        ]


class GroupRun:
    def __init__(
        self, scenario: Scenario, kind: GroupKind, members: list[Member], pacing: Pacing
    ) -> None:
        self.scenario = scenario
        self.kind = kind
        self.members = members
        self.pacing = pacing
        self.dice = Dice(scenario.seed)
        self.plan = send_plan(scenario.seed, pacing)
        # What a store node would hold: every content message ever sent, as first sent.
        self.store: dict[str, str] = {}
        self.logs: list[list[str]] = []

    def run(self) -> GroupOutcome:
        rounds = 0
        for rnd in range(self.pacing.total_rounds):
            self.play_round(rnd)
            rounds = rnd + 1
            # Logs only grow, so once everything is sent a converged group stays converged.
            if rnd >= self.pacing.send_rounds - 1 and self.refresh_logs_converged():
                break
        return GroupOutcome(
            kind=self.kind,
            rounds=rounds,
            sent=frozenset(self.store),
            names=tuple(m.name for m in self.members),
            implementations=tuple(m.implementation for m in self.members),
            logs=tuple(tuple(log) for log in self.logs),
            heard=tuple(frozenset(m.heard) for m in self.members),
            lamports={mid: wire_facts(wire).lamport for mid, wire in self.store.items()},
        )

    def loss(self, rnd: int) -> float:
        return self.scenario.loss if rnd < self.pacing.lossy_rounds else 0.0

    def play_round(self, rnd: int) -> None:
        now = self.pacing.start_ms + rnd * self.pacing.round_ms
        for member in self.members:
            member.peer.ok("clock", now_ms=now)
        frames = [self.send_content(index, rnd) for index in self.plan.get(rnd, [])]
        for index, member in enumerate(self.members):
            frames += self.maintain(index, member, rnd)
        self.deliver(rnd, frames)
        for index, member in enumerate(self.members):
            self.retrieve_missing(index, member, rnd)

    def send_content(self, index: int, rnd: int) -> Frame:
        member = self.members[index]
        member.sent_count += 1
        payload = f"{member.name}-{member.sent_count}".encode()
        # @waku/sds always uses sha256(payload); naming it keeps ours on the same ids
        # whatever its default scheme, so both kinds meet the same network dice.
        mid = hashlib.sha256(payload).hexdigest()
        wire = member.peer.ok("send", payload_hex=payload.hex(), message_id=mid)["wire_hex"]
        member.own_wire[mid] = wire
        member.last_broadcast[mid] = rnd
        self.store[mid] = wire
        return Frame(index, f"send:{mid}", wire)

    def maintain(self, index: int, member: Member, rnd: int) -> list[Frame]:
        frames: list[Frame] = []
        if (rnd + index) % self.pacing.sync_every == 0:
            wire = member.peer.ok("sync")["wire_hex"]
            if wire is not None:
                frames.append(Frame(index, "sync", wire))
        sweep = member.peer.ok("sweep_outgoing")
        for mid in self.due_resends(member, sweep, rnd):
            member.last_broadcast[mid] = rnd
            frames.append(Frame(index, f"resend:{mid}", member.own_wire[mid]))
        for wire in member.peer.ok("repair_sweep")["wire_hex_list"]:
            frames.append(Frame(index, f"repair:{wire_facts(wire).message_id}", wire))
        return frames

    def due_resends(self, member: Member, sweep: dict[str, Any], rnd: int) -> Iterable[str]:
        waits = (
            ("unacknowledged", self.pacing.resend_unacknowledged_after),
            ("possibly_acknowledged", self.pacing.resend_possibly_acknowledged_after),
        )
        for listing, wait in waits:
            for mid in sweep[listing]:
                if rnd - member.last_broadcast.get(mid, -wait) >= wait:
                    yield mid

    def deliver(self, rnd: int, frames: list[Frame]) -> None:
        loss = self.loss(rnd)
        arrivals: list[tuple[float, int, Frame]] = []
        for frame in frames:
            for receiver in range(len(self.members)):
                slot = (rnd, frame.key, frame.sender, receiver)
                if receiver == frame.sender or self.dice.chance(loss, "loss", *slot):
                    continue
                copies = 2 if self.dice.chance(self.pacing.duplicate, "dup", *slot) else 1
                arrivals += [
                    (self.dice.uniform("order", copy, *slot), receiver, frame)
                    for copy in range(copies)
                ]
        arrivals.sort(key=lambda arrival: arrival[0])
        for _, receiver, frame in arrivals:
            self.hand_over(receiver, frame.wire_hex)

    def hand_over(self, receiver: int, wire_hex: str) -> None:
        member = self.members[receiver]
        member.peer.ok("receive", wire_hex=wire_hex)
        member.heard.update(wire_facts(wire_hex).history)

    def retrieve_missing(self, index: int, member: Member, rnd: int) -> None:
        for entry in member.peer.ok("sweep_incoming")["missing"]:
            mid = entry["message_id"]
            wire = self.store.get(mid)
            if wire is not None and not self.dice.chance(self.loss(rnd), "store", rnd, mid, index):
                self.hand_over(index, wire)

    def refresh_logs_converged(self) -> bool:
        self.logs = [m.peer.ok("state")["log"] for m in self.members]
        return logs_converged(self.logs, self.store.keys())


def run_group(scenario: Scenario, kind: GroupKind, pacing: Pacing) -> GroupOutcome:
    with ExitStack() as stack:
        members = []
        for index, implementation in enumerate(kind.implementations):
            peer = start_peer(implementation, index, scenario, pacing)
            stack.callback(peer.close)
            members.append(Member(NAMES[index], implementation, peer))
        return GroupRun(scenario, kind, members, pacing).run()


@dataclass(frozen=True)
class ScenarioOutcome:
    scenario: Scenario
    groups: dict[GroupKind, GroupOutcome]

    def __getitem__(self, kind: GroupKind) -> GroupOutcome:
        return self.groups[kind]


def run_scenario(scenario: Scenario, pacing: Pacing = Pacing()) -> ScenarioOutcome:
    # The JS peers (and our `cli` ones) are processes, so the groups overlap on two cores.
    with ThreadPoolExecutor(len(GroupKind)) as pool:
        futures = {kind: pool.submit(run_group, scenario, kind, pacing) for kind in GroupKind}
        return ScenarioOutcome(scenario, {kind: f.result() for kind, f in futures.items()})
