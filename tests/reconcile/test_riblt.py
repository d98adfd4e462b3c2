"""RIBLT finds exactly A∖B and B∖A in two round trips, with and without a bucket cache (a
store's own, or a node's symbol cache attached to a snapshot)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reconcile_sets import item_sets, random_items, split_sets

from sdsync.errors import LocalProtocolError
from sdsync.reconcile import Item, ItemStore, MemoryItemStore, reconcile_in_memory
from sdsync.reconcile.riblt import RibltItemStore, RibltParams, SymbolCache, WindowSymbols
from sdsync.reconcile.riblt_coding import BucketCache, encode, item_words

_tuning = st.fixed_dictionaries(
    {
        "riblt": st.builds(RibltParams, st.integers(1, 8), st.integers(1, 8)),
        "max_frame_size": st.sampled_from([160, 1024, 1 << 20]),
        "cached": st.sampled_from(["none", "store", "snapshot"]),
        "bucket_width": st.integers(1, 5),
    }
)


Cache = Literal["none", "store", "snapshot"]


def _store(
    items: frozenset[Item] | set[Item],
    cached: Cache,
    bucket_width: int = 3,
    window: tuple[int, int | None] = (0, None),
) -> ItemStore:
    """``store``: the store keeps its own bucket cache; ``snapshot``: a node's symbol cache
    gives it the rows of the window's whole buckets."""
    if cached == "store":
        return RibltItemStore(items, bucket_width=bucket_width, prefix=8)
    if cached == "snapshot":
        store = RibltItemStore(items, bucket_width=None)
        SymbolCache(bucket_width, prefix=8).attach(store, *window)
        return store
    return MemoryItemStore(items)


def _check(a: frozenset[Item] | set[Item], b: frozenset[Item] | set[Item], **kwargs: Any) -> int:
    """Reconcile; assert the exact difference on both sides and two round trips; frames."""
    window = kwargs.pop("window", (0, None))
    cached = kwargs.pop("cached", "none")
    width = kwargs.pop("bucket_width", 3)
    start, end = window
    inside = {it for it in a | b if it[0] >= start and (end is None or it[0] < end)}
    result = reconcile_in_memory(
        _store(a, cached, width, window),
        _store(b, cached, width, window),
        "riblt",
        window=window,
        **kwargs,
    )
    assert sorted(result.have) == sorted((set(a) - set(b)) & inside)
    assert sorted(result.need) == sorted((set(b) - set(a)) & inside)
    assert sorted(result.peer_have) == sorted(result.need)
    assert sorted(result.peer_need) == sorted(result.have)
    assert result.round_trips <= 2
    return result.frames


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(common=item_sets, only_a=item_sets, only_b=item_sets, tuning=_tuning)
def test_exact_difference_both_ways(
    common: frozenset[Item],
    only_a: frozenset[Item],
    only_b: frozenset[Item],
    tuning: dict[str, Any],
) -> None:
    _check(common | only_a, (common | only_b) - (only_a - common), **tuning)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    a=item_sets,
    b=item_sets,
    start=st.integers(0, 12),
    length=st.one_of(st.none(), st.integers(1, 12)),
    cached=st.sampled_from(["none", "store", "snapshot"]),
)
def test_windowed_sync_sees_only_the_window(
    a: frozenset[Item], b: frozenset[Item], start: int, length: int | None, cached: Cache
) -> None:
    window = (start, None if length is None else start + length)
    _check(a, b, window=window, cached=cached)


def _equal_timestamps(n: int, seed: int) -> set[Item]:
    rng = np.random.default_rng(seed)
    return {(7, rng.bytes(32)) for _ in range(n)}


@pytest.mark.parametrize("cached", ["none", "store", "snapshot"])
@pytest.mark.parametrize(
    ("a", "b"),
    [
        (set(), set()),
        (random_items(300, 1), set()),
        (set(), random_items(300, 2)),
        (random_items(3000, 3), random_items(3000, 3)),
        (random_items(400, 4), random_items(500, 5)),
        split_sets(2000, 30, 30, seed=6),
        split_sets(100, 900, 800, seed=7),  # d >> N/2
        (_equal_timestamps(500, 8), _equal_timestamps(500, 8) | _equal_timestamps(40, 9)),
        (
            _equal_timestamps(500, 8) | _equal_timestamps(60, 10),
            _equal_timestamps(500, 8) | _equal_timestamps(40, 9),
        ),
    ],
    ids=[
        "empty",
        "a-only",
        "b-only",
        "identical",
        "disjoint",
        "few-diffs",
        "d-much-larger-than-n",
        "equal-timestamps",
        "equal-timestamps-both-ways",
    ],
)
def test_named_cases(a: set[Item], b: set[Item], cached: Cache) -> None:
    _check(a, b, cached=cached, bucket_width=10_000)


def test_two_round_trips_however_large_the_difference_and_small_the_frames() -> None:
    a, b = split_sets(5_000, 3_000, 3_000, seed=10, spread=50_000)
    # Frames of 4 KiB: the stream, DONE and TAILS all go in many parts, still two turns each.
    assert _check(a, b, max_frame_size=4096) == 4
    # Nothing to take: no TAILS. The responder holds a third of ours (it does not take the
    # count of an initiator far larger than itself at its word: test_riblt_hostile.py).
    assert _check(a, set(sorted(a)[::3]), max_frame_size=4096) == 3


def test_bytes_stay_near_the_information_limit() -> None:
    a, b = split_sets(20_000, 500, 500, seed=11)
    result = reconcile_in_memory(MemoryItemStore(a), MemoryItemStore(b), "riblt")
    per_difference = (result.bytes_a_to_b + result.bytes_b_to_a) / 1000
    assert per_difference < 80  # symbols ~1.4 x 30 B, DONE, TAILS


def test_cache_rows_are_the_symbols_of_each_bucket() -> None:
    items = random_items(2_000, 12, spread=1_000, base=0)
    store = RibltItemStore(items, bucket_width=100, prefix=64)
    words = store.words(0, len(store))
    for bucket in range(10):
        inside = (words[:, 2] // np.uint64(100)) == bucket
        (rows,) = store.cache.rows(bucket * 100, (bucket + 1) * 100)
        assert np.array_equal(rows, encode(words[inside], 64))


def test_inserts_keep_the_cache_current() -> None:
    items = sorted(random_items(600, 13, spread=1_000, base=0))
    grown = RibltItemStore(items[:300], bucket_width=50, prefix=32)
    for item in items[300:]:
        assert grown.insert(item)
    assert not grown.insert(items[0])
    whole = RibltItemStore(items, bucket_width=50, prefix=32)
    assert len(grown.cache) == len(whole.cache)
    for lo in range(0, 1_000, 50):
        assert all(
            np.array_equal(x, y)
            for x, y in zip(
                grown.cache.rows(lo, lo + 50), whole.cache.rows(lo, lo + 50), strict=True
            )
        )
    # Past the prefix, the window resumes from the states the inserts kept.
    symbols = WindowSymbols(grown, 0, len(grown), (0, None))
    assert np.array_equal(symbols.take(80), encode(whole.words(0, len(whole)), 80))


@pytest.mark.parametrize("window", [(0, None), (130, 870), (0, 49), (333, 334)])
def test_window_symbols_from_the_cache_equal_a_fresh_encoding(
    window: tuple[int, int | None],
) -> None:
    items = random_items(3_000, 14, spread=1_000, base=0)
    cached = RibltItemStore(items, bucket_width=50, prefix=40)
    start, end = window
    lo = cached.lower_bound((start, b""))
    hi = len(cached) if end is None else cached.lower_bound((end, b""))
    symbols = WindowSymbols(cached, lo, hi, window)
    # Past the cached prefix the window is encoded whole; both parts must agree.
    got = np.concatenate([symbols.take(n) for n in (1, 30, 9, 60)])
    assert np.array_equal(got, encode(cached.words(lo, hi), 100))


def test_a_symbol_cache_encodes_only_the_buckets_that_changed() -> None:
    items = sorted(random_items(3_000, 16, spread=1_000, base=0))
    window = (130, 870)  # whole buckets of 50: [150, 850), 14 of them
    cache = SymbolCache(bucket_width=50, prefix=40)

    def snapshot(held: list[Item]) -> tuple[RibltItemStore, tuple[int, int]]:
        store = RibltItemStore(held, bucket_width=None)
        counts = cache.attach(store, *window)
        lo, hi = store.lower_bound((130, b"")), store.lower_bound((870, b""))
        symbols = WindowSymbols(store, lo, hi, window)
        # The cached prefix, the two edge buckets and the symbols past it agree.
        assert np.array_equal(symbols.take(100), encode(store.words(lo, hi), 100))
        return store, counts

    store, counts = snapshot(items)
    assert counts == (0, 14) and len(cache) == 14
    assert snapshot(items)[1] == (14, 0)
    # One message more at 260 (bucket 5), one less in [500, 550) (bucket 10, retention):
    gone = next(it for it in items if 500 <= it[0] < 550)
    changed = [*(it for it in items if it != gone), (260, b"\x07" * 32)]
    assert snapshot(changed)[1] == (12, 2)
    assert snapshot(changed)[1] == (14, 0)
    with pytest.raises(LocalProtocolError, match="read-only"):
        store.insert((300, b"\x09" * 32))  # its rows are shared with other snapshots


def test_a_symbol_cache_holds_at_most_max_buckets() -> None:
    cache = SymbolCache(bucket_width=10, prefix=8, max_buckets=5)
    items = random_items(500, 17, spread=200, base=0)
    cache.attach(RibltItemStore(items, bucket_width=None), 0, 200)
    assert len(cache) == 5 and cache.encoded == 20
    # The five most recently used (the newest buckets) are the ones kept.
    assert cache.attach(RibltItemStore(items, bucket_width=None), 150, 200) == (5, 0)


def test_toggling_twice_empties_the_cache() -> None:
    words = item_words(np.arange(100, dtype=np.int64), np.zeros((100, 32), dtype=np.uint8))
    cache = BucketCache(10, 16)
    cache.toggle(words)
    assert len(cache) == 10 and cache.nbytes == 10 * 16 * 32
    cache.toggle(words)
    assert len(cache) == 0


def test_symbols_per_difference() -> None:
    """About 1.4 coded symbols per difference at d = 2,000 (the paper: 1.35 as d grows)."""
    a, b = split_sets(10_000, 1_000, 1_000, seed=15)
    init_store, resp_store = MemoryItemStore(a), MemoryItemStore(b)
    window = (10**18, None)  # the sets' timestamps are 10**18 + [0, 10**6): 3-byte offsets
    result = reconcile_in_memory(init_store, resp_store, "riblt", window=window)
    symbol_bytes = 16 + 3 + 6  # id, timestamp offset, checksum
    tails = 16 * 1_000
    symbols = (result.bytes_b_to_a - tails) / symbol_bytes
    assert 1.2 * 2_000 < symbols < 1.6 * 2_000


def test_parameters_are_checked() -> None:
    for bad in ({"first_batch": 0}, {"growth": 0}, {"max_symbols": 0}):
        with pytest.raises(LocalProtocolError):
            RibltParams(**bad)
    with pytest.raises(LocalProtocolError):
        BucketCache(0, 8)
