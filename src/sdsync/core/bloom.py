"""Bloom filters with js-waku's exact bytes, and the rolling filter a channel keeps.

Theory of operation
-------------------
A filter is sized from a capacity ``n`` and an error rate ``p``:
``bits_per_elem = ceil(-ln p / ln(2)^2)``, ``k = round_half_up(ln 2 * bits_per_elem)``,
``m = n * bits_per_elem`` bits held in ``1 + m // 64`` 64-bit words. Positions come from
MurmurHash3 (x86, 32-bit, seed 0, read signed) with double hashing:
``hA = |h(s)| mod m``, ``hB = |h(s + " b")| mod m``, ``pos_i = |hA + i*hB| mod m``.
Bit ``pos`` is bit ``pos % 64`` of word ``pos // 64``, least significant first, and words
are serialised big-endian. We keep the bits *in that serialised layout*, so producing the
wire bytes is a copy and testing a received filter needs no parsing at all.

A channel's own filter rolls over (the spec's SHOULD; js-waku never does): once it holds
``capacity`` ids it is rebuilt from the most recent ``capacity // 2`` ids, so its false
positive rate stays near the configured one forever. Only the local contents change; the
size and therefore the wire format do not.

A *received* filter is evidence, not state. It is usable only if it has exactly our size
(peers must agree on parameters) and is not saturated: a filter whose fill ratio implies a
false-positive rate far above the agreed one would "acknowledge" almost anything. Both
answers about a received filter — its fill and which ids it holds — depend on its bytes
alone, so :func:`received_filter` works each out once per bytes object, for every channel
that consults it.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from dataclasses import dataclass, field

import mmh3

from sdsync.errors import LocalProtocolError

Position = tuple[int, int]  # (byte index in the serialised filter, bit mask)


@dataclass(frozen=True, slots=True)
class BloomParams:
    """Filter geometry agreed by all participants of a channel."""

    capacity: int = 10_000
    error_rate: float = 0.001
    k: int = field(init=False)
    m_bits: int = field(init=False)
    n_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise LocalProtocolError(f"bloom capacity must be positive, got {self.capacity}")
        if not 0.0 < self.error_rate < 1.0:
            raise LocalProtocolError(f"bloom error rate must be in (0, 1), got {self.error_rate}")
        bits_per_elem = math.ceil(-math.log(self.error_rate) / math.log(2) ** 2)
        m_bits = self.capacity * bits_per_elem
        object.__setattr__(self, "k", math.floor(math.log(2) * bits_per_elem + 0.5))
        object.__setattr__(self, "m_bits", m_bits)
        object.__setattr__(self, "n_bytes", (1 + m_bits // 64) * 8)

    def positions(self, item: str) -> tuple[Position, ...]:
        """Where ``item``'s k bits live in the serialised filter."""
        return _positions(self.m_bits, self.k, item)

    def false_positive_rate(self, data: bytes) -> float:
        """The false-positive rate a filter with these bits would have."""
        fill = int.from_bytes(data, "big").bit_count() / self.m_bits
        return float(fill**self.k)


# Memoised for the recent ids only: every participant hashes the same ids at about the
# same time (receiving, then checking filters), but a long stream must not grow memory.
@functools.lru_cache(maxsize=1 << 14)
def _positions(m_bits: int, k: int, item: str) -> tuple[Position, ...]:
    data = item.encode()
    hash_a = abs(mmh3.hash(data, 0, signed=True)) % m_bits
    hash_b = abs(mmh3.hash(data + b" b", 0, signed=True)) % m_bits
    out = []
    for i in range(k):
        pos = (hash_a + i * hash_b) % m_bits
        out.append(((pos >> 6) * 8 + 7 - ((pos & 63) >> 3), 1 << (pos & 7)))
    return tuple(out)


def contains(data: bytes | bytearray, positions: tuple[Position, ...]) -> bool:
    """Whether all of an item's bits are set in serialised filter bytes."""
    # A plain loop: this runs for every id checked against every filter received, and
    # all() over a generator costs several times more per position.
    for i, mask in positions:  # noqa: SIM110 — see above
        if not data[i] & mask:
            return False
    return True


class ReceivedFilter:
    """A peer's filter as evidence: its false-positive rate and the membership of ids,
    each worked out once however many channels consult the same filter.

    One received bytes object often reaches many channels (a simulator decodes a broadcast
    once for all its receivers; a host of many channels may do the same): they all judge
    its fill and look up the same recent ids in it. Get one through
    :func:`received_filter`.
    """

    __slots__ = ("_fpr", "_held", "_lacked", "data", "params")

    def __init__(self, data: bytes, params: BloomParams) -> None:
        self.data = data
        self.params = params
        self._fpr: float | None = None
        # Ids looked up so far, by answer: sets, so lacking() is set arithmetic in C.
        self._held: set[str] = set()
        self._lacked: set[str] = set()

    @property
    def false_positive_rate(self) -> float:
        fpr = self._fpr
        if fpr is None:
            fpr = self._fpr = self.params.false_positive_rate(self.data)
        return fpr

    def __contains__(self, item: str) -> bool:
        if item in self._held:
            return True
        return item not in self._lacked and self._look_up(item)

    def lacking(self, items: set[str]) -> set[str]:
        """Those of ``items`` the filter does not hold."""
        unsure = items.difference(self._held)
        if unsure:
            for item in unsure.difference(self._lacked):
                self._look_up(item)
            unsure.difference_update(self._held)
        return unsure

    def _look_up(self, item: str) -> bool:
        member = contains(self.data, self.params.positions(item))
        (self._held if member else self._lacked).add(item)
        return member


# id(bytes) -> the ReceivedFilter of that very object. An entry keeps its bytes alive, so
# while it is here no other object can have that id (and the identity check below makes
# sure). Bounded by clearing: a broadcast's receivers consult its filter within moments.
_RECEIVED: dict[int, ReceivedFilter] = {}
_RECEIVED_MAX = 64


def received_filter(data: bytes, params: BloomParams) -> ReceivedFilter:
    """The shared :class:`ReceivedFilter` of the bytes object ``data`` under ``params``."""
    known = _RECEIVED.get(id(data))
    if known is not None and known.data is data and known.params is params:
        return known
    if len(_RECEIVED) >= _RECEIVED_MAX:
        _RECEIVED.clear()
    known = _RECEIVED[id(data)] = ReceivedFilter(data, params)
    return known


class BloomFilter:
    """A fixed-size filter (no rollover) with js-waku's byte layout."""

    __slots__ = ("_bits", "_snapshot", "count", "params")

    def __init__(self, params: BloomParams, data: bytes | None = None) -> None:
        if data is not None and len(data) != params.n_bytes:
            raise LocalProtocolError(f"filter has {len(data)} bytes, expected {params.n_bytes}")
        self.params = params
        self._bits = bytearray(data) if data is not None else bytearray(params.n_bytes)
        # The bytes last handed out, while no insert changed them: every message sent
        # carries the filter (18.7 kB with js-waku's defaults), and a sender whose filter
        # did not change since its last message need not copy it again.
        self._snapshot: bytes | None = None
        self.count = 0

    def insert(self, item: str) -> None:
        self.insert_positions(self.params.positions(item))

    def insert_positions(self, positions: tuple[Position, ...]) -> None:
        bits = self._bits
        for i, mask in positions:
            bits[i] |= mask
        self._snapshot = None
        self.count += 1

    def __contains__(self, item: str) -> bool:
        return contains(self._bits, self.params.positions(item))

    def to_bytes(self) -> bytes:
        snapshot = self._snapshot
        if snapshot is None:
            snapshot = self._snapshot = bytes(self._bits)
        return snapshot


class RollingBloomFilter:
    """A channel's own filter: rebuilt from its most recent ids once it is full."""

    __slots__ = ("_filter", "_recent", "inserted", "params", "rollover")

    def __init__(self, params: BloomParams, *, rollover: bool = True) -> None:
        self.params = params
        self.rollover = rollover
        self._filter = BloomFilter(params)
        # Positions rather than ids: a rollover then re-sets bits without re-hashing.
        self._recent: deque[tuple[Position, ...]] = deque(maxlen=params.capacity)
        self.inserted = 0  # ids ever inserted: with the newest ids, this fixes the state

    def insert(self, item: str, positions: tuple[Position, ...] | None = None) -> None:
        """Add an id (``positions`` may be passed if the caller already computed them)."""
        if self.rollover and self._filter.count >= self.params.capacity:
            self._roll_over()
        if positions is None:
            positions = self.params.positions(item)
        self._filter.insert_positions(positions)
        self._recent.append(positions)
        self.inserted += 1

    def restore(self, recent: list[str], inserted: int) -> None:
        """Rebuild the exact state after ``inserted`` inserts, the newest being ``recent``.

        Rollovers happen at fixed counts (the first at ``capacity``, then every
        ``capacity - capacity // 2``), so the filter holds the newest ``live`` ids; at most
        ``capacity`` of them are needed.
        """
        capacity = self.params.capacity
        keep = capacity // 2
        live = inserted
        if self.rollover and inserted > capacity:
            live = keep + 1 + (inserted - capacity - 1) % (capacity - keep)
        if len(recent) < live:
            raise LocalProtocolError(f"restoring needs the newest {live} ids, got {len(recent)}")
        self._filter = BloomFilter(self.params)
        self._recent.clear()
        for item in recent[len(recent) - live :]:
            self._filter.insert_positions(self.params.positions(item))
        self._recent.extend(self.params.positions(item) for item in recent[-capacity:])
        self.inserted = inserted

    def _roll_over(self) -> None:
        recent = list(self._recent)
        keep = recent[len(recent) - self.params.capacity // 2 :]
        self._filter = BloomFilter(self.params)
        for positions in keep:
            self._filter.insert_positions(positions)

    def __contains__(self, item: str) -> bool:
        return item in self._filter

    def to_bytes(self) -> bytes:
        return self._filter.to_bytes()
