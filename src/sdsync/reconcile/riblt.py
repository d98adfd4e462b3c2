"""Rateless IBLT set reconciliation: one stream of coded symbols, then one exchange.

Theory of operation
-------------------
The coding (items, coded symbols, the index sequence, the bucket cache) is in
:mod:`sdsync.reconcile.riblt_coding`. A session runs in two turns:

1. The initiator sends ``OPEN`` with the window, its item count and how many bytes its
   timestamps need past the window start. The responder answers with a *stream* of
   ``SYMBOLS`` frames: its coded symbols ``0, 1, 2, ...`` in growing batches (a quarter of
   what it has sent, from 1 up to ``first_batch``, later ``1/growth`` of it), without
   waiting for an answer (:meth:`~sdsync.reconcile.session.ReconcileSession.stream`).
   The initiator XORs each batch with its own symbols and with the items it has already
   peeled, then peels every *pure* symbol (one item: its checksum matches) until none is
   left. When every symbol is zero the difference is complete, and the initiator stops
   the stream by answering.
2. The initiator's ``DONE`` names what it learned: in full the items it holds and the
   responder lacks (``give``), and by reference the items the responder holds and it lacks
   (``take``). A reference is the item's timestamp and the shortest prefix of its id that
   no other item of the responder's with that timestamp shares, usually none: the
   initiator knows the responder's items of any timestamp exactly (its own, less what it
   gives, plus what it takes). The responder resolves each reference in its store and
   answers ``TAILS``, the last 16 bytes of those hashes, so the initiator's ``need`` holds
   whole items. No ``take``, no ``TAILS``: ``DONE`` is the last frame.

That is two round trips whatever the difference; long turns (a large ``DONE`` or
``TAILS``) are streamed in parts within the frame limit.

Version 2 names taken items by reference (version 1 sent their whole ids: 16 bytes more
each). A symbol carries an item's 16-byte id (as RBSR's item lists), only the low
``ts_bytes`` bytes of the timestamp (enough for the window: 6 for Store Sync's hour; the
initiator reads the rest from the window start) and a 48-bit checksum: ``22 + ts_bytes``
bytes. Items are told apart by ``(timestamp, id)``: two items with the same timestamp and
id (a 2**64 birthday search over one's own messages) count as one, as in RBSR.

Frames, version 2 (varints are negentropy's)::

    frame   = version:u8 type:u8 body
    OPEN=0    window_start:varint window_span:varint (0 = open) ts_bytes:u8 items:varint
    SYMBOLS=1 flags:u8 first:varint count:varint [ts_bytes:u8 items:varint] symbol*
              the bracket only when first = 0; flags bit 0: the stream ends here
              symbol = id:16 ts_low:ts_bytes (big-endian) checksum:6
    DONE=2    flags:u8 give:varint (ts_delta:varint hash:32)* take:varint ref*
              ref = (2 ts_delta + (k > 0)):varint [k:u8 prefix:k]     k in 1..16
              flags bit 0: last part; each list strictly increasing across parts, ts
              deltas from the previous entry of the same list (the window start first)
    TAILS=3   flags:u8 count:varint tail:16*     in the order of the take lists

Hostile peers
~~~~~~~~~~~~~
A responder streams at most ``cap = min(max_symbols, 3 * (n + min(m, n + unverified_items))
+ 64)`` symbols for its own ``n`` items and the initiator's claimed ``m``: the claim is
taken at its word only up to what the responder holds (plus ``unverified_items``), so an
``OPEN`` claiming 2**40 items earns no more symbols than one claiming ``n``. An initiator
holding more than that may not decode (:class:`UndecodedError`; Store Sync then
reconciles by RBSR). An initiator accepts no more than the same cap (computed from the
responder's claimed count), so the decoder holds at most ``cap`` symbols (32 bytes each)
and peels at most ``cap`` items, each once: a pure symbol that names an item already
peeled, or one outside the window, ends the session (``RemoteProtocolError``), and so
does a stream that ends undecoded. Every item peeled takes a symbol of its own, so a
``DONE`` names at most as many items, in all its parts, as symbols were streamed: the
responder refuses one that names more, or is longer than that many entries take, before
it reads a single entry. The entries it reads are checked one by one (one store lookup
each: a ``give`` item we hold, or a ``take`` reference that names none or several of our
items, is refused). Nothing
changes on a refused frame: a batch lands past the symbols held and the items it peeled
are XORed out again (XOR is its own inverse); other frames are checked whole before they
are applied. The transfer step's hash checks stay the final word on what is stored.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.reconcile.codec import Reader
from sdsync.reconcile.fingerprint import varint
from sdsync.reconcile.items import INFINITY_TS, Item, ItemStore, MemoryItemStore
from sdsync.reconcile.riblt_coding import (
    CHECKSUM,
    CHECKSUM_BITS,
    ID_SIZE,
    TS,
    WORDS,
    BucketCache,
    Encoder,
    Words,
    checksums,
    encode,
    item_words,
)
from sdsync.reconcile.session import (
    DEFAULT_MAX_FRAME_SIZE,
    FULL_WINDOW,
    FrameOutcome,
    MethodSession,
    StreamPart,
    Window,
    window_bounds,
)
from sdsync.wire.waku import HASH_SIZE

RIBLT_VERSION = 2
CHECKSUM_SIZE = CHECKSUM_BITS // 8
TAIL_SIZE = HASH_SIZE - ID_SIZE
_LAST = 1
_HEADER = 2 + 1 + 10 + 10 + 1 + 10
"""Bytes a frame's header takes at most."""
_DONE_ENTRY = 10 + HASH_SIZE
"""Bytes a ``DONE`` entry takes at most (a ``give``; a ``take`` reference is shorter)."""
Key = tuple[int, bytes]
"""``(timestamp, 16-byte id)``: an item as the symbols know it."""


class FrameType(IntEnum):
    OPEN = 0
    SYMBOLS = 1
    DONE = 2
    TAILS = 3


@dataclass(frozen=True, slots=True)
class RibltParams:
    """How the responder paces its stream, and the most symbols a session exchanges."""

    first_batch: int = 16
    """Batches grow by a quarter of the symbols sent from one symbol up to this size (which
    later ones keep at least)."""
    growth: int = 128
    """A later batch holds about ``1/growth`` of the symbols sent before it (the stream
    overshoots the symbols needed by half that on average)."""
    max_symbols: int = 1 << 21
    """Symbols a session sends or accepts at most (the decoder's memory: 32 bytes each)."""
    unverified_items: int = 1024
    """How many items the initiator's claim may exceed the responder's own count by and
    still count towards the stream's cap (the claim cannot be checked)."""

    def __post_init__(self) -> None:
        if not 1 <= self.first_batch <= 1 << 16:
            raise LocalProtocolError(f"first_batch {self.first_batch} outside [1, 65536]")
        if not 1 <= self.growth <= 1024:
            raise LocalProtocolError(f"growth {self.growth} outside [1, 1024]")
        if not 1 <= self.max_symbols <= 1 << 26:
            raise LocalProtocolError(f"max_symbols {self.max_symbols} outside [1, 2**26]")
        if not 0 <= self.unverified_items <= 1 << 26:
            raise LocalProtocolError(f"unverified_items {self.unverified_items} outside [0, 2**26]")

    @property
    def min_frame_size(self) -> int:
        """Room for a header and one symbol, ``DONE`` item or tail."""
        return _HEADER + 10 + HASH_SIZE + 16

    def default_max_rounds(self, max_frame_size: int) -> int:
        """Turns a session takes: ``OPEN``, the stream, ``DONE``, ``TAILS`` (stream parts
        are not turns; the symbol cap bounds them)."""
        return 4

    def cap(self, responder_items: int, initiator_items: int) -> int:
        """Symbols streamed at most for a responder's ``responder_items`` and the count the
        initiator claims: its claim counts up to the responder's own plus
        ``unverified_items``."""
        trusted = min(initiator_items, responder_items + self.unverified_items)
        return min(self.max_symbols, 3 * (responder_items + trusted) + 64)


class UndecodedError(RemoteProtocolError):
    """The responder's stream ended before the difference decoded: from an honest
    responder, the difference is larger than the stream it gives an initiator of
    unverified size (reconcile by another method); from another, bad symbols."""


def _shared(a: bytes, b: bytes) -> int:
    """How many leading bytes ``a`` and ``b`` share."""
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))


def _read_hash(r: Reader) -> tuple[int, bytes]:
    """A ``give`` entry: timestamp delta and whole hash."""
    return r.varint(1 << 63), r.take(HASH_SIZE)


def _read_reference(r: Reader) -> tuple[int, bytes]:
    """A ``take`` entry: timestamp delta and the id prefix that names the item (maybe
    none)."""
    delta, named = divmod(r.varint(1 << 64), 2)
    prefix = r.take(r.byte()) if named else b""
    if named and not 1 <= len(prefix) <= ID_SIZE:
        raise RemoteProtocolError(f"a DONE reference with a {len(prefix)}-byte prefix")
    return delta, prefix


def _ts_bytes(span: int) -> int:
    """Bytes that carry timestamp offsets ``< span + 1`` from the window start."""
    return max(1, min(8, (span.bit_length() + 7) // 8))


class WindowSymbols:
    """A store window's coded symbols, computed in order (from the cache where it has them)."""

    __slots__ = ("_ahead", "_cached", "_edges", "_prefix", "_resume", "_whole", "_words", "sent")

    def __init__(self, store: ItemStore, lo: int, hi: int, window: tuple[int, int | None]) -> None:
        self.sent = 0
        self._ahead = np.zeros((0, WORDS), dtype=np.uint64)  # computed, not yet taken
        self._words: Callable[[], Words] = lambda: window_words(store, lo, hi)
        self._whole: Encoder | None = None
        self._cached: list[Words] = []
        self._prefix = 0
        self._edges: Encoder | None = None
        self._resume: Callable[[], Encoder | None] | None = None
        cache = store.cache if isinstance(store, RibltItemStore) else None
        if cache is None:
            return
        assert isinstance(store, RibltItemStore)
        self._resume = lambda: store.resumed(lo, hi)
        start, end = cache.whole_buckets(*window)
        if start == end:
            return
        first = store.lower_bound((start, b""))
        last = hi if end is None else store.lower_bound((end, b""))
        self._cached = cache.rows(start, end)
        self._prefix = cache.prefix
        self._edges = Encoder(
            np.concatenate((window_words(store, lo, first), window_words(store, last, hi)))
        )

    def take(self, count: int) -> Words:
        """The next ``count`` symbols."""
        if len(self._ahead) < count:
            # Each pass costs a scan of all the window's items, but more symbols cost only
            # ~2 ln(1.5) more indices per item: compute half as many again as there are.
            self._ahead = np.concatenate(
                (self._ahead, self._compute(max(count, (self.sent + len(self._ahead)) // 2)))
            )
        out, self._ahead = self._ahead[:count], self._ahead[count:]
        self.sent += count
        return out

    def _compute(self, count: int) -> Words:
        out = np.zeros((count, WORDS), dtype=np.uint64)
        done = self.sent + len(self._ahead)
        start, stop = done, done + count
        if self._edges is not None and start < self._prefix:
            cut = min(stop, self._prefix)
            for rows in self._cached:
                out[: cut - start] ^= rows[start:cut]
            self._edges.extend(out, cut, offset=start)
            start = cut
        if start < stop:
            if self._whole is None:
                # Past the cached prefix, the window's items resume where the cache left
                # them; without a cache they are advanced from symbol 0.
                resumable = self._resume is not None and start >= self._prefix > 0
                resumed = self._resume() if self._resume is not None and resumable else None
                self._whole = Encoder(self._words()) if resumed is None else resumed
                self._whole.skip(start)
            self._whole.extend(out, stop, offset=done)
        return out


def window_words(store: ItemStore, lo: int, hi: int) -> Words:
    """The words of the items at positions ``[lo, hi)``."""
    if isinstance(store, RibltItemStore):
        return store.words(lo, hi)
    items = store.items(lo, hi)
    ts = np.fromiter((t for t, _ in items), dtype=np.int64, count=len(items))
    hashes = np.frombuffer(b"".join(h for _, h in items), dtype=np.uint8)
    return item_words(ts, hashes.reshape(len(items), HASH_SIZE))


class RibltItemStore(MemoryItemStore):
    """A :class:`MemoryItemStore` that reads its items as words in bulk and, if it has one,
    keeps a :class:`BucketCache` of their symbols current."""

    __slots__ = ("_next", "_next_state", "cache")

    DEFAULT_BUCKET_WIDTH = 60 * 10**9
    """One minute of nanosecond timestamps."""
    DEFAULT_PREFIX = 4096
    """Symbols cached per bucket (enough for about 3,000 differences): 128 KiB a bucket."""

    cache: BucketCache | None
    _next: npt.NDArray[np.int64] | None
    _next_state: Words | None

    def __init__(
        self,
        items: Iterable[Item] = (),
        *,
        bucket_width: int | None = DEFAULT_BUCKET_WIDTH,
        prefix: int = DEFAULT_PREFIX,
    ) -> None:
        """``bucket_width`` None: no cache (a snapshot read once)."""
        super().__init__(items)
        self._build(bucket_width, prefix)

    @classmethod
    def build(
        cls,
        timestamps: npt.NDArray[np.int64],
        hashes: npt.NDArray[np.uint8],
        *,
        bucket_width: int | None = DEFAULT_BUCKET_WIDTH,
        prefix: int = DEFAULT_PREFIX,
    ) -> RibltItemStore:
        """Like :meth:`MemoryItemStore.from_arrays`, with the cache built (``bucket_width``
        None: none)."""
        store = cls.from_arrays(timestamps, hashes)
        assert isinstance(store, RibltItemStore)
        store._build(bucket_width, prefix)
        return store

    def _build(self, bucket_width: int | None, prefix: int) -> None:
        self.cache = None if bucket_width is None else BucketCache(bucket_width, prefix)
        self._next = self._next_state = None
        if self.cache is not None:
            # Each item's index sequence past the prefix, by position: a window encoded
            # past the prefix resumes there instead of advancing every item from 0.
            self._next, self._next_state = self.cache.toggle(self.words(0, len(self)))

    def resumed(self, lo: int, hi: int) -> Encoder | None:
        """An encoder of the items at ``[lo, hi)`` past the cached prefix, if the store
        keeps its cache itself (it then knows every item's state there)."""
        if self.cache is None or self._next is None or self._next_state is None:
            return None
        return Encoder.resume(
            self.words(lo, hi),
            self._next[lo:hi].copy(),
            self._next_state[lo:hi].copy(),
            self.cache.prefix,
        )

    def words(self, lo: int, hi: int) -> Words:
        return item_words(self._ts[lo:hi], self._hashes[lo:hi])

    def buckets(self, lo: int, hi: int, width: int) -> list[tuple[int, int, int]]:
        """``(bucket, start, stop)`` of the items at ``[lo, hi)``, by buckets of ``width``
        timestamp units (only buckets holding items)."""
        if hi <= lo:
            return []
        keys = self._ts[lo:hi] // width
        cuts = np.flatnonzero(np.diff(keys)) + 1
        starts = np.concatenate(([0], cuts))
        stops = np.concatenate((cuts, [hi - lo]))
        return list(
            zip(keys[starts].tolist(), (starts + lo).tolist(), (stops + lo).tolist(), strict=True)
        )

    def spans(self, stamps: Sequence[int]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The positions ``[lo, hi)`` of the items of each timestamp, in bulk."""
        column = self._ts[: len(self)]
        values = np.array(stamps, dtype=np.int64)
        return (
            np.searchsorted(column, values, side="left"),
            np.searchsorted(column, values, side="right"),
        )

    def locate(self, refs: Sequence[Key], unique: bool = False) -> list[int | None]:
        """The position of the first item with each timestamp whose id starts with the
        given prefix, or None (also when ``unique`` and a second one follows); in bulk."""
        lo, hi = self.spans([ts for ts, _ in refs])
        found: list[int | None] = []
        for (ts, prefix), first, stop in zip(refs, lo.tolist(), hi.tolist(), strict=True):
            # Equal timestamps: the ids decide.
            p = self.lower_bound((ts, prefix)) if stop - first > 1 and prefix else first
            named = [q for q in (p, p + 1) if q < stop and self._starts(q, prefix)]
            found.append(named[0] if named and not (unique and len(named) > 1) else None)
        return found

    def _starts(self, position: int, prefix: bytes) -> bool:
        return self._hashes[position, : len(prefix)].tobytes() == prefix

    def insert(self, item: Item) -> bool:
        if not super().insert(item):
            return False
        if self.cache is not None:
            if self._next is None or self._next_state is None:
                raise LocalProtocolError("a store holding a SymbolCache's rows is read-only")
            p = self.lower_bound(item)
            current, state = self.cache.toggle(self.words(p, p + 1))
            self._next = np.insert(self._next, p, current)
            self._next_state = np.insert(self._next_state, p, state)
        return True


class SymbolCache:
    """Bucket rows for stores built afresh for every session (a store node's snapshots).

    A snapshot cannot keep a :class:`BucketCache` current: it is a new store every round.
    This cache keeps each bucket's rows with the count and fingerprint (RBSR's, which
    RBSR trusts to call two ranges equal) of the items they were encoded from, and hands
    them to a later snapshot whose bucket still has that count and fingerprint. So however
    the archive changed — any ingestion path, retention, another node writing the same
    database — a round encodes again only the buckets that changed. Safe to share between
    threads; it holds at most ``max_buckets`` buckets (the least recently used go), 128 KiB
    each with the default prefix.
    """

    def __init__(
        self,
        bucket_width: int = RibltItemStore.DEFAULT_BUCKET_WIDTH,
        prefix: int = RibltItemStore.DEFAULT_PREFIX,
        max_buckets: int = 256,
    ) -> None:
        if bucket_width < 1 or prefix < 1 or max_buckets < 1:
            raise LocalProtocolError("a symbol cache needs a positive width, prefix and size")
        self.bucket_width, self.prefix, self.max_buckets = bucket_width, prefix, max_buckets
        self._buckets: OrderedDict[int, tuple[int, int, Words]] = OrderedDict()
        self._lock = threading.Lock()
        self.reused = 0
        """Buckets handed out as they were."""
        self.encoded = 0
        """Buckets encoded (new, or changed since they were cached)."""

    def __len__(self) -> int:
        return len(self._buckets)

    def attach(self, store: RibltItemStore, start: int, end: int | None) -> tuple[int, int]:
        """Give ``store``, which holds every item of ``[start, end)``, the rows of the
        whole buckets inside that window (its sessions over the window then use them);
        how many buckets were reused and how many encoded."""
        shape = BucketCache(self.bucket_width, self.prefix)
        lo, hi = shape.whole_buckets(start, end)
        if lo == hi:
            store.cache = shape
            return 0, 0
        a = store.lower_bound((lo, b""))
        b = len(store) if hi is None else store.lower_bound((hi, b""))
        rows: dict[int, Words] = {}
        reused = 0
        for bucket, first, stop in store.buckets(a, b, self.bucket_width):
            rows[bucket], hit = self._rows(store, bucket, first, stop)
            reused += hit
        store.cache = BucketCache.holding(self.bucket_width, self.prefix, rows)
        return reused, len(rows) - reused

    def _rows(self, store: RibltItemStore, bucket: int, a: int, b: int) -> tuple[Words, bool]:
        """The bucket's rows, and whether they came from the cache."""
        fingerprint, count = store.summary(a, b)
        with self._lock:
            held = self._buckets.get(bucket)
            if held is not None and held[:2] == (count, fingerprint):
                self._buckets.move_to_end(bucket)
                self.reused += 1
                return held[2], True
        rows = encode(store.words(a, b), self.prefix)
        rows.flags.writeable = False  # shared by every store it is attached to
        with self._lock:
            self._buckets[bucket] = (count, fingerprint, rows)
            self._buckets.move_to_end(bucket)
            while len(self._buckets) > self.max_buckets:
                self._buckets.popitem(last=False)
            self.encoded += 1
        return rows, False


class _Phase(IntEnum):
    OPENING = 0
    SYMBOLS = 1
    DONE = 2
    TAILS = 3
    FINISHED = 4


class RibltSession(MethodSession[RibltParams]):
    """One side of a rateless IBLT reconciliation (see the module docstring)."""

    Params = RibltParams
    name = "riblt"
    streaming = True
    cached_symbols = True

    def __init__(
        self,
        store: ItemStore,
        *,
        initiator: bool,
        window: Window = FULL_WINDOW,
        params: RibltParams | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_rounds: int | None = None,
    ) -> None:
        super().__init__(
            store,
            initiator=initiator,
            window=window,
            params=params,
            max_frame_size=max_frame_size,
            max_rounds=max_rounds,
        )
        self._phase = _Phase.OPENING
        self._lo = self._hi = 0
        self._ts_bytes = 8
        self._cap = 0
        self._symbols: WindowSymbols | None = None
        # initiator: the decoder
        self._mine = np.zeros((0, WORDS), dtype=np.uint64)  # our symbols, memoised
        self._diff = np.zeros((0, WORDS), dtype=np.uint64)  # symbols [0, _m) and room
        self._m = 0
        self._peeled = Encoder(np.zeros((0, WORDS), dtype=np.uint64))
        self._keys: set[Key] = set()
        self._local: dict[Key, Item] = {}  # peeled items we hold
        self._parts: list[bytes] = []  # frames of a streamed turn still to send
        self._take: list[Key] = []
        # responder: what DONE told us
        self._last_give: Item | None = None
        self._last_take: Key | None = None
        self._tails: list[bytes] = []
        self._done_parts_in = 0
        self._named = 0  # items the DONE parts named so far

    @property
    def symbols(self) -> int:
        """Coded symbols streamed so far (sent by a responder, received by an initiator)."""
        if self.initiator:
            return self._m
        return 0 if self._symbols is None else self._symbols.sent

    # -- turns

    def _initiate(self) -> bytes:
        self._locate()
        span = self._end[0] - self._start[0] if self._end and self._end[0] < INFINITY_TS else 0
        body = [varint(self._start[0]), varint(span), bytes([self._own_ts_bytes()])]
        self._phase = _Phase.SYMBOLS
        return self._frame(FrameType.OPEN, *body, varint(self._hi - self._lo))

    def _evaluate(self, frame: bytes) -> FrameOutcome:
        r = Reader(frame)
        if r.byte() != RIBLT_VERSION:
            raise RemoteProtocolError(f"RIBLT frame version {frame[0]} is not {RIBLT_VERSION}")
        kind = r.byte()
        expected = {
            (False, _Phase.OPENING): FrameType.OPEN,
            (True, _Phase.SYMBOLS): FrameType.SYMBOLS,
            (False, _Phase.SYMBOLS): FrameType.DONE,  # it may stop our stream at any batch
            (False, _Phase.DONE): FrameType.DONE,
            (True, _Phase.TAILS): FrameType.TAILS,
        }.get((self.initiator, self._phase))
        if kind != expected:
            raise RemoteProtocolError(f"RIBLT frame type {kind} out of turn")
        if kind == FrameType.OPEN:
            return self._on_open(r)
        if kind == FrameType.SYMBOLS:
            return self._on_symbols(r)
        if kind == FrameType.DONE:
            return self._on_done(r)
        return self._on_tails(r)

    def _stream(self) -> StreamPart | None:
        if self._parts:
            part = self._parts.pop(0)
            return StreamPart(part, finished=not self._parts and self._finishes_after_parts())
        if not self.initiator and self._phase is _Phase.SYMBOLS:
            return self._next_batch()
        return None

    def _finishes_after_parts(self) -> bool:
        # The initiator's DONE ends the session when it asks for no tails; TAILS always does.
        return not self._take if self.initiator else True

    # -- responder

    def _on_open(self, r: Reader) -> FrameOutcome:
        start = r.varint(1 << 63)
        span = r.varint(1 << 63)
        peer_ts_bytes = r.byte()
        peer_items = r.varint(1 << 40)
        if not r.at_end or not 1 <= peer_ts_bytes <= 8:
            raise RemoteProtocolError("malformed RIBLT OPEN")
        try:
            bounds = window_bounds((start, start + span if span else None))
        except LocalProtocolError as exc:
            raise RemoteProtocolError(f"bad window: {exc}") from None
        # Every check is done: the session takes the window and answers from it.
        self._start, self._end = bounds
        self._locate()
        self._ts_bytes = max(peer_ts_bytes, self._own_ts_bytes())
        self._cap = self.params.cap(self._hi - self._lo, peer_items)
        self._phase = _Phase.SYMBOLS
        return FrameOutcome(self._next_batch().frame)

    def _next_batch(self) -> StreamPart:
        assert self._symbols is not None
        sent = self._symbols.sent
        size = ID_SIZE + self._ts_bytes + CHECKSUM_SIZE
        # A quarter of what was sent, at least 1 and at most first_batch, until 1/growth of
        # it is more: few symbols wasted for small differences, few frames for large ones.
        count = max(1, min(sent // 4, self.params.first_batch), sent // self.params.growth)
        count = min(count, self._cap - sent, (self.max_frame_size - _HEADER) // size)
        last = sent + count >= self._cap
        rows = self._symbols.take(count)
        header = [bytes([_LAST if last else 0]), varint(sent), varint(count)]
        if sent == 0:
            header += [bytes([self._ts_bytes]), varint(self._hi - self._lo)]
        frame = self._frame(FrameType.SYMBOLS, *header, self._pack(rows))
        if last:
            self._phase = _Phase.DONE
        return StreamPart(frame, finished=False)

    def _on_done(self, r: Reader) -> FrameOutcome:
        # Each item the initiator peeled took one of our symbols: no DONE may name more
        # items than we streamed, nor be longer than so many entries (checked before any
        # entry is read, so a long frame costs its length and no more).
        assert self._symbols is not None
        allowance = self._symbols.sent - self._named
        if len(r) > _HEADER + allowance * _DONE_ENTRY:
            raise RemoteProtocolError(
                f"a DONE of {len(r)} bytes after {self._symbols.sent} symbols: too long"
            )
        flags = r.byte()
        if flags & ~_LAST:
            raise RemoteProtocolError(f"unknown DONE flags {flags}")
        give, last_give = self._read_give(r, allowance)
        held, last_take = self._read_take(r, allowance - len(give))
        if not r.at_end:
            raise RemoteProtocolError("trailing bytes after DONE")
        tails = self._tails + [h[ID_SIZE:] for _, h in held]
        last = bool(flags & _LAST)
        parts = self._tail_parts(tails) if last else []

        def commit() -> None:
            self._last_give, self._last_take, self._tails = last_give, last_take, tails
            self._done_parts_in += 1
            self._named += len(give) + len(held)
            self._phase = _Phase.FINISHED if last else _Phase.DONE
            self._parts = parts[1:]

        return FrameOutcome(
            parts[0] if parts else None,
            have=held,
            need=give,
            finished=last and len(parts) <= 1,
            commit=commit,
            streamed=self._done_parts_in > 0,
        )

    def _read_give(self, r: Reader, limit: int) -> tuple[list[Item], Item | None]:
        items, last = self._read_list(r, self._last_give, _read_hash, 1 + HASH_SIZE, limit)
        ours = self._ours([self._key(item) for item in items])
        if any(mine == item for mine, item in zip(ours, items, strict=True)):
            raise RemoteProtocolError("DONE offers an item we hold")
        return items, last

    def _read_take(self, r: Reader, limit: int) -> tuple[list[Item], Key | None]:
        refs, last = self._read_list(r, self._last_take, _read_reference, 1, limit)
        held = [item for item in self._ours(refs, unique=True) if item is not None]
        if len(held) < len(refs):
            raise RemoteProtocolError("DONE names an item we do not hold, or several")
        return held, last

    def _read_list(
        self,
        r: Reader,
        last: Key | None,
        entry: Callable[[Reader], tuple[int, bytes]],
        min_size: int,
        limit: int,
    ) -> tuple[list[Key], Key | None]:
        """One of DONE's lists: ``entry`` reads each (timestamp delta, bytes) pair, of
        ``min_size`` bytes at least; at most ``limit`` entries, strictly increasing inside
        the window, continuing after ``last``. The list and its last item."""
        items: list[Key] = []
        for _ in range(r.varint(min(len(r) // min_size, limit) + 1)):
            delta, data = entry(r)
            item = ((self._start[0] if last is None else last[0]) + delta, data)
            if not self._inside(item[0]) or (last is not None and item <= last):
                raise RemoteProtocolError("DONE items out of order or outside the window")
            items.append(last := item)
        return items, last

    def _tail_parts(self, tails: Sequence[bytes]) -> list[bytes]:
        if not tails:
            return []
        per = (self.max_frame_size - _HEADER) // TAIL_SIZE
        chunks = [tails[i : i + per] for i in range(0, len(tails), per)]
        return [
            self._frame(
                FrameType.TAILS,
                bytes([_LAST if k == len(chunks) - 1 else 0]),
                varint(len(chunk)),
                *chunk,
            )
            for k, chunk in enumerate(chunks)
        ]

    # -- initiator

    def _on_symbols(self, r: Reader) -> FrameOutcome:
        flags = r.byte()
        first = r.varint(1 << 40)
        count = r.varint(1 << 40)
        m = self._m
        if flags & ~_LAST or first != m:
            raise RemoteProtocolError(f"symbols from {first}, expected from {m}")
        ts_bytes, cap = self._ts_bytes, self._cap
        if first == 0:
            ts_bytes = r.byte()
            peer_items = r.varint(1 << 40)
            if not self._own_ts_bytes() <= ts_bytes <= 8:
                raise RemoteProtocolError(f"timestamps of {ts_bytes} bytes do not fit the window")
            cap = self.params.cap(peer_items, self._hi - self._lo)
        if not 1 <= count <= cap - m or len(r) != count * (ID_SIZE + ts_bytes + CHECKSUM_SIZE):
            raise RemoteProtocolError(f"a batch of {count} symbols does not fit (cap {cap})")
        remote = self._unpack(r.take(len(r)), count, ts_bytes)
        peeled, found, decoded = self._decode(remote, ts_bytes, cap, last=bool(flags & _LAST))
        local = {**self._local, **{k: item for k, item in found if item is not None}}

        def commit() -> None:
            self._ts_bytes, self._cap = ts_bytes, cap
            self._m, self._peeled = m + count, peeled
            self._keys.update(k for k, _ in found)
            self._local = local

        if not decoded:
            return FrameOutcome(None, commit=commit, streamed=first > 0)
        give = sorted(local.values())
        take = sorted(k for k in self._keys | {k for k, _ in found} if k not in local)
        parts = self._done_parts(give, take)

        def finish() -> None:
            commit()
            self._take = take
            self._parts = parts[1:]
            self._phase = _Phase.TAILS

        return FrameOutcome(
            parts[0],
            have=give,
            finished=len(parts) == 1 and not take,
            commit=finish,
            streamed=first > 0,
        )

    def _decode(
        self, remote: Words, ts_bytes: int, cap: int, *, last: bool
    ) -> tuple[Encoder, list[tuple[Key, Item | None]], bool]:
        """Add a batch to the decoder and peel: the peeled items' new encoder, the items
        peeled, and whether every symbol is now empty (the difference is complete).

        The batch goes past the symbols we hold and peeling XORs in place; if the batch
        turns out bad, the peels are XORed out again (XOR is its own inverse), so the
        decoder is as before. Nothing is copied but the peeled items' states."""
        m, count = self._m, len(remote)
        mask = np.uint64((1 << (8 * ts_bytes)) - 1)
        mine = self._own_symbols(m + count)[m:].copy()
        mine[:, TS] &= mask
        rows = remote ^ mine
        peeled = self._peeled.copy()
        peeled.extend(rows, m + count, offset=m)
        if len(self._diff) < m + count:
            grown = np.zeros((max(m + count, 2 * len(self._diff)), WORDS), dtype=np.uint64)
            grown[:m] = self._diff[:m]
            self._diff = grown
        diff = self._diff[: m + count]
        diff[m:] = rows
        found: list[tuple[Key, Item | None]] = []
        done: list[tuple[Words, Words]] = []
        try:
            self._peel(diff, m, mask, cap, peeled, found, done)
            # Symbol 0 holds every item: it is empty first, and rarely alone.
            decoded = not diff[0].any() and not diff.any()
            if last and not decoded:
                raise UndecodedError(f"the difference did not decode within {len(diff)} symbols")
        except RemoteProtocolError:
            for items, payload in done:
                Encoder(items, payload).extend(diff, len(diff), offset=0)
            raise
        return peeled, found, decoded

    def _peel(
        self,
        diff: Words,
        m: int,
        mask: np.uint64,
        cap: int,
        peeled: Encoder,
        found: list[tuple[Key, Item | None]],
        done: list[tuple[Words, Words]],
    ) -> None:
        """Peel pure symbols among the new rows ``m:`` and those peeling touches, until none."""
        known = set(self._keys)
        candidates = np.arange(m, len(diff))
        while len(candidates):
            items = self._pure(diff, candidates, mask)
            if not len(items):
                break
            ids = items[:, :2].astype(">u8").tobytes()
            keys = [
                (ts, ids[k * ID_SIZE : (k + 1) * ID_SIZE])
                for k, ts in enumerate(items[:, TS].tolist())
            ]
            if len(known) + len(keys) > cap or not known.isdisjoint(keys):
                raise RemoteProtocolError("a symbol names an item already peeled")
            known.update(keys)
            found += zip(keys, self._ours(keys), strict=True)
            touched: list[npt.NDArray[np.int64]] = []
            payload = items.copy()
            payload[:, TS] &= mask  # the symbols carry the low timestamp bytes only
            fresh = Encoder(items, payload)
            fresh.extend(diff, len(diff), offset=0, touched=touched)
            done.append((items, payload))
            peeled.absorb(fresh)
            candidates = np.unique(np.concatenate(touched))

    def _pure(self, diff: Words, candidates: npt.NDArray[np.int64], mask: np.uint64) -> Words:
        """The distinct items alone in a candidate symbol (rows with full timestamps)."""
        rows = diff[candidates]
        rows = rows[rows.any(axis=1)]
        start = np.uint64(self._start[0])
        rows[:, TS] = start + ((rows[:, TS] - start) & mask)
        pure: Words = rows[checksums(rows) == rows[:, CHECKSUM]]
        if not len(pure):
            return pure
        rows = np.unique(pure, axis=0)
        assert self._end is not None
        if np.any(rows[:, TS] >= np.uint64(self._end[0])):
            raise RemoteProtocolError("a symbol names an item outside the window")
        return rows

    def _ours(self, refs: Sequence[Key], *, unique: bool = False) -> list[Item | None]:
        """Our first item with each timestamp whose id starts with the given prefix, or
        None (also when ``unique`` and a second one follows)."""
        store = self.store
        if isinstance(store, RibltItemStore):
            return [None if p is None else store.item(p) for p in store.locate(refs, unique)]
        found: list[Item | None] = []
        for ts, prefix in refs:
            p = store.lower_bound((ts, prefix))
            named = [store.item(q) for q in range(p, min(p + 2, self._hi))]
            named = [it for it in named if it[0] == ts and it[1].startswith(prefix)]
            found.append(named[0] if named and not (unique and len(named) > 1) else None)
        return found

    def _ids_at(self, stamps: Sequence[int]) -> dict[int, list[bytes]]:
        """The ids of our items of each of the (distinct, in-window) timestamps."""
        store = self.store
        if isinstance(store, RibltItemStore):
            lo, hi = store.spans(stamps)
            spans = zip(stamps, lo.tolist(), hi.tolist(), strict=True)
        else:
            ends = [store.lower_bound((ts + 1, b"")) for ts in stamps]
            starts = [store.lower_bound((ts, b"")) for ts in stamps]
            spans = zip(stamps, starts, ends, strict=True)
        return {ts: [h[:ID_SIZE] for _, h in store.items(a, b)] for ts, a, b in spans if b > a}

    def _references(self, give: list[Item], take: list[Key]) -> list[bytes]:
        """The id prefix naming each taken item among the peer's items of its timestamp,
        which are ours, less those we give, plus those we take (see the module docstring)."""
        given: dict[int, set[bytes]] = {}
        for ts, h in give:
            given.setdefault(ts, set()).add(h[:ID_SIZE])
        taken: dict[int, list[bytes]] = {}
        for ts, i in take:
            taken.setdefault(ts, []).append(i)
        ours = self._ids_at(list(taken))
        prefixes: dict[Key, bytes] = {}
        for ts, ids in taken.items():
            if len(ids) == 1 and ts not in ours:
                prefixes[ts, ids[0]] = b""  # the usual case: the peer's only item then
                continue
            peer = sorted((set(ours.get(ts, ())) - given.get(ts, set())) | set(ids))
            for i in ids:
                k = bisect.bisect_left(peer, i)
                neighbours = peer[max(0, k - 1) : k] + peer[k + 1 : k + 2]
                shared = max((_shared(i, o) for o in neighbours), default=-1)
                prefixes[ts, i] = i[: shared + 1]
        return [prefixes[key] for key in take]

    def _own_symbols(self, stop: int) -> Words:
        if len(self._mine) < stop:
            assert self._symbols is not None
            grow = max(stop - len(self._mine), len(self._mine) // 2)
            self._mine = np.concatenate((self._mine, self._symbols.take(grow)))
        return self._mine[:stop]

    def _done_parts(self, give: list[Item], take: list[Key]) -> list[bytes]:
        room = self.max_frame_size - _HEADER
        parts: list[bytes] = []
        lists: tuple[list[bytes], list[bytes]] = ([], [])
        size = 0

        def flush(final: bool) -> None:
            gives, takes = lists
            body = [varint(len(gives)), *gives, varint(len(takes)), *takes]
            parts.append(self._frame(FrameType.DONE, bytes([_LAST if final else 0]), *body))

        for out, entries in zip(lists, self._entries(give, take), strict=True):
            for entry in entries:
                if size + len(entry) > room:
                    flush(False)
                    lists[0].clear()
                    lists[1].clear()
                    size = 0
                out.append(entry)
                size += len(entry)
        flush(True)
        return parts

    def _entries(self, give: list[Item], take: list[Key]) -> tuple[list[bytes], list[bytes]]:
        """DONE's two lists, entry by entry (see the frame format)."""
        gives: list[bytes] = []
        last = self._start[0]
        for ts, h in give:
            gives.append(varint(ts - last) + h)
            last = ts
        takes: list[bytes] = []
        last = self._start[0]
        for (ts, _), prefix in zip(take, self._references(give, take), strict=True):
            named = bytes([len(prefix)]) + prefix if prefix else b""
            takes.append(varint(2 * (ts - last) + bool(prefix)) + named)
            last = ts
        return gives, takes

    def _on_tails(self, r: Reader) -> FrameOutcome:
        flags = r.byte()
        count = r.varint(1 << 40)
        done = len(self.need)
        if flags & ~_LAST or not 1 <= count <= len(self._take) - done:
            raise RemoteProtocolError("TAILS do not match what we asked for")
        if len(r) != count * TAIL_SIZE or bool(flags & _LAST) != (done + count == len(self._take)):
            raise RemoteProtocolError("TAILS do not match what we asked for")
        need = [(ts, head + r.take(TAIL_SIZE)) for ts, head in self._take[done : done + count]]
        return FrameOutcome(None, need=need, finished=bool(flags & _LAST), streamed=done > 0)

    # -- helpers

    def _locate(self) -> None:
        assert self._end is not None
        self._lo = self.store.lower_bound(self._start)
        self._hi = self.store.lower_bound(self._end)
        end = None if self._end[0] >= INFINITY_TS else self._end[0]
        self._symbols = WindowSymbols(self.store, self._lo, self._hi, (self._start[0], end))

    def _own_ts_bytes(self) -> int:
        if self._hi == self._lo:
            return 1
        return _ts_bytes(self.store.item(self._hi - 1)[0] - self._start[0])

    def _inside(self, ts: int) -> bool:
        assert self._end is not None
        return self._start[0] <= ts < self._end[0]

    @staticmethod
    def _key(item: Item) -> Key:
        return item[0], item[1][:ID_SIZE]

    def _pack(self, rows: Words) -> bytes:
        n, k = len(rows), self._ts_bytes
        out = np.empty((n, ID_SIZE + k + CHECKSUM_SIZE), dtype=np.uint8)
        out[:, :ID_SIZE] = rows[:, :2].astype(">u8").view(np.uint8).reshape(n, ID_SIZE)
        stamps = rows[:, TS].astype(">u8").view(np.uint8).reshape(n, 8)
        out[:, ID_SIZE : ID_SIZE + k] = stamps[:, 8 - k :]
        checks = rows[:, CHECKSUM].astype(">u8").view(np.uint8).reshape(n, 8)
        out[:, ID_SIZE + k :] = checks[:, 8 - CHECKSUM_SIZE :]
        return out.tobytes()

    @staticmethod
    def _unpack(data: bytes, n: int, k: int) -> Words:
        raw = np.frombuffer(data, dtype=np.uint8).reshape(n, ID_SIZE + k + CHECKSUM_SIZE)
        rows = np.zeros((n, WORDS), dtype=np.uint64)
        rows[:, :2] = raw[:, :ID_SIZE].copy().view(">u8").reshape(n, 2)
        padded = np.zeros((n, 8), dtype=np.uint8)
        padded[:, 8 - k :] = raw[:, ID_SIZE : ID_SIZE + k]
        rows[:, TS] = padded.view(">u8").ravel()
        padded[:] = 0
        padded[:, 8 - CHECKSUM_SIZE :] = raw[:, ID_SIZE + k :]
        rows[:, CHECKSUM] = padded.view(">u8").ravel()
        return rows

    @staticmethod
    def _frame(kind: FrameType, *parts: bytes) -> bytes:
        return bytes([RIBLT_VERSION, kind]) + b"".join(parts)
