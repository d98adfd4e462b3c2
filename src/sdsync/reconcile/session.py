"""The sans-I/O session shape every reconciliation method shares.

Theory of operation
-------------------
A session is one side of one reconciliation. It owns no socket and no clock: the caller
moves frames. The *initiator* calls :meth:`ReconcileSession.initiate` once and sends the
frame; from then on each side feeds every frame it gets to
:meth:`ReconcileSession.receive`, which returns the reply to send, or ``None`` when
nothing is left to say. A side that sends its last frame is :attr:`~ReconcileSession.done`
already; the peer's ``receive`` of that frame returns ``None``. Over a request/response
transport (the store's HTTP server) the initiator is the client and an empty response
stands for ``None``.

A method may *stream* a turn: after a frame, the same side sends further frames without
waiting for an answer (RIBLT's responder sends coded symbols until the initiator has
enough; long lists go out in parts). :meth:`ReconcileSession.stream` returns the next such
frame; a ``receive`` that returns ``None`` while the session is not done means "the peer's
stream goes on". Streamed frames are counted apart (``frames_*`` count turns).

Both sides end knowing both directions: :attr:`~ReconcileSession.have` (items we hold and
the peer lacks) and :attr:`~ReconcileSession.need` (items the peer holds and we lack), so
either may push or pull the messages afterwards.

:meth:`receive` handles a frame in two phases. The subclass's ``_evaluate`` decodes and
evaluates the whole frame against the store without touching the session and returns a
:class:`FrameOutcome`; only then does the base class apply it. So a malformed, oversized or
wrong-version frame raises :class:`~sdsync.errors.RemoteProtocolError` and changes
nothing, and calls out of turn raise :class:`~sdsync.errors.LocalProtocolError`.

Hostile peers
-------------
Every frame is untrusted. Besides the checks above, two limits bound what a peer can make
a session do:

* *Work per frame.* Each method evaluates a frame with a number of store calls and
  materialized items proportional to the bytes of the frame and of its reply, plus the
  items the frame teaches us (what lands in ``have`` / ``need``); no small frame makes a
  session walk a large part of its window item by item (``docs/reconcile.md``, "Hostile
  input", gives the constants the tests check). ``have`` and ``need`` never hold an item
  twice, however often a peer names it.
* *Rounds per session.* A session accepts at most ``max_rounds`` frames; the next one
  raises :class:`~sdsync.errors.RemoteProtocolError` ("round limit"), so a peer that never
  converges (ping-pongs the same ranges, re-asks the same nodes) is cut off.
  :func:`default_max_rounds` derives the default from the method's fanout and the frame
  limit (see there); pass ``max_rounds`` to a session to choose another.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar, Generic, Protocol, Self, TypeVar

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.reconcile.items import INFINITY, INFINITY_TS, MAX_TIMESTAMP, Bound, Item, ItemStore

Window = tuple[int, int | None]
"""``(start_ns, end_ns)`` timestamps, ``end`` exclusive; ``None`` for no end."""
FULL_WINDOW: Window = (0, None)

DEFAULT_MAX_FRAME_SIZE = 1 << 20
"""Largest frame a session sends or accepts, in bytes (both sides must agree)."""

ROUND_LIMIT_ITEMS = 1 << 21
"""Items (both windows together) the default round limit leaves room for: Store Sync's
responder holds at most ``SyncConfig.max_items`` (2M) items in its snapshots."""
ROUND_LIMIT_BYTES_PER_LEVEL = 64
"""Frame bytes per item and per tree level the default round limit provides for when
frames fill up (measured at most 40: ``docs/reconcile.md``, "Hostile input")."""


def default_max_rounds(fanout: int, max_frame_size: int, items: int = ROUND_LIMIT_ITEMS) -> int:
    """Frames a session accepts before it cuts a peer off, for windows of ``items`` items.

    A correct reconciliation descends a tree of branching ``fanout`` (RBSR splits, Prolly
    levels) of ``depth = ceil(log_fanout(items))`` levels: about one round per level, plus
    a few to exchange the leaves (RBSR's ``ITEMS``/``DIFF``/``FULL``, Prolly's root
    exchange and ``SyncDone``). We allow ``2 * depth + 8``.

    When frames fill up, what did not fit waits for later rounds (an RBSR frame sends the
    rest of the window as one fingerprint, which the peer splits again): with frames of
    ``F`` bytes a sync of ``n`` differing items took up to ``40 * depth * n / F`` rounds
    per side in our measurements (a difference as large as the windows, the worst case).
    We allow ``ROUND_LIMIT_BYTES_PER_LEVEL * depth * items / max_frame_size`` more, 1.6
    times that. With the defaults (1 MiB frames, 2M items) the limit is 788 rounds for RBSR
    (fanout 16) and 918 for Prolly (fanout 8). Nearly all of it is the allowance for full
    frames; a peer that ping-pongs small frames may use it too, but each of its rounds
    costs little (the work per frame is bounded by the frame's bytes).
    """
    if fanout < 2 or max_frame_size < 1 or items < 0:
        raise LocalProtocolError("default_max_rounds needs fanout >= 2 and a positive frame size")
    depth = 0
    while fanout**depth < items:
        depth += 1
    spill = math.ceil(items * ROUND_LIMIT_BYTES_PER_LEVEL * depth / max_frame_size)
    return 2 * depth + 8 + spill


def window_bounds(window: Window) -> tuple[Bound, Bound]:
    """The window as bounds; :class:`LocalProtocolError` if it is not a window."""
    start, end = window
    if not 0 <= start <= MAX_TIMESTAMP:
        raise LocalProtocolError(f"window start {start} outside [0, 2**63)")
    if end is None:
        return (start, b""), INFINITY
    if not start < end <= INFINITY_TS:
        raise LocalProtocolError(f"window end {end} must lie in ({start}, 2**63]")
    return (start, b""), (end, b"")


@dataclass(slots=True)
class SessionStats:
    """What one side sent and received."""

    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    streamed_in: int = 0
    """Frames received that continued the peer's turn (not counted in ``frames_in``)."""
    streamed_out: int = 0
    """Frames sent that continued our turn (not counted in ``frames_out``)."""

    @property
    def round_trips(self) -> int:
        """Frames both ways, paired into round trips (an odd last frame counts as one)."""
        return (self.frames_in + self.frames_out + 1) // 2


@dataclass(slots=True)
class FrameOutcome:
    """What one received frame does to the session: the reply, the items it teaches us,
    whether it ends the session and the state change to ``commit``. The session applies it
    only once the whole frame has been evaluated without error."""

    reply: bytes | None
    have: list[Item] = field(default_factory=list)
    need: list[Item] = field(default_factory=list)
    finished: bool = False
    commit: Callable[[], None] | None = None
    streamed: bool = False
    """The frame continued the peer's turn (a stream), it did not start one."""


@dataclass(frozen=True, slots=True)
class StreamPart:
    """A frame a side sends on in its own turn, and whether it is the session's last."""

    frame: bytes
    finished: bool


class _State(Enum):
    IDLE = "idle"
    RUNNING = "running"
    DONE = "done"


class ReconcileSession(ABC):
    """One side of a reconciliation over an :class:`~sdsync.reconcile.items.ItemStore`."""

    streaming: ClassVar[bool] = False
    """Turns may go on in :meth:`stream` frames; a request/response transport then sends
    and answers each turn whole (Store Sync's frame streams)."""

    def __init__(
        self,
        store: ItemStore,
        *,
        initiator: bool,
        window: Window,
        max_frame_size: int,
        min_frame_size: int,
        max_rounds: int,
    ) -> None:
        if max_frame_size < min_frame_size:
            raise LocalProtocolError(
                f"max_frame_size {max_frame_size} below this method's minimum {min_frame_size}"
            )
        if max_rounds < 1:
            raise LocalProtocolError(f"max_rounds {max_rounds} must be at least 1")
        self.store = store
        self.initiator = initiator
        self.max_frame_size = max_frame_size
        self.max_rounds = max_rounds
        """Frames this session accepts; a further one is refused (a peer that never converges)."""
        # A responder learns the window's end from the initiator's first frame.
        self._start, end = window_bounds(window)
        self._end: Bound | None = end if initiator else None
        self.have: list[Item] = []
        self.need: list[Item] = []
        self._known: set[Item] = set()  # have + need, so that a peer cannot repeat one
        self.stats = SessionStats()
        self._state = _State.IDLE

    @property
    def window(self) -> Window | None:
        """The window being synced (a responder knows it after the first frame)."""
        if self._end is None:
            return None
        end = None if self._end[0] >= INFINITY_TS else self._end[0]
        return self._start[0], end

    @property
    def bounds(self) -> tuple[Bound, Bound] | None:
        """The window as the item bounds the session compares (None until known)."""
        return None if self._end is None else (self._start, self._end)

    @property
    def done(self) -> bool:
        """True once neither side has anything left to send."""
        return self._state is _State.DONE

    def initiate(self) -> bytes:
        """The first frame (initiator only, once)."""
        if not self.initiator:
            raise LocalProtocolError("a responder does not initiate; feed it frames")
        if self._state is not _State.IDLE:
            raise LocalProtocolError("initiate() was already called")
        frame = self._initiate()
        self._state = _State.RUNNING
        self._count_out(frame)
        return frame

    def receive(self, frame: bytes) -> bytes | None:
        """Handle a peer frame; the reply to send, or ``None`` when there is nothing to send."""
        if not isinstance(frame, bytes | bytearray | memoryview):
            raise LocalProtocolError(f"a frame is bytes, not {type(frame).__name__}")
        if self._state is _State.DONE:
            raise LocalProtocolError("the session is done; start a new one")
        if self.initiator and self._state is _State.IDLE:
            raise LocalProtocolError("call initiate() before receive()")
        frame = bytes(frame)
        if len(frame) > self.max_frame_size:
            raise RemoteProtocolError(
                f"frame of {len(frame)} bytes exceeds the limit of {self.max_frame_size}"
            )
        if self.stats.frames_in >= self.max_rounds:
            raise RemoteProtocolError(
                f"no agreement after {self.stats.frames_in} rounds: the peer does not converge "
                f"(round limit {self.max_rounds})"
            )
        outcome = self._evaluate(frame)
        if outcome.streamed:
            self.stats.streamed_in += 1
        else:
            self.stats.frames_in += 1
        self.stats.bytes_in += len(frame)
        self._learn(self.have, outcome.have)
        self._learn(self.need, outcome.need)
        if outcome.commit is not None:
            outcome.commit()
        self._state = _State.DONE if outcome.finished else _State.RUNNING
        if outcome.reply is not None:
            self._count_out(outcome.reply)
        return outcome.reply

    def stream(self) -> bytes | None:
        """The next frame of our turn, sent without waiting for an answer; ``None`` when
        the turn is over (or the method does not stream)."""
        if self._state is not _State.RUNNING:
            return None
        part = self._stream()
        if part is None:
            return None
        self.stats.streamed_out += 1
        self.stats.bytes_out += len(part.frame)
        if part.finished:
            self._state = _State.DONE
        return part.frame

    def _stream(self) -> StreamPart | None:
        return None

    def _learn(self, into: list[Item], items: list[Item]) -> None:
        known = self._known
        for item in items:
            if item not in known:
                known.add(item)
                into.append(item)

    def _count_out(self, frame: bytes) -> None:
        self.stats.frames_out += 1
        self.stats.bytes_out += len(frame)

    @abstractmethod
    def _initiate(self) -> bytes: ...

    @abstractmethod
    def _evaluate(self, frame: bytes) -> FrameOutcome: ...


class MethodParams(Protocol):
    """What a method's parameters tell its sessions: the frame size they need at least and
    the round limit they allow by default."""

    @property
    def min_frame_size(self) -> int: ...

    def default_max_rounds(self, max_frame_size: int) -> int: ...


P = TypeVar("P", bound=MethodParams)


class MethodSession(ReconcileSession, Generic[P]):
    """A session of one method (a row of :data:`~sdsync.reconcile.methods.METHODS`), set up
    by the method's parameters ``P``."""

    name: ClassVar[str]
    """The method's name: its key in the table, its Store Sync route, its CLI choice."""
    Params: type[P]
    """The method's parameter class, with its limits (the smallest frame it works with, its
    default round limit); its defaults serve a session given no ``params``."""
    cached_symbols: ClassVar[bool] = False
    """The session reads coded symbols that a host caches across sessions: give it a
    :class:`~sdsync.reconcile.riblt.RibltItemStore` with the host's
    :class:`~sdsync.reconcile.riblt.SymbolCache` attached."""

    def __init__(
        self,
        store: ItemStore,
        *,
        initiator: bool,
        window: Window = FULL_WINDOW,
        params: P | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_rounds: int | None = None,
    ) -> None:
        """``max_rounds``: frames accepted before a peer is cut off (None: the default of
        ``params.default_max_rounds`` for ``max_frame_size``)."""
        self.params: P = self.Params() if params is None else params
        super().__init__(
            store,
            initiator=initiator,
            window=window,
            max_frame_size=max_frame_size,
            min_frame_size=self.params.min_frame_size,
            max_rounds=(
                self.params.default_max_rounds(max_frame_size) if max_rounds is None else max_rounds
            ),
        )

    @classmethod
    def responder(
        cls,
        store: ItemStore,
        *,
        params: P | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_rounds: int | None = None,
    ) -> Self:
        """The answering side; it takes the window from the initiator's first frame."""
        return cls(
            store,
            initiator=False,
            params=params,
            max_frame_size=max_frame_size,
            max_rounds=max_rounds,
        )
