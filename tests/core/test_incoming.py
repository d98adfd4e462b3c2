"""The incoming buffer on its own (sdsync.core.incoming): the dependency index both ways,
release order, the charge and both caps, which messages give way at the bounds and when
a newcomer is refused instead, and the round trip through stored state.

The channel-level behaviour (events, stats, gaps made of evicted messages) is in
test_buffer_budget.py; these tests pin the buffer's own contract, which the channel
relies on.
"""

from __future__ import annotations

from sdsync.core import DropReason, StoredIncoming
from sdsync.core.config import UNMET_DEPENDENCY_BYTES, incoming_charge
from sdsync.core.incoming import IncomingBuffer, WaitingMessage, waiting_charge
from sdsync.wire import HistoryEntry, Message, decode, encode


def message(mid: str, deps: list[str], size: int = 10) -> Message:
    return Message(
        sender_id="a",
        message_id=mid,
        channel_id="c",
        lamport_timestamp=1,
        causal_history=tuple(HistoryEntry(dep, None, "a") for dep in deps),
        content=b"x" * size,
    )


def waiting(mid: str, deps: list[str], charge: int = 100, received_ms: int = 0) -> WaitingMessage:
    return WaitingMessage(message(mid, deps), None, None, received_ms, set(deps), charge)


def buffer(capacity: int = 100, byte_budget: int = 10_000, *held: WaitingMessage) -> IncomingBuffer:
    incoming = IncomingBuffer(capacity, byte_budget)
    for w in held:
        incoming.add(w)
    return incoming


def ids(messages: list[WaitingMessage] | None) -> list[str] | None:
    return None if messages is None else [w.message_id for w in messages]


# ------------------------------------------------------------ index and charge


def test_add_charges_and_indexes_every_unmet_dependency() -> None:
    incoming = buffer(100, 10_000, waiting("m1", ["d1", "d2"], 300), waiting("m2", ["d2"], 50))
    assert (len(incoming), incoming.bytes) == (2, 350)
    assert [w.message_id for w in incoming] == ["m1", "m2"]  # arrival order
    assert "m1" in incoming and "d1" not in incoming
    assert incoming.awaited("d1") and incoming.awaited("d2")
    assert not incoming.awaited("m1")


def test_release_frees_what_needed_only_that_dependency_by_id_and_keeps_the_rest() -> None:
    incoming = buffer(
        100,
        10_000,
        waiting("m2", ["d"], 10),
        waiting("m1", ["d"], 20),
        waiting("m3", ["d", "e"], 40),
    )
    released = list(incoming.release("d"))
    assert ids(released) == ["m1", "m2"]  # by message id, not arrival
    assert [w.message_id for w in incoming] == ["m3"]
    assert incoming.bytes == 40
    held = incoming.get("m3")
    assert held is not None and held.unmet == {"e"}
    assert not incoming.awaited("d")
    assert list(incoming.release("d")) == []  # a dependency met twice releases nothing


def test_remove_drops_its_index_entries_but_not_those_of_others() -> None:
    m1 = waiting("m1", ["d1", "d2"])
    incoming = buffer(100, 10_000, m1, waiting("m2", ["d2"]))
    incoming.remove("m1")
    assert "m1" not in incoming and m1.unmet == {"d1", "d2"}  # as it was, for its report
    assert not incoming.awaited("d1")
    assert incoming.awaited("d2")
    assert ids(list(incoming.release("d2"))) == ["m2"]
    assert (len(incoming), incoming.bytes) == (0, 0)


def test_unindex_keeps_the_dependency_unmet_but_its_arrival_no_longer_releases() -> None:
    incoming = buffer(100, 10_000, waiting("m1", ["d1", "d2"]))
    incoming.unindex("m1", "d1")
    assert not incoming.awaited("d1")
    assert list(incoming.release("d1")) == []
    held = incoming.get("m1")
    assert held is not None and held.unmet == {"d1", "d2"}
    assert ids(list(incoming.release("d2"))) == []  # d1 still counts as unmet


def test_the_charge_is_of_the_bytes_kept_or_of_the_message_encoded_again() -> None:
    m = message("m", ["d1", "d2"], size=500)
    data = encode(m)
    expected = 2 * len(data) + 2 * UNMET_DEPENDENCY_BYTES
    assert waiting_charge(m, data, 2) == expected == incoming_charge(len(data), 2)
    assert waiting_charge(m, None, 2) == expected
    assert waiting_charge(m, b"12345", 0) == 10  # what was received, whatever it decodes to


def test_expired_is_what_arrived_timeout_ago_and_removes_nothing() -> None:
    incoming = buffer(
        100,
        10_000,
        waiting("late", ["d"], received_ms=50),
        waiting("early", ["d"], received_ms=10),
        waiting("edge", ["d"], received_ms=40),
    )
    assert ids(incoming.expired(60, 20)) == ["early", "edge"]
    assert len(incoming) == 3


def test_every_change_is_touched_once_a_journal_records() -> None:
    incoming = buffer(100, 10_000, waiting("before", ["d"]))
    touched: set[str] = set()
    incoming.touched = touched
    incoming.add(waiting("m1", ["d"]))
    assert touched == {"m1"}
    list(incoming.release("d"))
    assert touched == {"m1", "before"}
    touched.clear()
    incoming.add(waiting("m2", ["e"]))
    incoming.add(waiting("m3", ["e"]))
    touched.clear()
    incoming.clear()
    assert touched == {"m2", "m3"}
    assert (len(incoming), incoming.bytes, incoming.awaited("e")) == (0, 0, False)


# ------------------------------------------------------------------ the bounds


def test_over_cap_names_the_count_before_the_bytes() -> None:
    incoming = buffer(2, 1_000, waiting("m1", ["d"], 600))
    assert incoming.over_cap(1, 400) is None  # both caps reached exactly: it fits
    assert incoming.over_cap(1, 401) is DropReason.INCOMING_BUFFER_BYTES
    assert incoming.over_cap(2, 0) is DropReason.INCOMING_BUFFER_FULL
    assert incoming.over_cap(2, 401) is DropReason.INCOMING_BUFFER_FULL


def test_most_unmet_gives_way_first_then_the_oldest_among_equals() -> None:
    incoming = buffer(
        4,
        10_000,
        waiting("old-two", ["a", "b"]),
        waiting("three", ["a", "b", "c"]),
        waiting("new-two", ["c", "d"]),
        waiting("one", ["e"]),
    )
    # Full by count: one victim is enough, the one with the most unmet dependencies.
    assert ids(incoming.victims(1, 100)) == ["three"]
    assert len(incoming) == 4  # nothing is removed by asking
    incoming.remove("three")
    incoming.add(waiting("newest", ["f"]))
    assert ids(incoming.victims(1, 100)) == ["old-two"]  # it ties with new-two, and is older


def test_victims_continue_in_order_until_the_newcomer_fits_and_no_further() -> None:
    incoming = buffer(
        100,
        1_000,
        waiting("old-two", ["a", "b"], 200),
        waiting("three", ["a", "b", "c"], 100),
        waiting("new-two", ["c", "d"], 300),
        waiting("one", ["e"], 400),
    )
    # 1,000 held; a newcomer of 450 needs 450 freed: three (100), old-two (200), then
    # new-two (300) reaches it; "one" stays.
    assert ids(incoming.victims(1, 450)) == ["three", "old-two", "new-two"]
    # 150 needs only "three" and "old-two".
    assert ids(incoming.victims(1, 150)) == ["three", "old-two"]


def test_a_newcomer_is_refused_rather_than_evict_one_with_fewer_unmet() -> None:
    incoming = buffer(
        100, 1_000, waiting("three", ["a", "b", "c"], 100), waiting("one", ["e"], 900)
    )
    # Evicting "three" frees too little, and "one" has fewer unmet than the newcomer (2).
    assert incoming.victims(2, 300) is None
    # A newcomer with as few unmet as "one" ties with it, and is newer: "one" goes.
    assert ids(incoming.victims(1, 300)) == ["three", "one"]


def test_a_newcomer_that_would_go_first_is_refused_outright() -> None:
    incoming = buffer(1, 10_000, waiting("two", ["a", "b"]))
    assert incoming.victims(3, 100) is None
    assert ids(incoming.victims(2, 100)) == ["two"]  # equal: the older one gives way


# ------------------------------------------------------------------ stored state


def test_stored_is_the_bytes_received_or_the_message_encoded() -> None:
    m = message("m", ["d"])
    incoming = buffer(
        100,
        10_000,
        WaitingMessage(m, b"as received", b"hint", 7, {"d"}, 100),
        waiting("decoded-only", ["d"], received_ms=9),
    )
    assert incoming.stored("m") == StoredIncoming(b"as received", b"hint", 7)
    assert incoming.stored("decoded-only") == StoredIncoming(
        encode(message("decoded-only", ["d"])), None, 9
    )
    assert incoming.stored("absent") is None


def test_restore_charges_as_on_arrival_and_rebuilds_the_index() -> None:
    m = message("m", ["d1", "d2", "d1"])  # a history may name an id twice
    stored = StoredIncoming(encode(m), b"hint", 5)
    decoded = decode(stored.data)
    unmet = list(decoded.causal_history)  # what the restored log lacks: all three entries
    incoming = IncomingBuffer(100, 10_000_000)
    touched: set[str] = set()
    incoming.touched = touched
    incoming.restore(stored, decoded, unmet)
    held = incoming.get("m")
    assert held is not None
    assert held.unmet == {"d1", "d2"}
    # Charged per entry, as receive charges it (len of the unmet entries, not the ids).
    assert held.charge == incoming.bytes == incoming_charge(len(stored.data), 3)
    assert (held.data, held.retrieval_hint, held.received_ms) == (stored.data, b"hint", 5)
    assert incoming.stored("m") == stored
    assert touched == {"m"}
    assert ids(list(incoming.release("d1"))) == []
    assert ids(list(incoming.release("d2"))) == ["m"]
