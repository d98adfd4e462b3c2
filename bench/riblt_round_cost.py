"""What a store node's RIBLT round costs in CPU and memory, with its symbol cache, vs RBSR.

Two nodes hold the same messages (nanosecond timestamps, ``--items`` per hour) except
``d`` of them, half missing on each side. A node syncs the hour that ended 20 s ago every
5 minutes, so two rounds are measured: the first, with empty symbol caches (a node that
just started), and the next, 5 minutes later: the window has moved on by 5 minutes,
5 minutes of new messages arrived (on both nodes) and the rest is unchanged. Each round
is what a node does: a snapshot of the window from arrays
(``RibltItemStore.build``, as ``Archive.item_arrays`` gives them), the symbol cache
attached to it (``SymbolCache.attach``), then the reconciliation, both sides in this
process. The anchor, on the same snapshots in the same run, is RBSR, which needs no
cache. Memory: a snapshot's arrays, the cache's rows, and the peak of numpy's and
Python's allocations during a reconciliation (``tracemalloc``, in a run apart from the
timed one).

    .venv/bin/python bench/riblt_round_cost.py
    .venv/bin/python bench/riblt_round_cost.py --items 10000000 --diffs 10,1000
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar, get_args

import numpy as np
import numpy.typing as npt

from sdsync.reconcile import (
    Method,
    ReconcileResult,
    RibltItemStore,
    SymbolCache,
    reconcile_in_memory,
)

T = TypeVar("T")
MINUTE = 60 * 10**9
HOUR = 60 * MINUTE
STEP = 5 * MINUTE
START = 1_764_000_000 * 10**9 + 17 * 10**9  # a window that starts mid-bucket


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def peak_bytes(fn: Callable[[], object]) -> int:
    """The peak of the allocations ``fn`` makes (traced apart from the timings: tracing
    slows Python's allocations, which would favour numpy-bound code)."""
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


@dataclass(frozen=True)
class Messages:
    ts: npt.NDArray[np.int64]
    hashes: npt.NDArray[np.uint8]
    on_a: npt.NDArray[np.bool_]
    on_b: npt.NDArray[np.bool_]


def generate(per_hour: int, d: int, seed: int) -> Messages:
    """Two hours' worth around the windows; ``d`` of the first window's differ."""
    rng = np.random.default_rng(seed)
    n = per_hour * 13 // 12  # the first window and the 5 minutes after it
    ts = START + rng.integers(0, HOUR + STEP, size=n, dtype=np.int64)
    hashes = rng.integers(0, 256, size=(n, 32), dtype=np.uint8)
    on_a = np.ones(n, dtype=bool)
    on_b = np.ones(n, dtype=bool)
    first = np.flatnonzero(ts < START + HOUR)
    lost = rng.choice(first, size=d, replace=False)
    on_a[lost[: d // 2]] = False
    on_b[lost[d // 2 :]] = False
    return Messages(ts, hashes, on_a, on_b)


def snapshot(m: Messages, side: npt.NDArray[np.bool_], window: tuple[int, int]) -> RibltItemStore:
    inside = side & (m.ts >= window[0]) & (m.ts < window[1])
    return RibltItemStore.build(m.ts[inside], m.hashes[inside], bucket_width=None)


def one_round(
    m: Messages, caches: tuple[SymbolCache, SymbolCache], window: tuple[int, int]
) -> list[str]:
    inside = (m.ts >= window[0]) & (m.ts < window[1])
    differing = int(np.count_nonzero(inside & (m.on_a != m.on_b)))
    rows = [f"  {differing:,} differences in the window"]
    stores = []
    for name, side, cache in zip("ab", (m.on_a, m.on_b), caches, strict=True):
        store, built = timed(partial(snapshot, m, side, window))
        (reused, encoded), attached = timed(partial(cache.attach, store, *window))
        stores.append(store)
        rows.append(
            f"  node {name}: {len(store):,} items; snapshot {built:.3f} s "
            f"({mib(store_bytes(store))}); cache {attached:.3f} s, {encoded} buckets "
            f"encoded, {reused} reused (cache "
            f"{mib(len(cache) * cache.prefix * 32)})"
        )
    a, b = stores
    runs: dict[Method, tuple[ReconcileResult, float]] = {}
    for method in get_args(Method):
        if method != "prolly":
            runs[method] = timed(partial(reconcile_in_memory, a, b, method, window=window))
            result = runs[method][0]
            assert len(result.have) + len(result.need) == differing, "not the exact difference"
    parts = []
    for method, (result, seconds) in runs.items():
        total = result.bytes_a_to_b + result.bytes_b_to_a
        peak = mib(peak_bytes(partial(reconcile_in_memory, a, b, method, window=window)))
        parts.append(f"{method} {seconds:.3f} s (peak {peak}, {total:,} B)")
    ratio = runs["riblt"][1] / runs["rbsr"][1]
    rows.append(f"  reconcile, both sides: {', '.join(parts)}; RIBLT / RBSR time {ratio:.2f}")
    return rows


def store_bytes(store: RibltItemStore) -> int:
    """What a snapshot holds: its arrays (timestamps, hashes, limb prefix sums, coins)."""
    return sum(getattr(store, name).nbytes for name in ("_ts", "_hashes", "_prefix", "_coins"))


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000, help="messages per hour")
    parser.add_argument("--diffs", default="10,1000")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for d in (int(x) for x in args.diffs.split(",")):
        print(f"\n{args.items:,} messages an hour, d = {d:,}", flush=True)
        m = generate(args.items, d, args.seed)
        caches = (SymbolCache(), SymbolCache())
        for label, shift in (("first round (caches empty)", 0), ("5 minutes later", STEP)):
            print(f" {label}:", flush=True)
            window = (START + shift, START + shift + HOUR)
            # The new messages are on both nodes; only the first window's d differ.
            for line in one_round(m, caches, window):
                print(line, flush=True)


if __name__ == "__main__":
    main()
