"""SDS wire codec: typed messages <-> protobuf bytes, byte-identical to @waku/sds 0.0.8.

Theory of operation
-------------------
The schema lives in ``sds_message.proto`` and is compiled with the official protobuf
compiler; this module only converts between the generated classes and our immutable
:class:`Message` values. The upb encoder writes fields in field-number order, omits empty
proto3 strings and writes ``optional`` fields whenever they are set — exactly what the JS
encoder does — so equal logical messages give equal bytes.

Decoding treats its input as hostile: the frame size is checked before parsing, every
parser failure becomes :class:`~sdsync.errors.RemoteProtocolError`, and field sizes are
bounded by :class:`WireLimits`. The message *kind* is derived from field presence:

* content   — Lamport timestamp set and content non-empty
* sync      — Lamport timestamp set and content absent or empty
* ephemeral — no Lamport timestamp and content non-empty

Anything else is not an SDS message and is rejected.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.wire import sds_message_pb2 as pb

MAX_UINT64 = (1 << 64) - 1


class MessageKind(enum.Enum):
    CONTENT = "content"
    SYNC = "sync"
    EPHEMERAL = "ephemeral"


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """A reference to an earlier message: its id, how to fetch it, and who sent it."""

    message_id: str
    retrieval_hint: bytes | None = None
    sender_id: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One SDS message as it travels on the wire."""

    sender_id: str
    message_id: str
    channel_id: str
    lamport_timestamp: int | None = None
    causal_history: tuple[HistoryEntry, ...] = ()
    bloom_filter: bytes | None = None
    content: bytes | None = None
    repair_request: tuple[HistoryEntry, ...] = ()

    @property
    def kind(self) -> MessageKind:
        kind = classify(self.lamport_timestamp, self.content)
        if kind is None:
            raise LocalProtocolError("a message needs a Lamport timestamp, content, or both")
        return kind


def classify(lamport_timestamp: int | None, content: bytes | None) -> MessageKind | None:
    """The kind implied by field presence, or None for an invalid combination."""
    if lamport_timestamp is not None:
        return MessageKind.CONTENT if content else MessageKind.SYNC
    return MessageKind.EPHEMERAL if content else None


@dataclass(frozen=True, slots=True)
class WireLimits:
    """Upper bounds on what a remote peer may send us."""

    max_message_bytes: int = 1 << 20
    max_id_length: int = 256
    max_retrieval_hint_bytes: int = 256
    max_causal_history: int = 4096
    max_repair_requests: int = 64
    max_bloom_bytes: int = 1 << 19
    # Far beyond any millisecond clock; keeps a hostile timestamp from overflowing uint64
    # when we later send max(ts + 1, now).
    max_lamport_timestamp: int = (1 << 63) - 1


DEFAULT_LIMITS = WireLimits()


def message_id_for(payload: bytes) -> str:
    """The js-compatible default message id: lowercase hex sha256 of the payload."""
    return hashlib.sha256(payload).hexdigest()


def encode(message: Message) -> bytes:
    """Serialise a message; raises LocalProtocolError if it is not a valid SDS message."""
    message.kind  # noqa: B018 — validates field presence before we emit bytes
    if message.lamport_timestamp is not None and not 0 <= message.lamport_timestamp <= MAX_UINT64:
        raise LocalProtocolError(f"lamport timestamp {message.lamport_timestamp} is not a uint64")
    out = pb.SdsMessage(
        sender_id=message.sender_id,
        message_id=message.message_id,
        channel_id=message.channel_id,
        causal_history=[_entry_to_pb(e) for e in message.causal_history],
        repair_request=[_entry_to_pb(e) for e in message.repair_request],
    )
    if message.lamport_timestamp is not None:
        out.lamport_timestamp = message.lamport_timestamp
    if message.bloom_filter is not None:
        out.bloom_filter = message.bloom_filter
    if message.content is not None:
        out.content = message.content
    return out.SerializeToString()


def _entry_to_pb(entry: HistoryEntry) -> pb.HistoryEntry:
    out = pb.HistoryEntry(message_id=entry.message_id)
    if entry.retrieval_hint is not None:
        out.retrieval_hint = entry.retrieval_hint
    if entry.sender_id is not None:
        out.sender_id = entry.sender_id
    return out


def decode(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> Message:
    """Parse untrusted bytes. Raises only RemoteProtocolError."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise LocalProtocolError(f"decode expects bytes, got {type(data).__name__}")
    if len(data) > limits.max_message_bytes:
        raise RemoteProtocolError(
            f"message of {len(data)} bytes exceeds the limit of {limits.max_message_bytes}"
        )
    parsed = pb.SdsMessage()
    try:
        parsed.ParseFromString(bytes(data))
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise RemoteProtocolError(f"malformed SDS message: {exc}") from None
    return _from_pb(parsed, limits)


def _from_pb(parsed: pb.SdsMessage, limits: WireLimits) -> Message:
    lamport = parsed.lamport_timestamp if parsed.HasField("lamport_timestamp") else None
    content = parsed.content if parsed.HasField("content") else None
    if classify(lamport, content) is None:
        raise RemoteProtocolError("neither content, sync nor ephemeral: no lamport and no content")
    if lamport is not None and lamport > limits.max_lamport_timestamp:
        raise RemoteProtocolError(f"lamport timestamp {lamport} is beyond any plausible clock")
    for name in ("sender_id", "message_id", "channel_id"):
        _check_id(name, getattr(parsed, name), limits)
    if not parsed.message_id:
        raise RemoteProtocolError("message_id is empty")
    bloom = parsed.bloom_filter if parsed.HasField("bloom_filter") else None
    if bloom is not None and len(bloom) > limits.max_bloom_bytes:
        raise RemoteProtocolError(f"bloom filter of {len(bloom)} bytes exceeds the limit")
    if len(parsed.causal_history) > limits.max_causal_history:
        raise RemoteProtocolError(
            f"causal history of {len(parsed.causal_history)} entries exceeds the limit "
            f"of {limits.max_causal_history}"
        )
    if len(parsed.repair_request) > limits.max_repair_requests:
        raise RemoteProtocolError(
            f"{len(parsed.repair_request)} repair requests exceed the limit "
            f"of {limits.max_repair_requests}"
        )
    return Message(
        sender_id=parsed.sender_id,
        message_id=parsed.message_id,
        channel_id=parsed.channel_id,
        lamport_timestamp=lamport,
        causal_history=_entries_from_pb(parsed.causal_history, limits),
        bloom_filter=bloom,
        content=content,
        repair_request=_entries_from_pb(parsed.repair_request, limits),
    )


def _entries_from_pb(entries: object, limits: WireLimits) -> tuple[HistoryEntry, ...]:
    out = []
    for raw in entries:  # type: ignore[attr-defined]
        entry = HistoryEntry(
            message_id=raw.message_id,
            retrieval_hint=raw.retrieval_hint if raw.HasField("retrieval_hint") else None,
            sender_id=raw.sender_id if raw.HasField("sender_id") else None,
        )
        if not entry.message_id:
            raise RemoteProtocolError("history entry with an empty message_id")
        _check_id("history message_id", entry.message_id, limits)
        if entry.sender_id is not None:
            _check_id("history sender_id", entry.sender_id, limits)
        hint = entry.retrieval_hint
        if hint is not None and len(hint) > limits.max_retrieval_hint_bytes:
            raise RemoteProtocolError(f"retrieval hint of {len(hint)} bytes exceeds the limit")
        out.append(entry)
    return tuple(out)


def _check_id(name: str, value: str, limits: WireLimits) -> None:
    if len(value) > limits.max_id_length:
        raise RemoteProtocolError(
            f"{name} of {len(value)} characters exceeds the limit of {limits.max_id_length}"
        )


__all__ = [
    "DEFAULT_LIMITS",
    "HistoryEntry",
    "Message",
    "MessageKind",
    "WireLimits",
    "classify",
    "decode",
    "encode",
    "message_id_for",
]
