"""ReliabilityManager: the end-to-end reliability API proposal over many channels.

Theory of operation
-------------------
The proposal (seed 004) wants a library the application calls around its own
encryption and transport: ``wrap_outgoing_message`` before encrypting and sending,
``unwrap_received_message`` after decrypting, ``mark_dependencies_met`` when the
application found missing messages itself, and callbacks for *message ready*, *message
sent* (= acknowledged), *missing dependencies* and *periodic sync*.

It is a thin adapter: one :class:`~sdsync.core.MessageChannel` per channel id, created on
first use, with the application's long-term :class:`~sdsync.core.HistoryStore` answering
"do we already have it?" for entries beyond the in-memory window. This adapter reads a
clock (injectable) because its API has no time arguments; the channels underneath stay
sans-I/O. Calls are serialised by a lock so callbacks may come from any thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sdsync.core.channel import MessageChannel
from sdsync.core.config import ChannelConfig
from sdsync.core.events import (
    EphemeralReceived,
    Event,
    MessageAcknowledged,
    MessageDelivered,
    MessageMissing,
    MessageReceived,
)
from sdsync.core.log import HistoryStore
from sdsync.errors import LocalProtocolError
from sdsync.wire import decode

ChannelCallback = Callable[[str, str], None]


def system_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class UnwrapResult:
    """What ``unwrap_received_message`` found.

    ``payload`` is None when there is nothing new for the application: a duplicate, a
    sync message, our own message echoed back, or a message for another channel's
    participant set. Otherwise it is returned even while ``missing_dependencies`` is
    non-empty, so the application can show it with a "messages missing before this"
    marker; ``on_message_ready`` fires once the dependencies are met.
    """

    payload: bytes | None
    missing_dependencies: list[str]
    channel_id: str
    message_id: str


class ReliabilityManager:
    def __init__(
        self,
        participant_id: str,
        *,
        config: ChannelConfig | None = None,
        history_store_factory: Callable[[str], HistoryStore] | None = None,
        clock: Callable[[], int] = system_clock_ms,
        sync_interval_ms: int = 30_000,
    ) -> None:
        if not participant_id:
            raise LocalProtocolError("participant_id must be non-empty")
        self.participant_id = participant_id
        self.config = config if config is not None else ChannelConfig()
        self.sync_interval_ms = sync_interval_ms
        self._history_store_factory = history_store_factory
        self._clock = clock
        self._channels: dict[str, MessageChannel] = {}
        self._last_activity: dict[str, int] = {}
        self._lock = threading.RLock()
        self.on_message_ready: ChannelCallback | None = None
        self.on_message_sent: ChannelCallback | None = None
        self.on_missing_dependencies: Callable[[str, list[str]], None] | None = None
        self.on_periodic_sync: Callable[[str], None] | None = None

    def channel(self, channel_id: str) -> MessageChannel:
        """The channel's state machine, created on first use."""
        with self._lock:
            chan = self._channels.get(channel_id)
            if chan is None:
                store = (
                    self._history_store_factory(channel_id)
                    if self._history_store_factory is not None
                    else None
                )
                now = self._clock()
                chan = MessageChannel(
                    channel_id,
                    self.participant_id,
                    now_ms=now,
                    config=self.config,
                    history_store=store,
                )
                self._channels[channel_id] = chan
                self._last_activity[channel_id] = now
            return chan

    def wrap_outgoing_message(
        self, payload: bytes, channel_id: str, message_id: str | None = None
    ) -> bytes:
        """Add reliability metadata; returns the bytes to encrypt and send."""
        with self._lock:
            now = self._clock()
            out = self.channel(channel_id).send(payload, now, message_id=message_id)
            self._last_activity[channel_id] = now
            self._dispatch(channel_id, out.events)
            return out.data

    def unwrap_received_message(self, data: bytes) -> UnwrapResult:
        """Strip reliability metadata. Raises RemoteProtocolError for bad bytes."""
        message = decode(data, self.config.limits)
        with self._lock:
            chan = self.channel(message.channel_id)
            events = chan.receive_message(message, self._clock(), data=data)
            self._dispatch(message.channel_id, events)
            fresh = any(
                isinstance(e, MessageReceived | EphemeralReceived)
                and e.message_id == message.message_id
                for e in events
            )
            return UnwrapResult(
                message.content if fresh else None,
                chan.unmet_dependencies(message.message_id),
                message.channel_id,
                message.message_id,
            )

    def mark_dependencies_met(self, message_ids: Iterable[str], channel_id: str) -> None:
        """The application has these messages; release whatever waited for them."""
        with self._lock:
            events = self.channel(channel_id).mark_dependencies_met(message_ids)
            self._dispatch(channel_id, events)

    def build_sync_message(self, channel_id: str) -> bytes | None:
        """An empty-content sync message for ``channel_id`` (None if nothing to sync)."""
        with self._lock:
            now = self._clock()
            out = self.channel(channel_id).send_sync(now)
            self._last_activity[channel_id] = now
            return out.data if out is not None else None

    def tick(self) -> None:
        """Run periodic work: incoming sweeps, and sync signals for quiet channels."""
        with self._lock:
            now = self._clock()
            for channel_id, chan in self._channels.items():
                self._dispatch(channel_id, chan.sweep_incoming(now).events)
                if now - self._last_activity[channel_id] >= self.sync_interval_ms:
                    self._last_activity[channel_id] = now
                    if self.on_periodic_sync is not None:
                        self.on_periodic_sync(channel_id)

    def _dispatch(self, channel_id: str, events: list[Event]) -> None:
        missing: list[str] = []
        for event in events:
            if isinstance(event, MessageDelivered) and self.on_message_ready:
                self.on_message_ready(channel_id, event.message_id)
            elif isinstance(event, MessageAcknowledged) and self.on_message_sent:
                self.on_message_sent(channel_id, event.message_id)
            elif isinstance(event, MessageMissing):
                missing.append(event.message_id)
        if missing and self.on_missing_dependencies is not None:
            self.on_missing_dependencies(channel_id, missing)
