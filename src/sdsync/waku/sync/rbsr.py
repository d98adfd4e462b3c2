"""Between two sdsync nodes: RBSR's unforgeable fingerprints in place of XOR ones.

Theory of operation
-------------------
nwaku's reconciliation compares XOR fingerprints, which a peer that knows our items can
forge to hide a difference (:mod:`~sdsync.waku.sync.reconciliation`). sdsync nodes also
speak ``/sdsync/store-sync/rbsr/1.0.0``: the same exchange with
:class:`~sdsync.reconcile.RbsrSession` (sum-then-hash fingerprints, short ids, a bitmap
answer: docs/reconcile.md) and the same transfer protocol afterwards. A node starting a
round uses it when its peer announces it; with nwaku, Waku Sync as nwaku speaks it.

:class:`RbsrReconciler` has the shape of :class:`~sdsync.waku.sync.reconciliation.Reconciler`
(``first_payload``, ``receive``, ``finished``, ``differences``), so the service drives
both alike. RBSR frames name no topics, so the two ends of the exchange carry them in an
:class:`RbsrOpening`: the initiator's first frame wraps its RBSR frame with the window and
its topics, and the responder's first reply wraps its frame with its own topics (an
empty frame: nothing differs, or no topic in common — the exchange ends). The
responder compares only the topics both sync; the initiator, whose first frame was
already computed over its own topics, leaves out of what it pushes the messages on topics
the responder does not sync (which the responder would refuse).
"""

from __future__ import annotations

from sdsync.errors import RejectReason, RemoteProtocolError
from sdsync.reconcile import MemoryItemStore, RbsrSession
from sdsync.waku.sync import waku_sync_pb2 as pb
from sdsync.waku.sync.index import ItemRows
from sdsync.waku.sync.reconciliation import Differences, Topics
from sdsync.wire.untrusted import parse_untrusted

RBSR_PROTOCOL = "/sdsync/store-sync/rbsr/1.0.0"
MAX_FRAME_BYTES = 1 << 20
"""RBSR's frame limit (both sides must agree): Store Sync's."""


def opening_window(frame: bytes) -> tuple[int, int]:
    """The window an initiator's opening names; RemoteProtocolError if malformed."""
    opening = _parse(frame)
    if not 0 < opening.start <= opening.end:
        raise RemoteProtocolError(
            f"an RBSR opening with the window {opening.start}..{opening.end}",
            reason=RejectReason.MALFORMED_RPC,
        )
    return opening.start, opening.end


class RbsrReconciler:
    """One side of one RBSR exchange over ``rows`` (see the module); ``window`` is the
    span compared, both bounds inclusive, in ns."""

    def __init__(
        self, rows: ItemRows, own: Topics, window: tuple[int, int], *, initiator: bool
    ) -> None:
        self.rows = rows
        self.own = own
        self.window = window
        self.initiator = initiator
        self.differences = Differences()
        self.rounds = 0
        self._session: RbsrSession | None = None
        self._allowed: set[bytes] | None = None  # what the initiator may push, once known
        self._ended = False  # the responder's first reply said there is nothing to do
        self._learnt = (0, 0)  # how much of the session's have and need is in differences

    @property
    def finished(self) -> bool:
        return self._ended or (self._session is not None and self._session.done)

    def first_payload(self) -> bytes:
        """The initiator's opening: the window, our topics, RBSR's first frame."""
        self._session = self._new_session(self.own, initiator=True)
        start, end = self.window
        return _opening(self.own, self._session.initiate(), start, end)

    def receive(self, frame: bytes) -> bytes | None:
        """The reply to the peer's ``frame`` (None: none); raises only
        :class:`~sdsync.errors.RemoteProtocolError`."""
        self.rounds += 1
        if self._session is None:  # a responder: the initiator's opening
            return self._opened(_parse(frame))
        if self.initiator and self._allowed is None:  # the responder's first reply
            reply = _parse(frame)
            met = self.own.meet(reply.pubsub_topics, reply.content_topics)
            if met is None or not reply.frame:
                self._ended = True
                return None
            index = self.rows.restricted(met.pubsub, met.content)
            self._allowed = set(index.hashes_of(0, len(index)))
            frame = reply.frame
        answer = self._session.receive(frame)
        self._learn()
        return answer

    def _opened(self, opening: pb.RbsrOpening) -> bytes | None:
        met = self.own.meet(opening.pubsub_topics, opening.content_topics)
        if met is None:  # nothing in common: say so (an empty frame) and end
            self._ended = True
            return _opening(self.own, b"")
        self._session = self._new_session(met, initiator=False)
        answer = self._session.receive(opening.frame)
        self._learn()
        # An empty frame tells the initiator that nothing differs: RBSR itself would
        # answer nothing, and the initiator could not tell that from a peer gone.
        return _opening(self.own, answer or b"")

    def _new_session(self, topics: Topics, *, initiator: bool) -> RbsrSession:
        index = self.rows.restricted(topics.pubsub, topics.content)
        store = MemoryItemStore.from_arrays(index.times, index.hashes)
        if not initiator:
            return RbsrSession.responder(store, max_frame_size=MAX_FRAME_BYTES)
        start, end = self.window
        return RbsrSession(
            store, initiator=True, window=(start, end + 1), max_frame_size=MAX_FRAME_BYTES
        )

    def _learn(self) -> None:
        """Add what the last frame taught the session (the tails of its lists)."""
        assert self._session is not None
        have, need = self._session.have, self._session.need
        allowed = self._allowed
        for _, message_hash in have[self._learnt[0] :]:
            if allowed is None or message_hash in allowed:
                self.differences.to_send[message_hash] = None
        for timestamp, message_hash in need[self._learnt[1] :]:
            self.differences.wanted[message_hash] = timestamp
        self._learnt = (len(have), len(need))


def _opening(topics: Topics, frame: bytes, start: int = 0, end: int = 0) -> bytes:
    return pb.RbsrOpening(
        start=start,
        end=end,
        pubsub_topics=sorted(topics.pubsub),
        content_topics=sorted(topics.content),
        frame=frame,
    ).SerializeToString()


def _parse(frame: bytes) -> pb.RbsrOpening:
    return parse_untrusted(pb.RbsrOpening, frame, "RbsrOpening", RejectReason.MALFORMED_RPC)
