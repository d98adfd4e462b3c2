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
  local log yet, bounded by count and by bytes (see :mod:`.incoming`);
* the **known missing** ids: every id a processed causal history named — of a content or
  a sync message — that we never received, reported by every incoming sweep until it
  arrives, is marked met or is declared lost (see :mod:`.missing`);
* the peers heard from (up to the ack threshold: the threshold never exceeds their number);
* the **acknowledgements owed**: content of others we delivered that no message since has
  acknowledged to its sender — neither one of ours (it carries our bloom filter and causal
  history) nor another participant's naming it in its causal history (its sender hears
  that one too). The runtime's sync timer keeps an owed acknowledgement from being put off
  (:class:`~sdsync.runtime.SyncTimer`); a chat leaves only once it owes none. Not stored:
  after a restart, a sender waits for the next periodic sync instead;
* the **local log**, ordered by (Lamport timestamp, message id) — see :mod:`.log`;
* the SDS-R buffers — see :mod:`.repair`.

Receiving a message runs the spec's steps in order: drop our own, wrong-channel and
duplicate messages (and *id collisions*: an id we hold for a different message, which
must not acknowledge anything of ours); review ACK status (causal history =
acknowledged, bloom hit from a *distinct* peer = possibly acknowledged, enough of them =
acknowledged); add a content id to our bloom filter; deliver if every dependency is in
the log — strictly: a dependency sitting in the incoming buffer is not met — or buffer it
and record the dependencies we have never seen as missing. Delivery cascades to
everything that was waiting on it. A sync message goes through the same steps up to the
buffer: its gaps are recorded too.

When a message that must wait does not fit in the incoming buffer, the buffer says which
waiting messages give way (the most unmet dependencies first; see :mod:`.incoming` for
the rule and why) or that the newcomer is refused; the channel evicts and reports them
(:class:`~sdsync.core.events.MessageEvicted`, counted in ``stats.evicted``; a message
others wait for becomes a known-missing gap again, so retrieval asks for it) or refuses
the newcomer unrecorded (:class:`~sdsync.core.events.MessageDropped`). The known-missing
set is bounded by count and by bytes (``max_known_missing_bytes``, see
:mod:`sdsync.core.missing`), its oldest entry evicted and reported
(:class:`~sdsync.core.events.MessageMissingEvicted`) at either cap.

Where js-waku differs we chose correctness: duplicates are never re-delivered, one peer
repeating a bloom filter counts once, a saturated or mis-sized bloom filter gives no ack
evidence (and never aborts processing), every buffer has an explicit cap, and after the
lost timeout a waiting message is delivered with its missing dependencies reported lost
rather than silently discarded. Default message ids cover sender, Lamport timestamp and
payload, so the same bytes sent twice are two messages.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from sdsync.core.bloom import (
    Position,
    ReceivedFilter,
    RollingBloomFilter,
    contains,
    received_filter,
)
from sdsync.core.config import ChannelConfig
from sdsync.core.events import (
    DropReason,
    EphemeralReceived,
    Event,
    MessageAcknowledged,
    MessageDelivered,
    MessageDeliveredEarly,
    MessageDropped,
    MessageEvicted,
    MessageLost,
    MessageMissingEvicted,
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
from sdsync.core.history import HistoryWindow
from sdsync.core.incoming import IncomingBuffer, WaitingMessage, waiting_charge
from sdsync.core.journal import ChannelSnapshot, Journal, StoredIncoming, StoredOutgoing
from sdsync.core.log import HistoryStore, LocalLog, LogEntry
from sdsync.core.missing import KnownMissing, MissingDependency
from sdsync.core.outgoing import (
    MemoryWireStore,
    OutgoingEntry,
    OutgoingState,
    WireStore,
)
from sdsync.core.repair import RepairState
from sdsync.errors import LocalProtocolError, MessageTooLargeError, OutgoingBufferFullError
from sdsync.wire import (
    HistoryEntry,
    Message,
    MessageKind,
    decode,
    encode,
    message_id_for,
    message_id_for_sender,
)

__all__ = [
    "ChannelStats",
    "IncomingSweep",
    "MessageChannel",
    "Outgoing",
    "OutgoingEntry",
    "OutgoingState",
    "OutgoingSweep",
    "RepairSweep",
]

logger = logging.getLogger("sdsync.core")


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
    """Every known missing dependency (with its retrieval hint), and what the sweep did."""

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
    # The first peer whose bloom filter had another size, and that size: a channel whose
    # participants disagree on the filter size is misconfigured, and a user needs a name.
    bloom_wrong_size: tuple[str, int] | None = None
    # Known missing ids evicted from a full set (max_known_missing, max_known_missing_bytes).
    missing_evicted: int = 0
    # Waiting messages evicted from the incoming buffer, by DropReason (the cap they met).
    evicted: dict[str, int] = field(default_factory=dict)
    # Sends refused because the outgoing buffer was full.
    outgoing_full: int = 0

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
        wire_store: WireStore | None = None,
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
        self._history = HistoryWindow(self.config.causal_history_size)
        self._outgoing: dict[str, OutgoingEntry] = {}
        self._wires: WireStore = wire_store if wire_store is not None else MemoryWireStore()
        self._incoming = IncomingBuffer(
            self.config.max_incoming_buffer, self.config.max_incoming_buffer_bytes
        )
        self._missing = KnownMissing(
            self.config.max_known_missing, self.config.max_known_missing_bytes
        )
        self._heard: set[str] = set()
        # Message id -> its sender, oldest first; at most a causal history's worth (past
        # that, only a message of ours settles what we owe anyway).
        self._owed: dict[str, str] = {}
        self._lost: set[str] = set()
        self._met_elsewhere: set[str] = set()
        # In insertion order (a plain dict keeps it, at a third of an OrderedDict's size): the
        # first key is the one to evict.
        self._wire_cache: dict[str, bytes] = {}
        self._repair = (
            RepairState(self.config.repair, participant_id) if self.config.repair.enabled else None
        )
        self.journal: Journal | None = None

    # ------------------------------------------------------------------ sending

    def send(self, payload: bytes, now_ms: int, *, message_id: str | None = None) -> Outgoing:
        """Wrap ``payload`` in a content message and record it as handed to the transport.

        Raises (state unchanged) when the id is used already, the outgoing buffer is full,
        or the message would be larger than peers accept. Due SDS-R requests ride along
        only when they fit; otherwise they wait for a later message.
        """
        if not payload:
            raise LocalProtocolError("content messages need a non-empty payload")
        lamport = self._next_lamport(now_ms)
        if message_id is None:
            message_id = self._default_message_id(payload, lamport)
        self._check_sendable(message_id)
        history = self._history.quote(self._log)
        message = Message(
            sender_id=self.participant_id,
            message_id=message_id,
            channel_id=self.channel_id,
            lamport_timestamp=lamport,
            causal_history=history.entries,
            bloom_filter=self._bloom.to_bytes(),
            content=bytes(payload),
        )
        data = encode(message, history)
        limit = self.config.limits.max_message_bytes
        if len(data) > limit:
            raise MessageTooLargeError(
                f"a {len(payload)}-byte payload makes a {len(data)}-byte message, over the"
                f" {limit}-byte limit peers accept (max_message_bytes)"
            )
        events: list[Event] = []
        repairs = self._take_repair_requests(now_ms, message_id, events)
        if repairs:
            carrier = replace(message, repair_request=repairs)
            carried = encode(carrier, history)
            if len(carried) <= limit:
                message, data = carrier, carried
            else:  # they wait, due, for the next message
                events.clear()
                assert self._repair is not None  # it gave the requests
                self._repair.put_back(repairs, now_ms)
        self.lamport_timestamp = lamport
        positions = self.config.bloom.positions(message_id)
        entry = OutgoingEntry(
            message_id, lamport, message.content or b"", positions, now_ms, now_ms
        )
        self._outgoing[message_id] = entry
        self._wires[message_id] = data
        self._touch_outgoing(message_id)
        if self.config.own_log_policy == "on_send":
            self._enter_own_log(entry, data)
        self._owed.clear()
        events.insert(0, MessageSent(message_id, lamport))
        return Outgoing(message, data, events)

    def _default_message_id(self, payload: bytes, lamport: int) -> str:
        if self.config.message_id_scheme == "payload":
            return message_id_for(payload)
        return message_id_for_sender(self.participant_id, lamport, payload)

    def _check_sendable(self, message_id: str) -> None:
        if not message_id:
            raise LocalProtocolError("message_id must be non-empty")
        if message_id in self._outgoing or message_id in self._log:
            raise LocalProtocolError(
                f"message id {message_id} is already used in this channel; supply a unique "
                "message_id (or use the default scheme, which never repeats one)"
            )
        cap = self.config.max_outgoing_buffer
        if len(self._outgoing) >= cap:
            self.stats.outgoing_full += 1
            raise OutgoingBufferFullError(
                f"channel {self.channel_id}: {cap} messages await acknowledgement "
                "(max_outgoing_buffer); wait for acknowledgements or give up on some first"
            )

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
        history = self._history.quote(self._log)
        events: list[Event] = []
        repairs = self._take_repair_requests(now_ms, sync_id, events)
        if not history.entries and not repairs:
            return None
        message = Message(
            sender_id=self.participant_id,
            message_id=sync_id,
            channel_id=self.channel_id,
            lamport_timestamp=lamport,
            causal_history=history.entries,
            bloom_filter=self._bloom.to_bytes(),
            repair_request=repairs,
        )
        self._owed.clear()
        events.insert(0, SyncSent(sync_id, lamport))
        return Outgoing(message, encode(message, history), events)

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
        """Attach the transport's retrieval hint (e.g. a Waku message hash) to our message.

        The message may be in the log, the outgoing buffer or both; a message still
        awaiting acknowledgement under ``on_ack`` carries the hint into the log with it.
        """
        entry = self._outgoing.get(message_id)
        if entry is not None:
            entry.retrieval_hint = retrieval_hint
            self._touch_outgoing(message_id)
        if self._log.set_retrieval_hint(message_id, retrieval_hint):
            if self.journal is not None:
                self.journal.hints[message_id] = retrieval_hint
        elif entry is None:
            raise LocalProtocolError(
                f"message {message_id} is neither in the outgoing buffer nor in the log window"
            )

    def resend(self, message_id: str, now_ms: int) -> bytes:
        """The unchanged bytes of an unacknowledged message, counted as another attempt."""
        entry = self._outgoing_entry(message_id)
        entry.attempts += 1
        entry.last_sent_ms = now_ms
        self._touch_outgoing(message_id)
        return self._wires[message_id]

    def abandon(self, message_id: str) -> list[Event]:
        """Give up on an unacknowledged message (e.g. after the last retry)."""
        self._outgoing_entry(message_id)
        self._leave_outgoing(message_id)
        return [SendFailed(message_id)]

    def _leave_outgoing(self, message_id: str) -> None:
        del self._outgoing[message_id]
        del self._wires[message_id]
        self._touch_outgoing(message_id)

    def _outgoing_entry(self, message_id: str) -> OutgoingEntry:
        entry = self._outgoing.get(message_id)
        if entry is None:
            raise LocalProtocolError(f"message {message_id} is not in the outgoing buffer")
        return entry

    def _touch_outgoing(self, message_id: str) -> None:
        if self.journal is not None:
            self.journal.outgoing.add(message_id)

    def _tick(self, now_ms: int) -> None:
        self.lamport_timestamp = self._next_lamport(now_ms)

    def _next_lamport(self, now_ms: int) -> int:
        return max(self.lamport_timestamp + 1, now_ms)

    def _take_repair_requests(
        self, now_ms: int, carrier_id: str, events: list[Event]
    ) -> tuple[HistoryEntry, ...]:
        if self._repair is None:
            return ()
        requests = self._repair.take_requests(now_ms)
        events.extend(RepairRequestSent(r.message_id, carrier_id) for r in requests)
        return tuple(requests)

    def _enter_own_log(self, entry: OutgoingEntry, data: bytes) -> None:
        self._add_to_bloom(entry.message_id, entry.positions)
        self._insert_log(
            LogEntry(
                entry.message_id,
                entry.lamport_timestamp,
                self.participant_id,
                entry.retrieval_hint,
            ),
            data,
            entry.content,
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
            if drop is DropReason.DUPLICATE and self._repair is not None:
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
        self._hear(message.sender_id)
        self._settle_owed(message)
        self._process_repair(message, now_ms, events)
        # Acks first: with on_ack, a message naming ours may be what puts ours in the log.
        self._review_acks(message, now_ms, events)
        unmet = self._unmet(message)
        if kind is MessageKind.SYNC:
            self._record_missing(unmet, message.sender_id, now_ms, events)
            return events
        charge = 0
        if unmet:
            charge = waiting_charge(message, data, len(unmet))
            refused = self._make_room(len(unmet), charge, now_ms, events)
            if refused is not None:
                # Not recorded, not in our filter: the sender will resend and we try again.
                self.stats.count(self.stats.dropped, refused)
                events.append(MessageDropped(message.message_id, refused))
                return events
        self._add_to_bloom(message.message_id)
        events.append(
            MessageReceived(
                message.message_id, message.sender_id, message.lamport_timestamp or 0, len(unmet)
            )
        )
        if unmet:
            self._buffer(message, data, retrieval_hint, now_ms, unmet, charge, events)
        else:
            self._deliver(message, retrieval_hint, data, events)
        return events

    def _drop_reason(self, message: Message, now_ms: int) -> DropReason | None:
        if message.channel_id != self.channel_id:
            return DropReason.WRONG_CHANNEL
        if message.sender_id == self.participant_id:
            return DropReason.OWN_MESSAGE
        if message.kind is not MessageKind.CONTENT:
            return None
        if message.message_id in self._outgoing:
            return DropReason.ID_COLLISION  # another sender used the id of one of ours
        if self._seen(message.message_id):
            return DropReason.ID_COLLISION if self._collides(message) else DropReason.DUPLICATE
        skew = self.config.max_lamport_skew_ms
        if skew is not None and (message.lamport_timestamp or 0) > now_ms + skew:
            # Delivering it would drag our clock (and every later message) that far ahead.
            return DropReason.FUTURE_LAMPORT
        return None

    def _seen(self, message_id: str) -> bool:
        return (
            message_id in self._incoming
            or message_id in self._met_elsewhere
            or message_id in self._log
        )

    def _collides(self, message: Message) -> bool:
        """Whether a message with an id we hold is not the message we hold under it.

        A copy of the same message has the same sender and Lamport timestamp (and content,
        which we can compare while it waits); for entries that left the in-memory log
        only the id is known, so they count as duplicates.
        """
        waiting = self._incoming.get(message.message_id)
        if waiting is not None:
            held = waiting.message
            return (held.sender_id, held.lamport_timestamp, held.content) != (
                message.sender_id,
                message.lamport_timestamp,
                message.content,
            )
        entry = self._log.get(message.message_id)
        if entry is None:
            return False
        return (entry.sender_id, entry.lamport_timestamp) != (
            message.sender_id,
            message.lamport_timestamp or 0,
        )

    def _hear(self, sender_id: str) -> None:
        # Only whether there are at least `threshold` peers matters, so no more are kept.
        heard = self._heard
        if sender_id in heard or len(heard) >= self.config.possible_acks_threshold:
            return
        heard.add(sender_id)
        if self.journal is not None:
            self.journal.peers.append(sender_id)

    def _owe(self, message_id: str, sender_id: str) -> None:
        owed = self._owed
        owed[message_id] = sender_id
        if len(owed) > max(self.config.causal_history_size, 1):
            del owed[next(iter(owed))]

    def _settle_owed(self, message: Message) -> None:
        # A sender's own history names its message to nobody but us.
        owed = self._owed
        if owed:
            for message_id in owed.keys() & message.history_ids:
                if owed[message_id] != message.sender_id:
                    del owed[message_id]

    def _unmet(self, message: Message) -> list[HistoryEntry]:
        """Entries of a causal history that are not (yet) in our log, lost or met elsewhere."""
        # Set differences run in C; the first is nearly always empty. What is left is outside
        # the window, so only the history store remains to ask, one id at a time.
        absent = message.history_ids.difference(self._log.window)
        if not absent:
            return []
        absent = absent.difference(self._lost, self._met_elsewhere, (message.message_id,))
        evicted = self._log.history_store
        unmet = {mid for mid in absent if mid not in evicted}
        if not unmet:
            return []
        return [e for e in message.causal_history if e.message_id in unmet]

    def _buffer(
        self,
        message: Message,
        data: bytes | None,
        retrieval_hint: bytes | None,
        now_ms: int,
        unmet: list[HistoryEntry],
        charge: int,
        events: list[Event],
    ) -> None:
        waiting_id = message.message_id
        self._missing.remove(waiting_id)  # it arrived: it waits, it is not missing
        self._record_missing(unmet, message.sender_id, now_ms, events)
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
        unmet_ids = {e.message_id for e in unmet}
        self._incoming.add(WaitingMessage(message, data, retrieval_hint, now_ms, unmet_ids, charge))

    def _make_room(
        self, unmet: int, charge: int, now_ms: int, events: list[Event]
    ) -> DropReason | None:
        """Evict what the incoming buffer says must give way for a message with ``unmet``
        dependencies, charged ``charge`` bytes; or why it must be refused instead."""
        reason = self._incoming.over_cap(1, charge)
        if reason is None:
            return None
        victims = self._incoming.victims(unmet, charge)
        if victims is None:
            return reason
        for victim in victims:
            self._evict(victim, reason, now_ms, events)
        return None

    def _evict(
        self, waiting: WaitingMessage, reason: DropReason, now_ms: int, events: list[Event]
    ) -> None:
        message = waiting.message
        mid = message.message_id
        self._incoming.remove(mid)
        self.stats.count(self.stats.evicted, reason)
        events.append(
            MessageEvicted(
                mid,
                reason,
                message.sender_id,
                len(waiting.unmet),
                waiting.charge,
                waiting.retrieval_hint,
            )
        )
        if self._incoming.awaited(mid):  # others wait for it: a gap again, to be asked for
            entry = HistoryEntry(mid, waiting.retrieval_hint, message.sender_id)
            self._record_missing([entry], message.sender_id, now_ms, events)
        logger.log(
            logging.WARNING if sum(self.stats.evicted.values()) == 1 else logging.DEBUG,
            "channel %s: %s (%d messages, %d bytes); evicted %s from %s, waiting for %d"
            " (%d evicted so far)",
            self.channel_id,
            reason,
            len(self._incoming),
            self._incoming.bytes,
            mid,
            message.sender_id,
            len(waiting.unmet),
            sum(self.stats.evicted.values()),
        )

    def _record_missing(
        self, entries: list[HistoryEntry], named_by: str, now_ms: int, events: list[Event]
    ) -> None:
        """Dependencies we never received (not merely waiting ones) join the known missing;
        newly noticed ones are reported and asked for through SDS-R."""
        # The entries come from _unmet: none is in the log, lost or met elsewhere.
        incoming = self._incoming
        for entry in entries:
            if entry.message_id in incoming:
                continue
            new, evicted = self._missing.add(entry, named_by, now_ms)
            for gone in evicted:
                self._evicted_missing(gone, events)
            if new:
                events.append(missing_event(entry))
                if self._repair is not None:
                    self._repair.mark_missing(entry, now_ms)

    def _evicted_missing(self, gone: MissingDependency, events: list[Event]) -> None:
        self.stats.missing_evicted += 1
        if self._repair is not None:
            self._repair.requests.remove(gone.message_id)
        events.append(MessageMissingEvicted(gone.message_id))
        logger.log(
            logging.WARNING if self.stats.missing_evicted == 1 else logging.DEBUG,
            "channel %s: known-missing set full (%d ids, %d bytes); stopped tracking %s,"
            " named by %s (%d evicted so far)",
            self.channel_id,
            self.config.max_known_missing,
            self.config.max_known_missing_bytes,
            gone.message_id,
            gone.named_by,
            self.stats.missing_evicted,
        )

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
            self._missing.remove(mid)
            self._insert_log(LogEntry(mid, lamport, msg.sender_id, hint), raw, msg.content)
            self._owe(mid, msg.sender_id)
            events.append(MessageDelivered(mid, msg.sender_id, lamport, msg.content or b"", hint))
            for waiting in self._incoming.release(mid):
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

    def _bloom_evidence(self, message: Message) -> ReceivedFilter | None:
        """The message's bloom filter if it may be trusted, else None (counted, logged)."""
        data = message.bloom_filter
        if data is None:
            return None
        params = self.config.bloom
        if len(data) != params.n_bytes:
            if self.stats.bloom_wrong_size is None:
                self.stats.bloom_wrong_size = (message.sender_id, len(data))
            self._ignore_bloom(f"{len(data)} bytes, expected {params.n_bytes}", message.sender_id)
            return None
        bloom = received_filter(data, params)
        if bloom.false_positive_rate > self.config.max_bloom_false_positive_rate:
            self._ignore_bloom("saturated", message.sender_id)
            return None
        return bloom

    def _review_acks(self, message: Message, now_ms: int, events: list[Event]) -> None:
        outgoing = self._outgoing
        named = outgoing.keys() & message.history_ids if outgoing else ()
        for message_id in sorted(named):
            acked = outgoing[message_id]
            self._acknowledged(acked, message.sender_id, events, by_causal_history=True)
        implied = self._answers_implied(message)
        if not (outgoing or implied):
            return  # nothing reads the filter: it is not checked (nor distrusted, counted)
        bloom = self._bloom_evidence(message)
        if bloom is None:
            return
        if outgoing:
            self._review_bloom(bloom, message.sender_id, events)
        if implied:
            self._answer_implied_requests(message, bloom, now_ms)

    def _review_bloom(self, bloom: ReceivedFilter, sender_id: str, events: list[Event]) -> None:
        # Never more peers than we have heard from: in a two-member channel, the other
        # member's filter is all the evidence there can be.
        threshold = min(self.config.possible_acks_threshold, len(self._heard))
        outgoing = self._outgoing
        for mid, entry in list(outgoing.items()):
            if sender_id in entry.possible_ackers or not contains(bloom.data, entry.positions):
                continue
            entry.possible_ackers.add(sender_id)
            self._touch_outgoing(mid)
            count = len(entry.possible_ackers)
            if count >= threshold:
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
        """Settle one of our messages; with ``on_ack`` it enters our log only now."""
        mid = entry.message_id
        data = self._wires[mid] if self.config.own_log_policy == "on_ack" else None
        self._leave_outgoing(mid)
        events.append(MessageAcknowledged(mid, by_causal_history, acker_id))
        if data is not None:
            self._enter_own_log(entry, data)
            self._resolve_elsewhere(mid, events)

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

    def _answers_implied(self, message: Message) -> bool:
        return (
            message.kind is MessageKind.SYNC
            and self._repair is not None
            and self.config.repair.sync_repair_window > 0
        )

    def _answer_implied_requests(self, sync: Message, bloom: ReceivedFilter, now_ms: int) -> None:
        """Rebroadcast (SDS-R style) what the sync's sender shows it lacks, of what it
        has had ``t_min_ms`` to receive and its filter still holds; see :mod:`.repair`."""
        repair = self._repair
        assert repair is not None  # see _answers_implied
        settled = min(sync.lamport_timestamp or 0, now_ms) - repair.config.t_min_ms
        # A rolling filter keeps at least the newest capacity // 2 ids it took in: an
        # older id missing from it says nothing (tiny filters would "lack" everything).
        remembered = self.config.bloom.capacity // 2 - self._log.count_since(settled)
        window = min(repair.config.sync_repair_window, remembered)
        if window <= 0:
            return
        entries = self._log.newest_before(settled, window)
        # Nearly always the filter holds them all: one set operation says so.
        lacked = bloom.lacking({entry.message_id for entry in entries})
        if not lacked:
            return
        cached = self._wire_cache
        lacking = [
            entry.history_entry
            for entry in entries
            if entry.message_id in lacked
            and entry.sender_id != sync.sender_id
            and entry.message_id in cached
        ]
        repair.answer_implied(lacking, now_ms)

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
        """Report every known missing dependency; past the lost timeout, declare it lost.

        A gap expires ``lost_timeout_ms`` after it was first seen, and a waiting message
        that long after it arrived is delivered without whatever it still waits for.
        Gaps that SDS-R stopped asking for (its buffer was full) are asked for again.
        """
        events: list[Event] = []
        timeout = self.config.lost_timeout_ms
        if timeout is not None:
            for gone in self._missing.expired(now_ms, timeout):
                self._declare_lost(gone.message_id, events)
            for waiting in self._incoming.expired(now_ms, timeout):
                self._give_up_waiting(waiting, events)
        missing = [known.entry for known in self._missing]
        if self._repair is not None:
            self._repair.request_again(missing, now_ms)
        events.extend(missing_event(entry) for entry in missing)
        return IncomingSweep(missing, events)

    def _declare_lost(self, dependency_id: str, events: list[Event]) -> None:
        self._set_lost(dependency_id, True)
        self._missing.remove(dependency_id)
        if self._repair is not None:
            self._repair.requests.remove(dependency_id)
        events.append(MessageLost(dependency_id))
        self._resolve_elsewhere(dependency_id, events)

    def _give_up_waiting(self, waiting: WaitingMessage, events: list[Event]) -> None:
        mid = waiting.message_id
        if mid not in self._incoming:
            return  # released while handling an earlier expired message
        for dep_id in sorted(waiting.unmet):
            if dep_id in self._incoming:
                # Not lost, only waiting too: its delivery no longer releases this message,
                # which is delivered below without it; it stays among the unmet, so that
                # the releases of the lost ones do not count this message ready meanwhile.
                self._incoming.unindex(mid, dep_id)
                continue
            self._declare_lost(dep_id, events)
        if mid in self._incoming:  # only waiting on other buffered messages now
            waiting.unmet.clear()
            self._incoming.remove(mid)
            self._deliver(waiting.message, waiting.retrieval_hint, waiting.data, events)

    def _resolve_elsewhere(self, dependency_id: str, events: list[Event]) -> None:
        for waiting in list(self._incoming.release(dependency_id)):
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
            self._missing.remove(mid)
            if self.journal is not None:
                self.journal.met_elsewhere.append(mid)
            if self._repair is not None:
                self._repair.mark_received(mid)
            self._resolve_elsewhere(mid, events)
        return events

    def drop_volatile_state(self) -> None:
        """Forget what a crash loses when only the log and outgoing buffer are durable:
        the incoming buffer, the known missing ids and the SDS-R schedules. What was lost
        is learnt again from later causal histories, repairs and stores."""
        self._incoming.clear()
        self._missing.clear()
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
            self._missing.touched = self.journal.missing
            self._incoming.touched = self.journal.incoming
            if self._repair is not None:
                self._repair.attach_journal(self.journal)
        return self.journal

    def use_wire_store(self, store: WireStore) -> None:
        """Keep the outgoing buffer's wire bytes in ``store`` (before anything is sent)."""
        if self._outgoing:
            raise LocalProtocolError("the wire store can only change while nothing is outgoing")
        self._wires = store

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
        self._wire_cache = dict(snapshot.wire_cache)
        self._heard = set(list(snapshot.peers_heard)[: self.config.possible_acks_threshold])
        self._missing.restore(snapshot.missing)
        for out in snapshot.outgoing:
            self._restore_outgoing(out)
        for stored in snapshot.incoming:
            message = decode(stored.data, limits)
            unmet = self._unmet(message)
            for entry in unmet:  # state stored before gaps were kept knows them only here
                self._missing.add(entry, message.sender_id, stored.received_ms)
            self._incoming.restore(stored, message, unmet)
        for waiting in self._incoming:  # it arrived, whatever else named it
            self._missing.remove(waiting.message_id)
        if self._repair is not None:
            self._repair.restore(snapshot.repair_requests, snapshot.repair_responses)
        if self.journal is not None:
            self.journal.clear()  # restoring changes nothing that is not stored already

    def _restore_outgoing(self, stored: StoredOutgoing) -> None:
        message = decode(stored.data, self.config.limits)
        mid = message.message_id
        self._outgoing[mid] = OutgoingEntry(
            mid,
            message.lamport_timestamp or 0,
            message.content or b"",
            self.config.bloom.positions(mid),
            stored.first_sent_ms,
            stored.last_sent_ms,
            stored.attempts,
            set(stored.possible_ackers),
            stored.retrieval_hint,
        )
        if mid not in self._wires:  # a durable wire store holds them already
            self._wires[mid] = stored.data

    def stored_incoming(self, message_id: str) -> StoredIncoming | None:
        """A waiting message as it must be stored (None once it left the buffer)."""
        return self._incoming.stored(message_id)

    def stored_outgoing(self, message_id: str) -> StoredOutgoing | None:
        """An unacknowledged message as it must be stored (None once it left the buffer)."""
        entry = self._outgoing.get(message_id)
        if entry is None:
            return None
        return StoredOutgoing(
            self._wires[message_id],
            entry.first_sent_ms,
            entry.last_sent_ms,
            entry.attempts,
            frozenset(entry.possible_ackers),
            entry.retrieval_hint,
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
        return [waiting.message_id for waiting in self._incoming]

    def outgoing_ids(self) -> list[str]:
        return list(self._outgoing)

    def buffer_sizes(self) -> tuple[int, int]:
        """How many messages wait in the incoming buffer and in the outgoing buffer."""
        return len(self._incoming), len(self._outgoing)

    def incoming_bytes(self) -> int:
        """What the incoming buffer's messages count against its byte budget."""
        return self._incoming.bytes

    def outgoing_entry(self, message_id: str) -> OutgoingEntry | None:
        return self._outgoing.get(message_id)

    def unmet_dependencies(self, message_id: str) -> list[str]:
        """What a message in the incoming buffer still waits for (empty if not waiting)."""
        waiting = self._incoming.get(message_id)
        return sorted(waiting.unmet) if waiting is not None else []

    def bloom_inserted(self) -> int:
        """How many ids ever entered our bloom filter (rollover state depends on it)."""
        return self._bloom.inserted

    def acknowledgements_owed(self) -> int:
        """Delivered content of others no message since acknowledged to its sender."""
        return len(self._owed)

    def missing_ids(self) -> list[str]:
        """Known missing dependencies, oldest first sighting first."""
        return [known.message_id for known in self._missing]

    def missing_count(self) -> int:
        return len(self._missing)

    def missing_bytes(self) -> int:
        """What the known-missing set counts against its byte budget."""
        return self._missing.bytes

    def missing_dependency(self, message_id: str) -> MissingDependency | None:
        """What we know of a missing dependency (None if it is not known missing)."""
        return self._missing.get(message_id)

    def peers_heard(self) -> list[str]:
        """Peers heard from in this channel, at most ``possible_acks_threshold`` of them."""
        return sorted(self._heard)
