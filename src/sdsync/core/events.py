"""Events the protocol engine returns to its caller (h11 style: values, not callbacks).

Every state-changing call on a :class:`~sdsync.core.MessageChannel` returns the list of
events it caused, in order. The runtime turns them into I/O and application callbacks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sdsync.wire import HistoryEntry


@dataclass(frozen=True, slots=True)
class Event:
    """Base class; ``type`` is the stable name used in JSON (see ``sdsync peer``)."""

    message_id: str

    type = "event"


@dataclass(frozen=True, slots=True)
class MessageSent(Event):
    """Our content message was handed to the transport (and entered our log, on_send)."""

    lamport_timestamp: int
    type = "message_sent"


@dataclass(frozen=True, slots=True)
class MessageReceived(Event):
    """A content message arrived; ``unmet_dependencies`` of its causal history are not in
    our log yet (it waits for them in the incoming buffer)."""

    sender_id: str
    lamport_timestamp: int
    unmet_dependencies: int
    type = "message_received"


@dataclass(frozen=True, slots=True)
class MessageDelivered(Event):
    """A content message's causal dependencies are all met; it is in the local log."""

    sender_id: str
    lamport_timestamp: int
    content: bytes
    retrieval_hint: bytes | None
    type = "message_delivered"


@dataclass(frozen=True, slots=True)
class MessageDeliveredEarly(Event):
    """A content message shown before its dependencies are met (``deliver_early``).

    ``missing_dependencies`` of its causal history have not arrived: the application may
    show it with "N earlier messages missing". A :class:`MessageDelivered` for the same id
    follows once it takes its place in the log; neither kind is ever repeated, unless a
    :class:`MessageEvicted` for it came between (it is then received as new if it comes
    again).
    """

    sender_id: str
    lamport_timestamp: int
    content: bytes
    retrieval_hint: bytes | None
    missing_dependencies: int
    type = "message_delivered_early"


@dataclass(frozen=True, slots=True)
class EphemeralReceived(Event):
    """An ephemeral message: delivered at once, never logged, buffered or acknowledged."""

    sender_id: str
    content: bytes
    type = "ephemeral_received"


@dataclass(frozen=True, slots=True)
class MessageAcknowledged(Event):
    """One of our messages left the outgoing buffer: a peer has it.

    ``acker_id`` is the peer whose message settled it (named it in its causal history, or
    was the last of the distinct peers whose bloom filters contained it).
    """

    by_causal_history: bool
    acker_id: str
    type = "message_acknowledged"


@dataclass(frozen=True, slots=True)
class MessagePossiblyAcknowledged(Event):
    """A bloom filter from a new distinct peer (``acker_id``) contains one of our messages.

    ``count`` distinct peers' filters have contained it so far, still fewer than
    ``ChannelConfig.possible_acks_threshold`` (reaching it acknowledges the message).
    """

    count: int
    acker_id: str
    type = "message_possibly_acknowledged"


@dataclass(frozen=True, slots=True)
class MessageMissing(Event):
    """A dependency we have never received; retrieve it with the hint if possible."""

    retrieval_hint: bytes | None
    sender_id: str | None
    type = "message_missing"


@dataclass(frozen=True, slots=True)
class MessageMissingEvicted(Event):
    """A missing dependency we stopped tracking: the known-missing set was full (in
    count or in bytes).

    It is no longer reported by incoming sweeps or asked for, unless a later causal
    history names it again (see ``ChannelConfig.max_known_missing`` and
    ``max_known_missing_bytes``).
    """

    type = "message_missing_evicted"


@dataclass(frozen=True, slots=True)
class MessageLost(Event):
    """A dependency given up on after the lost timeout; its dependents stop waiting for it
    (those that waited for nothing else are delivered)."""

    type = "message_lost"


class DropReason(enum.StrEnum):
    """Why an incoming message was discarded; the values are the stable strings of JSON
    output and metric labels."""

    WRONG_CHANNEL = "wrong channel"
    OWN_MESSAGE = "own message"
    DUPLICATE = "duplicate"
    ID_COLLISION = "id collision"
    FUTURE_LAMPORT = "lamport timestamp too far in the future"
    INCOMING_BUFFER_FULL = "incoming buffer full"
    INCOMING_BUFFER_BYTES = "incoming buffer over its byte budget"

    @property
    def bad_input(self) -> bool:
        """A well-formed message that is still a peer's bad input (not a copy, an echo of
        ours, a collision an honest js-waku peer can cause, or our own lack of room)."""
        return self in (DropReason.WRONG_CHANNEL, DropReason.FUTURE_LAMPORT)


@dataclass(frozen=True, slots=True)
class MessageDropped(Event):
    """An incoming message we discarded without changing state, and why."""

    reason: DropReason
    type = "message_dropped"


@dataclass(frozen=True, slots=True)
class MessageEvicted(Event):
    """A message waiting in the incoming buffer that we discarded to make room for a
    newer one: ``reason`` is the cap it would have broken (``INCOMING_BUFFER_FULL``: the
    message count, ``INCOMING_BUFFER_BYTES``: the byte budget).

    It had ``unmet_dependencies`` still missing and was charged ``size_bytes`` (see
    ``ChannelConfig.max_incoming_buffer_bytes``). No :class:`MessageDelivered` follows
    for it unless it arrives again — a later causal history naming it makes it missing,
    so retrieval asks for it; a store catch-up fetches it again by ``retrieval_hint``, the
    envelope hash it came with — and then it is received as new.
    """

    reason: DropReason
    sender_id: str
    unmet_dependencies: int
    size_bytes: int
    retrieval_hint: bytes | None = None
    type = "message_evicted"


@dataclass(frozen=True, slots=True)
class SendFailed(Event):
    """The caller gave up on one of our messages (the runtime does after ``max_attempts``):
    it left the outgoing buffer unacknowledged and is never resent."""

    type = "send_failed"


@dataclass(frozen=True, slots=True)
class SyncSent(Event):
    """We built a sync message (``message_id`` is its own id) at ``lamport_timestamp``."""

    lamport_timestamp: int
    type = "sync_sent"


@dataclass(frozen=True, slots=True)
class SyncReceived(Event):
    """A sync message from ``sender_id`` arrived."""

    sender_id: str
    type = "sync_received"


@dataclass(frozen=True, slots=True)
class SyncStatus(Event):
    """The channel's sync state changed (``message_id`` is empty: it is about the channel).

    Synced means nothing is missing, waiting or outstanding; otherwise the channel is
    syncing: ``missing`` dependencies were never received, ``waiting`` received messages
    are held back for them, ``outstanding`` of our messages are not acknowledged yet.
    ``catching_up`` while a store catch-up (:class:`~sdsync.runtime.CatchUp`) runs; it
    does not make the channel unsynced: catch-ups are periodic, and what one finds shows
    up in the other counts.
    """

    missing: int
    waiting: int
    outstanding: int
    catching_up: bool = False
    type = "sync_status"

    @property
    def synced(self) -> bool:
        return not (self.missing or self.waiting or self.outstanding)


@dataclass(frozen=True, slots=True)
class RepairRequestSent(Event):
    """We asked the group to rebroadcast ``message_id`` (carried by another message)."""

    carrier_message_id: str
    type = "repair_request_sent"


@dataclass(frozen=True, slots=True)
class RepairRequestReceived(Event):
    """``sender_id`` asked the group to rebroadcast ``message_id`` (SDS-R)."""

    sender_id: str
    type = "repair_request_received"


@dataclass(frozen=True, slots=True)
class RepairResponseSent(Event):
    """We rebroadcast ``message_id`` (SDS-R: a peer asked for it, or a sync's bloom filter
    lacked it)."""

    type = "repair_response_sent"


def missing_event(entry: HistoryEntry) -> MessageMissing:
    return MessageMissing(entry.message_id, entry.retrieval_hint, entry.sender_id)
