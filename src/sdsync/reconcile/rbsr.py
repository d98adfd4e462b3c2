"""Range-based set reconciliation (RBSR) with sum-then-hash fingerprints.

Theory of operation
-------------------
Both sides hold sorted items ``(timestamp, hash)`` (:mod:`sdsync.reconcile.items`). A frame
describes the sync window as consecutive ranges ``[lower, upper)``; each range carries a
*mode*, and a reply answers range by range:

* ``FINGERPRINT`` (16 bytes, :mod:`sdsync.reconcile.fingerprint`): equal to ours, the range
  is settled (we say nothing). Different: we describe our side of it, either as
  ``ITEMS`` (at most ``item_threshold`` items) or split into ``fanout`` buckets of equal
  *local* count, each with its own ``FINGERPRINT``.
* ``ITEMS``: the peer's items, each as its timestamp and a 16-byte *id* (the hash's first
  16 bytes: as hard to forge as a fingerprint, half the bytes of a hash). We answer with
  ``DIFF``: a bitmap over the list marking the items we lack, plus, in full, the items we
  hold that the list lacks. If we hold more than ``item_threshold`` items beyond the
  list's length we split instead, which keeps every ``DIFF`` small.
* ``DIFF``: the answer to our ``ITEMS``. We now know both directions; if the peer lacks
  some of our items we send them in full as ``FULL``, else the range is settled.
* ``FULL``: the items we marked as lacking; settled. (Negentropy's server echoes its whole
  id list instead; bitmap and short ids are what make our bytes smaller.)
* ``SKIP``: nothing to do; consecutive skips merge and a trailing one is left out.

A side that sends no ``FINGERPRINT``, ``ITEMS`` or ``DIFF`` with marks expects no answer and
is done. A side that must answer but agrees with everything sends the bare version byte.

The initiator sizes its first split (``fanout`` to ``fanout**2`` buckets) so that the
``fanout``-way splits after it end just under ``item_threshold`` items (7/8 of it, leaving
room for the differences): the fewest rounds for the chosen fanout, e.g. six frames for a
million items with the defaults.

Frame
~~~~~
::

    frame   = version:u8 [window_start:varint] range*   (window_start: first frame only)
    range   = ts_code:varint (prefix_len * 8 + mode):varint prefix payload
              ts_code 0 = infinity, else the bound's timestamp minus the previous bound's
              (window_start first) plus 1; the bound is (timestamp, prefix)
    SKIP=0        -
    FINGERPRINT=1 16 bytes
    ITEMS=2       count:varint (ts_delta:varint id:16)*      ts_delta from the previous item,
                                                             the first from the range's lower
    DIFF=3        count:varint bitmap:ceil(count/8) count':varint (ts_delta:varint hash:32)*
                  count = length of the list answered; bit i (LSB first) = "I lack item i"
    FULL=4        count:varint (ts_delta:varint hash:32)*

Varints are negentropy's. The first frame's last bound is the window's end. A frame never
exceeds ``max_frame_size``: when the next range's answer would not fit, the rest of the
window goes out as one ``FINGERPRINT`` and is taken up again in later rounds.

``fanout`` 16 and ``item_threshold`` 24 were chosen by measurement (docs/reconcile.md,
``bench/reconcile_vs_negentropy.py --sweep``).

Hostile frames
~~~~~~~~~~~~~~
Besides the format, a frame is checked against what it can mean: a ``DIFF`` answers one of
our ``ITEMS`` lists, so it names exactly as many items as we hold in its range, at most
``item_threshold``, and is rejected before we read them; a ``FULL`` is checked item by
item (one lookup each), never by reading its range; full-hash lists (``DIFF``, ``FULL``)
are strictly increasing. So a frame costs store work in proportion to its bytes and its
reply's (``docs/reconcile.md``, "Hostile input"), and a peer that never settles a range is
cut off by the session's round limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.reconcile.codec import Reader, minimal_bound
from sdsync.reconcile.fingerprint import FINGERPRINT_SIZE, fingerprint_of_sum, varint
from sdsync.reconcile.items import INFINITY_TS, MAX_TIMESTAMP, Bound, Item
from sdsync.reconcile.session import FrameOutcome, MethodSession, default_max_rounds
from sdsync.wire.waku import HASH_SIZE

RBSR_VERSION = 1
ITEM_ID_SIZE = 16
"""Bytes of a hash that identify an item inside an ``ITEMS`` list."""
_MAX_BOUND = 10 + 2 + HASH_SIZE
_MAX_ITEM = 10 + HASH_SIZE
_RESERVE = 2 * _MAX_BOUND + FINGERPRINT_SIZE
"""Room kept free for the closing skip + remainder fingerprint of a full frame."""
_SLACK = 7 / 8
"""Share of ``item_threshold`` the first split aims at (the peer may hold a few more)."""


class Mode(IntEnum):
    SKIP = 0
    FINGERPRINT = 1
    ITEMS = 2
    DIFF = 3
    FULL = 4


@dataclass(frozen=True, slots=True)
class RbsrParams:
    """How a side describes a range that differs."""

    fanout: int = 16
    """Buckets a differing range is split into."""
    item_threshold: int = 24
    """Ranges with at most this many local items are sent as item lists."""

    def __post_init__(self) -> None:
        if not 2 <= self.fanout <= 1024:
            raise LocalProtocolError(f"fanout {self.fanout} outside [2, 1024]")
        if not 1 <= self.item_threshold <= 4096:
            raise LocalProtocolError(f"item_threshold {self.item_threshold} outside [1, 4096]")

    @property
    def min_frame_size(self) -> int:
        """The smallest frame limit that always fits one range's answer."""
        split = self.fanout * (_MAX_BOUND + FINGERPRINT_SIZE)
        diff = 2 * self.item_threshold * _MAX_ITEM + self.item_threshold // 4 + 3 * 10
        return 1 + 10 + 2 * _MAX_BOUND + max(split, diff) + _RESERVE

    def default_max_rounds(self, max_frame_size: int) -> int:
        """The round limit of a session with these parameters (see :func:`default_max_rounds`)."""
        return default_max_rounds(self.fanout, max_frame_size)

    def first_fanout(self, count: int) -> int:
        """Buckets for the initiator's first split of ``count`` items."""
        span = self.item_threshold * _SLACK
        while count / span > self.fanout**2:
            span *= self.fanout
        return max(self.fanout, math.ceil(count / span))


# -- decoding -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Range:
    lower: Bound
    upper: Bound
    mode: Mode
    fingerprint: bytes = b""
    items: tuple[Item, ...] = ()
    answered: int = 0
    bitmap: bytes = b""

    @property
    def expects_answer(self) -> bool:
        if self.mode is Mode.DIFF:
            return any(self.bitmap)
        return self.mode in (Mode.FINGERPRINT, Mode.ITEMS)


def _read_items(
    r: Reader, lower: Bound, upper: Bound, count_limit: int, id_size: int = HASH_SIZE
) -> tuple[Item, ...]:
    # Ids are hash prefixes: compare them with bounds cut to their length. Two items may
    # share an id only if someone found a 128-bit collision; keep them both. Full hashes
    # name each item once: they must strictly increase.
    low = (lower[0], lower[1][:id_size])
    high = (upper[0], upper[1][:id_size])
    high_is_exact = len(upper[1]) <= id_size
    strict = id_size == HASH_SIZE
    count = r.varint(limit=count_limit + 1)
    items: list[Item] = []
    ts = lower[0]
    for _ in range(count):
        ts += r.varint(limit=1 << 63)
        item = (ts, r.take(id_size))
        if (
            item < low
            or item > high
            or (item == high and high_is_exact)
            or (items and (item <= items[-1] if strict else item < items[-1]))
        ):
            raise RemoteProtocolError("item list out of order or outside its range")
        items.append(item)
    return tuple(items)


def _read_range(r: Reader, lower: Bound, max_items: int) -> _Range:
    code = r.varint()
    if code == 0:
        ts = INFINITY_TS
    else:
        ts = lower[0] + code - 1
        if ts > MAX_TIMESTAMP:
            raise RemoteProtocolError(f"bound timestamp {ts} beyond 2**63 - 1")
    prefix_size, code = divmod(r.varint(limit=(HASH_SIZE + 1) * 8), 8)
    upper = (ts, r.take(prefix_size))
    if not lower < upper:
        raise RemoteProtocolError(f"range bounds do not increase: {lower} .. {upper}")
    if code not in Mode._value2member_map_:
        raise RemoteProtocolError(f"unknown range mode {code}")
    mode = Mode(code)
    if mode is Mode.FINGERPRINT:
        return _Range(lower, upper, mode, fingerprint=r.take(FINGERPRINT_SIZE))
    if mode is Mode.ITEMS:
        items = _read_items(r, lower, upper, max_items, ITEM_ID_SIZE)
        return _Range(lower, upper, mode, items=items)
    if mode is Mode.DIFF:
        answered = r.varint(limit=8 * len(r) + 1)  # its bitmap must fit
        bitmap = r.take((answered + 7) // 8)
        if answered % 8 and bitmap[-1] >> (answered % 8):
            raise RemoteProtocolError("bitmap padding bits are set")
        items = _read_items(r, lower, upper, max_items)
        return _Range(lower, upper, mode, items=items, answered=answered, bitmap=bitmap)
    if mode is Mode.FULL:
        return _Range(lower, upper, mode, items=_read_items(r, lower, upper, max_items))
    return _Range(lower, upper, mode)


def _decode(frame: bytes, start: Bound, end: Bound | None) -> list[_Range]:
    """All ranges of a frame; ``end`` None means this is the first frame (it sets the end)."""
    r = Reader(frame)
    version = r.byte()
    if version != RBSR_VERSION:
        raise RemoteProtocolError(f"RBSR version {version}, we speak {RBSR_VERSION}")
    if end is None:
        start = (r.varint(limit=MAX_TIMESTAMP + 1), b"")
    ranges: list[_Range] = []
    lower = start
    max_items = len(frame) // ITEM_ID_SIZE
    while not r.at_end:
        rng = _read_range(r, lower, max_items)
        ranges.append(rng)
        lower = rng.upper
    if end is None:
        if (
            not ranges
            or ranges[-1].upper[1]
            or any(x.mode in (Mode.DIFF, Mode.FULL) for x in ranges)
        ):
            raise RemoteProtocolError("a first frame covers its window with FINGERPRINT/ITEMS")
    elif lower > end:
        raise RemoteProtocolError(f"range beyond the window end {end}")
    return ranges


# -- encoding -------------------------------------------------------------------------

_Piece = tuple[Bound, Mode, bytes]
"""One range of a reply: its upper bound, mode and payload."""


def _encode_range(piece: _Piece, last_ts: int) -> bytes:
    (ts, prefix), mode, payload = piece
    code = 0 if ts >= INFINITY_TS else ts - last_ts + 1
    return varint(code) + varint(len(prefix) * 8 + mode) + prefix + payload


def _items_payload(lower_ts: int, items: Sequence[Item], id_size: int = HASH_SIZE) -> bytes:
    parts = [varint(len(items))]
    ts = lower_ts
    for t, h in items:
        parts.append(varint(t - ts))
        parts.append(h[:id_size])
        ts = t
    return b"".join(parts)


class _Frame:
    """A reply under construction: fills gaps with skips, knows if it expects an answer."""

    def __init__(self, header: bytes, start: Bound, limit: int) -> None:
        self._buf = bytearray(header)
        self._covered = start
        self._limit = limit
        self.expects_answer = False
        self.empty = True

    def try_add(
        self, lower: Bound, pieces: list[_Piece], expects: bool, *, forced: bool = False
    ) -> bool:
        """Append the answer for a range from ``lower`` unless it would overflow the frame
        (``forced``: it may use the reserve)."""
        out = bytearray()
        last_ts = self._covered[0]
        if lower != self._covered:
            out += _encode_range((lower, Mode.SKIP, b""), last_ts)
            last_ts = lower[0]
        for piece in pieces:
            out += _encode_range(piece, last_ts)
            last_ts = piece[0][0]
        room = self._limit - (0 if forced else _RESERVE)
        if len(self._buf) + len(out) > room:
            return False
        self._buf += out
        self._covered = pieces[-1][0]
        self.empty = False
        self.expects_answer |= expects
        return True

    def bytes(self) -> bytes:
        return bytes(self._buf)


def _bitmap(flags: Sequence[bool]) -> bytes:
    out = bytearray((len(flags) + 7) // 8)
    for i, flag in enumerate(flags):
        if flag:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def _bit(bitmap: bytes, i: int) -> bool:
    return bool(bitmap[i >> 3] >> (i & 7) & 1)


def _id(item: Item) -> Item:
    return item[0], item[1][:ITEM_ID_SIZE]


@dataclass(slots=True)
class _Answer:
    """Our answer to one range and what it taught us."""

    pieces: list[_Piece] | None = None
    expects: bool = False
    have: tuple[Item, ...] | list[Item] = ()
    need: tuple[Item, ...] | list[Item] = ()


# -- the session ----------------------------------------------------------------------


class RbsrSession(MethodSession[RbsrParams]):
    """One side of an RBSR reconciliation (see the module docstring for the protocol)."""

    Params = RbsrParams
    name = "rbsr"

    def _initiate(self) -> bytes:
        assert self._end is not None
        frame = _Frame(bytes([RBSR_VERSION]) + varint(self._start[0]), self._start, 1 << 62)
        lo, hi = self.store.lower_bound(self._start), self.store.lower_bound(self._end)
        # As many buckets as fit the frame limit (min_frame_size guarantees `fanout` do).
        fits = (self.max_frame_size - 1 - 10) // (_MAX_BOUND + FINGERPRINT_SIZE)
        fanout = min(self.params.first_fanout(hi - lo), max(fits, self.params.fanout))
        frame.try_add(self._start, self._describe(self._start, self._end, lo, hi, fanout), True)
        return frame.bytes()

    def _evaluate(self, frame: bytes) -> FrameOutcome:
        first = self._end is None
        ranges = _decode(frame, self._start, self._end)
        start = ranges[0].lower if first else self._start
        end = ranges[-1].upper if first else self._end
        assert end is not None
        out = _Frame(bytes([RBSR_VERSION]), start, self.max_frame_size)
        have: list[Item] = []
        need: list[Item] = []
        lo = self.store.lower_bound(start)
        for rng in ranges:
            hi = self.store.lower_bound(rng.upper)
            answer = self._answer(rng, lo, hi)
            if answer.pieces is not None and not out.try_add(
                rng.lower, answer.pieces, answer.expects
            ):
                rest = self.store.lower_bound(end)
                remainder = fingerprint_of_sum(*self.store.summary(lo, rest))
                out.try_add(rng.lower, [(end, Mode.FINGERPRINT, remainder)], True, forced=True)
                break
            have += answer.have
            need += answer.need
            lo = hi

        def commit() -> None:
            self._start, self._end = start, end

        expected = any(x.expects_answer for x in ranges)
        reply = out.bytes() if expected or not out.empty else None
        return FrameOutcome(reply, have, need, finished=not out.expects_answer, commit=commit)

    def _answer(self, rng: _Range, lo: int, hi: int) -> _Answer:
        store = self.store
        if rng.mode is Mode.FINGERPRINT:
            if fingerprint_of_sum(*store.summary(lo, hi)) == rng.fingerprint:
                return _Answer()
            return _Answer(self._describe(rng.lower, rng.upper, lo, hi), expects=True)
        if rng.mode is Mode.ITEMS:
            if hi - lo > len(rng.items) + self.params.item_threshold:
                return _Answer(self._describe(rng.lower, rng.upper, lo, hi), expects=True)
            return self._diff(rng, store.items(lo, hi))
        if rng.mode is Mode.DIFF:
            # Count before reading: a DIFF over a wide range must not make us read it all.
            if hi - lo != rng.answered or rng.answered > self.params.item_threshold:
                raise RemoteProtocolError(
                    f"DIFF answers {rng.answered} items, our list had {hi - lo}"
                )
            return self._full(rng, store.items(lo, hi))
        if rng.mode is Mode.FULL:
            if any(self._holds(it, hi) for it in rng.items):
                raise RemoteProtocolError("FULL sends items we hold")
            return _Answer(need=rng.items)
        return _Answer()

    def _holds(self, item: Item, hi: int) -> bool:
        """Whether we hold ``item`` (it lies in a range that ends at position ``hi``)."""
        position = self.store.lower_bound(item)
        return position < hi and self.store.item(position) == item

    def _diff(self, rng: _Range, ours: list[Item]) -> _Answer:
        """Answer the peer's ``ITEMS`` with the bitmap of what we lack and our extras."""
        mine = {_id(it) for it in ours}
        theirs = set(rng.items)
        extras = [it for it in ours if _id(it) not in theirs]
        lacking = [it not in mine for it in rng.items]
        if not extras and not any(lacking):
            return _Answer()
        payload = varint(len(rng.items)) + _bitmap(lacking)
        payload += _items_payload(rng.lower[0], extras)
        return _Answer([(rng.upper, Mode.DIFF, payload)], expects=any(lacking), have=extras)

    def _full(self, rng: _Range, ours: list[Item]) -> _Answer:
        """Settle our ``ITEMS``: note both directions, send in full what the peer lacks."""
        if len(ours) != rng.answered:
            raise RemoteProtocolError(
                f"DIFF answers {rng.answered} items, our list had {len(ours)}"
            )
        if {_id(it) for it in rng.items} & {_id(it) for it in ours}:
            raise RemoteProtocolError("DIFF offers items we listed ourselves")
        lacked = [it for i, it in enumerate(ours) if _bit(rng.bitmap, i)]
        pieces = [(rng.upper, Mode.FULL, _items_payload(rng.lower[0], lacked))] if lacked else None
        return _Answer(pieces, have=lacked, need=rng.items)

    def _describe(
        self, lower: Bound, upper: Bound, lo: int, hi: int, fanout: int = 0
    ) -> list[_Piece]:
        """Our side of ``[lower, upper)``: an item list, or fingerprints of equal buckets."""
        store = self.store
        count = hi - lo
        if count <= self.params.item_threshold:
            items = store.items(lo, hi)
            return [(upper, Mode.ITEMS, _items_payload(lower[0], items, ITEM_ID_SIZE))]
        fanout = fanout or self.params.fanout
        cuts = sorted({lo + count * k // fanout for k in range(1, fanout)} - {lo})
        pieces: list[_Piece] = []
        begin = lo
        for cut in [*cuts, hi]:
            bound = upper if cut == hi else minimal_bound(store.item(cut - 1), store.item(cut))
            fp = fingerprint_of_sum(*store.summary(begin, cut))
            pieces.append((bound, Mode.FINGERPRINT, fp))
            begin = cut
        return pieces
