"""The sans-I/O session shape both reconciliation methods share.

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

Both sides end knowing both directions: :attr:`~ReconcileSession.have` (items we hold and
the peer lacks) and :attr:`~ReconcileSession.need` (items the peer holds and we lack), so
either may push or pull the messages afterwards.

:meth:`receive` handles a frame in two phases. The subclass's ``_step`` decodes and
evaluates the whole frame against the store without touching the session and returns a
:class:`Step`; only then does the base class apply it. So a malformed, oversized or
wrong-version frame raises :class:`~sdsync.errors.RemoteProtocolError` and changes
nothing, and calls out of turn raise :class:`~sdsync.errors.LocalProtocolError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.reconcile.items import INFINITY, INFINITY_TS, MAX_TIMESTAMP, Bound, Item, ItemStore

Window = tuple[int, int | None]
"""``(start_ns, end_ns)`` timestamps, ``end`` exclusive; ``None`` for no end."""
FULL_WINDOW: Window = (0, None)

DEFAULT_MAX_FRAME_SIZE = 1 << 20
"""Largest frame a session sends or accepts, in bytes (both sides must agree)."""


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

    @property
    def round_trips(self) -> int:
        """Frames both ways, paired into round trips (an odd last frame counts as one)."""
        return (self.frames_in + self.frames_out + 1) // 2


@dataclass(slots=True)
class Step:
    """The evaluated effect of one received frame, applied only if evaluation succeeded."""

    reply: bytes | None
    have: list[Item] = field(default_factory=list)
    need: list[Item] = field(default_factory=list)
    finished: bool = False
    commit: Callable[[], None] | None = None


class _State(Enum):
    IDLE = "idle"
    RUNNING = "running"
    DONE = "done"


class ReconcileSession(ABC):
    """One side of a reconciliation over an :class:`~sdsync.reconcile.items.ItemStore`."""

    def __init__(
        self,
        store: ItemStore,
        *,
        initiator: bool,
        window: Window,
        max_frame_size: int,
        min_frame_size: int,
    ) -> None:
        if max_frame_size < min_frame_size:
            raise LocalProtocolError(
                f"max_frame_size {max_frame_size} below this method's minimum {min_frame_size}"
            )
        self.store = store
        self.initiator = initiator
        self.max_frame_size = max_frame_size
        # A responder learns the window's end from the initiator's first frame.
        self._start, end = window_bounds(window)
        self._end: Bound | None = end if initiator else None
        self.have: list[Item] = []
        self.need: list[Item] = []
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
        step = self._step(frame)
        self.stats.frames_in += 1
        self.stats.bytes_in += len(frame)
        self.have.extend(step.have)
        self.need.extend(step.need)
        if step.commit is not None:
            step.commit()
        self._state = _State.DONE if step.finished else _State.RUNNING
        if step.reply is not None:
            self._count_out(step.reply)
        return step.reply

    def _count_out(self, frame: bytes) -> None:
        self.stats.frames_out += 1
        self.stats.bytes_out += len(frame)

    @abstractmethod
    def _initiate(self) -> bytes: ...

    @abstractmethod
    def _step(self, frame: bytes) -> Step: ...
