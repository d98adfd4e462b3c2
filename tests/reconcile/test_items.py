"""MemoryItemStore: order, bounds, O(1) range summaries, inserts, cut points."""

from __future__ import annotations

import random

import numpy as np
import pytest
from reconcile_sets import random_items

from sdsync.errors import LocalProtocolError
from sdsync.reconcile import INFINITY, MemoryItemStore, summarize
from sdsync.reconcile.items import coin


def test_sorted_deduplicated_and_equal_timestamps_kept_apart() -> None:
    h1, h2 = b"\x02" * 32, b"\x01" * 32
    store = MemoryItemStore([(5, h1), (5, h2), (3, h1), (5, h1)])
    assert store.items(0, len(store)) == [(3, h1), (5, h2), (5, h1)]
    assert (5, h2) in store and (4, h2) not in store


def test_from_arrays_matches_plain_build() -> None:
    items = random_items(500, seed=1, spread=50)
    ts = np.array([t for t, _ in items], dtype=np.int64)
    hs = np.frombuffer(b"".join(h for _, h in items), dtype=np.uint8).reshape(-1, 32)
    a = MemoryItemStore.from_arrays(ts, hs)
    assert a.items(0, len(a)) == sorted(items)
    with pytest.raises(LocalProtocolError):
        MemoryItemStore.from_arrays(ts, hs[:-1])


def test_lower_bound_with_prefixes() -> None:
    h = [bytes([1, 5]) + bytes(30), bytes([1, 7]) + bytes(30), bytes([2]) + bytes(31)]
    store = MemoryItemStore([(10, h[0]), (10, h[1]), (10, h[2]), (11, h[0])])
    assert store.lower_bound((10, b"")) == 0
    assert store.lower_bound((10, b"\x01\x06")) == 1
    assert store.lower_bound((10, b"\x01\x07")) == 1
    assert store.lower_bound((10, b"\x02")) == 2
    assert store.lower_bound((10, b"\x03")) == 3
    assert store.lower_bound((12, b"")) == 4
    assert store.lower_bound(INFINITY) == 4


def test_range_summaries_match_the_reference_function() -> None:
    items = sorted(random_items(300, seed=2))
    store = MemoryItemStore(items)
    rng = random.Random(3)
    for _ in range(50):
        i, j = sorted(rng.sample(range(len(items) + 1), 2))
        assert store.summary(i, j) == summarize(h for _, h in items[i:j])


def test_insert_is_incremental_and_equivalent_to_a_rebuild() -> None:
    items = list(random_items(200, seed=4, spread=30))
    store = MemoryItemStore()
    for it in items:
        assert store.insert(it)
    assert not store.insert(items[0])
    fresh = MemoryItemStore(items)
    assert store.items(0, len(store)) == fresh.items(0, len(fresh))
    assert store.summary(0, len(store)) == fresh.summary(0, len(fresh))
    assert store.summary(17, 123) == fresh.summary(17, 123)
    assert store.cut_points(0, len(store), 1 << 62) == fresh.cut_points(0, len(fresh), 1 << 62)
    with pytest.raises(LocalProtocolError):
        store.insert((-1, bytes(32)))
    with pytest.raises(LocalProtocolError):
        store.insert((1, bytes(31)))


def test_cut_points_follow_the_hash_coin() -> None:
    items = sorted(random_items(2000, seed=5))
    store = MemoryItemStore(items)
    threshold = 1 << 60  # one item in 16
    expected = [i for i, (_, h) in enumerate(items) if coin(h) < threshold]
    assert store.cut_points(0, len(items), threshold) == expected
    assert 60 < len(expected) < 200
    assert store.next_cut(0, len(items), threshold) == expected[0]
    assert store.next_cut(expected[3] + 1, len(items), threshold) == expected[4]
    assert store.next_cut(0, expected[0], threshold) == expected[0]
