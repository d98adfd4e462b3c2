"""Run two reconciliation sessions against each other in memory (tests, benchmarks).

Theory of operation
-------------------
The initiator's first frame goes to the responder; every reply goes back the other way
until a ``receive`` returns ``None`` (or, when the side that returned it is still running,
the sender's :meth:`~sdsync.reconcile.session.ReconcileSession.stream` has nothing more).
Bytes and frames are counted per direction; the result carries what each side learned, so
a caller can check the two views agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sdsync.errors import LocalProtocolError
from sdsync.reconcile.items import Item, ItemStore
from sdsync.reconcile.methods import METHODS, Method, session_class
from sdsync.reconcile.session import (
    DEFAULT_MAX_FRAME_SIZE,
    FULL_WINDOW,
    MethodParams,
    MethodSession,
    ReconcileSession,
    Window,
)


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """What ``a`` (the initiator) and ``b`` learned, and what it cost."""

    have: list[Item]
    """Items ``a`` holds and ``b`` lacks, as ``a`` learned them."""
    need: list[Item]
    """Items ``b`` holds and ``a`` lacks, as ``a`` learned them."""
    peer_have: list[Item]
    """``b``'s view: items ``b`` holds and ``a`` lacks."""
    peer_need: list[Item]
    """``b``'s view: items ``a`` holds and ``b`` lacks."""
    frames: int
    """Turns: a streamed run of frames counts once."""
    bytes_a_to_b: int
    bytes_b_to_a: int
    streamed: int = 0
    """Frames that continued a turn (a stream), not counted in ``frames``."""

    @property
    def round_trips(self) -> int:
        return (self.frames + 1) // 2


def sessions(
    a: ItemStore,
    b: ItemStore,
    method: Method,
    *,
    window: Window = FULL_WINDOW,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_rounds: int | None = None,
    **params: MethodParams | None,
) -> tuple[ReconcileSession, ReconcileSession]:
    """An initiator over ``a`` and a responder over ``b`` (``max_rounds``: both sessions'
    round limit, None for the method's default). ``params`` are methods' parameters by
    method name (``rbsr=RbsrParams(…)``, None for the defaults); ``method``'s serve both
    sessions and the others are ignored, so one set of tuning serves every method."""
    session = session_class(method)
    unknown = params.keys() - METHODS.keys()
    if unknown:
        raise LocalProtocolError(f"no reconciliation method is named {sorted(unknown)}")
    chosen = params.get(method)
    if chosen is not None and not isinstance(chosen, session.Params):
        raise LocalProtocolError(f"{method}= takes {session.Params.__name__}, not {chosen!r}")
    return _pair(session, chosen, a, b, window, max_frame_size, max_rounds)


def _pair(
    session: type[MethodSession[Any]],
    params: MethodParams | None,
    a: ItemStore,
    b: ItemStore,
    window: Window,
    max_frame_size: int,
    max_rounds: int | None,
) -> tuple[ReconcileSession, ReconcileSession]:
    size, rounds = max_frame_size, max_rounds
    initiator = session(
        a, initiator=True, window=window, params=params, max_frame_size=size, max_rounds=rounds
    )
    return initiator, session.responder(b, params=params, max_frame_size=size, max_rounds=rounds)


def reconcile_in_memory(
    a: ItemStore,
    b: ItemStore,
    method: Method = "rbsr",
    *,
    window: Window = FULL_WINDOW,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_frames: int = 100_000,
    max_rounds: int | None = None,
    **params: MethodParams | None,
) -> ReconcileResult:
    """Reconcile ``a`` with ``b`` over ``window``; ``a`` initiates (``params``: as
    :func:`sessions` takes them)."""
    init, resp = sessions(
        a,
        b,
        method,
        window=window,
        max_frame_size=max_frame_size,
        max_rounds=max_rounds,
        **params,
    )
    frame: bytes | None = init.initiate()
    receiver, sender = resp, init
    frames = streamed = 0
    while frame is not None:
        frames += 1
        if frames + streamed > max_frames:
            raise LocalProtocolError(f"no agreement after {max_frames} frames")
        reply = receiver.receive(frame)
        # A None from a side still running: the sender's turn goes on (a stream).
        while reply is None and not receiver.done and (more := sender.stream()) is not None:
            streamed += 1
            if frames + streamed > max_frames:
                raise LocalProtocolError(f"no agreement after {max_frames} frames")
            reply = receiver.receive(more)
        frame = reply
        receiver, sender = sender, receiver
    return ReconcileResult(
        have=init.have,
        need=init.need,
        peer_have=resp.have,
        peer_need=resp.need,
        frames=frames,
        bytes_a_to_b=init.stats.bytes_out,
        bytes_b_to_a=resp.stats.bytes_out,
        streamed=streamed,
    )
