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

With a ``state_dir`` every channel keeps its state in ``<state_dir>/<channel id>.sqlite``
(:mod:`sdsync.runtime.state`): each driver step is committed in one transaction *before*
any callback hears of it or any byte is returned or transmitted, so whatever the
application was told survives a crash, and reopening the channel restores the log, the
outgoing buffer and the planned resends. Deliveries are numbered; the delivered cursor is
moved past a step's deliveries just before ``on_message_ready`` is called for them, so
after a restart nothing is reported ready twice, and deliveries committed but never
reported (the process died in between) are reported when the channel is reopened.

Threads: every public method takes one re-entrant lock, so any number of threads (and a
tick thread) may call in. Callbacks run on the thread whose call caused them, *while the
lock is held*, after the step is committed: they see the manager's state in order and
may call back into the manager from the same thread, but must not wait for another thread
that uses the manager. An exception raised by a callback is logged (logger
``sdsync.runtime``) and counted in ``callback_errors``; it never reaches the caller and
never undoes state, which is committed already. A step that cannot be committed (disk
full, I/O error) raises and forgets its channel: memory would be ahead of the stored
state, and reopening the channel restores what was stored.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sdsync.core import (
    ChannelConfig,
    EphemeralReceived,
    HistoryStore,
    MessageAcknowledged,
    MessageChannel,
    MessageDelivered,
    MessageMissing,
    MessagePossiblyAcknowledged,
    MessageReceived,
    SendFailed,
    system_clock_ms,
)
from sdsync.errors import LocalProtocolError
from sdsync.runtime.driver import Action, ChannelDriver, Step, Transmit, TransmitKind
from sdsync.runtime.policy import RuntimeConfig
from sdsync.runtime.state import ChannelState, Delivery, LogRecord, Synchronous, state_path
from sdsync.wire import decode

logger = logging.getLogger("sdsync.runtime")

__all__ = ["ReliabilityManager", "TransmitKind", "UnwrapResult"]


@dataclass(frozen=True, slots=True)
class UnwrapResult:
    """What ``unwrap_received_message`` found.

    ``payload`` is None when there is nothing new for the application: a duplicate, a
    sync message, our own message echoed back, or bytes for a channel that is not open
    (``channel_open`` False: nothing was changed). Otherwise it is returned even while
    ``missing_dependencies`` is non-empty, so the application can show it with a
    "messages missing before this" marker; ``on_message_ready`` fires once they are met.
    """

    payload: bytes | None
    missing_dependencies: list[str]
    channel_id: str
    message_id: str
    channel_open: bool = True


@dataclass(frozen=True, slots=True)
class _Open:
    driver: ChannelDriver
    state: ChannelState | None


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
    ) -> None:
        if not participant_id:
            raise LocalProtocolError("participant_id must be non-empty")
        if max_channels < 1:
            raise LocalProtocolError("max_channels must be >= 1")
        if state_dir is not None and history_store_factory is not None:
            # The stored log answers for evicted entries: a second store would disagree.
            raise LocalProtocolError("history_store_factory and state_dir are exclusive")
        self.participant_id = participant_id
        self.config = config if config is not None else ChannelConfig(own_log_policy="on_ack")
        self.runtime = runtime if runtime is not None else RuntimeConfig()
        self.state_dir = state_dir
        self.max_channels = max_channels
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._synchronous = synchronous
        self._history_store_factory = history_store_factory
        self._channels: dict[str, _Open] = {}
        self._lock = threading.RLock()
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
        """Forget ``channel_id``; its stored state stays for a later ``open_channel``."""
        with self._lock:
            opened = self._channels.pop(channel_id, None)
            if opened is not None and opened.state is not None:
                opened.state.close()

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
        ``RuntimeConfig.sync_ms_per_participant``."""
        if participants < 1:
            raise LocalProtocolError("participants must be >= 1")
        with self._lock:
            self._require(channel_id).driver.set_participant_count(participants)

    def close(self) -> None:
        """Close every channel and its durable state."""
        with self._lock:
            for channel_id in list(self._channels):
                self.close_channel(channel_id)

    def _open(self, channel_id: str) -> _Open:
        opened = self._channels.get(channel_id)
        if opened is not None:
            return opened
        if not channel_id:
            raise LocalProtocolError("channel_id must be non-empty")
        if len(self._channels) >= self.max_channels:
            raise LocalProtocolError(f"already {self.max_channels} channels open (max_channels)")
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
        state = None
        if self.state_dir is not None:
            path = state_path(self.state_dir, channel_id)
            state = ChannelState(path, driver, synchronous=self._synchronous)
        opened = _Open(driver, state)
        self._channels[channel_id] = opened
        if state is not None and state.pending:
            # Committed before the last process died, never reported: report them now.
            self._dispatch(channel_id, opened, state.pending, ())
        return opened

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
        with self._lock:
            opened = self._open(channel_id)
            step = opened.driver.publish(payload, self._clock(), message_id=message_id)
            first = step.actions[0]
            assert isinstance(first, Transmit)  # publish's own content transmission
            deliveries = self._commit(channel_id, opened, step)
            self._dispatch(channel_id, opened, deliveries, step.actions[1:])
            return first.data

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
            deliveries = self._commit(channel_id, opened, step)
            fresh = any(
                isinstance(e, MessageReceived | EphemeralReceived) and e.message_id == message_id
                for e in step.events
            )
            self._dispatch(channel_id, opened, deliveries, step.actions)
            missing = opened.driver.channel.unmet_dependencies(message_id)
            return UnwrapResult(message.content if fresh else None, missing, channel_id, message_id)

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
        """Do everything due at ``now_ms`` (the clock's time when None) on every channel."""
        with self._lock:
            now = self._clock() if now_ms is None else now_ms
            for channel_id, opened in list(self._channels.items()):
                if self._channels.get(channel_id) is not opened:
                    continue  # closed by a callback of an earlier channel
                if opened.driver.next_due() <= now:
                    self._carry_out(channel_id, opened, opened.driver.tick(now))

    def next_due(self) -> int | None:
        """The earliest time at which ``tick`` has work (None: no channel is open)."""
        with self._lock:
            return min((o.driver.next_due() for o in self._channels.values()), default=None)

    # --------------------------------------------------------------- steps

    def _carry_out(self, channel_id: str, opened: _Open, step: Step) -> None:
        deliveries = self._commit(channel_id, opened, step)
        self._dispatch(channel_id, opened, deliveries, step.actions)

    def _commit(self, channel_id: str, opened: _Open, step: Step) -> list[Delivery]:
        state = opened.state
        if state is None:
            return [Delivery(None, event) for event in step.events]
        try:
            return state.commit(step)  # stored before anyone hears of it
        except BaseException:
            # Memory is ahead of the database: only reopening from what is stored is safe.
            self._channels.pop(channel_id, None)
            state.close()
            raise

    def _dispatch(
        self,
        channel_id: str,
        opened: _Open,
        deliveries: Sequence[Delivery],
        actions: Sequence[Action],
    ) -> None:
        numbered = [d.seq for d in deliveries if d.seq is not None]
        if numbered and opened.state is not None:
            opened.state.handed_off(numbered[-1])  # never reported twice, even after a crash
        missing: list[str] = []
        for delivery in deliveries:
            event = delivery.event
            if isinstance(event, MessageDelivered):
                self._call("on_message_ready", channel_id, event.message_id)
            elif isinstance(event, MessageAcknowledged):
                self._call("on_message_sent", channel_id, event.message_id)
            elif isinstance(event, MessagePossiblyAcknowledged):
                self._call("on_possibly_acknowledged", channel_id, event.message_id, event.count)
            elif isinstance(event, MessageMissing):
                missing.append(event.message_id)
            elif isinstance(event, SendFailed):
                self._call("on_send_failed", channel_id, event.message_id)
        if missing:
            self._call("on_missing_dependencies", channel_id, missing)
        for action in actions:
            if isinstance(action, Transmit):
                self._call("on_transmit", channel_id, action.kind, action.message_id, action.data)
                if action.kind == "sync":
                    self._call("on_periodic_sync", channel_id)

    def _call(self, name: str, *args: object) -> None:
        callback = getattr(self, name)
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:
            self.callback_errors += 1
            logger.exception(
                "%s: %s raised (%d so far)", self.participant_id, name, self.callback_errors
            )
