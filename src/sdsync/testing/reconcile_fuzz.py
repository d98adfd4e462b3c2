"""Hostile-input harness for the reconciliation sessions (tests and ``bench/fuzz_decoders.py``).

Theory of operation
-------------------
A *conversation* is a real reconciliation between two :class:`ReconcileSession` objects,
recorded frame by frame: before each frame is received, both sessions are checkpointed
(deep copies sharing the stores). A fuzz case picks a step of a conversation, restores the
receiver as it was, and feeds it a hostile frame: one generated from scratch or the
step's real frame mutated. :func:`check_frame` then checks the properties every session
must keep:

* nothing but :class:`~sdsync.errors.RemoteProtocolError` escapes ``receive``;
* a rejected frame leaves the session's observable state (everything but the store) as
  it was, and the real frame of that step, fed afterwards, still leads to the exact
  difference;
* an accepted frame keeps the session sane: it learns only items in its window, ``have``
  only items it holds, ``need`` only items it lacks, and its reply fits the frame limit;
* the work of one ``receive`` is bounded: counted by a :class:`CountingStore` (store calls
  plus items and cut positions materialized, never wall-clock time), it stays within
  :func:`work_bound` of the bytes in and out and the items learned, and the positions a
  Prolly scan passes over stay within :data:`SCAN_PER_ITEM` times the window.

Mutations are lists of operations (:data:`Mutation`) applied by :func:`mutate`, so that a
hypothesis strategy and a seeded :class:`random.Random` can both produce them:
byte-level (bit flips, bytes set, truncation, insertion, deletion, duplication, splices of
other real frames, swapped spans, varints replaced by huge values or made overlong) and
structural (RBSR ranges or Prolly nodes repeated, dropped, swapped or reversed, fields
set to extreme values). :func:`random_mutations`, :func:`random_rbsr_frame` and
:func:`random_prolly_frame` are the seeded generators the bench uses.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message

from sdsync.errors import RemoteProtocolError
from sdsync.reconcile import prolly_pb2 as pb
from sdsync.reconcile.codec import Reader
from sdsync.reconcile.fingerprint import FINGERPRINT_SIZE, varint
from sdsync.reconcile.items import Bound, Item, ItemStore, MemoryItemStore
from sdsync.reconcile.memory import sessions
from sdsync.reconcile.methods import Method
from sdsync.reconcile.prolly import MESSAGE_TYPES, MessageType, ProllyParams
from sdsync.reconcile.rbsr import ITEM_ID_SIZE, Mode, RbsrParams
from sdsync.reconcile.session import FULL_WINDOW, ReconcileSession, SessionStats, Window
from sdsync.wire.waku import HASH_SIZE

T = TypeVar("T")

FUZZED_METHODS: tuple[Method, ...] = ("rbsr", "prolly")
"""The methods of :data:`~sdsync.reconcile.METHODS` this harness records and generates
frames for. Not RIBLT: recording does not follow a streamed turn, and its hostile frames
are tested apart (``tests/reconcile/test_riblt_hostile.py``)."""

WORK_PER_BYTE = 4
"""Store calls and materialized items one ``receive`` may spend per byte in or out."""
WORK_PER_ITEM = 2
"""... and per item it learns (adds to ``have`` or ``need``)."""
WORK_CONSTANT = 128
"""... plus this much (a window's bounds, a root, the range that did not fit)."""
SCAN_PER_ITEM = 4
"""Cut positions a Prolly ``receive`` may scan (numpy), per item of the window, plus
:data:`WORK_CONSTANT` chunks of 256."""


def work_bound(bytes_in: int, bytes_out: int, learned: int) -> int:
    """The most store work one ``receive`` may do (see :class:`CountingStore`)."""
    return WORK_PER_BYTE * (bytes_in + bytes_out) + WORK_PER_ITEM * learned + WORK_CONSTANT


# -- counting -------------------------------------------------------------------------


class CountingStore:
    """An :class:`ItemStore` that counts what a session asks of the store it wraps.

    ``calls`` counts every method call, ``items`` the items and cut positions handed out
    (``item``, ``items``, ``cut_points``), ``scanned`` the positions ``next_cut`` and
    ``cut_points`` pass over. ``work`` is ``calls + items``.
    """

    def __init__(self, inner: ItemStore) -> None:
        self.inner = inner
        self.calls = 0
        self.items_out = 0
        self.scanned = 0
        self._all: frozenset[Item] | None = None

    def holds(self, item: Item) -> bool:
        """Whether the store holds ``item`` (uncounted: for the harness's checks)."""
        if self._all is None:
            self._all = frozenset(self.inner.items(0, len(self.inner)))
        return item in self._all

    def reset(self) -> None:
        self.calls = self.items_out = self.scanned = 0

    @property
    def work(self) -> int:
        return self.calls + self.items_out

    def __len__(self) -> int:
        self.calls += 1
        return len(self.inner)

    def __deepcopy__(self, memo: dict[int, Any]) -> CountingStore:
        return self  # checkpoints share the store (it never changes during a session)

    def lower_bound(self, bound: Bound) -> int:
        self.calls += 1
        return self.inner.lower_bound(bound)

    def item(self, position: int) -> Item:
        self.calls += 1
        self.items_out += 1
        return self.inner.item(position)

    def items(self, start: int, stop: int) -> list[Item]:
        self.calls += 1
        out = self.inner.items(start, stop)
        self.items_out += len(out)
        return out

    def summary(self, start: int, stop: int) -> tuple[int, int]:
        self.calls += 1
        return self.inner.summary(start, stop)

    def next_cut(self, start: int, stop: int, threshold: int) -> int:
        self.calls += 1
        found = self.inner.next_cut(start, stop, threshold)
        self.scanned += max(0, min(found + 1, stop) - start)
        return found

    def cut_points(self, start: int, stop: int, threshold: int) -> Sequence[int]:
        self.calls += 1
        out = self.inner.cut_points(start, stop, threshold)
        self.items_out += len(out)
        self.scanned += max(0, stop - start)
        return out


# -- conversations --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scene:
    """Two item sets and how to reconcile them."""

    name: str
    method: Method
    a: frozenset[Item]
    b: frozenset[Item]
    window: Window = FULL_WINDOW
    max_frame_size: int = 1 << 20
    fanout: int = 0
    """RBSR or Prolly fanout (0: the default)."""


@dataclass
class Turn:
    """One frame of a real conversation and both sessions just before it was received."""

    receiver: int
    """0: the initiator receives it, 1: the responder."""
    frame: bytes
    checkpoint: tuple[ReconcileSession, ReconcileSession]


@dataclass
class Conversation:
    scene: Scene
    stores: tuple[CountingStore, CountingStore]
    turns: list[Turn]
    expected: tuple[frozenset[Item], frozenset[Item]]
    """The exact difference: what the initiator holds and the responder lacks, and back."""
    max_rounds: int

    def restore(self, index: int) -> tuple[ReconcileSession, ReconcileSession]:
        """Fresh copies of both sessions as they were before turn ``index``."""
        init, resp = self.turns[index].checkpoint
        return _clone(init), _clone(resp)

    @property
    def frames(self) -> list[bytes]:
        return [t.frame for t in self.turns]


def _clone(session: ReconcileSession) -> ReconcileSession:
    return copy.deepcopy(session)


def _open(
    scene: Scene, stores: tuple[CountingStore, CountingStore], max_rounds: int | None
) -> tuple[ReconcileSession, ReconcileSession]:
    rbsr = RbsrParams(fanout=scene.fanout) if scene.method == "rbsr" and scene.fanout else None
    prolly = ProllyParams(scene.fanout) if scene.method == "prolly" and scene.fanout else None
    init, resp = sessions(
        stores[0],
        stores[1],
        scene.method,
        window=scene.window,
        max_frame_size=scene.max_frame_size,
        rbsr=rbsr,
        prolly=prolly,
    )
    if max_rounds is not None:
        init.max_rounds = resp.max_rounds = max_rounds
    return init, resp


def record(scene: Scene, *, slack_rounds: int = 16) -> Conversation:
    """Run ``scene`` to the end, checkpointing before every frame.

    The sessions' round limit is set to the rounds the conversation needed plus
    ``slack_rounds``, so that a diverted conversation is cut off soon.
    """
    stores = (CountingStore(MemoryItemStore(scene.a)), CountingStore(MemoryItemStore(scene.b)))
    init, resp = _open(scene, stores, None)
    turns: list[Turn] = []
    frame: bytes | None = init.initiate()
    receiver = 1
    honest = Outcome()  # honest frames keep the work bounds too
    while frame is not None:
        turns.append(Turn(receiver, frame, (_clone(init), _clone(resp))))
        accepted, frame = _receive((init, resp)[receiver], stores[receiver], frame, honest)
        if not accepted or honest.failures:
            raise AssertionError(f"scene {scene.name}: {honest.failures or 'a real frame failed'}")
        receiver = 1 - receiver
    start, end = scene.window
    inside = {it for it in scene.a | scene.b if it[0] >= start and (end is None or it[0] < end)}
    expected = (frozenset((scene.a - scene.b) & inside), frozenset((scene.b - scene.a) & inside))
    if (frozenset(init.have), frozenset(init.need)) != expected:
        raise AssertionError(f"scene {scene.name}: the real conversation is wrong")
    rounds = max(init.stats.frames_in, resp.stats.frames_in) + slack_rounds
    for turn in turns:
        for s in turn.checkpoint:
            s.max_rounds = rounds
    return Conversation(scene, stores, turns, expected, rounds)


def _items(n: int, rng: random.Random, *, spread: int, base: int = 10**18) -> set[Item]:
    out: set[Item] = set()
    while len(out) < n:
        h = rng.randbytes(32)
        if rng.random() < 0.2:  # hashes sharing long prefixes: long bounds (but distinct
            h = bytes(14) + h[14:]  # 16-byte RBSR ids, which only a sha256 break could clash)
        out.add((base + rng.randrange(spread), h))
    return out


def _split(
    n: int, only_a: int, only_b: int, seed: int, *, spread: int = 10**6
) -> tuple[frozenset[Item], frozenset[Item]]:
    rng = random.Random(seed)
    pool = sorted(_items(n + only_a + only_b, rng, spread=spread))
    rng.shuffle(pool)
    common = set(pool[:n])
    return (
        frozenset(common | set(pool[n : n + only_a])),
        frozenset(common | set(pool[n + only_a :])),
    )


def default_scenes() -> list[Scene]:
    """Small scenes that reach every kind of frame: splits, item lists, diffs, full
    lists, spilled frames, cut nodes, multi-part ``SyncDone``, windows, equal timestamps."""
    scenes: list[Scene] = []
    min_rbsr = RbsrParams(fanout=4).min_frame_size
    for method in FUZZED_METHODS:
        a, b = _split(1500, 10, 12, seed=1)
        scenes.append(Scene(f"{method}/few-diffs", method, a, b))
        a, b = _split(0, 9, 14, seed=2, spread=50)
        scenes.append(Scene(f"{method}/tiny", method, a, b))
        a, b = _split(1500, 40, 30, seed=3, spread=5000)
        small = min_rbsr if method == "rbsr" else 600
        scenes.append(Scene(f"{method}/small-frames", method, a, b, max_frame_size=small, fanout=4))
        a, b = _split(800, 40, 40, seed=4, spread=3000)
        window = (10**18 + 500, 10**18 + 2500)
        scenes.append(Scene(f"{method}/window", method, a, b, window=window))
        a, b = _split(300, 0, 0, seed=5)
        scenes.append(Scene(f"{method}/equal", method, a, b))
        # A window many times the frame limit: a frame that made a session read a wide
        # range item by item would exceed the work bound even when it is rejected.
        a, b = _split(24_000, 6, 5, seed=6)
        large = RbsrParams().min_frame_size if method == "rbsr" else 1024
        scenes.append(Scene(f"{method}/large", method, a, b, max_frame_size=large))
        a, b = _split(0, 1200, 0, seed=7)
        scenes.append(Scene(f"{method}/a-only", method, a, b))
        scenes.append(Scene(f"{method}/b-only", method, b, a))
    return scenes


def conversations(scenes: Sequence[Scene] | None = None) -> list[Conversation]:
    return [record(s) for s in (default_scenes() if scenes is None else scenes)]


# -- checking -------------------------------------------------------------------------


def snapshot(session: ReconcileSession) -> dict[str, Any]:
    """Everything a session holds but its store, frozen for comparison."""
    return {k: _freeze(v) for k, v in vars(session).items() if k != "store"}


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        if value and not isinstance(value[0], list | tuple | set | SessionStats):
            return (type(value).__name__, *value)  # items, frozen dataclasses: immutable
        return (type(value).__name__, *(_freeze(v) for v in value))
    if isinstance(value, set):
        return frozenset(value)
    if isinstance(value, SessionStats):
        return (value.frames_in, value.frames_out, value.bytes_in, value.bytes_out)
    return value  # ints, bytes, enums, frozen dataclasses: immutable


@dataclass
class Outcome:
    accepted: bool = False
    failures: list[str] = field(default_factory=list)
    work: int = 0
    steps: int = 0
    """Frames ``receive`` handled in this case, continuations included."""


def _receive(
    session: ReconcileSession, store: CountingStore, frame: bytes, out: Outcome
) -> tuple[bool, bytes | None]:
    """Feed one frame and check the properties; (accepted, reply)."""
    before = snapshot(session)
    have, need = len(session.have), len(session.need)
    store.reset()
    out.steps += 1
    try:
        reply = session.receive(frame)
    except RemoteProtocolError:
        work = store.work
        out.work += work
        limit = work_bound(len(frame), session.max_frame_size, 0)
        if work > limit:
            out.failures.append(f"rejecting a {len(frame)}-byte frame cost {work} > {limit}")
        if snapshot(session) != before:
            out.failures.append("a rejected frame changed the session")
        _check_scan(store, out)
        return False, None
    except Exception as exc:  # the property: nothing else may escape
        out.failures.append(f"receive raised {type(exc).__name__}: {exc}")
        return False, None
    work = store.work
    out.work += work
    learned = len(session.have) - have + len(session.need) - need
    limit = work_bound(len(frame), len(reply or b""), learned)
    if work > limit:
        out.failures.append(
            f"a {len(frame)}-byte frame with a {len(reply or b'')}-byte reply, {learned} items "
            f"learned, cost {work} > {limit}"
        )
    _check_scan(store, out)
    if reply is not None and len(reply) > session.max_frame_size:
        out.failures.append(f"reply of {len(reply)} bytes over the limit")
    window = session.bounds
    for item in session.have[have:]:
        if not store.holds(item) or (window and not window[0] <= item < window[1]):
            out.failures.append(f"have holds {item!r}, not ours or outside the window")
            break
    for item in session.need[need:]:
        if store.holds(item) or (window and not window[0] <= item < window[1]):
            out.failures.append(f"need holds {item!r}, ours or outside the window")
            break
    return True, reply


def _check_scan(store: CountingStore, out: Outcome) -> None:
    limit = SCAN_PER_ITEM * len(store.inner) + WORK_CONSTANT * 256
    if store.scanned > limit:
        out.failures.append(f"one frame scanned {store.scanned} positions > {limit}")


def _run_on(
    sessions_: list[ReconcileSession],
    stores: tuple[CountingStore, CountingStore],
    receiver: int,
    frame: bytes | None,
    out: Outcome,
    *,
    honest: bool,
) -> bool:
    """Continue a conversation until a side has nothing to say; False if one rejected.

    ``honest``: both sides have seen only real frames, so none may be done early."""
    while frame is not None:
        if sessions_[receiver].done:
            # After a forged frame an honest side may well have finished already.
            if honest:
                out.failures.append("a frame arrived for a finished session")
            return False
        ok, frame = _receive(sessions_[receiver], stores[receiver], frame, out)
        if not ok:
            return False
        receiver = 1 - receiver
    return True


class Harness:
    """Feeds hostile frames to sessions restored from conversations' checkpoints.

    A receiver that rejected a frame is unchanged (that is checked), so it is kept for the
    next case at the same turn; only acceptance costs a fresh copy.
    """

    def __init__(self, convs: Sequence[Conversation]) -> None:
        self.convs = list(convs)
        self._ready: dict[tuple[int, int], ReconcileSession] = {}

    def check(self, conv: int, index: int, frame: bytes, *, follow: bool = False) -> Outcome:
        """:func:`check_frame` on conversation ``conv``, turn ``index``."""
        if follow:
            return check_frame(self.convs[conv], index, frame, follow=True)
        c = self.convs[conv]
        turn = c.turns[index]
        session = self._ready.pop((conv, index), None)
        if session is None:
            session = _clone(turn.checkpoint[turn.receiver])
        out = Outcome()
        out.accepted, _ = _receive(session, c.stores[turn.receiver], frame, out)
        if not out.accepted and not out.failures:
            self._ready[(conv, index)] = session
        return out


def check_frame(conv: Conversation, index: int, frame: bytes, *, follow: bool = True) -> Outcome:
    """Feed ``frame`` instead of the real frame of turn ``index``; check the properties.

    ``follow``: after a rejection, go on with the real frame to the end and check the
    difference found; after an acceptance of a different frame, go on talking with the
    honest peer until one side is done or rejects something (the round limit ends it).
    """
    turn = conv.turns[index]
    out = Outcome()
    if not follow:
        session = _clone(turn.checkpoint[turn.receiver])
        out.accepted, _ = _receive(session, conv.stores[turn.receiver], frame, out)
        return out
    pair = list(conv.restore(index))
    accepted, reply = _receive(pair[turn.receiver], conv.stores[turn.receiver], frame, out)
    out.accepted = accepted
    if out.failures:
        return out
    if not accepted:
        if _run_on(pair, conv.stores, turn.receiver, turn.frame, out, honest=True):
            found = (frozenset(pair[0].have), frozenset(pair[0].need))
            peer = (frozenset(pair[1].need), frozenset(pair[1].have))
            if found != conv.expected or peer != conv.expected:
                out.failures.append("after a rejected frame the real conversation went wrong")
        else:
            out.failures.append("after a rejected frame the real frames were refused")
    elif frame != turn.frame:
        _run_on(pair, conv.stores, 1 - turn.receiver, reply, out, honest=False)
    return out


# -- mutations ------------------------------------------------------------------------

Mutation = tuple[str, int, int, bytes]
"""``(operation, position, value, data)``; positions wrap around the frame's length."""

BYTE_OPS = (
    "flip",
    "set",
    "truncate",
    "insert",
    "delete",
    "dup",
    "splice",
    "swap",
    "varint",
    "overlong",
)
STRUCT_OPS = ("repeat", "drop", "swap-parts", "reverse", "field")
HUGE = (
    0,
    1,
    127,
    128,
    255,
    1 << 14,
    1 << 31,
    (1 << 32) + 1,
    (1 << 63) - 1,
    1 << 63,
    (1 << 64) - 1,
    1 << 70,
)
"""Values a varint or field is set to: edges, counts and lengths inflated, huge values."""


def _varint_at(data: bytes | bytearray, at: int) -> int:
    """Length of the varint starting at ``at`` (at most 10 bytes, or to the end)."""
    n = 0
    while at + n < len(data) and n < 10:
        n += 1
        if not data[at + n - 1] & 0x80:
            break
    return n


def _byte_op(data: bytearray, op: str, at: int, value: int, blob: bytes) -> None:
    if not data:
        data += blob or b"\x01"
        return
    at %= len(data)
    if op == "flip":
        data[at] ^= 1 << (value % 8)
    elif op == "set":
        data[at] = value % 256
    elif op == "truncate":
        del data[at:]
    elif op == "insert":
        data[at:at] = blob
    elif op == "delete":
        del data[at : at + 1 + value % 16]
    elif op == "dup":
        data[at:at] = data[at : at + 1 + value % 64]
    elif op == "splice":  # a piece of another real frame
        if blob:
            start = value % len(blob)
            data[at:at] = blob[start : start + 1 + value % 97]
    elif op == "swap":
        n = 1 + value % 24
        other = (at + n + value % 200) % len(data)
        a, b = sorted((at, other))
        if a + n <= b:
            data[a : b + n] = data[b : b + n] + data[a + n : b] + data[a : a + n]
    elif op == "varint":  # replace a varint: counts, lengths and bounds inflated
        n = _varint_at(data, at)
        data[at : at + n] = encode_varint(HUGE[value % len(HUGE)] if value >= 0 else -value)
    elif op == "overlong":
        n = _varint_at(data, at)
        if n:
            last = at + n - 1
            data[last] |= 0x80
            data[last + 1 : last + 1] = b"\x80" * (value % 10) + b"\x00"


def encode_varint(value: int) -> bytes:
    """A varint of any size (values of 64 bits and more make 10 bytes or longer)."""
    if value < 1 << 64:
        return varint(value)
    groups = []
    while value:
        groups.append(value & 0x7F)
        value >>= 7
    groups.reverse()
    return bytes([g | 0x80 for g in groups[:-1]] + [groups[-1]])


def mutate(method: str, frame: bytes, ops: Sequence[Mutation], *, first: bool = False) -> bytes:
    """``frame`` with ``ops`` applied in order (``method``: "rbsr", "prolly" or "batch";
    ``first``: an RBSR first frame, which carries the window start)."""
    data = frame
    for op, at, value, blob in ops:
        if op in STRUCT_OPS:
            data = _struct_op(method, data, op, at, value, blob, first)
        else:
            buf = bytearray(data)
            _byte_op(buf, op, at, value, blob)
            data = bytes(buf)
    return data


def _struct_op(
    method: str, data: bytes, op: str, at: int, value: int, blob: bytes, first: bool
) -> bytes:
    if method == "prolly":
        return _prolly_op(data, op, at, value, blob)
    head, parts = rbsr_ranges(data, first) if method == "rbsr" else batch_entries(data)
    if not parts:
        return data
    if op == "field":  # the part's leading varint (a bound's ts code, a length) set huge
        i = at % len(parts)
        n = _varint_at(parts[i], 0)
        parts[i] = encode_varint(HUGE[value % len(HUGE)]) + parts[i][n:]
    else:
        _rearrange(parts, op, at, value)
    return head + b"".join(parts)


def _rearrange(parts: list[T], op: str, at: int, value: int) -> None:
    """Apply a structural ``op`` other than "field" to a non-empty list of parts."""
    i, j = at % len(parts), value % len(parts)
    if op == "repeat":
        parts[i:i] = [parts[i]] * _repeats(value)
    elif op == "drop":
        del parts[i]
    elif op == "swap-parts":
        parts[i], parts[j] = parts[j], parts[i]
    else:
        parts.reverse()


def _repeats(value: int) -> int:
    """A part repeated once to thrice, or a flood of copies one time in five."""
    return 1 + value % 3 if value % 5 else 16 + value % 400


def rbsr_ranges(frame: bytes, first: bool) -> tuple[bytes, list[bytes]]:
    """A well-formed RBSR frame cut into its header and its ranges' bytes (what cannot be
    parsed stays in the last part)."""
    r = Reader(frame)
    cuts: list[int] = []
    try:
        r.byte()
        if first:
            r.varint()
        cuts.append(len(frame) - len(r))
        while not r.at_end:
            r.varint()
            size, mode = divmod(r.varint(), 8)
            r.take(size)
            if mode == Mode.FINGERPRINT:
                r.take(FINGERPRINT_SIZE)
            elif mode == Mode.ITEMS:
                for _ in range(r.varint(1 << 20)):
                    r.varint()
                    r.take(ITEM_ID_SIZE)
            elif mode in (Mode.DIFF, Mode.FULL):
                if mode == Mode.DIFF:
                    r.take((r.varint(1 << 20) + 7) // 8)
                for _ in range(r.varint(1 << 20)):
                    r.varint()
                    r.take(HASH_SIZE)
            cuts.append(len(frame) - len(r))
    except RemoteProtocolError:
        pass
    if not cuts:
        return b"", [frame]
    bounds = [*cuts, len(frame)] if cuts[-1] < len(frame) else cuts
    return frame[: cuts[0]], [frame[a:b] for a, b in pairwise(bounds)]


def batch_entries(body: bytes) -> tuple[bytes, list[bytes]]:
    """A message batch cut into its entries' bytes (what cannot be parsed stays last)."""
    r = Reader(body)
    cuts = [0]
    try:
        while not r.at_end:
            r.take(r.varint(1 << 24))
            r.take(r.varint(1 << 24))
            cuts.append(len(body) - len(r))
    except RemoteProtocolError:
        cuts.append(len(body))
    return b"", [body[a:b] for a, b in pairwise(cuts) if b > a]


def _node_lists(message: Message) -> list[Any]:
    if isinstance(message, pb.GetNonBoundaryNodesRequest):
        return [message.start_nodes]
    if isinstance(message, pb.GetNonBoundaryNodesResponse):
        return [message.non_boundary_nodes]
    if isinstance(message, pb.SyncDone):
        return [message.client_has, message.client_needs]
    return []


def _nodes(message: Message) -> list[pb.Node]:
    if isinstance(message, pb.ExchangeRootRequest | pb.ExchangeRootResponse):
        return [message.root]
    if isinstance(message, pb.GetIntermediateNodeResponse):
        return [message.node]
    return [n for nodes in _node_lists(message) for n in nodes]


_NODE_FIELDS = ("timestamp", "level", "right", "node_hash", "merkle_hash", "data", "is_tail")


def _set_field(node: pb.Node, name: str, value: int, blob: bytes) -> None:
    if name in ("timestamp", "right"):
        old = getattr(node, name)
        choices = (-1, 0, 1, (1 << 63) - 1, -(1 << 63), min(old + 1, (1 << 63) - 1), old - 1)
        setattr(node, name, max(-(1 << 63), choices[value % len(choices)]))
    elif name == "level":
        up = min(node.level + 1, (1 << 31) - 1)
        node.level = (-1, 0, 1, 2, 63, 64, 65, (1 << 31) - 1, up)[value % 9]
    elif name == "is_tail":
        node.is_tail = not node.is_tail
    else:
        size = (0, 1, 15, 16, 17, 31, 32, 33, 64)[value % 9]
        setattr(node, name, (blob * (size // max(1, len(blob)) + 1))[:size])


def _prolly_op(data: bytes, op: str, at: int, value: int, blob: bytes) -> bytes:
    if len(data) < 2 or data[1] not in MessageType._value2member_map_:
        return data
    kind = MessageType(data[1])
    message = MESSAGE_TYPES[kind]()
    try:
        message.ParseFromString(data[2:])
    except DecodeError:
        return data
    lists = [nodes for nodes in _node_lists(message) if len(nodes)]
    if op == "field" or not lists:
        nodes = _nodes(message)
        if isinstance(message, pb.GetIntermediateNodeRequest):
            message.node_id = (-1, 0, (1 << 63) - 1, min(message.node_id + 1, (1 << 63) - 1))[
                value % 4
            ]
            message.level = (-1, 0, 1, 64, 65)[at % 5]
        elif isinstance(message, pb.SyncDone) and not nodes:
            message.more = not message.more
        elif nodes:
            node = nodes[at % len(nodes)]
            _set_field(node, _NODE_FIELDS[value % len(_NODE_FIELDS)], value // 7, blob)
    else:
        nodes = lists[at % len(lists)]
        copies = [pb.Node.FromString(n.SerializeToString()) for n in nodes]
        _rearrange(copies, op, at, value)
        del nodes[:]
        nodes.extend(copies)
    encoded: bytes = message.SerializeToString()
    return data[:2] + encoded


def random_mutations(rng: random.Random, donors: Sequence[bytes]) -> list[Mutation]:
    """One to four operations: mostly byte-level, a third structural."""
    ops: list[Mutation] = []
    for _ in range(rng.randint(1, 4)):
        structural = rng.random() < 0.35
        op = rng.choice(STRUCT_OPS if structural else BYTE_OPS)
        value = rng.choice([rng.randrange(256), rng.randrange(1 << 16), -rng.randrange(1 << 40)])
        if op == "splice":
            blob = rng.choice(donors) if donors else b""
        elif op == "insert":
            blob = rng.randbytes(rng.randint(1, 12))
        else:
            blob = rng.randbytes(rng.randint(1, 4))
        ops.append((op, rng.randrange(1 << 20), abs(value) if op != "varint" else value, blob))
    return ops


# -- frames from scratch (seeded) -----------------------------------------------------


def _pick_ts(rng: random.Random, near: int) -> int:
    return rng.choice(
        [0, 1, near, near + rng.randrange(1 << 20), rng.randrange(1 << 63), (1 << 63) - 1]
    )


def random_rbsr_frame(rng: random.Random, near: int = 10**18, *, first: bool = False) -> bytes:
    """An RBSR frame built range by range with plausible and extreme fields."""
    out = bytearray([1 if rng.random() < 0.95 else rng.randrange(256)])
    if first or rng.random() < 0.2:
        out += encode_varint(rng.choice([0, near, _pick_ts(rng, near), 1 << 63]))
    for _ in range(rng.choice([0, 1, 1, 2, 3, 5, 8, rng.randrange(40)])):
        code = rng.choice([0, 1, 2, rng.randrange(1 << 10), rng.randrange(1 << 40), 1 << 63])
        prefix = rng.randbytes(rng.choice([0, 0, 0, 1, 2, 16, 32, 33]))
        mode = rng.choice([0, 1, 1, 2, 2, 3, 3, 4, 4, rng.randrange(8)])
        out += encode_varint(code) + encode_varint(len(prefix) * 8 + mode) + prefix
        if mode == Mode.FINGERPRINT:
            out += rng.randbytes(rng.choice([16, 16, 16, 15]))
        elif mode in (Mode.ITEMS, Mode.DIFF, Mode.FULL):
            if mode == Mode.DIFF:
                answered = rng.choice([0, 1, 7, 8, 24, 25, rng.randrange(1 << 16)])
                out += encode_varint(answered)
                out += rng.randbytes(min((answered + 7) // 8, rng.randrange(64)))
            count = rng.choice([0, 1, 2, 5, 24, rng.randrange(1 << 12), (1 << 64) - 1])
            out += encode_varint(count)
            size = ITEM_ID_SIZE if mode == Mode.ITEMS else HASH_SIZE
            for _ in range(min(count, rng.randrange(30))):
                out += encode_varint(rng.choice([0, 1, rng.randrange(1 << 30), 1 << 62]))
                out += rng.randbytes(size)
    if out and rng.random() < 0.1:
        del out[rng.randrange(len(out)) :]
    return bytes(out)


def _random_node(rng: random.Random, near: int) -> pb.Node:
    node = pb.Node()
    if rng.random() < 0.8:
        node.timestamp = rng.choice([-1, _pick_ts(rng, near), _pick_ts(rng, near)])
    if rng.random() < 0.5:
        node.node_hash = rng.randbytes(rng.choice([0, 1, 2, 16, 32, 33]))
    if rng.random() < 0.7:
        node.level = rng.choice([-1, 0, 1, 1, 2, 3, 7, 64, 65, (1 << 31) - 1])
    if rng.random() < 0.6:
        node.merkle_hash = rng.randbytes(rng.choice([16, 16, 0, 15, 17]))
    if rng.random() < 0.4:
        node.data = rng.randbytes(rng.choice([32, 32, 0, 31, 33]))
    if rng.random() < 0.25:
        node.is_tail = True
    if rng.random() < 0.2:
        node.right = rng.choice([-1, 0, _pick_ts(rng, near)])
    return node


def random_prolly_frame(rng: random.Random, near: int = 10**18) -> bytes:
    """A Prolly frame: a random message type with random nodes (or garbage)."""
    kind = rng.choice([*MessageType, *MessageType, 0, 8, rng.randrange(256)])
    header = bytes([1 if rng.random() < 0.95 else rng.randrange(256), int(kind)])
    if rng.random() < 0.1:
        return header + rng.randbytes(rng.randrange(64))
    nodes = [_random_node(rng, near) for _ in range(rng.choice([0, 1, 2, 3, 5, rng.randrange(40)]))]
    message: Message
    if kind in (MessageType.EXCHANGE_ROOT_REQUEST, MessageType.EXCHANGE_ROOT_RESPONSE):
        root = nodes[0] if nodes else pb.Node()
        message = (
            pb.ExchangeRootRequest(root=root)
            if kind == MessageType.EXCHANGE_ROOT_REQUEST
            else pb.ExchangeRootResponse(root=root)
        )
    elif kind == MessageType.GET_INTERMEDIATE_NODE_REQUEST:
        message = pb.GetIntermediateNodeRequest(
            node_id=_pick_ts(rng, near) * rng.choice([1, -1]),
            level=rng.choice([-1, 0, 1, 2, 64, 65]),
        )
    elif kind == MessageType.GET_INTERMEDIATE_NODE_RESPONSE:
        message = pb.GetIntermediateNodeResponse(node=nodes[0] if nodes else None)
    elif kind == MessageType.GET_NON_BOUNDARY_NODES_REQUEST:
        message = pb.GetNonBoundaryNodesRequest(start_nodes=nodes)
    elif kind == MessageType.GET_NON_BOUNDARY_NODES_RESPONSE:
        message = pb.GetNonBoundaryNodesResponse(non_boundary_nodes=nodes)
    else:
        half = rng.randrange(len(nodes) + 1)
        message = pb.SyncDone(
            client_has=nodes[:half], client_needs=nodes[half:], more=rng.random() < 0.3
        )
    return header + message.SerializeToString()
