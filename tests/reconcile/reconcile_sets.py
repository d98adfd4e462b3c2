"""Shared item generators for the reconciliation tests (seeded, small), and the
hypothesis strategy of item sets the property tests of every method draw from."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from sdsync.reconcile import Item

# Hashes from a tiny alphabet share long prefixes, which exercises the shortest-bound logic;
# timestamps from a tiny range collide, which exercises ordering by hash.
_hash = st.one_of(
    st.binary(min_size=32, max_size=32),
    st.lists(st.sampled_from([0, 1, 255]), min_size=32, max_size=32).map(bytes),
)
item_sets = st.frozensets(st.tuples(st.integers(0, 12), _hash), max_size=60)


def random_items(n: int, seed: int, *, spread: int = 1_000_000, base: int = 10**18) -> set[Item]:
    """``n`` items with timestamps in ``[base, base + spread)`` and random hashes."""
    rng = random.Random(seed)
    return {(base + rng.randrange(spread), rng.randbytes(32)) for _ in range(n)}


def split_sets(
    n: int, only_a: int, only_b: int, seed: int, *, spread: int = 1_000_000
) -> tuple[set[Item], set[Item]]:
    """Two sets sharing ``n`` items, with ``only_a`` / ``only_b`` items of their own."""
    pool = sorted(random_items(n + only_a + only_b, seed, spread=spread))
    random.Random(seed + 1).shuffle(pool)
    common = set(pool[:n])
    return common | set(pool[n : n + only_a]), common | set(pool[n + only_a :])
