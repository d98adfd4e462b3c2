"""The incoming buffer's byte budget (issue 27 row 18): accounting, the eviction rule,
its reports, and a stateful test that the budget holds after every step.

Messages are built by hand so that each names exactly the dependencies a test wants;
small wire limits keep the smallest accepted budget (one largest message) small.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sdsync.core import (
    ChannelConfig,
    DropReason,
    Event,
    MessageChannel,
    MessageDelivered,
    MessageDropped,
    MessageEvicted,
    MessageMissing,
    MessageReceived,
)
from sdsync.core.config import UNMET_DEPENDENCY_BYTES, incoming_charge
from sdsync.errors import LocalProtocolError
from sdsync.wire import HistoryEntry, Message, WireLimits, encode

LIMITS = WireLimits(max_message_bytes=4_096, max_causal_history=16)
SMALLEST = incoming_charge(LIMITS.max_message_bytes, LIMITS.max_causal_history)


def config(budget: int = SMALLEST, count: int = 10_000) -> ChannelConfig:
    return ChannelConfig(
        causal_history_size=8,
        limits=LIMITS,
        max_incoming_buffer=count,
        max_incoming_buffer_bytes=budget,
    )


def wire(mid: str, lamport: int, deps: list[str], size: int = 100, sender: str = "a") -> bytes:
    history = tuple(HistoryEntry(dep, None, sender) for dep in deps)
    message = Message(
        sender_id=sender,
        message_id=mid,
        channel_id="c",
        lamport_timestamp=lamport,
        causal_history=history,
        content=b"x" * size,
    )
    return encode(message)


def junk(name: str, n: int) -> list[str]:
    return [f"{name}-never-{i}" for i in range(n)]


def of(events: list[Event], kind: type[Event]) -> list[str]:
    return [e.message_id for e in events if isinstance(e, kind)]


def evictions(events: list[Event]) -> list[MessageEvicted]:
    return [e for e in events if isinstance(e, MessageEvicted)]


def receiver(budget: int = SMALLEST, count: int = 10_000) -> MessageChannel:
    return MessageChannel("c", "b", now_ms=0, config=config(budget, count))


# ------------------------------------------------------------------ the config


@pytest.mark.parametrize("budget", [-1, 0, 1, SMALLEST - 1])
def test_a_budget_that_cannot_hold_the_largest_message_is_refused(budget: int) -> None:
    with pytest.raises(LocalProtocolError, match="max_incoming_buffer_bytes"):
        config(budget)


def test_the_default_budget_is_64_mib_and_holds_the_largest_message() -> None:
    default = ChannelConfig()
    assert default.max_incoming_buffer_bytes == 64 << 20
    largest = incoming_charge(default.limits.max_message_bytes, default.limits.max_causal_history)
    assert largest == 5 << 20  # so 12 of the largest forged messages fit, no more
    assert config(SMALLEST).max_incoming_buffer_bytes == SMALLEST


# --------------------------------------------------------------- accounting


def test_each_waiting_message_is_charged_twice_its_size_plus_each_unmet_dependency() -> None:
    b = receiver(SMALLEST * 4)
    first = wire("m1", 2, ["m0"])
    second = wire("m2", 3, ["m0", "m1", *junk("j", 3)])
    b.receive(first, 1)
    assert b.incoming_bytes() == 2 * len(first) + UNMET_DEPENDENCY_BYTES
    b.receive(second, 1)  # m1 is waiting, so not met: five unmet
    expected = 2 * len(first) + UNMET_DEPENDENCY_BYTES + 2 * len(second) + 5 * 768
    assert b.incoming_bytes() == expected
    b.mark_dependencies_met(junk("j", 3))
    assert b.incoming_bytes() == expected  # the charge is fixed on arrival
    delivered = of(b.receive(wire("m0", 1, []), 1), MessageDelivered)
    assert delivered == ["m0", "m1", "m2"]
    assert b.incoming_bytes() == 0
    assert b.buffer_sizes()[0] == 0


def test_a_message_needing_nothing_costs_nothing() -> None:
    b = receiver()
    assert of(b.receive(wire("m0", 1, [], size=3_000), 1), MessageDelivered) == ["m0"]
    assert b.incoming_bytes() == 0


# ------------------------------------------------------------------ eviction


def test_the_message_with_most_unmet_dependencies_gives_way_reported() -> None:
    b = receiver()  # the smallest budget: ~20 kB
    forged = wire("forged", 5, junk("f", 16), size=2_000)
    b.receive(forged, 1)
    forged_charge = incoming_charge(len(forged), 16)
    honest = wire("honest", 2, ["gap"], size=3_000)
    events = b.receive(honest, 2)
    assert b.incoming_ids() == ["honest"]
    (evicted,) = evictions(events)
    assert evicted == MessageEvicted(
        "forged", DropReason.INCOMING_BUFFER_BYTES, "a", 16, forged_charge
    )
    assert b.stats.evicted == {"incoming buffer over its byte budget": 1}
    assert of(events, MessageReceived) == ["honest"]
    assert of(b.receive(wire("gap", 1, []), 3), MessageDelivered) == ["gap", "honest"]


def test_a_newcomer_that_would_go_first_is_refused_and_nothing_is_evicted() -> None:
    b = receiver()
    b.receive(wire("honest", 2, ["gap"], size=3_000), 1)
    before = b.incoming_bytes()
    events = b.receive(wire("forged", 5, junk("f", 16), size=2_000), 2)
    assert events[-1] == MessageDropped("forged", DropReason.INCOMING_BUFFER_BYTES)
    assert not evictions(events)
    assert not of(events, MessageMissing)  # nothing of it was recorded
    assert (b.incoming_ids(), b.incoming_bytes()) == (["honest"], before)
    assert b.stats.dropped == {"incoming buffer over its byte budget": 1}


def test_among_equals_the_oldest_gives_way() -> None:
    b = receiver()
    for i in range(3):
        b.receive(wire(f"w{i}", 2 + i, [f"gap{i}"], size=3_000), i)
    events = b.receive(wire("w3", 9, ["gap3"], size=3_000), 5)
    assert [e.message_id for e in evictions(events)] == ["w0"]
    assert b.incoming_ids() == ["w1", "w2", "w3"]


def test_several_give_way_for_one_large_newcomer_most_unmet_first() -> None:
    b = receiver()
    b.receive(wire("few", 2, ["g0"], size=2_000), 1)
    b.receive(wire("many", 3, junk("m", 4), size=2_000), 1)
    b.receive(wire("some", 4, junk("s", 3), size=2_000), 1)
    assert not b.stats.evicted
    events = b.receive(wire("big", 9, junk("b", 3), size=3_950), 2)
    # "many" (4 unmet) first; "some" ties with the newcomer (3) and is older; "few" stays.
    assert [e.message_id for e in evictions(events)] == ["many", "some"]
    assert b.incoming_ids() == ["few", "big"]
    assert b.incoming_bytes() <= SMALLEST


def test_a_newcomer_is_refused_rather_than_evict_what_has_fewer_unmet() -> None:
    b = receiver()
    b.receive(wire("few", 2, ["g0"], size=2_000), 1)
    b.receive(wire("many", 3, junk("m", 4), size=2_000), 1)
    b.receive(wire("some", 4, junk("s", 1), size=2_400), 1)
    before = b.incoming_ids()
    events = b.receive(wire("big", 9, junk("b", 3), size=3_950), 2)
    # Evicting "many" is not enough, and "some" has fewer unmet than the newcomer.
    assert events[-1] == MessageDropped("big", DropReason.INCOMING_BUFFER_BYTES)
    assert not evictions(events)
    assert b.incoming_ids() == before


def test_the_count_cap_evicts_by_the_same_rule() -> None:
    b = receiver(count=2)
    b.receive(wire("forged", 3, junk("f", 5)), 1)
    b.receive(wire("one", 2, ["g1"]), 1)
    events = b.receive(wire("two", 4, ["g2"]), 1)
    (evicted,) = evictions(events)
    assert (evicted.message_id, evicted.reason) == ("forged", DropReason.INCOMING_BUFFER_FULL)
    dropped = b.receive(wire("worse", 5, junk("w", 2)), 1)
    assert dropped[-1] == MessageDropped("worse", DropReason.INCOMING_BUFFER_FULL)
    assert b.incoming_ids() == ["one", "two"]


def test_an_evicted_message_received_again_is_new_and_delivered_once() -> None:
    b = receiver(count=1)
    forged = wire("forged", 3, junk("f", 3))
    b.receive(forged, 1)
    assert [e.message_id for e in evictions(b.receive(wire("one", 2, ["g1"]), 1))] == ["forged"]
    assert "forged" not in b.missing_ids()  # nothing waits for it: not a gap
    b.mark_dependencies_met([*junk("f", 3), "g1"])
    delivered = of(b.receive(forged, 2), MessageDelivered) + of(
        b.receive(forged, 3), MessageDelivered
    )
    assert delivered == ["forged"]
    assert b.log_ids() == ["one", "forged"]


def test_a_dependency_evicted_under_its_dependent_becomes_missing() -> None:
    b = receiver(count=2)
    b.receive(wire("dep", 2, ["gap", "gap2"]), 1)
    b.receive(wire("dependent", 3, ["dep"]), 1)
    # The newcomer (1 unmet) ties with "dependent" and beats "dep" (2): "dep" goes.
    events = b.receive(wire("new", 4, ["other"]), 1)
    assert [e.message_id for e in evictions(events)] == ["dep"]
    assert of(events, MessageMissing) == ["dep", "other"]
    assert "dep" in b.missing_ids()
    b.mark_dependencies_met(["gap", "gap2"])
    delivered = of(b.receive(wire("dep", 2, ["gap", "gap2"]), 2), MessageDelivered)
    assert delivered == ["dep", "dependent"]


def test_an_evicted_message_leaves_the_stored_state() -> None:
    b = receiver()
    journal = b.start_journal()
    b.receive(wire("forged", 5, junk("f", 16), size=2_000), 1)
    b.receive(wire("honest", 2, ["gap"], size=3_000), 2)
    assert journal.incoming >= {"forged", "honest"}
    assert b.stored_incoming("forged") is None  # the state store deletes it
    assert b.stored_incoming("honest") is not None


# -------------------------------------------------------------- stateful test


class BudgetedReceiver(RuleBasedStateMachine):
    """One receiver under a small budget and count cap, fed messages of a random universe
    (each naming some earlier ones and some ids that never arrive) in any order, with
    duplicates. After every step the buffer is within both caps and charged exactly what
    the events say; every message that left the buffer was delivered or evicted, and each
    eviction is reported once, of a message that was waiting; nothing is delivered twice.
    At the end everything arrives again and every message is delivered exactly once."""

    @initialize(
        seed=st.integers(0, 2**32 - 1),
        budget=st.sampled_from([SMALLEST, SMALLEST * 2, SMALLEST * 4]),
        count=st.integers(1, 6),
    )
    def setup(self, seed: int, budget: int, count: int) -> None:
        rng = random.Random(seed)
        self.budget, self.count = budget, count
        self.channel = receiver(budget, count)
        self.wires: list[bytes] = []
        self.junk: list[str] = []
        for i in range(14):
            earlier = rng.sample(range(i), min(i, rng.randint(0, 4)))
            never = junk(f"u{i}", rng.choice([0, 0, 1, 2, 6, 11]))
            self.junk += never
            deps = [f"u{j}" for j in earlier] + never
            self.wires.append(wire(f"u{i}", i + 1, deps, size=rng.randint(1, 3_000)))
        self.charges: dict[str, int] = {}  # what the events say waits, and its charge
        self.delivered: set[str] = set()
        self.now = 0

    def feed(self, events: list[Event], sizes: dict[str, int]) -> None:
        before = dict(self.charges)
        left: set[str] = set()
        for event in events:
            if isinstance(event, MessageDelivered):
                assert event.message_id not in self.delivered, "delivered twice"
                self.delivered.add(event.message_id)
                left.add(event.message_id)
                self.charges.pop(event.message_id, None)
            elif isinstance(event, MessageEvicted):
                assert event.message_id in self.charges, "evicted twice, or never waiting"
                assert event.size_bytes == self.charges.pop(event.message_id)
                left.add(event.message_id)
            elif isinstance(event, MessageReceived) and event.unmet_dependencies:
                size = sizes[event.message_id]
                self.charges[event.message_id] = incoming_charge(size, event.unmet_dependencies)
        # Never silent: whatever left the buffer was delivered or evicted in this step.
        assert set(before) - set(self.channel.incoming_ids()) <= left

    @rule(pick=st.integers(0, 13))
    def arrive(self, pick: int) -> None:
        data = self.wires[pick]
        self.now += 1
        self.feed(self.channel.receive(data, self.now), {f"u{pick}": len(data)})

    @rule(pick=st.integers(0, 1 << 16))
    def junk_found(self, pick: int) -> None:
        if self.junk:
            found = self.junk[pick % len(self.junk)]
            self.feed(self.channel.mark_dependencies_met([found]), {})

    @invariant()
    def within_budget_and_accounted(self) -> None:
        if not hasattr(self, "channel"):
            return
        channel = self.channel
        assert channel.incoming_bytes() <= self.budget
        assert len(channel.incoming_ids()) <= self.count
        assert set(channel.incoming_ids()) == set(self.charges)
        assert channel.incoming_bytes() == sum(self.charges.values())

    def teardown(self) -> None:
        if not hasattr(self, "channel"):
            return
        self.feed(self.channel.mark_dependencies_met(self.junk), {})
        for _ in range(len(self.wires)):  # in order, so each finds its dependencies met
            for i, data in enumerate(self.wires):
                self.now += 1
                self.feed(self.channel.receive(data, self.now), {f"u{i}": len(data)})
        assert self.delivered == {f"u{i}" for i in range(len(self.wires))}
        assert self.channel.incoming_bytes() == 0


TestBudgetedReceiver = BudgetedReceiver.TestCase
TestBudgetedReceiver.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
