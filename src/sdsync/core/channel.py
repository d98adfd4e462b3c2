"""MessageChannel: the SDS protocol state machine of one participant in one channel.

Theory of operation
-------------------
This is the only place where protocol state changes. It is sans-I/O: it never reads a
clock, draws a random number or touches a socket. Every call that depends on time takes
``now_ms``; every call that changes state returns the :mod:`events <sdsync.core.events>`
it caused, and outgoing bytes are handed back to the caller to transmit.

State, per the spec's *participant state*:

* the Lamport timestamp (milliseconds; ``max(ts + 1, now)`` on send, ``max(ts, msg.ts)``
  on delivery);
* the rolling bloom filter of received message ids;
* the **outgoing buffer**: our content messages not yet acknowledged, each either
  *unacknowledged* or *possibly acknowledged* (seen in the bloom filters of fewer distinct
  peers than the threshold);
* the **incoming buffer**: content messages whose causal dependencies are not all in the
  local log yet, indexed both ways (message -> unmet dependencies, dependency -> waiting
  messages) so an arriving dependency releases its dependents in O(their number);
* the **local log**, ordered by (Lamport timestamp, message id) — see :mod:`.log`;
* the SDS-R buffers — see :mod:`.repair`.

Receiving a message runs the spec's steps in order: drop our own, wrong-channel and
duplicate messages; review ACK status (causal history = acknowledged, bloom hit from a
*distinct* peer = possibly acknowledged, enough of them = acknowledged); add a content id
to our bloom filter; deliver if every dependency is in the log — strictly: a dependency
sitting in the incoming buffer is not met — or buffer it and report the dependencies we
have never seen as missing. Delivery cascades to everything that was waiting on it.

Where js-waku differs we chose correctness: duplicates are never re-delivered, one peer
repeating a bloom filter counts once, a saturated or mis-sized bloom filter gives no ack
evidence (and never aborts processing), every buffer has an explicit cap, and after the
lost timeout a waiting message is delivered with its missing dependencies reported lost
rather than silently discarded.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import logging
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from sdsync.core.bloom import Position, RollingBloomFilter, contains
from sdsync.core.config import ChannelConfig
from sdsync.core.events import (
    EphemeralReceived,
    Event,
    MessageAcknowledged,
    MessageDelivered,
    MessageDeliveredEarly,
    MessageDropped,
    MessageLost,
    MessagePossiblyAcknowledged,
    MessageReceived,
    MessageSent,
    RepairRequestReceived,
    RepairRequestSent,
    RepairResponseSent,
    SendFailed,
    SyncReceived,
    SyncSent,
    missing_event,
)
from sdsync.core.journal import ChannelSnapshot, Journal, StoredIncoming, StoredOutgoing
from sdsync.core.log import HistoryStore, LocalLog, LogEntry
from sdsync.core.repair import RepairState
from sdsync.errors import LocalProtocolError
from sdsync.wire import HistoryEntry, Message, MessageKind, decode, encode, message_id_for

logger = logging.getLogger("sdsync.core")


class OutgoingState(enum.Enum):
    UNACKNOWLEDGED = "unacknowledged"
    POSSIBLY_ACKNOWLEDGED = "possibly_acknowledged"


@dataclass(slots=True)
class OutgoingEntry:
    """One of our content messages awaiting acknowledgement."""

    message: Message
    data: bytes
    positions: tuple[Position, ...]
    first_sent_ms: int
    last_sent_ms: int
    attempts: int = 1
    possible_ackers: set[str] = field(default_factory=set)

    @property
    def message_id(self) -> str:
        return self.message.message_id

    @property
    def state(self) -> OutgoingState:
        if self.possible_ackers:
            return OutgoingState.POSSIBLY_ACKNOWLEDGED
        return OutgoingState.UNACKNOWLEDGED


@dataclass(slots=True)
class _Waiting:
    """A content message in the incoming buffer."""

    message: Message
    data: bytes | None
    retrieval_hint: bytes | None
    received_ms: int
    unmet: set[str]


@dataclass(frozen=True, slots=True)
class Outgoing:
    """Bytes for the caller to transmit, the message they encode, and what happened."""

    message: Message
    data: bytes
    events: list[Event]

    @property
    def message_id(self) -> str:
        return self.message.message_id


@dataclass(frozen=True, slots=True)
class IncomingSweep:
    missing: list[HistoryEntry]
    events: list[Event]


@dataclass(frozen=True, slots=True)
class OutgoingSweep:
    unacknowledged: list[OutgoingEntry]
    possibly_acknowledged: list[OutgoingEntry]


@dataclass(frozen=True, slots=True)
class RepairSweep:
    data: list[bytes]
    events: list[Event]


@dataclass(slots=True)
class ChannelStats:
    """Counters of what the channel discarded or distrusted, for metrics and logs."""

    dropped: dict[str, int] = field(default_factory=dict)
    bloom_ignored: dict[str, int] = field(default_factory=dict)

    def count(self, table: dict[str, int], reason: str) -> None:
        table[reason] = table.get(reason, 0) + 1


class MessageChannel:
    """Protocol state of ``participant_id`` in ``channel_id``. Not thread-safe."""

    def __init__(
        self,
        channel_id: str,
        participant_id: str,
        *,
        now_ms: int,
        config: ChannelConfig | None = None,
        history_store: HistoryStore | None = None,
    ) -> None:
        if not participant_id:
            raise LocalProtocolError("participant_id must be non-empty")
        self.channel_id = channel_id
        self.participant_id = participant_id
        self.config = config if config is not None else ChannelConfig()
        self.lamport_timestamp = now_ms
        self.stats = ChannelStats()
        self._bloom = RollingBloomFilter(self.config.bloom, rollover=self.config.bloom_rollover)
        self._log = LocalLog(self.config.max_log_entries, history_store)
        self._outgoing: dict[str, OutgoingEntry] = {}
        self._incoming: dict[str, _Waiting] = {}
        self._waiters: dict[str, tuple[HistoryEntry, set[str]]] = {}
        self._lost: set[str] = set()
        self._met_elsewhere: set[str] = set()
        self._wire_cache: OrderedDict[str, bytes] = OrderedDict()
        self._repair = (
            RepairState(self.config.repair, participant_id) if self.config.repair.enabled else None
        )
        self.journal: Journal | None = None

    # ------------------------------------------------------------------ sending

    def send(self, payload: bytes, now_ms: int, *, message_id: str | None = None) -> Outgoing:
        """Wrap ``payload`` in a content message and record it as handed to the transport."""
        if not payload:
            raise LocalProtocolError("content messages need a non-empty payload")
        message_id = message_id if message_id is not None else message_id_for(payload)
        if not message_id:
            raise LocalProtocolError("message_id must be non-empty")
        if message_id in self._outgoing or message_id in self._log:
            raise LocalProtocolError(
                f"message id {message_id} is already used in this channel; identical "
                "payloads get identical default ids, so supply a unique message_id"
            )
        self._tick(now_ms)
        events: list[Event] = []
        message = Message(
            sender_id=self.participant_id,
            message_id=message_id,
            channel_id=self.channel_id,
            lamport_timestamp=self.lamport_timestamp,
            causal_history=self._causal_history(),
            bloom_filter=self._bloom.to_bytes(),
            content=bytes(payload),
            repair_request=self._take_repair_requests(now_ms, message_id, events),
        )
        data = encode(message)
        positions = self.config.bloom.positions(message_id)
        self._outgoing[message_id] = OutgoingEntry(message, data, positions, now_ms, now_ms)
        self._touch_outgoing(message_id)
        if self.config.own_log_policy == "on_send":
            self._enter_own_log(message, data, positions)
        events.insert(0, MessageSent(message_id, message.lamport_timestamp or 0))
        return Outgoing(message, data, events)

    def send_sync(self, now_ms: int) -> Outgoing | None:
        """A sync message, or None when there is no history and no repair to ask for.

        Sync messages carry causal history and bloom filter only; they are never buffered,
        logged or put in a filter, so their id need only be unique enough to trace them.
        Like js-waku, the Lamport timestamp advances even when nothing is sent.
        """
        self._tick(now_ms)
        lamport = self.lamport_timestamp
        sync_id = (
            "sync-"
            + hashlib.sha256(
                f"{self.participant_id}\x00{self.channel_id}\x00{lamport}".encode()
            ).hexdigest()[:24]
        )
        history = self._causal_history()
        events: list[Event] = []
        repairs = self._take_repair_requests(now_ms, sync_id, events)
        if not history and not repairs:
            return None
        message = Message(
            sender_id=self.participant_id,
            message_id=sync_id,
            channel_id=self.channel_id,
            lamport_timestamp=lamport,
            causal_history=history,
            bloom_filter=self._bloom.to_bytes(),
            repair_request=repairs,
        )
        events.insert(0, SyncSent(sync_id, lamport))
        return Outgoing(message, encode(message), events)

    def send_ephemeral(self, payload: bytes, *, message_id: str | None = None) -> Outgoing:
        """A message with no reliability: no timestamp, history, filter or buffering."""
        if not payload:
            raise LocalProtocolError("ephemeral messages need a non-empty payload")
        message = Message(
            sender_id=self.participant_id,
            message_id=message_id if message_id is not None else message_id_for(payload),
            channel_id=self.channel_id,
            content=bytes(payload),
        )
        return Outgoing(message, encode(message), [])

    def set_retrieval_hint(self, message_id: str, retrieval_hint: bytes) -> None:
        """Attach the transport's retrieval hint (e.g. a Waku message hash) to our message."""
        if not self._log.set_retrieval_hint(message_id, retrieval_hint):
            raise LocalProtocolError(f"message {message_id} is not in the local log window")
        if self.journal is not None:
            self.journal.hints[message_id] = retrieval_hint

    def resend(self, message_id: str, now_ms: int) -> bytes:
        """The unchanged bytes of an unacknowledged message, counted as another attempt."""
        entry = self._outgoing_entry(message_id)
        entry.attempts += 1
        entry.last_sent_ms = now_ms
        self._touch_outgoing(message_id)
        return entry.data

    def abandon(self, message_id: str) -> list[Event]:
        """Give up on an unacknowledged message (e.g. after the last retry)."""
        self._outgoing_entry(message_id)
        del self._outgoing[message_id]
        self._touch_outgoing(message_id)
        return [SendFailed(message_id)]

    def _outgoing_entry(self, message_id: str) -> OutgoingEntry:
        entry = self._outgoing.get(message_id)
        if entry is None:
            raise LocalProtocolError(f"message {message_id} is not in the outgoing buffer")
        return entry

    def _touch_outgoing(self, message_id: str) -> None:
        if self.journal is not None:
            self.journal.outgoing.add(message_id)

    def _touch_incoming(self, message_id: str) -> None:
        if self.journal is not None:
            self.journal.incoming.add(message_id)

    def _tick(self, now_ms: int) -> None:
        self.lamport_timestamp = max(self.lamport_timestamp + 1, now_ms)

    def _causal_history(self) -> tuple[HistoryEntry, ...]:
        tail = self._log.tail(self.config.causal_history_size)
        return tuple(entry.history_entry for entry in tail)

    def _take_repair_requests(
        self, now_ms: int, carrier_id: str, events: list[Event]
    ) -> tuple[HistoryEntry, ...]:
        if self._repair is None:
            return ()
        requests = self._repair.take_requests(now_ms)
        events.extend(RepairRequestSent(r.message_id, carrier_id) for r in requests)
        return tuple(requests)

    def _enter_own_log(
        self, message: Message, data: bytes, positions: tuple[Position, ...]
    ) -> None:
        self._add_to_bloom(message.message_id, positions)
        self._insert_log(
            LogEntry(message.message_id, message.lamport_timestamp or 0, self.participant_id),
            data,
            message.content,
        )

    def _add_to_bloom(self, message_id: str, positions: tuple[Position, ...] | None = None) -> None:
        self._bloom.insert(message_id, positions)
        if self.journal is not None:
            self.journal.bloom.append(message_id)

    # ---------------------------------------------------------------- receiving

    def receive(
        self, data: bytes, now_ms: int, *, retrieval_hint: bytes | None = None
    ) -> list[Event]:
        """Process bytes from the transport. Raises RemoteProtocolError (state unchanged)."""
        message = decode(data, self.config.limits)
        return self.receive_message(message, now_ms, retrieval_hint=retrieval_hint, data=data)

    def receive_message(
        self,
        message: Message,
        now_ms: int,
        *,
        retrieval_hint: bytes | None = None,
        data: bytes | None = None,
    ) -> list[Event]:
        """Process an already decoded message (``data``, if given, is kept for SDS-R)."""
        drop = self._drop_reason(message, now_ms)
        if drop is not None:
            if drop == "duplicate" and self._repair is not None:
                # Someone rebroadcast it: a repair response we owe is no longer needed.
                self._repair.responses.remove(message.message_id)
            self.stats.count(self.stats.dropped, drop)
            return [MessageDropped(message.message_id, drop)]
        kind = message.kind
        if kind is MessageKind.EPHEMERAL:
            return [
                EphemeralReceived(message.message_id, message.sender_id, message.content or b"")
            ]
        events: list[Event] = []
        if kind is MessageKind.SYNC:
            events.append(SyncReceived(message.message_id, message.sender_id))
        self._process_repair(message, now_ms, events)
        # Acks first: with on_ack, a message naming ours may be what puts ours in the log.
        self._review_acks(message, events)
        unmet = self._unmet(message)
        full = len(self._incoming) >= self.config.max_incoming_buffer
        if unmet and full and kind is MessageKind.CONTENT:
            # Not recorded, not in our filter: the sender will resend and we try again.
            self.stats.count(self.stats.dropped, "incoming buffer full")
            events.append(MessageDropped(message.message_id, "incoming buffer full"))
            return events
        if kind is MessageKind.SYNC:
            self._report_missing(unmet, now_ms, events)
            return events
        self._add_to_bloom(message.message_id)
        events.append(
            MessageReceived(
                message.message_id, message.sender_id, message.lamport_timestamp or 0, len(unmet)
            )
        )
        if unmet:
            self._buffer(message, data, retrieval_hint, now_ms, unmet, events)
        else:
            self._deliver(message, retrieval_hint, data, events)
        return events

    def _drop_reason(self, message: Message, now_ms: int) -> str | None:
        if message.channel_id != self.channel_id:
            return "wrong channel"
        if message.sender_id == self.participant_id:
            return "own message"
        if message.kind is not MessageKind.CONTENT:
            return None
        if self._seen(message.message_id):
            return "duplicate"
        skew = self.config.max_lamport_skew_ms
        if skew is not None and (message.lamport_timestamp or 0) > now_ms + skew:
            # Delivering it would drag our clock (and every later message) that far ahead.
            return "lamport timestamp too far in the future"
        return None

    def _seen(self, message_id: str) -> bool:
        return (
            message_id in self._incoming
            or message_id in self._met_elsewhere
            or message_id in self._log
        )

    def _met(self, message_id: str) -> bool:
        return (
            message_id in self._lost
            or message_id in self._met_elsewhere
            or (message_id in self._log)
        )

    def _unmet(self, message: Message) -> list[HistoryEntry]:
        """Entries of a causal history that are not (yet) in our log, lost or met elsewhere."""
        # Set difference against the window's dict runs in C; nearly always it is empty.
        absent = message.history_ids.difference(self._log.window)
        if not absent:
            return []
        absent = absent - {message.message_id}
        return [
            e
            for e in message.causal_history
            if e.message_id in absent and not self._met(e.message_id)
        ]

    def _buffer(
        self,
        message: Message,
        data: bytes | None,
        retrieval_hint: bytes | None,
        now_ms: int,
        unmet: list[HistoryEntry],
        events: list[Event],
    ) -> None:
        waiting_id = message.message_id
        self._report_missing(unmet, now_ms, events)
        if self.config.deliver_early:
            events.append(
                MessageDeliveredEarly(
                    waiting_id,
                    message.sender_id,
                    message.lamport_timestamp or 0,
                    message.content or b"",
                    retrieval_hint,
                    len(unmet),
                )
            )
        self._wait(_Waiting(message, data, retrieval_hint, now_ms, {e.message_id for e in unmet}))

    def _wait(self, waiting: _Waiting) -> None:
        waiting_id = waiting.message.message_id
        self._incoming[waiting_id] = waiting
        self._touch_incoming(waiting_id)
        for entry in waiting.message.causal_history:
            if entry.message_id in waiting.unmet:
                self._waiters.setdefault(entry.message_id, (entry, set()))[1].add(waiting_id)

    def _report_missing(
        self, entries: Iterable[HistoryEntry], now_ms: int, events: list[Event]
    ) -> None:
        """Newly noticed dependencies that we never received (not merely waiting ones)."""
        for entry in entries:
            mid = entry.message_id
            if self._met(mid) or mid in self._incoming or mid in self._waiters:
                continue
            events.append(missing_event(entry))
            if self._repair is not None:
                self._repair.mark_missing(entry, now_ms)

    def _deliver(
        self,
        message: Message,
        retrieval_hint: bytes | None,
        data: bytes | None,
        events: list[Event],
    ) -> None:
        """Deliver a message, then everything its delivery releases, in log order."""
        ready: list[tuple[int, str, Message, bytes | None, bytes | None]] = [
            (message.lamport_timestamp or 0, message.message_id, message, retrieval_hint, data)
        ]
        while ready:
            lamport, mid, msg, hint, raw = heapq.heappop(ready)
            self.lamport_timestamp = max(self.lamport_timestamp, lamport)
            self._set_lost(mid, False)
            self._insert_log(LogEntry(mid, lamport, msg.sender_id, hint), raw, msg.content)
            events.append(MessageDelivered(mid, msg.sender_id, lamport, msg.content or b"", hint))
            for waiting in self._release(mid):
                heapq.heappush(
                    ready,
                    (
                        waiting.message.lamport_timestamp or 0,
                        waiting.message.message_id,
                        waiting.message,
                        waiting.retrieval_hint,
                        waiting.data,
                    ),
                )

    def _release(self, dependency_id: str) -> Iterator[_Waiting]:
        """Messages that became deliverable because ``dependency_id`` is now met."""
        _, waiting_ids = self._waiters.pop(dependency_id, (None, set()))
        for waiting_id in sorted(waiting_ids):
            waiting = self._incoming[waiting_id]
            waiting.unmet.discard(dependency_id)
            if not waiting.unmet:
                del self._incoming[waiting_id]
                self._touch_incoming(waiting_id)
                yield waiting

    def _insert_log(self, entry: LogEntry, data: bytes | None, content: bytes | None) -> None:
        journal = self.journal
        if journal is not None:
            journal.log.append((entry, content))
        for evicted in self._log.insert(entry):
            self._uncache(evicted.message_id)
        if data is not None and self.config.repair.cache_size:
            self._cache(entry.message_id, data)

    def _cache(self, message_id: str, data: bytes) -> None:
        self._wire_cache[message_id] = data
        if self.journal is not None:
            self.journal.wire[message_id] = data
        if len(self._wire_cache) > self.config.repair.cache_size:
            self._uncache(next(iter(self._wire_cache)))

    def _uncache(self, message_id: str) -> None:
        if self._wire_cache.pop(message_id, None) is not None and self.journal is not None:
            self.journal.wire[message_id] = None

    def _set_lost(self, message_id: str, lost: bool) -> None:
        if lost == (message_id in self._lost):
            return
        if lost:
            self._lost.add(message_id)
        else:
            self._lost.discard(message_id)
        if self.journal is not None:
            self.journal.lost[message_id] = lost

    # ------------------------------------------------------------ acknowledgement

    def _review_acks(self, message: Message, events: list[Event]) -> None:
        outgoing = self._outgoing
        if not outgoing:
            return
        named = outgoing.keys() & message.history_ids
        for message_id in sorted(named):
            acked = outgoing.pop(message_id)
            self._touch_outgoing(message_id)
            self._acknowledged(acked, message.sender_id, events, by_causal_history=True)
        if outgoing and message.bloom_filter is not None:
            self._review_bloom(message.bloom_filter, message.sender_id, events)

    def _review_bloom(self, bloom: bytes, sender_id: str, events: list[Event]) -> None:
        params = self.config.bloom
        if len(bloom) != params.n_bytes:
            self._ignore_bloom(f"{len(bloom)} bytes, expected {params.n_bytes}", sender_id)
            return
        if params.false_positive_rate(bloom) > self.config.max_bloom_false_positive_rate:
            self._ignore_bloom("saturated", sender_id)
            return
        threshold = self.config.possible_acks_threshold
        outgoing = self._outgoing
        for mid, entry in list(outgoing.items()):
            if sender_id in entry.possible_ackers or not contains(bloom, entry.positions):
                continue
            entry.possible_ackers.add(sender_id)
            self._touch_outgoing(mid)
            count = len(entry.possible_ackers)
            if count >= threshold:
                del outgoing[mid]
                self._acknowledged(entry, sender_id, events, by_causal_history=False)
            else:
                events.append(MessagePossiblyAcknowledged(mid, count, sender_id))

    def _ignore_bloom(self, reason: str, sender_id: str) -> None:
        kind = "saturated" if reason == "saturated" else "wrong size"
        table = self.stats.bloom_ignored
        # The first time per kind at WARNING; after that DEBUG, so a peer cannot flood logs.
        level = logging.WARNING if kind not in table else logging.DEBUG
        self.stats.count(table, kind)
        logger.log(
            level,
            "channel %s: bloom filter from %s gives no ack evidence: %s (%d so far)",
            self.channel_id,
            sender_id,
            reason,
            table[kind],
        )

    def _acknowledged(
        self, entry: OutgoingEntry, acker_id: str, events: list[Event], *, by_causal_history: bool
    ) -> None:
        events.append(MessageAcknowledged(entry.message.message_id, by_causal_history, acker_id))
        if self.config.own_log_policy == "on_ack":
            self._enter_own_log(entry.message, entry.data, entry.positions)
            self._resolve_elsewhere(entry.message.message_id, events)

    # ---------------------------------------------------------------------- SDS-R

    def _process_repair(self, message: Message, now_ms: int, events: list[Event]) -> None:
        repair = self._repair
        if repair is None:
            return
        repair.mark_received(message.message_id)
        for request in message.repair_request:
            events.append(RepairRequestReceived(request.message_id, message.sender_id))
            repair.defer_request(request.message_id, now_ms)
            if request.message_id in self._wire_cache:
                repair.schedule_response(request, now_ms)

    def sweep_repair(self, now_ms: int) -> RepairSweep:
        """Rebroadcasts whose response time has come (original bytes, unchanged)."""
        if self._repair is None:
            return RepairSweep([], [])
        data: list[bytes] = []
        events: list[Event] = []
        for entry in self._repair.take_responses(now_ms):
            raw = self._wire_cache.get(entry.message_id)
            if raw is None:
                logger.info("repair for %s skipped: no longer cached", entry.message_id)
                continue
            data.append(raw)
            events.append(RepairResponseSent(entry.message_id))
        return RepairSweep(data, events)

    def set_participant_count(self, participants: int) -> None:
        """Spread repair responses over max(1, participants // 128) response groups."""
        if self._repair is not None:
            self._repair.set_participant_count(participants)

    def next_repair_request_due(self) -> int | None:
        """When our next SDS-R request may ride on an outgoing message (for schedulers)."""
        return self._repair.requests.next_due() if self._repair is not None else None

    def next_repair_response_due(self) -> int | None:
        """When ``sweep_repair`` will next have a rebroadcast to hand out."""
        return self._repair.responses.next_due() if self._repair is not None else None

    # ------------------------------------------------------------------- sweeps

    def sweep_incoming(self, now_ms: int) -> IncomingSweep:
        """Report missing dependencies; past the lost timeout, stop waiting for them."""
        events: list[Event] = []
        timeout = self.config.lost_timeout_ms
        if timeout is not None:
            expired = [w for w in self._incoming.values() if now_ms - w.received_ms >= timeout]
            for waiting in expired:
                self._give_up_waiting(waiting, events)
        missing = [
            entry for dep_id, (entry, _) in self._waiters.items() if dep_id not in self._incoming
        ]
        events.extend(missing_event(entry) for entry in missing)
        return IncomingSweep(missing, events)

    def _give_up_waiting(self, waiting: _Waiting, events: list[Event]) -> None:
        mid = waiting.message.message_id
        if mid not in self._incoming:
            return  # released while handling an earlier expired message
        for dep_id in sorted(waiting.unmet):
            if dep_id in self._incoming:
                self._waiters[dep_id][1].discard(mid)
                if not self._waiters[dep_id][1]:
                    del self._waiters[dep_id]
                continue
            self._set_lost(dep_id, True)
            if self._repair is not None:
                self._repair.requests.remove(dep_id)
            events.append(MessageLost(dep_id))
            self._resolve_elsewhere(dep_id, events)
        if mid in self._incoming:  # only waiting on other buffered messages now
            waiting.unmet.clear()
            del self._incoming[mid]
            self._touch_incoming(mid)
            self._deliver(waiting.message, waiting.retrieval_hint, waiting.data, events)

    def _resolve_elsewhere(self, dependency_id: str, events: list[Event]) -> None:
        for waiting in list(self._release(dependency_id)):
            self._deliver(waiting.message, waiting.retrieval_hint, waiting.data, events)

    def sweep_outgoing(self) -> OutgoingSweep:
        """Our unacknowledged and possibly acknowledged messages, oldest first."""
        unacked: list[OutgoingEntry] = []
        possibly: list[OutgoingEntry] = []
        for entry in self._outgoing.values():
            target = possibly if entry.possible_ackers else unacked
            target.append(entry)
        return OutgoingSweep(unacked, possibly)

    def mark_dependencies_met(self, message_ids: Iterable[str]) -> list[Event]:
        """The application found these in its own long-term history: stop waiting."""
        events: list[Event] = []
        for mid in message_ids:
            if mid in self._log or mid in self._met_elsewhere:
                continue
            self._met_elsewhere.add(mid)
            if self.journal is not None:
                self.journal.met_elsewhere.append(mid)
            if self._repair is not None:
                self._repair.mark_received(mid)
            self._resolve_elsewhere(mid, events)
        return events

    def drop_volatile_state(self) -> None:
        """Forget what a crash loses when only the log and outgoing buffer are durable:
        the incoming buffer and the SDS-R schedules. What was lost is learnt again from
        later causal histories, repairs and stores."""
        for mid in self._incoming:
            self._touch_incoming(mid)
        self._incoming.clear()
        self._waiters.clear()
        if self._repair is not None:
            old = self._repair
            self._repair = RepairState(old.config, self.participant_id)
            if self.journal is not None:
                self.journal.repair_requests.update(old.requests.ids())
                self.journal.repair_responses.update(old.responses.ids())
                self._repair.attach_journal(self.journal)

    # ------------------------------------------------------------- durable state

    def start_journal(self) -> Journal:
        """Record from now on what every step changes (see :mod:`.journal`)."""
        if self.journal is None:
            self.journal = Journal()
            if self._repair is not None:
                self._repair.attach_journal(self.journal)
        return self.journal

    def restore(self, snapshot: ChannelSnapshot) -> None:
        """Carry on from stored state; only a channel that has done nothing yet may."""
        if self._log.total or self._outgoing or self._incoming or self._bloom.inserted:
            raise LocalProtocolError("restore needs a fresh channel")
        limits = self.config.limits
        self.lamport_timestamp = snapshot.lamport_timestamp
        self._log.restore(snapshot.log, snapshot.log_total)
        self._bloom.restore(list(snapshot.bloom_recent), snapshot.bloom_total)
        self._lost = set(snapshot.lost)
        self._met_elsewhere = set(snapshot.met_elsewhere)
        self._wire_cache = OrderedDict(snapshot.wire_cache)
        for out in snapshot.outgoing:
            self._restore_outgoing(out)
        for stored in snapshot.incoming:
            message = decode(stored.data, limits)
            unmet = {e.message_id for e in self._unmet(message)}
            self._wait(
                _Waiting(message, stored.data, stored.retrieval_hint, stored.received_ms, unmet)
            )
        if self._repair is not None:
            self._repair.restore(snapshot.repair_requests, snapshot.repair_responses)
        if self.journal is not None:
            self.journal.clear()  # restoring changes nothing that is not stored already

    def _restore_outgoing(self, stored: StoredOutgoing) -> None:
        message = decode(stored.data, self.config.limits)
        self._outgoing[message.message_id] = OutgoingEntry(
            message,
            stored.data,
            self.config.bloom.positions(message.message_id),
            stored.first_sent_ms,
            stored.last_sent_ms,
            stored.attempts,
            set(stored.possible_ackers),
        )

    def stored_incoming(self, message_id: str) -> StoredIncoming | None:
        """A waiting message as it must be stored (None once it left the buffer)."""
        waiting = self._incoming.get(message_id)
        if waiting is None:
            return None
        data = waiting.data if waiting.data is not None else encode(waiting.message)
        return StoredIncoming(data, waiting.retrieval_hint, waiting.received_ms)

    def stored_outgoing(self, message_id: str) -> StoredOutgoing | None:
        """An unacknowledged message as it must be stored (None once it left the buffer)."""
        entry = self._outgoing.get(message_id)
        if entry is None:
            return None
        return StoredOutgoing(
            entry.data,
            entry.first_sent_ms,
            entry.last_sent_ms,
            entry.attempts,
            frozenset(entry.possible_ackers),
        )

    def repair_schedule(
        self, message_id: str
    ) -> tuple[tuple[HistoryEntry, int] | None, tuple[HistoryEntry, int] | None]:
        """The SDS-R request and response scheduled for ``message_id``, with due times."""
        if self._repair is None:
            return None, None
        return self._repair.requests.get(message_id), self._repair.responses.get(message_id)

    # -------------------------------------------------------------- inspection

    @property
    def log(self) -> LocalLog:
        return self._log

    def log_ids(self) -> list[str]:
        return [entry.message_id for entry in self._log]

    def bloom_bytes(self) -> bytes:
        return self._bloom.to_bytes()

    def incoming_ids(self) -> list[str]:
        return list(self._incoming)

    def outgoing_ids(self) -> list[str]:
        return list(self._outgoing)

    def buffer_sizes(self) -> tuple[int, int]:
        """How many messages wait in the incoming buffer and in the outgoing buffer."""
        return len(self._incoming), len(self._outgoing)

    def outgoing_entry(self, message_id: str) -> OutgoingEntry | None:
        return self._outgoing.get(message_id)

    def unmet_dependencies(self, message_id: str) -> list[str]:
        """What a message in the incoming buffer still waits for (empty if not waiting)."""
        waiting = self._incoming.get(message_id)
        return sorted(waiting.unmet) if waiting is not None else []

    def bloom_inserted(self) -> int:
        """How many ids ever entered our bloom filter (rollover state depends on it)."""
        return self._bloom.inserted

    def missing_ids(self) -> list[str]:
        return [dep for dep in self._waiters if dep not in self._incoming]

    def wire_bytes(self, message_id: str) -> bytes | None:
        """Cached wire bytes of a recent log entry (what SDS-R would rebroadcast)."""
        return self._wire_cache.get(message_id)
