"""Rateless IBLT coding: items to coded symbols, vectorised, and the bucket cache.

Theory of operation
-------------------
Rateless invertible Bloom lookup tables (Yang, Gilad, Alizadeh, "Practical Rateless Set
Reconciliation", SIGCOMM 2024) describe a set by an endless sequence of *coded symbols*.
Coded symbol ``i`` is the XOR of the items mapped to it, so symbols are linear: the
symbols of a disjoint union are the XOR of the parts' symbols, and the XOR of two sets'
symbols is the symbols of their symmetric difference. A difference of ``d`` items is
peeled from about ``1.35 d`` of them.

Each item is four ``u64`` *words*: the first 16 bytes of its hash (the *id*, as RBSR's
item lists use; two words, big-endian), its timestamp, and a 48-bit *checksum*. Symbol
``i`` holds the XOR of its items' words, so a symbol holding a single item is recognised
(it is *pure*) by its checksum matching its content. The checksum, like the seed of the
item's index sequence, is a splitmix64 hash of ``(timestamp, id)``.

Index sequence. Item ``x`` maps to symbol ``i`` with probability ``1 / (1 + i / 2)`` (the
paper's ``alpha = 1/2``): always to symbol 0, then to a sparser and sparser sequence. From
index ``i`` the next index ``j`` has ``P(j > k) = ((i + 1.5) / (k + 1.5))**2``, which we
sample from one uniform ``u`` in ``(0, 1]`` as ``ceil((i + 1.5) / sqrt(u) - 1.5)`` (at least
``i + 1``); ``u`` comes from a splitmix64 stream seeded by the item. An item meets about
``2 ln(m / 2) + 1`` of the first ``m`` symbols.

:class:`Encoder` computes the symbols of many items at once: it keeps every item's next
index and generator state in numpy arrays and, symbol range by symbol range, XORs all
items whose next index falls in the range into it (``np.bitwise_xor.at``) and advances
them. Its cost is one vector step per index an item meets, about 40 ns per (item, index)
pair; memory is 48 bytes per item.

:class:`BucketCache` keeps, for every time bucket (``bucket_width`` timestamp units), the
first ``prefix`` symbols of the items in it, updated as items come and go. The first
``prefix`` symbols of a window are then the XOR of its whole buckets' rows plus the
symbols of the few items in the two partial buckets at its edges: a round does not
re-encode the window.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from sdsync.errors import LocalProtocolError

Words = npt.NDArray[np.uint64]
"""``(n, 4)`` rows of ``id_hi, id_lo, timestamp, checksum``."""
WORDS = 4
TS, CHECKSUM = 2, 3
ID_SIZE = 16
CHECKSUM_BITS = 48
CHECKSUM_MASK = np.uint64((1 << CHECKSUM_BITS) - 1)
NO_INDEX = 1 << 62
"""Indices past this are never reached; the sequence stops there."""

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SEED_SALT = np.uint64(0x5EED_0F_51_6E_A1_5D)
_CHECK_SALT = np.uint64(0xC4EC_55_0D_D1_FF_E1)


def _mix(x: Words) -> Words:
    """splitmix64's finaliser: a bijective avalanche of ``u64``s (wraps by design)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _seeds(words: Words) -> Words:
    h = _mix(words[:, TS] ^ _SEED_SALT)
    h = _mix(h ^ words[:, 0])
    return _mix(h ^ words[:, 1])


def checksums(words: Words) -> Words:
    """The 48-bit checksum of each row's ``(id, timestamp)``."""
    return _mix(_seeds(words) ^ _CHECK_SALT) & CHECKSUM_MASK


def item_words(timestamps: npt.NDArray[np.int64], hashes: npt.NDArray[np.uint8]) -> Words:
    """Rows of words for items given as ``(n,)`` timestamps and ``(n, 32)`` hashes."""
    n = len(timestamps)
    words = np.empty((n, WORDS), dtype=np.uint64)
    ids = np.ascontiguousarray(hashes[:, :ID_SIZE]).view(">u8").reshape(n, 2)
    words[:, :2] = ids
    words[:, TS] = np.asarray(timestamps, dtype=np.int64).view(np.uint64)
    words[:, CHECKSUM] = checksums(words)
    return words


def _advance(current: npt.NDArray[np.int64], state: Words) -> tuple[npt.NDArray[np.int64], Words]:
    """Each item's next index and generator state."""
    state = state + _GAMMA
    u = ((_mix(state) >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53
    following = np.ceil((current + 1.5) / np.sqrt(u) - 1.5)
    following = np.minimum(following, float(NO_INDEX)).astype(np.int64)
    return np.maximum(following, current + 1), state


class Encoder:
    """The coded symbols of a fixed set of items, computed range after range."""

    __slots__ = ("_current", "_state", "_words", "symbols")

    def __init__(self, words: Words, payload: Words | None = None) -> None:
        """Items ``words``; ``payload``: the rows XORed in for them, if not ``words``."""
        self._words = words if payload is None else payload
        self._current = np.zeros(len(words), dtype=np.int64)
        self._state = _seeds(words) if len(words) else np.zeros(0, dtype=np.uint64)
        self.symbols = 0
        """Symbols ``[0, symbols)`` are done: every item's next index is past them."""

    def __len__(self) -> int:
        return len(self._words)

    def extend(
        self,
        out: Words,
        stop: int,
        offset: int | None = None,
        touched: list[npt.NDArray[np.int64]] | None = None,
    ) -> None:
        """XOR every item into rows ``index - offset`` of ``out`` for its indices in
        ``[symbols, stop)`` (``offset`` defaults to ``symbols``: ``out`` holds that range);
        the indices met are appended to ``touched`` if given."""
        base = self.symbols if offset is None else offset
        self._run(stop, lambda current, words: _scatter(out, current - base, words, touched))

    def _run(self, stop: int, visit: Callable[[npt.NDArray[np.int64], Words], None] | None) -> None:
        """Advance every item past ``stop``, visiting each index met before it."""
        # Work on compacted copies of the items still below ``stop``; write each back once.
        active = np.flatnonzero(self._current < stop)
        current, state = self._current[active], self._state[active]
        words = self._words[active] if visit is not None else self._words[:0]
        while len(active):
            if visit is not None:
                visit(current, words)
            current, state = _advance(current, state)
            below = current < stop
            if not below.all():
                past = ~below
                self._current[active[past]], self._state[active[past]] = current[past], state[past]
                active, current, state = active[below], current[below], state[below]
                if visit is not None:
                    words = words[below]
        self.symbols = max(self.symbols, stop)

    def skip(self, stop: int) -> None:
        """Move past symbols ``[symbols, stop)`` without computing them."""
        self._run(stop, None)

    @classmethod
    def resume(
        cls, words: Words, current: npt.NDArray[np.int64], state: Words, symbols: int
    ) -> Encoder:
        """Items whose next indices and generator states past ``symbols`` are known."""
        encoder = cls.__new__(cls)
        encoder._words, encoder._current, encoder._state = words, current, state
        encoder.symbols = symbols
        return encoder

    def states(self) -> tuple[npt.NDArray[np.int64], Words]:
        """Each item's next index and generator state (copies)."""
        return self._current.copy(), self._state.copy()

    def copy(self) -> Encoder:
        twin = Encoder.__new__(Encoder)
        twin._words, twin._current = self._words, self._current.copy()
        twin._state, twin.symbols = self._state.copy(), self.symbols
        return twin

    def absorb(self, other: Encoder) -> None:
        """Take over ``other``'s items, which must be at the same symbol."""
        self._words = np.concatenate((self._words, other._words))
        self._current = np.concatenate((self._current, other._current))
        self._state = np.concatenate((self._state, other._state))


def _scatter(
    out: Words,
    rows: npt.NDArray[np.int64],
    words: Words,
    touched: list[npt.NDArray[np.int64]] | None,
) -> None:
    np.bitwise_xor.at(out, rows, words)
    if touched is not None:
        touched.append(rows)


def encode(words: Words, count: int) -> Words:
    """The first ``count`` coded symbols of the items ``words``."""
    out = np.zeros((count, WORDS), dtype=np.uint64)
    Encoder(words).extend(out, count)
    return out


class BucketCache:
    """The first ``prefix`` coded symbols of every time bucket, kept current."""

    __slots__ = ("_rows", "bucket_width", "prefix")

    def __init__(self, bucket_width: int, prefix: int) -> None:
        if bucket_width < 1 or prefix < 1:
            raise LocalProtocolError("a bucket cache needs a positive width and prefix")
        self.bucket_width = bucket_width
        self.prefix = prefix
        self._rows: dict[int, Words] = {}

    @classmethod
    def holding(cls, bucket_width: int, prefix: int, rows: dict[int, Words]) -> BucketCache:
        """A cache of the given rows of buckets (bucket index -> ``(prefix, 4)`` rows)."""
        cache = cls(bucket_width, prefix)
        cache._rows = rows
        return cache

    def __len__(self) -> int:
        """Buckets held."""
        return len(self._rows)

    @property
    def nbytes(self) -> int:
        return sum(rows.nbytes for rows in self._rows.values())

    def toggle(self, words: Words) -> tuple[npt.NDArray[np.int64], Words]:
        """Add items not in the cache, or remove items that are (XOR is its own inverse).
        Each item's next index and generator state past the prefix, in the given order
        (an :class:`Encoder` resumes there, see :meth:`Encoder.resume`)."""
        current = np.zeros(len(words), dtype=np.int64)
        state = np.zeros(len(words), dtype=np.uint64)
        buckets = words[:, TS].view(np.int64) // self.bucket_width
        order = np.argsort(buckets, kind="stable")
        edges = np.flatnonzero(np.diff(buckets[order])) + 1
        for part in np.split(order, edges) if len(words) else []:
            bucket = int(buckets[part[0]])
            rows = self._rows.get(bucket)
            if rows is None:
                rows = self._rows[bucket] = np.zeros((self.prefix, WORDS), dtype=np.uint64)
            encoder = Encoder(words[part])
            encoder.extend(rows, self.prefix)
            current[part], state[part] = encoder.states()
            if not rows.any():
                del self._rows[bucket]
        return current, state

    def whole_buckets(self, start: int, end: int | None) -> tuple[int, int | None]:
        """The timestamps ``[lo, hi)`` covered by the whole buckets inside ``[start, end)``
        (``lo == hi`` when there is none; ``hi`` None: open)."""
        w = self.bucket_width
        lo = -(-start // w) * w
        if end is None:
            return lo, None
        hi = end // w * w
        return (lo, hi) if hi > lo else (start, start)

    def rows(self, lo: int, hi: int | None) -> list[Words]:
        """The symbol rows of the buckets in ``[lo, hi)`` (bucket-aligned timestamps); the
        window's symbols are their XOR. Rows change in place as items come and go: a
        session holding them needs a store that does not change meanwhile, as every
        session does."""
        first = lo // self.bucket_width
        last = None if hi is None else hi // self.bucket_width
        return [
            rows
            for bucket, rows in self._rows.items()
            if bucket >= first and (last is None or bucket < last)
        ]
