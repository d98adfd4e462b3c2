"""Two Reconcilers, one per side, exchange payloads until one is finished: each side ends
knowing exactly what it must send and what it lacks, within the topics both sync.

The driver is the service's loop (the host's conversation) without the host: the
initiator's opening, then each side's reply to the other's payload, until a side has no
reply. Sets are seeded random: shared items and items only on each side, sizes around
nwaku's item-set threshold (100) and past 800 so that ranges split, equal timestamps
(more than the threshold in one nanosecond, so that a range too narrow to split holds
them), several pubsub and content topics of which each side syncs some.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdsync.errors import RejectReason, RemoteProtocolError
from sdsync.waku.sync import (
    ItemRows,
    ItemSet,
    Range,
    RangesData,
    RangeType,
    Reconciler,
    SyncId,
    Topics,
    decode_ranges,
    encode_ranges,
)
from sdsync.waku.sync.reconciliation import PARTITIONS, THRESHOLD, Limits

SPAN = 2**20
WINDOW = (0, SPAN)
PUBSUB = ("/waku/2/rs/1/0", "/waku/2/rs/1/1", "/waku/2/rs/1/2")
CONTENT = ("/app/1/a/proto", "/app/1/b/proto")
Z = bytes(32)
Item = tuple[SyncId, str, str]
LEVELS = math.ceil(math.log(SPAN, PARTITIONS))  # splits before a range is under 8 ns
MAX_PAYLOADS = 1 + LEVELS + 1 + 2 + 1  # opening, splits, one too narrow, item sets, end


def exchange(a: Reconciler, b: Reconciler) -> list[bytes]:
    """Every payload of an exchange ``a`` opens, in order (the last one: the empty one)."""
    frames = [a.first_payload()]
    sides = (b, a)
    while True:
        side = sides[(len(frames) - 1) % 2]
        reply = side.receive(frames[-1])
        if reply is None:
            assert side.finished
            return frames
        assert side.finished == (reply == b"\x00")
        frames.append(reply)
        assert len(frames) <= 100, "the exchange does not end"


def topic_filter(a: Topics, b: Topics) -> tuple[set[str] | None, set[str] | None]:
    """The topics both sync, computed apart from Topics.meet: None for every one."""
    out: list[set[str] | None] = []
    for ours, theirs in ((a.pubsub, b.pubsub), (a.content, b.content)):
        if ours and theirs:
            out.append(set(ours & theirs))
        else:
            out.append(set(ours or theirs) or None)
    return out[0], out[1]


def expected(items: set[Item], a: Topics, b: Topics) -> dict[bytes, int]:
    pubsub, content = topic_filter(a, b)
    return {
        i.hash: i.time
        for i, p, c in items
        # the window's upper bound has a zero hash: an item at its very time is outside
        if 0 <= i.time < SPAN
        and (pubsub is None or p in pubsub)
        and (content is None or c in content)
    }


def random_items(
    rng: random.Random,
    count: int,
    *,
    equal_times: bool,
    clustered: bool = False,
    outside: bool = True,
) -> set[Item]:
    """``count`` items in the window (``clustered``: all in one 64th of it, so that the
    other side may hold nothing where these are), and 3 beyond it."""
    low, width = (rng.randrange(SPAN - SPAN // 64), SPAN // 64) if clustered else (0, SPAN)
    stamps = [low + rng.randrange(width + 1) for _ in range(4)] + [0, SPAN]
    items = set()
    for _ in range(count):
        time = (
            rng.choice(stamps) if equal_times and rng.random() < 0.7 else low + rng.randrange(width)
        )
        items.add((SyncId(time, rng.randbytes(32)), rng.choice(PUBSUB), rng.choice(CONTENT)))
    if outside:  # beyond the window: never compared
        items |= {
            (SyncId(SPAN + 1 + n, rng.randbytes(32)), PUBSUB[0], CONTENT[0]) for n in range(3)
        }
    return items


def rows(items: set[Item]) -> ItemRows:
    return ItemRows.of(sorted(items))


topic_sets = st.frozensets(st.sampled_from(PUBSUB))
content_sets = st.frozensets(st.sampled_from(CONTENT))


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**32),
    shared=st.sampled_from([0, 3, 99, 100, 101, 180, 850]),
    only_a=st.sampled_from([0, 1, 40, 100, 101, 230]),
    only_b=st.sampled_from([0, 1, 7, 100, 101, 900]),
    equal_times=st.booleans(),
    clustered=st.booleans(),
    topics_a=st.tuples(topic_sets, content_sets),
    topics_b=st.tuples(topic_sets, content_sets),
)
def test_each_side_finds_exactly_what_the_other_lacks(
    seed: int,
    shared: int,
    only_a: int,
    only_b: int,
    equal_times: bool,
    clustered: bool,
    topics_a: tuple[frozenset[str], frozenset[str]],
    topics_b: tuple[frozenset[str], frozenset[str]],
) -> None:
    rng = random.Random(seed)
    common = random_items(rng, shared, equal_times=equal_times, clustered=clustered)
    a_only = random_items(rng, only_a, equal_times=equal_times, clustered=clustered) - common
    b_only = random_items(rng, only_b, equal_times=equal_times, clustered=clustered)
    b_only -= common | a_only
    own_a, own_b = Topics(*topics_a), Topics(*topics_b)
    a = Reconciler(rows(common | a_only), own_a, WINDOW)
    b = Reconciler(rows(common | b_only), own_b, WINDOW)
    frames = exchange(a, b)
    assert a.finished and b.finished
    assert frames[-1] == b"\x00"
    if own_a.meet(own_b.pubsub, own_b.content) is None:  # nothing in common: ends at once
        assert len(frames) == 2
        assert a.differences.to_send == b.differences.to_send == {}
        assert a.differences.wanted == b.differences.wanted == {}
        return
    a_lacks, b_lacks = expected(b_only, own_a, own_b), expected(a_only, own_a, own_b)
    assert set(a.differences.to_send) == set(b_lacks)
    assert a.differences.wanted == a_lacks
    assert set(b.differences.to_send) == set(a_lacks)
    assert b.differences.wanted == b_lacks
    assert len(frames) <= MAX_PAYLOADS
    assert a.rounds + b.rounds == len(frames)
    for frame in frames:  # what travelled is what nwaku reads: in order, delta-encoded
        decoded = decode_ranges(frame)
        assert encode_ranges(decoded) == frame or not decoded.ranges


def test_identical_sets_end_after_one_fingerprint() -> None:
    rng = random.Random(1)
    items = random_items(rng, 900, equal_times=False)
    own = Topics(frozenset(PUBSUB[:1]))
    a, b = Reconciler(rows(items), own, WINDOW), Reconciler(rows(items), own, WINDOW)
    frames = exchange(a, b)
    assert frames[1:] == [b"\x00"]
    opening = decode_ranges(frames[0])
    assert opening.pubsub_topics == PUBSUB[:1] and opening.content_topics == ()
    assert [(r.lower, r.upper, r.type) for r in opening.ranges] == [
        (SyncId(0, Z), SyncId(SPAN, Z), RangeType.FINGERPRINT)
    ]


def test_a_side_holding_nothing_learns_everything_the_other_holds() -> None:
    """Both ways: the empty side must learn the hashes, not only the full side that they
    are missing (the full side's push is admitted only if the empty side expects it)."""
    rng = random.Random(2)
    for count in (1, THRESHOLD, 850):
        items = random_items(rng, count, equal_times=False, outside=False)
        own = Topics(frozenset(PUBSUB))
        want = expected(items, own, own)
        for full_opens in (True, False):
            full = Reconciler(rows(items), own, WINDOW)
            empty = Reconciler(rows(set()), own, WINDOW)
            exchange(full, empty) if full_opens else exchange(empty, full)
            assert set(full.differences.to_send) == set(want)
            assert empty.differences.wanted == want
            assert full.differences.wanted == empty.differences.to_send == {}


def test_disjoint_topics_end_at_once_with_the_empty_payload() -> None:
    rng = random.Random(3)
    items = random_items(rng, 50, equal_times=False)
    cases = [
        (Topics(frozenset(PUBSUB[:1])), Topics(frozenset(PUBSUB[1:]))),
        (
            Topics(frozenset(PUBSUB), frozenset(CONTENT[:1])),
            Topics(frozenset(PUBSUB), frozenset(CONTENT[1:])),
        ),
    ]
    for own_a, own_b in cases:
        a, b = Reconciler(rows(items), own_a, WINDOW), Reconciler(rows(set()), own_b, WINDOW)
        assert b.receive(a.first_payload()) == b"\x00"
        assert b.finished
        assert a.receive(b"\x00") is None
        assert a.finished
        assert a.differences.to_send == b.differences.wanted == {}


def test_topics_meet() -> None:
    p0, p1, p2 = PUBSUB
    c0, c1 = CONTENT
    everything = Topics()
    assert everything.meet((), ()) == Topics()
    assert everything.meet([p0], [c0]) == Topics(frozenset({p0}), frozenset({c0}))
    ours = Topics(frozenset({p0, p1}), frozenset({c0}))
    assert ours.meet((), ()) == ours
    assert ours.meet([p1, p2], []) == Topics(frozenset({p1}), frozenset({c0}))
    assert ours.meet([p1, p2], [c0, c1]) == Topics(frozenset({p1}), frozenset({c0}))
    assert ours.meet([p2], []) is None  # no pubsub topic in common
    assert ours.meet([p0], [c1]) is None  # no content topic in common
    assert Topics(frozenset({p0})).meet([p0, p1], [c1]) == Topics(frozenset({p0}), frozenset({c1}))


# -- bounds and hostile payloads


def fingerprint_payload(lower: int, upper: int, fingerprint: bytes) -> bytes:
    opening = Range(SyncId(lower, Z), SyncId(upper, Z), RangeType.FINGERPRINT, fingerprint)
    return encode_ranges(RangesData((opening,), PUBSUB))


def item_set_payload(lower: int, upper: int, ids: list[SyncId], reconciled: bool) -> bytes:
    items = ItemSet(tuple(sorted(ids)), reconciled)
    ranges = (Range(SyncId(lower, Z), SyncId(upper, Z), RangeType.ITEM_SET, items=items),)
    return encode_ranges(RangesData(ranges, PUBSUB))


def snapshot(r: Reconciler) -> tuple[dict[bytes, None], dict[bytes, int], bool]:
    return dict(r.differences.to_send), dict(r.differences.wanted), r.finished


def test_max_rounds() -> None:
    rng = random.Random(4)
    items = random_items(rng, 20, equal_times=False)
    side = Reconciler(rows(items), Topics(), WINDOW, limits=Limits(max_rounds=2))
    for _ in range(2):  # a peer that keeps the exchange going with a wrong fingerprint
        assert side.receive(fingerprint_payload(0, SPAN, rng.randbytes(32))) not in (None, b"\x00")
    before = snapshot(side)
    with pytest.raises(RemoteProtocolError, match="more than 2 payloads") as caught:
        side.receive(fingerprint_payload(0, SPAN, rng.randbytes(32)))
    assert caught.value.reason is RejectReason.MALFORMED_RPC
    assert snapshot(side) == before


def test_max_ranges() -> None:
    ranges = tuple(
        Range(SyncId(n, Z), SyncId(n + 1, Z), RangeType.FINGERPRINT, bytes([n + 1]) * 32)
        for n in range(4)
    )
    side = Reconciler(rows(set()), Topics(), WINDOW, limits=Limits(max_ranges=3))
    assert side.receive(encode_ranges(RangesData(ranges[:3]))) is not None
    before = snapshot(side)
    with pytest.raises(RemoteProtocolError, match="4 ranges"):
        side.receive(encode_ranges(RangesData(ranges)))
    assert snapshot(side) == before


def test_max_wanted() -> None:
    rng = random.Random(5)
    ids = [SyncId(10 + n, rng.randbytes(32)) for n in range(3)]
    side = Reconciler(rows(set()), Topics(), WINDOW, limits=Limits(max_wanted=2))
    side.receive(item_set_payload(0, 100, ids[:2], reconciled=False))
    assert side.differences.wanted == {i.hash: i.time for i in ids[:2]}
    with pytest.raises(RemoteProtocolError, match="more than 2 items wanted"):
        side.receive(item_set_payload(0, 100, ids, reconciled=True))


def test_malformed_payloads_leave_the_exchange_untouched() -> None:
    rng = random.Random(6)
    side = Reconciler(rows(random_items(rng, 10, equal_times=False)), Topics(), WINDOW)
    for frame in (b"\x00\x00\x05\x01\x03", b"\x01\x09abc", b"\x00\x00\x05\x00\x21" + Z + Z):
        with pytest.raises(RemoteProtocolError):
            side.receive(frame)
        assert snapshot(side) == ({}, {}, False)


def test_ranges_outside_the_window_are_skipped() -> None:
    rng = random.Random(7)
    window = (1000, 2000)
    inside = [SyncId(1000 + n * 100, rng.randbytes(32)) for n in range(5)]
    mine = {(i, PUBSUB[0], CONTENT[0]) for i in inside}
    side = Reconciler(rows(mine), Topics(), window)
    before = [SyncId(100, rng.randbytes(32)), SyncId(999, rng.randbytes(32))]
    after = [SyncId(2001, rng.randbytes(32))]
    # A peer's item sets before and after our window: nothing to want, nothing to send.
    sets = (
        Range(
            SyncId(0, Z), SyncId(999, Z), RangeType.ITEM_SET, items=ItemSet(tuple(before), False)
        ),
        Range(SyncId(999, Z), SyncId(999, Z), RangeType.FINGERPRINT, fingerprint=b"\x01" * 32),
        Range(SyncId(999, Z), SyncId(3000, Z), RangeType.SKIP),
        Range(
            SyncId(3000, Z), SyncId(4000, Z), RangeType.ITEM_SET, items=ItemSet(tuple(after), False)
        ),
    )
    assert side.receive(encode_ranges(RangesData(sets))) == b"\x00"
    assert side.finished
    assert snapshot(side) == ({}, {}, True)
    # The same item sets over ranges that reach into the window are compared.
    side = Reconciler(rows(mine), Topics(), window)
    reply = side.receive(
        item_set_payload(999, 1500, [inside[0], SyncId(1250, Z[:-1] + b"\x01")], False)
    )
    assert reply is not None and reply != b"\x00"
    assert side.differences.wanted == {Z[:-1] + b"\x01": 1250}
    assert list(side.differences.to_send) == [i.hash for i in inside[1:5] if i.time <= 1500]


def test_item_set_elements_outside_their_range_are_ignored() -> None:
    rng = random.Random(8)
    side = Reconciler(rows(set()), Topics(), WINDOW)
    inside, outside = SyncId(50, rng.randbytes(32)), SyncId(500, rng.randbytes(32))
    side.receive(item_set_payload(0, 100, [inside, outside], reconciled=True))
    assert side.differences.wanted == {inside.hash: 50}


def test_a_range_too_narrow_to_split_is_answered_with_all_its_items() -> None:
    """More than the threshold in fewer nanoseconds than partitions: one item set (nwaku
    drops such a range from its reply)."""
    rng = random.Random(9)
    crowd = {(SyncId(500 + n % 3, rng.randbytes(32)), PUBSUB[0], CONTENT[0]) for n in range(150)}
    side = Reconciler(rows(crowd), Topics(), WINDOW)
    reply = decode_ranges(side.receive(fingerprint_payload(498, 505, b"\x01" * 32)) or b"")
    assert [r.type for r in reply.ranges] == [RangeType.ITEM_SET]
    assert reply.ranges[0].items is not None
    assert {i.hash for i in reply.ranges[0].items.elements} == {i.hash for i, _, _ in crowd}
