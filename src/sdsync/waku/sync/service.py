"""Waku Sync on a node: periodic rounds, sessions answered for peers, transfers both ways.

Theory of operation
-------------------
:class:`WakuSync` mounts ``/vac/waku/reconciliation/1.0.0`` and
``/vac/waku/transfer/1.0.0`` on a Waku host (the
:class:`~sdsync.waku.node.WakuHost` contract) and reaches the node's archive
through :class:`SyncArchive`, a port the store node implements — so this folder knows
no database, and the store imports it, not the other way.

* **Rounds.** Every ``interval_s`` it picks one connected peer at random among those
  that announce both protocols (identify), as nwaku does, and reconciles the window
  ``[now - jitter - range, now - jitter]`` with it (:meth:`WakuSync.round`): it loads a
  snapshot of the window (:meth:`SyncArchive.rows`), opens a conversation
  (:class:`~sdsync.waku.sync.reconciliation.Reconciler`) and takes turns until one side
  finds nothing left. A peer that also announces ``/sdsync/store-sync/rbsr/1.0.0`` (an
  sdsync node) is reconciled by RBSR instead, whose fingerprints cannot be forged
  (:mod:`~sdsync.waku.sync.rbsr`); the transfer is the same.
* **Sessions for peers.** A peer's stream is admitted only within bounds (below); its
  first payload names the window, which is clamped to the span this node syncs (with a
  margin for another node's settings and clock) before the snapshot is loaded.
* **Transfers.** Whatever a session found the peer lacks is read from the archive a
  few hundred at a time and pushed on the peer's transfer lane
  (:meth:`~sdsync.waku.node.WakuHost.push`), one frame per message. Whatever
  it found we lack is *expected* from that peer (:mod:`~sdsync.waku.sync.transfer`);
  what the peer pushes is admitted by the same rules as a relayed message plus that
  expectation, and archived in batches through one queue (its bound is the
  backpressure on the peer's stream).

Bounds, per peer like every other surface: one session per peer at a time, at most
``max_sessions`` in all, ``sessions_per_minute`` per peer (a token bucket); a snapshot
of at most ``max_items``; frames of at most ``max_frame_bytes``; the whole exchange
within ``session_timeout_s`` and ``max_rounds`` payloads; ``max_expected`` hashes
expected per peer. A refused session resets its stream; every refusal is counted
(:attr:`WakuSync.refused`, by reason).

Nothing here survives a restart, and nothing needs to: a round is a pure function of
two archives, so a node killed mid-round simply has the next round find the same
differences again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError
from sdsync.waku.node import Conversation, Envelope, WakuHost
from sdsync.waku.ratelimit import PeerBuckets, RateLimit
from sdsync.waku.sync.codec import (
    RECONCILIATION_PROTOCOL,
    TRANSFER_PROTOCOL,
    RangesData,
    WakuMessageAndTopic,
    decode_ranges,
)
from sdsync.waku.sync.index import ItemRows
from sdsync.waku.sync.rbsr import RBSR_PROTOCOL, RbsrReconciler, opening_window
from sdsync.waku.sync.reconciliation import Differences, Limits, Reconciler, Topics
from sdsync.waku.sync.transfer import Expected, TransferRefused, admit
from sdsync.wire.waku import DEFAULT_TIMESTAMP_VARIANCE_S

logger = logging.getLogger("sdsync.waku.sync")
NS = 10**9
PROTOCOLS = (RECONCILIATION_PROTOCOL, TRANSFER_PROTOCOL)
"""Waku Sync's protocols: what a peer must announce to be synced with."""
WAKU = "waku"
RBSR = "rbsr"
READ_CHUNK = 256
RECENT_ROUNDS = 10


class SyncArchive(Protocol):
    """What Waku Sync needs of the node's archive."""

    async def rows(self, start: int, end: int, max_items: int) -> ItemRows:
        """The archive's items with ``start <= timestamp <= end`` (ns), in order; raises
        :class:`SnapshotTooLarge` past ``max_items``."""
        ...

    async def messages(self, hashes: Sequence[bytes]) -> list[Envelope]:
        """The messages of ``hashes`` the archive still holds."""
        ...

    async def archive(self, envelopes: Sequence[Envelope]) -> int:
        """Archive messages a sync peer pushed (already admitted); how many were new."""
        ...


class SnapshotTooLarge(Exception):  # noqa: N818 -- a refusal, not a failure
    """A window holds more items than a session may load."""


@dataclass(frozen=True)
class WakuSyncConfig:
    """Waku Sync's settings, named and defaulted as nwaku's ``--store-sync-*``."""

    pubsub_topics: tuple[str, ...]
    """The pubsub topics this node syncs: those it archives."""
    content_topics: tuple[str, ...] = ()
    """Content topics to restrict the sync to (none: all)."""
    interval_s: float = 300.0
    """Seconds between our rounds (``--store-sync-interval``); 0: answer peers only."""
    range_s: float = 3600.0
    """How far back a round reaches (``--store-sync-range``)."""
    relay_jitter_s: float = 20.0
    """The newest seconds a round leaves out (``--store-sync-relay-jitter``)."""
    window_margin_s: float = 300.0
    """How much further back than our own window a peer's session may reach."""
    clock_skew_s: float = DEFAULT_TIMESTAMP_VARIANCE_S
    """How far ahead of our clock a peer's window may end, and a pushed message's time."""
    max_sessions: int = 8
    sessions_per_minute: float = 12.0
    """Sessions one peer may open per minute, on average (nwaku's shortest usual
    interval, 5 s); more are refused."""
    session_burst: int = 8
    max_items: int = 2_000_000
    max_frame_bytes: int = 32 * 2**20
    session_timeout_s: float = 120.0
    max_rounds: int = 64
    max_expected: int = 1 << 20
    expected_ttl_s: float = 600.0
    transfer_timeout_s: float = 30.0
    archive_queue: int = 1024

    def __post_init__(self) -> None:
        if not self.pubsub_topics:
            raise LocalProtocolError("Waku Sync needs the pubsub topics the node archives")
        if self.interval_s < 0 or self.range_s <= 0 or self.relay_jitter_s < 0:
            raise LocalProtocolError(
                "the sync interval must not be negative, the range must be positive and"
                " the relay jitter not negative"
            )
        bounds = (self.max_sessions, self.session_burst, self.max_items, self.max_rounds)
        if min(bounds) < 1 or self.max_frame_bytes < 1024 or self.session_timeout_s <= 0:
            raise LocalProtocolError("Waku Sync's session bounds must be positive")

    def window(self, now_ns: int) -> tuple[int, int]:
        """A round's window: ``[now - jitter - range, now - jitter]``."""
        end = now_ns - round(self.relay_jitter_s * NS)
        return end - round(self.range_s * NS), end

    def served_window(self, now_ns: int) -> tuple[int, int]:
        """The most a peer's session may cover: our window, widened by the margin back
        and the clock skew ahead."""
        start, _ = self.window(now_ns)
        return start - round(self.window_margin_s * NS), now_ns + round(self.clock_skew_s * NS)


@dataclass
class RoundReport:
    peer: str
    role: str
    """``initiator`` (our round) or ``responder`` (a peer's)."""
    method: str = "waku"
    """``waku`` (nwaku's XOR ranges) or ``rbsr`` (between sdsync nodes)."""
    round_trips: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    items: int = 0
    differences: int = 0
    pushed: int = 0
    """Messages we pushed to the peer."""
    expected: int = 0
    """Messages the peer holds and we lacked."""
    seconds: float = 0.0
    at_ns: int = 0
    outcome: str = "ok"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Engine(Protocol):
    """One side of one exchange: XOR ranges (nwaku's) or RBSR (between sdsync nodes)."""

    differences: Differences

    @property
    def finished(self) -> bool: ...

    def first_payload(self) -> bytes: ...

    def receive(self, frame: bytes) -> bytes | None: ...


class _Session:
    """One reconciliation with one peer, as a :class:`Conversation` the host drives."""

    def __init__(self, sync: WakuSync, peer: str, role: str, method: str) -> None:
        self.sync = sync
        self.peer = peer
        self.method = method
        self.engine: _Engine | None = None
        self.report = RoundReport(peer, role, method=method, at_ns=sync.now_ns())
        self.window: tuple[int, int] | None = None
        self._started = time.perf_counter()

    def stale(self, timeout_s: float) -> bool:
        """Older than the host lets a session run: its stream is gone, however it ended."""
        return time.perf_counter() - self._started > timeout_s + 1.0

    @property
    def finished(self) -> bool:
        return self.engine is not None and self.engine.finished

    async def prepare(self, window: tuple[int, int]) -> _Engine:
        self.window = window
        sync = self.sync
        rows = await sync.archive_port.rows(*window, sync.config.max_items)
        self.report.items = len(rows)
        initiator = self.report.role == "initiator"
        self.engine = (
            RbsrReconciler(rows, sync.topics, window, initiator=initiator)
            if self.method == RBSR
            else Reconciler(rows, sync.topics, window, limits=sync.limits)
        )
        return self.engine

    async def receive(self, frame: bytes) -> bytes | None:
        self.report.bytes_received += len(frame)
        engine = self.engine
        if engine is None:  # a peer's first payload: it names the window
            engine = await self.prepare(self.sync.opening_window(self.method, frame))
        reply = engine.receive(frame)
        self.report.round_trips += 1
        if reply is not None:
            self.report.bytes_sent += len(reply)
        self.sync.expected.add(self.peer, engine.differences.wanted, self.sync.now_ns())
        return reply

    def close(self) -> RoundReport:
        report = self.report
        report.seconds = time.perf_counter() - self._started
        if self.engine is not None:
            differences = self.engine.differences
            report.expected = len(differences.wanted)
            report.differences = report.expected + len(differences.to_send)
        return report


class WakuSync:
    """Waku Sync on ``host`` over ``archive`` (see the module)."""

    def __init__(
        self,
        host: WakuHost,
        archive: SyncArchive,
        config: WakuSyncConfig,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        rng: random.Random | None = None,
        max_future_ns: int | None = None,
    ) -> None:
        self.host = host
        self.archive_port = archive
        self.config = config
        self.topics = Topics(frozenset(config.pubsub_topics), frozenset(config.content_topics))
        self.limits = Limits(max_rounds=config.max_rounds, max_wanted=config.max_expected)
        self.expected = Expected(round(config.expected_ttl_s * NS), config.max_expected)
        self.refused: Counter[str] = Counter()
        """Sessions and pushed messages refused, by reason."""
        self.rounds = 0
        self.sessions: Counter[tuple[str, str]] = Counter()
        """Exchanges completed, by (role, method)."""
        self.failures = 0
        self.archived = 0
        self.pushed = 0
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_ROUNDS)
        self._clock_ns = clock_ns
        self._rng = rng or random.Random()
        self._max_future_ns = (
            max_future_ns if max_future_ns is not None else round(config.clock_skew_s * NS)
        )
        self._sessions: dict[str, _Session] = {}
        self._rates = PeerBuckets(
            RateLimit(
                config.session_burst, 60.0 * config.session_burst / config.sessions_per_minute
            )
        )
        self._inbox: asyncio.Queue[Envelope] = asyncio.Queue(config.archive_queue)
        self._outbound: dict[str, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def now_ns(self) -> int:
        return self._clock_ns()

    # -- lifecycle

    async def start(self) -> None:
        """Mount both protocols and start archiving what peers push, and our rounds."""
        config = self.config
        # Transfer first: serving a conversation tells the peers that speak it, and by
        # then they must see both protocols (nwaku picks peers that announce them).
        await self.host.serve_pushes(
            TRANSFER_PROTOCOL, self._pushed, max_frame_bytes=config.max_frame_bytes
        )
        await self.host.serve_conversations(
            RECONCILIATION_PROTOCOL,
            self._open,
            max_frame_bytes=config.max_frame_bytes,
            timeout_s=config.session_timeout_s,
        )
        await self.host.serve_conversations(
            RBSR_PROTOCOL,
            self._open_rbsr,
            max_frame_bytes=config.max_frame_bytes,
            timeout_s=config.session_timeout_s,
        )
        self._tasks.append(asyncio.create_task(self._archive_pushed(), name="waku-sync-inbox"))
        if config.interval_s > 0:
            self._tasks.append(asyncio.create_task(self._rounds(), name="waku-sync-rounds"))

    async def close(self) -> None:
        for task in [*self._tasks, *self._outbound.values()]:
            task.cancel()
        for task in [*self._tasks, *self._outbound.values()]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._outbound.clear()

    async def _rounds(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            try:
                await self.round()
            except Exception:  # the next round may work
                logger.exception("Waku Sync round failed")

    # -- our rounds

    async def round(self, peer: str | None = None) -> RoundReport | None:
        """One round with ``peer`` (a multiaddr or a connected peer's id), else with a
        random connected peer that announces Waku Sync; None if there is none or the
        round failed (logged, and kept in :attr:`recent`)."""
        self.rounds += 1
        if peer is None:
            candidates = await self.host.peers_serving(*PROTOCOLS)
            if not candidates:
                self._failed("", "no connected peer announces Waku Sync")
                return None
            peer = self._rng.choice(candidates)
        peer_id = peer.rsplit("/p2p/", 1)[-1]
        if peer_id in self._sessions:
            self._failed(peer_id, "a session with this peer is running")
            return None
        sdsync_peers = await self.host.peers_serving(RBSR_PROTOCOL, *PROTOCOLS)
        method = RBSR if peer_id in sdsync_peers else WAKU
        session = self._sessions[peer_id] = _Session(self, peer_id, "initiator", method)
        try:
            engine = await session.prepare(self.config.window(self.now_ns()))
            first = engine.first_payload()
            session.report.bytes_sent += len(first)
            await self.host.converse(
                peer,
                RBSR_PROTOCOL if method == RBSR else RECONCILIATION_PROTOCOL,
                first,
                session,
                max_frame_bytes=self.config.max_frame_bytes,
                timeout_s=self.config.session_timeout_s,
            )
        except (OSError, TimeoutError, RemoteProtocolError, SnapshotTooLarge) as exc:
            self._sessions.pop(peer_id, None)
            self._failed(peer_id, f"{type(exc).__name__}: {exc}")
            return None
        return self._ended(session)

    def _ended(self, session: _Session) -> RoundReport:
        self._sessions.pop(session.peer, None)
        report = session.close()
        self.sessions[report.role, report.method] += 1
        assert session.engine is not None
        to_send = list(session.engine.differences.to_send)
        report.pushed = len(to_send)
        if to_send:
            self._send(session.peer, to_send)
        self.recent.append(report.as_dict())
        logger.info(
            "Waku Sync %s (%s) with %s: %d items, %d differences (%d to push, %d expected),"
            " %d round trips, %d B out, %d B in, %.2f s",
            report.role,
            report.method,
            report.peer,
            report.items,
            report.differences,
            report.pushed,
            report.expected,
            report.round_trips,
            report.bytes_sent,
            report.bytes_received,
            report.seconds,
        )
        return report

    def _failed(self, peer: str, error: str) -> None:
        self.failures += 1
        self.recent.append(
            {
                "peer": peer,
                "role": "initiator",
                "at_ns": self.now_ns(),
                "outcome": f"failed: {error}",
            }
        )
        logger.warning("Waku Sync round with %s failed: %s", peer or "no peer", error)

    # -- sessions for peers

    def clamp(self, opening: RangesData) -> tuple[int, int]:
        """The window of a peer's first payload, within what we serve."""
        low, high = self.config.served_window(self.now_ns())
        if not opening.ranges:
            return low, high
        start, end = opening.ranges[0].lower.time, opening.ranges[-1].upper.time
        start = min(max(start, low), high)  # a window past ours: its last instant
        return start, max(min(end, high), start)

    def opening_window(self, method: str, frame: bytes) -> tuple[int, int]:
        """The window a peer's first frame asks for, within what we serve: clamped for
        nwaku's (its settings may differ from ours), refused beyond it for RBSR's (only
        sdsync nodes speak it)."""
        if method == WAKU:
            return self.clamp(decode_ranges(frame))
        start, end = opening_window(frame)
        low, high = self.config.served_window(self.now_ns())
        if start < low or end > high:
            raise RemoteProtocolError(
                f"an RBSR window {start}..{end} outside the served {low}..{high}",
                reason=RejectReason.MALFORMED_RPC,
            )
        return start, end

    async def _open(self, peer: str) -> Conversation:
        return self._admit(peer, WAKU)

    async def _open_rbsr(self, peer: str) -> Conversation:
        return self._admit(peer, RBSR)

    def _admit(self, peer: str, method: str) -> Conversation:
        reason = self._refusal(peer)
        if reason is not None:
            self.refused[reason] += 1
            raise ConnectionRefusedError(f"Waku Sync session refused: {reason}")
        session = self._sessions[peer] = _Session(self, peer, "responder", method)
        return _Responding(self, session)

    def _refusal(self, peer: str) -> str | None:
        for other, session in list(self._sessions.items()):
            if session.stale(self.config.session_timeout_s):
                del self._sessions[other]
        if peer in self._sessions:
            return "session_running"
        if len(self._sessions) >= self.config.max_sessions:
            return "too_many_sessions"
        if not self._rates.take(peer, time.monotonic()):
            return "session_rate"
        return None

    # -- transfers

    def _send(self, peer: str, hashes: list[bytes]) -> None:
        running = self._outbound.get(peer)
        previous = running if running is not None and not running.done() else None
        task = asyncio.create_task(
            self._push_all(peer, hashes, previous), name=f"waku-sync-push {peer}"
        )
        self._outbound[peer] = task

    async def _push_all(
        self, peer: str, hashes: list[bytes], after: asyncio.Task[None] | None
    ) -> None:
        if after is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await after
        try:
            for start in range(0, len(hashes), READ_CHUNK):
                for envelope in await self.archive_port.messages(
                    hashes[start : start + READ_CHUNK]
                ):
                    frame = WakuMessageAndTopic(envelope.pubsub_topic, envelope.message).to_bytes()
                    await self.host.push(
                        peer, TRANSFER_PROTOCOL, frame, timeout_s=self.config.transfer_timeout_s
                    )
                    self.pushed += 1
        except (OSError, TimeoutError, RemoteProtocolError) as exc:
            logger.warning("Waku Sync: pushing to %s failed: %s", peer, exc)
        finally:
            if self._outbound.get(peer) is asyncio.current_task():
                del self._outbound[peer]

    async def _pushed(self, peer: str, frame: bytes) -> None:
        session = self._sessions.get(peer)
        try:
            envelope = admit(
                frame,
                peer,
                topics=self.topics.pubsub,
                expected=self.expected,
                running_window=session.window if session is not None else None,
                now_ns=self.now_ns(),
                max_future_ns=self._max_future_ns,
            )
        except TransferRefused as exc:
            self.refused[exc.reason] += 1
            logger.debug("Waku Sync: a message from %s refused: %s", peer, exc)
            return
        except RemoteProtocolError as exc:
            self.refused[str(exc.reason)] += 1
            if exc.reason in ("malformed Waku RPC", "oversized", "not a WakuMessage"):
                raise  # a broken frame: the stream is reset
            logger.debug("Waku Sync: a message from %s refused: %s", peer, exc)
            return
        await self._inbox.put(envelope)

    async def _archive_pushed(self) -> None:
        while True:
            batch = [await self._inbox.get()]
            while not self._inbox.empty() and len(batch) < READ_CHUNK:
                batch.append(self._inbox.get_nowait())
            try:
                self.archived += await self.archive_port.archive(batch)
            except Exception:  # the archive failed; the next round finds them again
                logger.exception("Waku Sync: archiving %d pushed messages failed", len(batch))
            self.expected.prune(self.now_ns())

    def info(self) -> dict[str, Any]:
        return {
            "protocols": [*PROTOCOLS, RBSR_PROTOCOL],
            "interval_s": self.config.interval_s,
            "range_s": self.config.range_s,
            "relay_jitter_s": self.config.relay_jitter_s,
            "pubsub_topics": list(self.config.pubsub_topics),
            "rounds": self.rounds,
            "failures": self.failures,
            "archived": self.archived,
            "pushed": self.pushed,
            "expected": len(self.expected),
            "sessions": len(self._sessions),
            "refused": dict(self.refused),
            "recent": list(reversed(self.recent)),
        }


@dataclass
class _Responding:
    """A peer's session as the host holds it: ends the session when it finishes."""

    sync: WakuSync
    session: _Session
    _done: bool = field(default=False)

    @property
    def finished(self) -> bool:
        return self.session.finished

    async def receive(self, frame: bytes) -> bytes | None:
        try:
            reply = await self.session.receive(frame)
        except SnapshotTooLarge as exc:
            self.sync.refused["snapshot_too_large"] += 1
            self._end()
            raise RemoteProtocolError(f"Waku Sync session refused: {exc}") from None
        except BaseException:
            self._end()
            raise
        if self.session.finished:
            self._end(ok=True)
        return reply

    def _end(self, ok: bool = False) -> None:
        if self._done:
            return
        self._done = True
        if ok:
            self.sync._ended(self.session)
        else:
            self.sync._sessions.pop(self.session.peer, None)
