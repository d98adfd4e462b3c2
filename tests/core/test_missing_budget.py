"""The known-missing set's byte budget (issue 27, the SDS buffers): ids of the widest
characters the wire allows evict at the budget, reported like the count cap's evictions;
the config refuses a budget that could not hold one entry; and a hypothesis property that
the charge is exact and both caps hold after every step, nothing lost unreported."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdsync.core import ChannelConfig, MessageChannel, MessageMissing, MessageMissingEvicted
from sdsync.core.missing import KnownMissing, largest_missing_charge, missing_charge
from sdsync.errors import LocalProtocolError
from sdsync.wire import DEFAULT_LIMITS, HistoryEntry, Message, encode

WIDE = "\U0010ffff"  # 4 bytes a character in Python, the widest


def wide_id(i: int) -> str:
    return f"{i:08d}".ljust(DEFAULT_LIMITS.max_id_length, WIDE)


def test_wide_ids_evict_at_the_byte_budget_and_are_reported() -> None:
    """200 ids of 256 wide characters (~3.8 kB charged each; the count cap of 10,000
    would hold ~38 MB of them) under a budget of 40: the oldest go, each reported and
    counted, the budget holds; an honest gap named after them is tracked."""
    largest = largest_missing_charge(DEFAULT_LIMITS)
    budget = 40 * largest
    b = MessageChannel("c", "b", now_ms=0, config=ChannelConfig(max_known_missing_bytes=budget))
    evicted: list[str] = []
    named: list[str] = []
    for batch in range(4):
        history = tuple(
            HistoryEntry(wide_id(batch * 50 + i), bytes(256), WIDE * 256) for i in range(50)
        )
        sync = Message(WIDE * 256, f"s{batch}", "c", 10 + batch, history, None)
        events = b.receive(encode(sync), 10 + batch)
        named += [e.message_id for e in events if isinstance(e, MessageMissing)]
        evicted += [e.message_id for e in events if isinstance(e, MessageMissingEvicted)]
        assert b.missing_bytes() <= budget
    assert len(named) == 200
    assert b.missing_count() == 40
    assert evicted == named[:160]  # oldest first, every one reported
    assert b.stats.missing_evicted == 160
    honest = HistoryEntry("a" * 64, b"h" * 32, "alice")
    b.receive(encode(Message("alice", "m1", "c", 20, (honest,), None)), 20)
    assert b.missing_ids()[-1] == honest.message_id
    assert b.missing_bytes() <= budget


def test_honest_entries_reach_the_count_cap_before_the_default_budget() -> None:
    """ASCII ids of the wire's largest size, 10,000 of them, fit the 16 MiB default."""
    config = ChannelConfig()
    entry = HistoryEntry("i" * 256, bytes(256), "s" * 256)
    assert config.max_known_missing * missing_charge(entry, "p" * 256) < (
        config.max_known_missing_bytes
    )


def test_a_budget_that_holds_no_largest_entry_is_refused() -> None:
    largest = largest_missing_charge(DEFAULT_LIMITS)
    ChannelConfig(max_known_missing_bytes=largest)
    with pytest.raises(LocalProtocolError, match="max_known_missing_bytes"):
        ChannelConfig(max_known_missing_bytes=largest - 1)


ids = st.sampled_from([f"id{i}" for i in range(12)])
texts = st.text(max_size=40)
entries = st.builds(
    HistoryEntry, ids, st.none() | st.binary(max_size=40), st.none() | st.text(max_size=40)
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), entries, texts),
        st.tuples(st.just("remove"), ids, st.just("")),
        st.tuples(st.just("clear"), st.just(""), st.just("")),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(steps=steps, capacity=st.integers(1, 8), slack=st.integers(0, 2_000))
def test_the_budget_holds_and_nothing_leaves_unreported(
    steps: list[tuple[str, object, str]], capacity: int, slack: int
) -> None:
    # At least the largest entry these strategies draw, so every one fits alone.
    budget = missing_charge(HistoryEntry("id10", bytes(40), WIDE * 40), WIDE * 40) + slack
    missing = KnownMissing(capacity, budget)
    tracked: set[str] = set()
    for now, (kind, what, named_by) in enumerate(steps):
        if kind == "add":
            assert isinstance(what, HistoryEntry)
            _, evicted = missing.add(what, named_by, now)
            assert what.message_id in missing  # it never evicts itself
            gone = {known.message_id for known in evicted}
            assert what.message_id not in gone and gone <= tracked
            tracked = (tracked - gone) | {what.message_id}
        elif kind == "remove":
            assert missing.remove(str(what)) == (what in tracked)
            tracked.discard(str(what))
        else:
            missing.clear()
            tracked = set()
        held = list(missing)
        assert {known.message_id for known in held} == tracked  # no silent loss
        assert missing.bytes == sum(missing_charge(k.entry, k.named_by) for k in held)
        assert missing.bytes <= budget and len(held) <= capacity
