"""Sorted item stores that both reconciliation methods read.

Theory of operation
-------------------
An *item* is ``(timestamp_ns, hash)``: the Waku message timestamp (``0 <= ts < 2**63``, so
it fits the protobuf ``int64`` of 75/WAKU2-SYNC) and the 32-byte deterministic message
hash. Items are ordered by timestamp, then hash, and a store holds each item once.

Both methods address a store by *position* in that order and by *bounds*. A bound
``(ts, prefix)`` sits just before every item ``(ts, h)`` with ``h >= prefix`` (Python
tuple and bytes order), so a short prefix can separate two items with equal
timestamps; ``INFINITY`` sits after every item. A *window* ``[start, end)`` of timestamps
limits a sync to the items Store Sync compares (``now - 1 h - 20 s .. now - 20 s``).

The :class:`ItemStore` protocol is what a session needs; a store node may back it by
SQLite or PostgreSQL (``lower_bound`` is a ``COUNT(*)`` below a key, ``items`` an ordered
range scan, ``summary`` a sum over that scan) or, better, load the window into a
:class:`MemoryItemStore` once per sync and keep it up to date with :meth:`insert`.

:class:`MemoryItemStore` keeps the items in sorted numpy arrays with a prefix sum of each
hash's eight 32-bit limbs. The sum of hashes mod 2**256 is a group operation, so the
summary of any range is one subtraction of two prefix rows plus a carry pass: O(1) range
fingerprints after an O(n log n) build. Inserts shift only the tail after the new item;
messages arrive roughly in time order, so the tail is short.

Prolly-tree sync also asks for *cut points*: positions whose *coin* (the hash's last
eight bytes, a big-endian ``u64``; the hash is a sha256 output, so the coin is uniform)
is below a threshold. The store keeps the coins beside the items.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from sdsync.errors import LocalProtocolError
from sdsync.reconcile.fingerprint import LIMBS, sum_from_limb_sums
from sdsync.wire.waku import HASH_SIZE

Item = tuple[int, bytes]
"""``(timestamp_ns, 32-byte message hash)``."""
Bound = tuple[int, bytes]
"""``(timestamp_ns, hash prefix)``: the position just before items ``>=`` it."""

MAX_TIMESTAMP = (1 << 63) - 1
INFINITY_TS = 1 << 63
INFINITY: Bound = (INFINITY_TS, b"")
"""The bound after every item."""
COIN_OFFSET = HASH_SIZE - 8


class ItemStore(Protocol):
    """A sorted set of items, addressed by position (0 .. len)."""

    def __len__(self) -> int: ...

    def lower_bound(self, bound: Bound) -> int:
        """Position of the first item ``>= bound`` (``len`` if none)."""
        ...

    def item(self, position: int) -> Item: ...

    def items(self, start: int, stop: int) -> list[Item]:
        """Items at positions ``[start, stop)`` in order."""
        ...

    def summary(self, start: int, stop: int) -> tuple[int, int]:
        """``(sum of hashes mod 2**256, count)`` of positions ``[start, stop)``."""
        ...

    def next_cut(self, start: int, stop: int, threshold: int) -> int:
        """First position in ``[start, stop)`` whose coin is ``< threshold``, else ``stop``."""
        ...

    def cut_points(self, start: int, stop: int, threshold: int) -> Sequence[int]:
        """All positions in ``[start, stop)`` whose coin is ``< threshold``, ascending."""
        ...


def check_item(item: Item) -> Item:
    """``item`` if it is a well-formed item, else :class:`LocalProtocolError`."""
    ts, h = item
    if not 0 <= ts <= MAX_TIMESTAMP:
        raise LocalProtocolError(f"item timestamp {ts} outside [0, 2**63)")
    if len(h) != HASH_SIZE:
        raise LocalProtocolError(f"item hash of {len(h)} bytes, expected {HASH_SIZE}")
    return item


def coin(h: bytes) -> int:
    """The uniform ``u64`` a hash contributes to Prolly-tree cut decisions."""
    return int.from_bytes(h[COIN_OFFSET:], "big")


class MemoryItemStore:
    """Sorted numpy arrays with limb prefix sums: O(1) range summaries, fast bulk builds."""

    __slots__ = ("_coins", "_hashes", "_n", "_prefix", "_ts")

    def __init__(self, items: Iterable[Item] = ()) -> None:
        checked = [check_item(it) for it in items]
        ts = np.fromiter((t for t, _ in checked), dtype=np.int64, count=len(checked))
        hashes = np.frombuffer(b"".join(h for _, h in checked), dtype=np.uint8)
        self._load(ts, hashes.reshape(len(checked), HASH_SIZE))

    @classmethod
    def from_arrays(
        cls, timestamps: npt.NDArray[np.int64], hashes: npt.NDArray[np.uint8]
    ) -> MemoryItemStore:
        """Build from ``timestamps`` (n,) and ``hashes`` (n, 32) in any order, duplicates ok."""
        ts = np.asarray(timestamps, dtype=np.int64)
        hs = np.asarray(hashes, dtype=np.uint8)
        if ts.ndim != 1 or hs.shape != (len(ts), HASH_SIZE):
            raise LocalProtocolError(f"shapes {ts.shape} and {hs.shape} do not pair up")
        if len(ts) and (int(ts.min()) < 0):
            raise LocalProtocolError("item timestamps must be >= 0")
        store = cls.__new__(cls)
        store._load(ts, hs)
        return store

    def _load(self, ts: npt.NDArray[np.int64], hashes: npt.NDArray[np.uint8]) -> None:
        words = np.ascontiguousarray(hashes).view(">u8")  # (n, 4): byte order == u64 order
        order = np.lexsort((words[:, 0], ts))
        ts_sorted, head = ts[order], words[order, 0]
        if np.any((ts_sorted[1:] == ts_sorted[:-1]) & (head[1:] == head[:-1])):
            order = np.lexsort((words[:, 3], words[:, 2], words[:, 1], words[:, 0], ts))
        ts, hashes = ts[order], np.ascontiguousarray(hashes[order])
        if len(ts) > 1:
            differs = (ts[1:] != ts[:-1]) | np.any(hashes[1:] != hashes[:-1], axis=1)
            keep = np.concatenate(([True], differs))
            ts, hashes = ts[keep], hashes[keep]
        n = len(ts)
        self._n = n
        self._ts = ts.copy()
        self._hashes = hashes.copy()
        self._coins = hashes[:, COIN_OFFSET:].copy().view(">u8").ravel().astype(np.uint64)
        self._prefix = np.zeros((n + 1, LIMBS), dtype=np.uint64)
        np.cumsum(hashes.view(">u4").astype(np.uint64), axis=0, out=self._prefix[1:])

    def __len__(self) -> int:
        return self._n

    def __contains__(self, item: object) -> bool:
        if not (isinstance(item, tuple) and len(item) == 2):
            return False
        ts, h = item
        if not (isinstance(ts, int) and isinstance(h, bytes)):
            return False
        i = self.lower_bound((ts, h))
        return i < self._n and self.item(i) == item

    def lower_bound(self, bound: Bound) -> int:
        ts, prefix = bound
        if ts >= INFINITY_TS:
            return self._n
        column = self._ts[: self._n]
        lo = int(np.searchsorted(column, ts, side="left"))
        if not prefix:
            return lo
        hi = int(np.searchsorted(column, ts, side="right"))
        return lo + bisect.bisect_left(range(lo, hi), prefix, key=self._hash_at)

    def _hash_at(self, position: int) -> bytes:
        return bytes(self._hashes[position])

    def item(self, position: int) -> Item:
        return int(self._ts[position]), self._hashes[position].tobytes()

    def items(self, start: int, stop: int) -> list[Item]:
        blob = self._hashes[start:stop].tobytes()
        stamps = self._ts[start:stop].tolist()
        offsets = range(0, len(blob), HASH_SIZE)
        return [(t, blob[k : k + HASH_SIZE]) for k, t in zip(offsets, stamps, strict=True)]

    def summary(self, start: int, stop: int) -> tuple[int, int]:
        limb_sums = (self._prefix[stop] - self._prefix[start]).tolist()
        return sum_from_limb_sums(limb_sums), stop - start

    def next_cut(self, start: int, stop: int, threshold: int) -> int:
        # Cuts are ~1/fanout**level apart: scan growing chunks, never the whole tail at once.
        chunk = 256
        while start < stop:
            end = min(stop, start + chunk)
            hits = np.flatnonzero(self._coins[start:end] < threshold)
            if len(hits):
                return start + int(hits[0])
            start, chunk = end, chunk * 4
        return stop

    def cut_points(self, start: int, stop: int, threshold: int) -> list[int]:
        return (np.flatnonzero(self._coins[start:stop] < threshold) + start).tolist()

    def insert(self, item: Item) -> bool:
        """Add ``item``; False if it was already there. Costs O(items after it)."""
        ts, h = check_item(item)
        p = self.lower_bound((ts, h))
        if p < self._n and self.item(p) == (ts, h):
            return False
        n = self._n
        if n == len(self._ts):
            self._grow(max(16, 2 * n))
        row = np.frombuffer(h, dtype=np.uint8)
        limbs = row.view(">u4").astype(np.uint64)
        self._ts[p + 1 : n + 1] = self._ts[p:n]
        self._hashes[p + 1 : n + 1] = self._hashes[p:n]
        self._coins[p + 1 : n + 1] = self._coins[p:n]
        self._prefix[p + 2 : n + 2] = self._prefix[p + 1 : n + 1] + limbs
        self._ts[p] = ts
        self._hashes[p] = row
        self._coins[p] = coin(h)
        self._prefix[p + 1] = self._prefix[p] + limbs
        self._n = n + 1
        return True

    def _grow(self, capacity: int) -> None:
        n = self._n

        def grown(a: npt.NDArray[np.generic], rows: int) -> npt.NDArray[np.generic]:
            bigger = np.zeros((rows, *a.shape[1:]), dtype=a.dtype)
            bigger[: len(a)] = a
            return bigger

        self._ts = grown(self._ts[:n], capacity)  # type: ignore[assignment]
        self._hashes = grown(self._hashes[:n], capacity)  # type: ignore[assignment]
        self._coins = grown(self._coins[:n], capacity)  # type: ignore[assignment]
        self._prefix = grown(self._prefix[: n + 1], capacity + 1)  # type: ignore[assignment]
