"""ReliabilityManager: the end-to-end reliability API (seed 004) over many channels.

Theory of operation
-------------------
The proposal wants a library the application calls around its own encryption and
transport: :meth:`~ReliabilityManager.wrap_outgoing_message` before encrypting and
sending, :meth:`~ReliabilityManager.unwrap_received_message` after decrypting,
:meth:`~ReliabilityManager.mark_dependencies_met` when the application found missing
messages itself, and callbacks for what happens meanwhile. Transport stays the
application's: everything the protocol must (re)transmit reaches it through
``on_transmit``.

Each open channel is a :class:`~sdsync.core.MessageChannel` under a
:class:`~sdsync.runtime.ChannelDriver`, which makes every timing decision — resends with
backoff, jitter, a longer period once possibly acknowledged and a maximum number of
attempts, SDS-R request and response times, syncs at the sync interval, incoming sweeps —
exactly as for a :class:`~sdsync.runtime.ReliableChannel`. The driver never queries a
store: retrieval is the application's, and ``on_missing_dependencies`` is how it learns
what to look for. The one periodic call is :meth:`~ReliabilityManager.tick`; ``next_due``
says when it next has work. Our own messages enter the log once acknowledged
(``own_log_policy="on_ack"``, as the proposal resolves) unless a config says otherwise.

Channels exist only when the application opens them (:meth:`open_channel`, or by wrapping
on one): bytes naming any other channel change nothing and say so (``channel_open``), so a
remote peer cannot make us hold state for channels of its choosing.

Every event the application must hear of — a message ready (with its payload, sender and
Lamport timestamp), one of ours acknowledged, possibly acknowledged or given up on,
missing dependencies, a waiting message evicted (``on_event`` hears of it), bytes to
transmit, a periodic sync — is numbered per channel and kept until the application has
it (:mod:`sdsync.runtime.event_log`). With a
``state_dir`` every channel keeps its state in ``<state_dir>/<channel id>.sqlite``
(:mod:`sdsync.runtime.state`), and each driver step is committed, with the events it
caused, in one transaction *before* any callback hears of it or any byte is returned, so
whatever the application was told survives a crash and reopening the channel restores the
log, the outgoing buffer, the planned resends and the events not yet acknowledged.

How events are acknowledged is the ``acknowledge`` mode:

* ``"on_return"`` (the default, for an application in this process): the callbacks are
  called for each event in order, and an event counts as processed once every callback
  returned for it. A callback that raises is logged and counted (``callback_errors``);
  its event and every later one on that channel wait and are reported again, under the
  same numbers, at the first tick :data:`REDELIVER_MS` later. After a crash the events
  not acknowledged are reported again when their channel is opened: set the callbacks
  before opening channels. ``on_event`` receives each event as a
  :class:`~sdsync.runtime.Delivery` with its number; the others are seed 004's.
* ``"explicit"`` (the gRPC service): the callbacks hear of each event once, as it
  happens, and it stays until :meth:`ack_events`; :meth:`read_events` reads it back.

Either way delivery is at least once with a stable (channel, number) key, so an
application that remembers its last processed number per channel processes each event
exactly once. What is kept per channel is bounded (:class:`EventLimits`); beyond it the
oldest events give way to an :class:`EventsDiscarded` that says which.

A wrap under an explicit message id (or any wrap with the ``payload`` id scheme) keeps
its bytes: repeating it with the same payload — after its answer was lost, say — returns
them again and changes nothing; another payload under that id is refused. A payload whose
message would exceed the wire limit peers accept is refused at wrap
(:class:`~sdsync.errors.MessageTooLargeError`), never sent.

:meth:`close_channel` records that the application closed the channel;
:meth:`reopen_channels` opens every channel of the state directory it did not close.
Inside :meth:`batch`, calls share one commit per channel, made (and only then heard of)
when the batch ends: many wraps or unwraps for the price of one transaction.

Threads: every public method takes one re-entrant lock, so any number of threads (and a
tick thread) may call in. Callbacks run on the thread whose call caused them, *while the
lock is held*, after the step is committed: they see the manager's state in order and
may call back into the manager from the same thread (events such a call causes are
reported after the current one), but must not wait for another thread that uses the
manager. An exception raised by a callback never reaches the caller and never undoes
state, which is committed already. A step that cannot be committed (disk full, I/O
error) raises and forgets its channel: memory would be ahead of the stored state, and
reopening the channel restores what was stored.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import unquote

from sdsync.core import (
    ChannelConfig,
    DropReason,
    EphemeralReceived,
    HistoryStore,
    MessageAcknowledged,
    MessageChannel,
    MessageDelivered,
    MessageDropped,
    MessageEvicted,
    MessageMissing,
    MessagePossiblyAcknowledged,
    MessageReceived,
    SendFailed,
)
from sdsync.errors import LocalProtocolError
from sdsync.runtime.clock import system_clock_ms
from sdsync.runtime.crash import crash_point
from sdsync.runtime.driver import ChannelDriver, Step, Transmit, TransmitKind
from sdsync.runtime.event_log import (
    Delivery,
    EventLimits,
    EventLog,
    PeriodicSync,
    Reported,
)
from sdsync.runtime.policy import RuntimeConfig
from sdsync.runtime.state import WRAPS_KEPT, ChannelState, LogRecord, Synchronous, state_path
from sdsync.wire import decode, message_id_for

logger = logging.getLogger("sdsync.runtime")

__all__ = [
    "Acknowledge",
    "OwnMessage",
    "ReliabilityManager",
    "TransmitKind",
    "UnwrapResult",
    "WaitingMessage",
    "Wrapped",
]

Acknowledge = Literal["on_return", "explicit"]
#: After a callback raised, its channel's events are reported again this much later.
REDELIVER_MS = 1_000
#: The core events reported (the manager never delivers early, and a lost dependency
#: shows as the messages that waited for it becoming ready).
_REPORTED = (
    MessageDelivered,
    MessageAcknowledged,
    MessagePossiblyAcknowledged,
    MessageMissing,
    MessageEvicted,
    SendFailed,
)
# Events read per batch while reporting them.
_BATCH = 256


@dataclass(frozen=True, slots=True)
class UnwrapResult:
    """What ``unwrap_received_message`` found.

    ``payload`` is None when there is nothing new for the application: a duplicate, a
    sync message, our own message echoed back, or bytes for a channel that is not open
    (``channel_open`` False: nothing was changed). Otherwise it is returned even while
    ``missing_dependencies`` is non-empty, so the application can show it with a
    "messages missing before this" marker; ``on_message_ready`` fires once they are met.
    ``duplicate``: the message was processed before; its content, if it was ever new,
    came or comes with its ready event, never only with this answer.
    """

    payload: bytes | None
    missing_dependencies: list[str]
    channel_id: str
    message_id: str
    channel_open: bool = True
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Wrapped:
    """What a wrap returned: the bytes to send, their id, and whether an earlier wrap
    with the same id and payload made them (``repeated``: nothing changed now)."""

    data: bytes
    message_id: str
    repeated: bool = False


@dataclass(frozen=True, slots=True)
class OwnMessage:
    """One of our messages awaiting acknowledgement (it is still resent)."""

    message_id: str
    lamport_timestamp: int
    payload: bytes
    attempts: int
    possibly_acknowledged: int
    first_sent_ms: int


@dataclass(frozen=True, slots=True)
class WaitingMessage:
    """A received message waiting for dependencies before it is ready."""

    message_id: str
    sender_id: str
    lamport_timestamp: int
    payload: bytes
    missing_dependencies: list[str]
    received_ms: int


@dataclass(frozen=True, slots=True)
class _Undo:
    """How a channel was found when opened: enough to undo the opening."""

    created: bool  # its state file did not exist
    was_closed: bool  # the application had closed it


@dataclass(slots=True)
class _Open:
    driver: ChannelDriver
    state: ChannelState | None
    events: EventLog
    # Without a state_dir: recent wraps under explicit ids, oldest first.
    wraps: dict[str, bytes] = field(default_factory=dict)
    reporting: bool = False  # on_return: events are being reported (re-entrancy guard)
    retry_at: int | None = None  # on_return: a callback raised; report again then
    participants: int | None = None
    undo: _Undo | None = None


class ReliabilityManager:
    def __init__(
        self,
        participant_id: str,
        *,
        config: ChannelConfig | None = None,
        runtime: RuntimeConfig | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], int] = system_clock_ms,
        state_dir: Path | None = None,
        synchronous: Synchronous = "NORMAL",
        history_store_factory: Callable[[str], HistoryStore] | None = None,
        max_channels: int = 1_000,
        acknowledge: Acknowledge = "on_return",
        event_limits: EventLimits | None = None,
    ) -> None:
        if not participant_id:
            raise LocalProtocolError("participant_id must be non-empty")
        if max_channels < 1:
            raise LocalProtocolError("max_channels must be >= 1")
        if state_dir is not None and history_store_factory is not None:
            # The stored log answers for evicted entries: a second store would disagree.
            raise LocalProtocolError("history_store_factory and state_dir are exclusive")
        if acknowledge not in ("on_return", "explicit"):
            raise LocalProtocolError(f"acknowledge must be on_return or explicit: {acknowledge!r}")
        self.participant_id = participant_id
        self.config = config if config is not None else ChannelConfig(own_log_policy="on_ack")
        self.runtime = runtime if runtime is not None else RuntimeConfig()
        self.state_dir = state_dir
        self.max_channels = max_channels
        self.acknowledge = acknowledge
        self.event_limits = event_limits if event_limits is not None else EventLimits()
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._synchronous = synchronous
        self._history_store_factory = history_store_factory
        self._channels: dict[str, _Open] = {}
        self._lock = threading.RLock()
        # Inside batch(): the channels whose steps wait for the batch's commit.
        self._batch: dict[str, tuple[_Open, list[Delivery]]] | None = None
        self.on_event: Callable[[str, Delivery], None] | None = None
        self.on_message_ready: Callable[[str, str], None] | None = None
        self.on_message_sent: Callable[[str, str], None] | None = None
        self.on_possibly_acknowledged: Callable[[str, str, int], None] | None = None
        self.on_missing_dependencies: Callable[[str, list[str]], None] | None = None
        self.on_send_failed: Callable[[str, str], None] | None = None
        self.on_transmit: Callable[[str, TransmitKind, str, bytes], None] | None = None
        self.on_periodic_sync: Callable[[str], None] | None = None
        self.callback_errors = 0

    # --------------------------------------------------------------- channels

    def open_channel(self, channel_id: str) -> None:
        """Open ``channel_id`` (restored from ``state_dir`` when stored there); idempotent."""
        with self._lock:
            self._open(channel_id)

    def close_channel(self, channel_id: str) -> None:
        """Close ``channel_id``: its stored state stays for a later ``open_channel``, but
        :meth:`reopen_channels` no longer opens it. Idempotent."""
        with self._lock:
            opened = self._channels.pop(channel_id, None)
            if opened is not None and opened.state is not None:
                opened.state.set_closed(True)
                opened.state.close()

    def reopen_channels(self) -> list[str]:
        """Open every channel stored in ``state_dir`` that was not closed (after a
        restart); the ids, in name order. Set the callbacks first: events not yet
        acknowledged are reported as each channel opens."""
        if self.state_dir is None:
            return []
        with self._lock:
            stored = _stored_channels(self.state_dir, set(self._channels))
            if len(self._channels) + len(stored) > self.max_channels:
                raise LocalProtocolError(
                    f"{self.state_dir} holds {len(stored)} open channels, more than"
                    f" max_channels ({self.max_channels}) allows"
                )
            for channel_id in stored:
                self._open(channel_id)
            return stored

    def channels(self) -> list[str]:
        """The open channels, in the order they were opened."""
        with self._lock:
            return list(self._channels)

    def channel(self, channel_id: str) -> MessageChannel:
        """The protocol state of an open channel (read it under no other thread's call)."""
        with self._lock:
            return self._require(channel_id).driver.channel

    def history(self, channel_id: str, limit: int | None = None) -> list[LogRecord]:
        """The stored log of an open channel, with content, oldest first (``state_dir``)."""
        with self._lock:
            state = self._require(channel_id).state
            if state is None:
                raise LocalProtocolError("history is kept only with a state_dir")
            return state.history(limit)

    def set_participant_count(self, channel_id: str, participants: int) -> None:
        """How many the group has: SDS-R's response groups, and the sync interval with
        ``RuntimeConfig.sync_ms_per_participant``. Stored with the channel."""
        if participants < 1:
            raise LocalProtocolError("participants must be >= 1")
        with self._lock:
            opened = self._require(channel_id)
            opened.driver.set_participant_count(participants)
            opened.participants = participants
            if opened.state is not None:
                opened.state.set_participants(participants)

    def participant_count(self, channel_id: str) -> int | None:
        """As last set (None: never set)."""
        with self._lock:
            return self._require(channel_id).participants

    def unacknowledged(self, channel_id: str) -> list[OwnMessage]:
        """Our messages awaiting acknowledgement (still resent), oldest first."""
        with self._lock:
            channel = self._require(channel_id).driver.channel
            out = []
            for mid in channel.outgoing_ids():
                entry = channel.outgoing_entry(mid)
                if entry is not None:
                    out.append(
                        OwnMessage(
                            mid,
                            entry.lamport_timestamp,
                            entry.content,
                            entry.attempts,
                            len(entry.possible_ackers),
                            entry.first_sent_ms,
                        )
                    )
            return out

    def waiting(self, channel_id: str) -> list[WaitingMessage]:
        """Received messages waiting for dependencies, in arrival order."""
        with self._lock:
            channel = self._require(channel_id).driver.channel
            out = []
            for mid in channel.incoming_ids():
                stored = channel.stored_incoming(mid)
                if stored is None:
                    continue
                message = decode(stored.data, self.config.limits)
                out.append(
                    WaitingMessage(
                        mid,
                        message.sender_id,
                        message.lamport_timestamp or 0,
                        message.content or b"",
                        channel.unmet_dependencies(mid),
                        stored.received_ms,
                    )
                )
            return out

    def close(self) -> None:
        """Close every channel's durable state (they stay open for a restart)."""
        with self._lock:
            for opened in self._channels.values():
                if opened.state is not None:
                    opened.state.close()
            self._channels.clear()

    def _open(self, channel_id: str) -> _Open:
        opened = self._channels.get(channel_id)
        if opened is not None:
            return opened
        if not channel_id:
            raise LocalProtocolError("channel_id must be non-empty")
        if len(self._channels) >= self.max_channels:
            raise LocalProtocolError(f"already {self.max_channels} channels open (max_channels)")
        if self.state_dir is not None:
            _check_file_name(state_path(self.state_dir, channel_id))
        factory = self._history_store_factory
        now = self._clock()
        channel = MessageChannel(
            channel_id,
            self.participant_id,
            now_ms=now,
            config=self.config,
            history_store=factory(channel_id) if factory is not None else None,
        )
        driver = ChannelDriver(channel, self.runtime, self._rng, now, query_stores=False)
        if self.state_dir is None:
            opened = _Open(driver, None, EventLog(self.event_limits))
        else:
            path = state_path(self.state_dir, channel_id)
            created = not path.exists()
            state = ChannelState(
                path, driver, synchronous=self._synchronous, event_limits=self.event_limits
            )
            was_closed = state.closed
            if was_closed:
                state.set_closed(False)
            opened = _Open(driver, state, state.events, participants=state.participants)
            opened.undo = _Undo(created, was_closed)
        self._channels[channel_id] = opened
        self._report(channel_id, opened, now)  # what a crash left unacknowledged
        return opened

    def _abandon(self, channel_id: str, opened: _Open) -> None:
        """Undo the opening of a channel that nothing was done on."""
        del self._channels[channel_id]
        state, undo = opened.state, opened.undo
        if state is None or undo is None:
            return
        if undo.was_closed:
            state.set_closed(True)
        state.close()
        if undo.created:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{state.path}{suffix}").unlink(missing_ok=True)

    def _require(self, channel_id: str) -> _Open:
        opened = self._channels.get(channel_id)
        if opened is None:
            raise LocalProtocolError(f"channel {channel_id!r} is not open")
        return opened

    # ------------------------------------------------------------------- API

    def wrap_outgoing_message(
        self, payload: bytes, channel_id: str, message_id: str | None = None
    ) -> bytes:
        """Add reliability metadata (opening the channel if need be); returns the bytes
        to encrypt and send. Resends of it come through ``on_transmit``."""
        return self.wrap(payload, channel_id, message_id).data

    def wrap(self, payload: bytes, channel_id: str, message_id: str | None = None) -> Wrapped:
        """``wrap_outgoing_message`` with the message id, and whether it repeated a wrap.
        A refused wrap leaves no channel open that was not open before."""
        with self._lock:
            was_open = channel_id in self._channels
            opened = self._open(channel_id)
            try:
                return self._wrap(channel_id, opened, payload, message_id)
            except LocalProtocolError:
                if not was_open:
                    self._abandon(channel_id, opened)
                raise

    def _wrap(
        self, channel_id: str, opened: _Open, payload: bytes, message_id: str | None
    ) -> Wrapped:
        kept_as = self._kept_id(payload, message_id)
        if kept_as is not None:
            earlier = self._earlier_wrap(opened, kept_as)
            if earlier is not None:
                return self._repeat(earlier, payload, kept_as)
        published = opened.driver.publish(payload, self._clock(), message_id=message_id)
        data = published.transmit.data  # the application transmits it, not us
        if kept_as is not None:
            self._keep_wrap(opened, kept_as, data)
        self._carry_out(channel_id, opened, published.step)
        return Wrapped(data, published.message_id)

    def unwrap_received_message(self, data: bytes) -> UnwrapResult:
        """Strip reliability metadata. Raises RemoteProtocolError for bad bytes (state
        unchanged); bytes for a channel that is not open change nothing either."""
        message = decode(data, self.config.limits)
        channel_id, message_id = message.channel_id, message.message_id
        with self._lock:
            opened = self._channels.get(channel_id)
            if opened is None:
                return UnwrapResult(None, [], channel_id, message_id, channel_open=False)
            step = opened.driver.receive_message(message, self._clock(), data=data)
            fresh = duplicate = False
            for e in step.events:
                if e.message_id != message_id:
                    continue
                fresh = fresh or isinstance(e, MessageReceived | EphemeralReceived)
                duplicate = duplicate or (
                    isinstance(e, MessageDropped) and e.reason == DropReason.DUPLICATE
                )
            self._carry_out(channel_id, opened, step)
            missing = opened.driver.channel.unmet_dependencies(message_id)
            payload = message.content if fresh else None
            return UnwrapResult(payload, missing, channel_id, message_id, duplicate=duplicate)

    def mark_dependencies_met(self, message_ids: Iterable[str], channel_id: str) -> None:
        """The application has these messages; release whatever waited for them."""
        with self._lock:
            opened = self._require(channel_id)
            self._carry_out(
                channel_id, opened, opened.driver.mark_dependencies_met(list(message_ids))
            )

    def build_sync_message(self, channel_id: str) -> bytes | None:
        """An empty-content sync message for an open channel (None: nothing to sync).
        ``tick`` sends syncs by itself; this is for an application that wants one now."""
        with self._lock:
            opened = self._require(channel_id)
            out = opened.driver.channel.send_sync(self._clock())
            if out is None:
                return None
            self._carry_out(channel_id, opened, Step([], list(out.events)))
            return out.data

    def tick(self, now_ms: int | None = None) -> None:
        """Do everything due at ``now_ms`` (the clock's time when None) on every channel,
        and report again the events of channels whose callbacks raised."""
        with self._lock:
            now = self._clock() if now_ms is None else now_ms
            for channel_id, opened in list(self._channels.items()):
                if self._channels.get(channel_id) is not opened:
                    continue  # closed by a callback of an earlier channel
                if opened.driver.next_due() <= now:
                    self._carry_out(channel_id, opened, opened.driver.tick(now))
                    if self._channels.get(channel_id) is not opened:
                        continue  # closed by one of its own callbacks
                if opened.retry_at is not None and opened.retry_at <= now:
                    self._report(channel_id, opened, now)
                elif opened.state is not None and opened.state.events.dirty:
                    opened.state.commit()  # acknowledgements of an idle channel

    def next_due(self) -> int | None:
        """The earliest time at which ``tick`` has work (None: no channel is open)."""
        with self._lock:
            return min((_due(o) for o in self._channels.values()), default=None)

    # ----------------------------------------------------------------- events

    def read_events(self, channel_id: str, after: int, limit: int = _BATCH) -> list[Delivery]:
        """Up to ``limit`` events of an open channel numbered above ``after`` and not
        acknowledged, in order."""
        with self._lock:
            return self._require(channel_id).events.read(after, limit)

    def ack_events(self, channel_id: str, through: int) -> None:
        """The application processed the channel's events up to ``through``: forget them
        (stored at once). Numbers not reached yet acknowledge what there is."""
        with self._lock:
            opened = self._require(channel_id)
            if opened.events.ack(through) and opened.state is not None:
                opened.state.commit()

    def event_positions(self, channel_id: str) -> tuple[int, int]:
        """(last event number, acknowledged number) of an open channel."""
        with self._lock:
            events = self._require(channel_id).events
            return events.last_seq, events.acked_seq

    # --------------------------------------------------------------- steps

    def _kept_id(self, payload: bytes, message_id: str | None) -> str | None:
        """The id a wrap is kept under for a retry: an explicit one, or the payload's own
        with the payload scheme (the same payload always gets it)."""
        if message_id is not None:
            return message_id
        if self.config.message_id_scheme == "payload" and payload:
            return message_id_for(payload)
        return None

    def _earlier_wrap(self, opened: _Open, message_id: str) -> bytes | None:
        if opened.state is not None:
            return opened.state.wrapped(message_id)
        return opened.wraps.get(message_id)

    def _repeat(self, earlier: bytes, payload: bytes, message_id: str) -> Wrapped:
        if decode(earlier, self.config.limits).content != payload:
            raise LocalProtocolError(
                f"message id {message_id} is already used for another payload; wrap a new"
                " message under a new id"
            )
        return Wrapped(earlier, message_id, repeated=True)

    def _keep_wrap(self, opened: _Open, message_id: str, data: bytes) -> None:
        if opened.state is not None:
            opened.state.keep_wrap(message_id, data)
            return
        opened.wraps[message_id] = data
        if len(opened.wraps) > WRAPS_KEPT:
            del opened.wraps[next(iter(opened.wraps))]

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Calls made inside share one commit per channel, made when the batch ends (many
        wraps or unwraps cost one transaction): no callback runs and nothing is durable
        before then, so hand nothing a call returned inside it to anyone until it ends.
        Holds the lock throughout; batches nest."""
        with self._lock:
            if self._batch is not None:
                yield
                return
            self._batch = {}
            try:
                yield
            finally:
                touched, self._batch = self._batch, None
                self._settle_all(touched)

    def _settle_all(self, touched: dict[str, tuple[_Open, list[Delivery]]]) -> None:
        failure: BaseException | None = None
        for channel_id, (opened, numbered) in touched.items():
            if self._channels.get(channel_id) is not opened:
                continue  # closed inside the batch, which stored it
            try:
                self._settle(channel_id, opened, numbered)
            except BaseException as exc:  # the others are settled all the same
                failure = failure or exc
        if failure is not None:
            raise failure

    def _carry_out(self, channel_id: str, opened: _Open, step: Step) -> None:
        reported = _reported(step)
        numbered = opened.events.record(reported) if reported else []
        if self._batch is not None:
            self._batch.setdefault(channel_id, (opened, []))[1].extend(numbered)
            return
        self._settle(channel_id, opened, numbered)

    def _settle(self, channel_id: str, opened: _Open, numbered: list[Delivery]) -> None:
        """Commit what the channel's steps changed, then let the application hear of it."""
        state = opened.state
        if state is not None:
            try:
                state.commit()  # stored, with its events, before anyone hears of it
            except BaseException:
                # Memory is ahead of the database: only reopening from what is stored is safe.
                self._channels.pop(channel_id, None)
                state.close()
                raise
        crash_point("commit")
        if self.acknowledge == "explicit":
            for delivery in numbered:
                self._notify(channel_id, delivery)
        elif numbered:
            self._report(channel_id, opened, self._clock())

    def _notify(self, channel_id: str, delivery: Delivery) -> None:
        try:
            self._call_back(channel_id, delivery)
        except Exception:
            self._count_error()

    def _report(self, channel_id: str, opened: _Open, now: int) -> None:
        """on_return: report every unacknowledged event in order, acknowledging each once
        its callbacks returned; stop at the first that raises and try again later."""
        if self.acknowledge == "explicit" or opened.reporting:
            return  # the outer report reaches events that callbacks cause
        if opened.retry_at is not None and now < opened.retry_at:
            return
        opened.reporting = True
        try:
            events = opened.events
            while batch := events.read(events.acked_seq, _BATCH):
                done = events.acked_seq
                try:
                    for delivery in batch:
                        self._call_back(channel_id, delivery)
                        done = delivery.seq or done
                except Exception:
                    self._count_error()
                    opened.retry_at = now + REDELIVER_MS
                    return
                finally:
                    events.ack(done)  # those whose callbacks returned
            opened.retry_at = None
        finally:
            opened.reporting = False

    def _call_back(self, channel_id: str, delivery: Delivery) -> None:
        if self.on_event is not None:
            self.on_event(channel_id, delivery)
        event = delivery.event
        match event:
            case MessageDelivered():
                if self.on_message_ready is not None:
                    self.on_message_ready(channel_id, event.message_id)
            case MessageAcknowledged():
                if self.on_message_sent is not None:
                    self.on_message_sent(channel_id, event.message_id)
            case MessagePossiblyAcknowledged():
                if self.on_possibly_acknowledged is not None:
                    self.on_possibly_acknowledged(channel_id, event.message_id, event.count)
            case MessageMissing():
                if self.on_missing_dependencies is not None:
                    self.on_missing_dependencies(channel_id, [event.message_id])
            case SendFailed():
                if self.on_send_failed is not None:
                    self.on_send_failed(channel_id, event.message_id)
            case Transmit():
                if self.on_transmit is not None:
                    self.on_transmit(channel_id, event.kind, event.message_id, event.data)
            case PeriodicSync():
                if self.on_periodic_sync is not None:
                    self.on_periodic_sync(channel_id)

    def _count_error(self) -> None:
        self.callback_errors += 1
        logger.exception(
            "%s: a callback raised (%d so far)", self.participant_id, self.callback_errors
        )


def _due(opened: _Open) -> int:
    due = opened.driver.next_due()
    return due if opened.retry_at is None else min(due, opened.retry_at)


def _reported(step: Step) -> list[Reported]:
    """What of a step the application must hear of, in order: events, then bytes to
    transmit (a sync transmission followed by its periodic sync)."""
    out: list[Reported] = [e for e in step.events if isinstance(e, _REPORTED)]
    for action in step.actions:
        if isinstance(action, Transmit):
            out.append(action)
            if action.kind == "sync":
                out.append(PeriodicSync(action.message_id))
    return out


def _stored_channels(state_dir: Path, skip: set[str]) -> list[str]:
    """The channels stored in ``state_dir`` that the application did not close, but for
    those in ``skip`` (open here: their files are locked)."""
    found = []
    for path in sorted(state_dir.glob("*.sqlite")):
        if unquote(path.stem) in skip:
            continue
        db = sqlite3.connect(path, timeout=0.1)
        try:
            row = db.execute("SELECT * FROM channel").fetchone()
            columns = [d[0] for d in db.execute("SELECT * FROM channel").description]
        except sqlite3.Error as exc:
            raise LocalProtocolError(f"{path} is not a channel's state: {exc}") from None
        finally:
            db.close()
        if row is None:
            continue
        values = dict(zip(columns, row, strict=True))
        if not values.get("closed"):
            found.append(str(values["channel_id"]))
    return found


def _check_file_name(path: Path) -> None:
    """A channel whose (escaped) id is too long for a file name is refused before the
    disk is touched, rather than failing there with an OSError."""
    try:
        limit = os.pathconf(path.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255  # what common file systems allow
    if len(path.name.encode()) > limit:
        raise LocalProtocolError(
            f"channel id too long: its state file name would be {len(path.name.encode())}"
            f" bytes, over the {limit} the state directory's file system allows"
        )
