"""Shared item generators for the reconciliation tests (seeded, small)."""

from __future__ import annotations

import random

from sdsync.reconcile import Item


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
