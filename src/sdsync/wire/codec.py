"""SDS wire codec: typed messages <-> protobuf bytes, byte-identical to @waku/sds 0.0.8.

Theory of operation
-------------------
The schema lives in ``sds_message.proto`` and is compiled with the official protobuf
compiler; this module only converts between the generated classes and our immutable
:class:`Message` values. The upb encoder writes fields in field-number order, omits empty
proto3 strings and writes ``optional`` fields whenever they are set — exactly what the JS
encoder does — so equal logical messages give equal bytes.

Speed comes from one schema fact: an embedded message and a ``bytes`` field share the
same encoding. ``SdsMessageView`` declares the history entries as ``bytes``, so a message
of 200 entries parses and serialises in bulk, and each distinct entry is converted to or
from its serialized form only once (entries recur in many consecutive messages).

Decoding treats its input as hostile: the frame size is checked before parsing, every
parser failure becomes :class:`~sdsync.errors.RemoteProtocolError`, and field sizes are
bounded by :class:`WireLimits`; each rejection carries its
:class:`~sdsync.errors.RejectReason`. The message *kind* is derived from field presence:

* content   — Lamport timestamp set and content non-empty
* sync      — Lamport timestamp set and content absent or empty
* ephemeral — no Lamport timestamp and content non-empty

Anything else is not an SDS message and is rejected.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError
from sdsync.wire import sds_message_pb2 as pb
from sdsync.wire.untrusted import parse_untrusted

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
    _wire: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def to_bytes(self) -> bytes:
        """The entry's serialized form, computed once (entries recur in ~200 messages)."""
        wire = self._wire
        if wire is None:
            out = pb.HistoryEntry(message_id=self.message_id)
            if self.retrieval_hint is not None:
                out.retrieval_hint = self.retrieval_hint
            if self.sender_id is not None:
                out.sender_id = self.sender_id
            wire = out.SerializeToString()
            object.__setattr__(self, "_wire", wire)
        return wire


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
    _history_ids: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def history_ids(self) -> frozenset[str]:
        """Ids of the causal history as a set (computed once; receivers share a message)."""
        ids = self._history_ids
        if ids is None:
            ids = frozenset(e.message_id for e in self.causal_history)
            object.__setattr__(self, "_history_ids", ids)
        return ids

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
    """js-waku's message id: lowercase hex sha256 of the payload (identical bytes collide)."""
    return hashlib.sha256(payload).hexdigest()


def message_id_for_sender(sender_id: str, lamport_timestamp: int, payload: bytes) -> str:
    """sdsync's default message id: lowercase hex sha256 over sender, timestamp and payload.

    The hashed bytes are ``len(sender) (4 bytes, big-endian) || sender (UTF-8) ||
    lamport_timestamp (8 bytes, big-endian) || payload``: the length prefix keeps the
    sender/timestamp boundary unambiguous, so no two different triples hash the same
    bytes, and one participant's Lamport timestamps never repeat, so the same payload sent
    twice, or by two participants, gets two ids.
    """
    sender = sender_id.encode()
    if not 0 <= lamport_timestamp <= MAX_UINT64:
        raise LocalProtocolError(f"lamport timestamp {lamport_timestamp} is not a uint64")
    digest = hashlib.sha256(len(sender).to_bytes(4, "big") + sender)
    digest.update(lamport_timestamp.to_bytes(8, "big"))
    digest.update(payload)
    return digest.hexdigest()


def encode(message: Message, history: EncodedHistory | None = None) -> bytes:
    """Serialise a message; raises LocalProtocolError if it is not a valid SDS message.

    ``history``, when it holds the very tuple the message quotes, supplies that causal
    history's bytes ready-made (see :class:`EncodedHistory`); any other history is
    encoded here.
    """
    message.kind  # noqa: B018 — validates field presence before we emit bytes
    lamport = message.lamport_timestamp
    if lamport is not None and not 0 <= lamport <= MAX_UINT64:
        raise LocalProtocolError(f"lamport timestamp {lamport} is not a uint64")
    if history is None or history.entries is not message.causal_history:
        history = EncodedHistory.of(message.causal_history)
    parts = [
        _string_field(b"\x0a", message.sender_id),
        _string_field(b"\x12", message.message_id),
        _string_field(b"\x1a", message.channel_id),
    ]
    if lamport is not None:
        parts.append(b"\x50" + uvarint(lamport))
    parts += history.frames
    if message.bloom_filter is not None:
        parts += (b"\x62", uvarint(len(message.bloom_filter)), message.bloom_filter)
    parts += map(_repair_frame, message.repair_request)
    if message.content is not None:
        parts += (b"\xa2\x01", uvarint(len(message.content)), message.content)
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class EncodedHistory:
    """A causal history with its encoding (field 11, every entry framed), for a sender.

    A sender quotes the newest entries of its log, so consecutive messages share all but
    the oldest and the newest: :meth:`slide` builds the next history from the previous
    one by encoding only the entries that are new, instead of all ~200 of them.
    """

    entries: tuple[HistoryEntry, ...] = ()
    # Each entry as one element of field 11: tag, length, entry bytes.
    frames: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, entries: tuple[HistoryEntry, ...]) -> EncodedHistory:
        return cls(entries, tuple(map(_history_frame, entries)))

    def slide(self, drop: int, added: tuple[HistoryEntry, ...]) -> EncodedHistory:
        """This history without its ``drop`` oldest entries and with ``added`` after it."""
        frames = self.frames[drop:] + tuple(map(_history_frame, added))
        return EncodedHistory(self.entries[drop:] + added, frames)


def _framed(tag: bytes, entry: HistoryEntry) -> bytes:
    """A history entry as one element of a repeated field: tag, length, entry bytes."""
    raw = entry.to_bytes()
    return tag + uvarint(len(raw)) + raw


_history_frame = functools.partial(_framed, b"\x5a")  # field 11, causal_history
_repair_frame = functools.partial(_framed, b"\x6a")  # field 13, repair_request


def _string_field(tag: bytes, value: str) -> bytes:
    """A proto3 string field: omitted when empty, as upb and the JS encoder do."""
    if not value:
        return b""
    raw = value.encode()
    return tag + uvarint(len(raw)) + raw


def uvarint(value: int) -> bytes:
    """``value`` as a protobuf varint (base 128, least significant group first)."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> Message:
    """Parse untrusted bytes. Raises only RemoteProtocolError."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise LocalProtocolError(f"decode expects bytes, got {type(data).__name__}")
    if len(data) > limits.max_message_bytes:
        raise RemoteProtocolError(
            f"message of {len(data)} bytes exceeds the limit of {limits.max_message_bytes}",
            reason=RejectReason.MESSAGE_TOO_LARGE,
        )
    parsed = parse_untrusted(pb.SdsMessageView, bytes(data), "SDS message", RejectReason.MALFORMED)
    return _from_view(parsed, limits)


def _from_view(parsed: pb.SdsMessageView, limits: WireLimits) -> Message:
    lamport = parsed.lamport_timestamp if parsed.HasField("lamport_timestamp") else None
    content = parsed.content if parsed.HasField("content") else None
    if classify(lamport, content) is None:
        raise RemoteProtocolError(
            "neither content, sync nor ephemeral: no lamport and no content",
            reason=RejectReason.NO_KIND,
        )
    if lamport is not None and lamport > limits.max_lamport_timestamp:
        raise RemoteProtocolError(
            f"lamport timestamp {lamport} is beyond any plausible clock",
            reason=RejectReason.IMPLAUSIBLE_LAMPORT,
        )
    for name in ("sender_id", "message_id", "channel_id"):
        _check_id(name, getattr(parsed, name), limits)
    if not parsed.message_id:
        raise RemoteProtocolError("message_id is empty", reason=RejectReason.EMPTY_MESSAGE_ID)
    bloom = parsed.bloom_filter if parsed.HasField("bloom_filter") else None
    if bloom is not None and len(bloom) > limits.max_bloom_bytes:
        raise RemoteProtocolError(
            f"bloom filter of {len(bloom)} bytes exceeds the limit",
            reason=RejectReason.FIELD_TOO_LARGE,
        )
    if len(parsed.causal_history) > limits.max_causal_history:
        raise RemoteProtocolError(
            f"causal history of {len(parsed.causal_history)} entries exceeds the limit "
            f"of {limits.max_causal_history}",
            reason=RejectReason.FIELD_TOO_LARGE,
        )
    if len(parsed.repair_request) > limits.max_repair_requests:
        raise RemoteProtocolError(
            f"{len(parsed.repair_request)} repair requests exceed the limit "
            f"of {limits.max_repair_requests}",
            reason=RejectReason.FIELD_TOO_LARGE,
        )
    return Message(
        sender_id=parsed.sender_id,
        message_id=parsed.message_id,
        channel_id=parsed.channel_id,
        lamport_timestamp=lamport,
        causal_history=_entries(parsed.causal_history, limits),
        bloom_filter=bloom,
        content=content,
        repair_request=_entries(parsed.repair_request, limits),
    )


class _EntryCache:
    """Serialized entry -> parsed entry. A causal history slides by one entry per message,
    so almost every entry of a received message was seen in the previous one.

    Bounded in entries and in bytes: a peer sending endless fresh entries only makes us
    clear it now and then, and one naming ids of the largest size (a 256-character id of
    wide characters is 1 kB of UTF-8, and its parsed copy more) cannot make the entry
    bound a few hundred megabytes that no channel budget counts. The byte bound is on the
    serialized entries; what Python holds for them is a few times that.
    """

    __slots__ = ("entries", "raw_bytes")

    def __init__(self) -> None:
        self.entries: dict[bytes, HistoryEntry] = {}
        self.raw_bytes = 0

    def put(self, raw: bytes, parsed: HistoryEntry) -> None:
        if (
            len(self.entries) >= ENTRY_CACHE_ENTRIES
            or self.raw_bytes + len(raw) > ENTRY_CACHE_BYTES
        ):
            self.entries.clear()
            self.raw_bytes = 0
        self.entries[raw] = parsed
        self.raw_bytes += len(raw)


_ENTRY_CACHES: dict[WireLimits, _EntryCache] = {}
ENTRY_CACHE_ENTRIES = 1 << 16
# About 65,536 honest entries (a 64-character id, a 32-byte hint, a short sender), or
# 5,000 of the largest.
ENTRY_CACHE_BYTES = 8 << 20


def _entries(raw_entries: Iterable[bytes], limits: WireLimits) -> tuple[HistoryEntry, ...]:
    cache = _ENTRY_CACHES.get(limits)
    if cache is None:
        cache = _ENTRY_CACHES[limits] = _EntryCache()
    raws = list(raw_entries)
    found = list(map(cache.entries.get, raws))
    if not all(found):
        for i, known in enumerate(found):
            if known is None:
                parsed = found[i] = _parse_entry(raws[i], limits)
                cache.put(raws[i], parsed)
    return tuple(found)  # type: ignore[arg-type]


def entry_cache_bytes(limits: WireLimits) -> int:
    """Serialized bytes of the parsed history entries kept for messages decoded under
    ``limits`` (at most ``ENTRY_CACHE_BYTES``)."""
    cache = _ENTRY_CACHES.get(limits)
    return cache.raw_bytes if cache is not None else 0


def _parse_entry(raw: bytes, limits: WireLimits) -> HistoryEntry:
    parsed = parse_untrusted(pb.HistoryEntry, raw, "history entry", RejectReason.MALFORMED)
    if not parsed.message_id:
        raise RemoteProtocolError(
            "history entry with an empty message_id", reason=RejectReason.EMPTY_MESSAGE_ID
        )
    _check_id("history message_id", parsed.message_id, limits)
    sender = parsed.sender_id if parsed.HasField("sender_id") else None
    if sender is not None:
        _check_id("history sender_id", sender, limits)
    hint = parsed.retrieval_hint if parsed.HasField("retrieval_hint") else None
    if hint is not None and len(hint) > limits.max_retrieval_hint_bytes:
        raise RemoteProtocolError(
            f"retrieval hint of {len(hint)} bytes exceeds the limit",
            reason=RejectReason.FIELD_TOO_LARGE,
        )
    return HistoryEntry(parsed.message_id, hint, sender)


def _check_id(name: str, value: str, limits: WireLimits) -> None:
    if len(value) > limits.max_id_length:
        raise RemoteProtocolError(
            f"{name} of {len(value)} characters exceeds the limit of {limits.max_id_length}",
            reason=RejectReason.FIELD_TOO_LARGE,
        )


__all__ = [
    "DEFAULT_LIMITS",
    "EncodedHistory",
    "HistoryEntry",
    "Message",
    "MessageKind",
    "WireLimits",
    "classify",
    "decode",
    "encode",
    "message_id_for",
    "message_id_for_sender",
]
