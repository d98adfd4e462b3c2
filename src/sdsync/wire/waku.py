"""The Waku envelope: WakuMessage codec and the deterministic message hash.

Theory of operation
-------------------
On the p2p network and in store archives an SDS message is the ``payload`` of a
WakuMessage (14/WAKU2-MESSAGE) published on a *pubsub topic* with a *content topic*.
Stores index messages by the deterministic message hash::

    sha256(pubsub_topic || payload || content_topic || meta || timestamp as 8-byte big-endian)

which is also the SDS *retrieval hint*: whoever holds the hint can ask any store for
the message. The hash covers neither ``version`` nor ``ephemeral``, and a message with
no timestamp hashes without the trailing 8 bytes (nwaku's rule).

Decoding treats its input as hostile: every failure is a
:class:`~sdsync.errors.RemoteProtocolError` (``OVERSIZED`` or ``NOT_WAKU_MESSAGE``), sizes
are bounded before parsing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError
from sdsync.wire import waku_message_pb2 as pb
from sdsync.wire.untrusted import parse_untrusted

#: nwaku's default maximum message size (150 KiB payload plus envelope).
MAX_WAKU_MESSAGE_BYTES = 150 * 1024 + 4096
#: A deterministic message hash: SHA-256.
HASH_SIZE = 32
#: Of a pubsub or a content topic, in UTF-8: both go into PostgreSQL index entries,
#: which may not exceed 2,704 bytes.
MAX_TOPIC_BYTES = 1024
#: How far ahead of the node's clock a message timestamp may be (nwaku's
#: ``MaxMessageTimestampVariance``).
DEFAULT_TIMESTAMP_VARIANCE_S = 20.0
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class WakuMessage:
    """A WakuMessage as published on a pubsub topic.

    ``timestamp`` is Unix time in nanoseconds (``None`` when the sender set none).
    """

    payload: bytes
    content_topic: str
    timestamp: int | None = None
    meta: bytes = b""
    version: int = 0
    ephemeral: bool = False

    def __post_init__(self) -> None:
        if not self.content_topic:
            raise LocalProtocolError("a WakuMessage needs a content topic")
        if self.timestamp is not None and not _INT64_MIN <= self.timestamp <= _INT64_MAX:
            raise LocalProtocolError(f"timestamp {self.timestamp} does not fit a signed 64-bit")
        if not 0 <= self.version < 1 << 32:
            raise LocalProtocolError(f"version {self.version} does not fit an unsigned 32-bit")

    def hash(self, pubsub_topic: str) -> bytes:
        """The deterministic message hash on ``pubsub_topic`` (32 bytes)."""
        return message_hash(
            pubsub_topic, self.payload, self.content_topic, self.meta, self.timestamp
        )

    def to_bytes(self) -> bytes:
        out = pb.WakuMessage(payload=self.payload, content_topic=self.content_topic)
        if self.version:
            out.version = self.version
        if self.timestamp is not None:
            out.timestamp = self.timestamp
        if self.meta:
            out.meta = self.meta
        if self.ephemeral:
            out.ephemeral = True
        return out.SerializeToString()


def message_hash(
    pubsub_topic: str,
    payload: bytes,
    content_topic: str,
    meta: bytes = b"",
    timestamp: int | None = None,
) -> bytes:
    """sha256(pubsub_topic || payload || content_topic || meta || timestamp_be64)."""
    digest = hashlib.sha256()
    digest.update(pubsub_topic.encode())
    digest.update(payload)
    digest.update(content_topic.encode())
    digest.update(meta)
    if timestamp is not None:
        digest.update((timestamp & ((1 << 64) - 1)).to_bytes(8, "big"))
    return digest.digest()


def decode_waku_message(data: bytes, *, max_bytes: int = MAX_WAKU_MESSAGE_BYTES) -> WakuMessage:
    """Parse a WakuMessage from a remote peer; raises only :class:`RemoteProtocolError`."""
    if len(data) > max_bytes:
        raise RemoteProtocolError(
            f"WakuMessage of {len(data)} bytes exceeds {max_bytes}", reason=RejectReason.OVERSIZED
        )
    parsed = parse_untrusted(pb.WakuMessage, data, "WakuMessage", RejectReason.NOT_WAKU_MESSAGE)
    if not parsed.content_topic:
        raise RemoteProtocolError(
            "WakuMessage without a content topic", reason=RejectReason.NOT_WAKU_MESSAGE
        )
    return WakuMessage(
        payload=parsed.payload,
        content_topic=parsed.content_topic,
        timestamp=parsed.timestamp if parsed.HasField("timestamp") else None,
        meta=parsed.meta,
        version=parsed.version,
        ephemeral=parsed.ephemeral,
    )


def topic_problem(topic: str) -> str | None:
    """Why ``topic`` cannot be archived and indexed on every backend, or None."""
    try:
        size = len(topic.encode())
    except UnicodeEncodeError:
        return "is not valid UTF-8 text"
    if "\x00" in topic:
        return "contains a NUL character"
    if size > MAX_TOPIC_BYTES:
        return f"has {size} bytes (at most {MAX_TOPIC_BYTES})"
    return None


def check_timestamp(timestamp: int, now_ns: int, max_future_ns: int) -> None:
    """Refuse a timestamp that is not positive, or more than ``max_future_ns`` ahead of
    ``now_ns`` (RemoteProtocolError). Old timestamps pass."""
    if timestamp <= 0:
        raise RemoteProtocolError(
            f"message timestamp {timestamp} is not positive",
            reason=RejectReason.TIMESTAMP_NOT_POSITIVE,
        )
    if timestamp > now_ns + max_future_ns:
        raise RemoteProtocolError(
            f"message timestamp {timestamp} is {(timestamp - now_ns) / 1e9:.3g} s ahead of "
            f"this node's clock (at most {max_future_ns / 1e9:g} s)",
            reason=RejectReason.TIMESTAMP_IN_FUTURE,
        )


def check_relayable(
    message: WakuMessage, pubsub_topic: str, now_ns: int, max_future_ns: int
) -> None:
    """What a message must be to be relayed or archived, the same rule for both: topics
    an archive can store, and a timestamp present and plausible (:func:`check_timestamp`).
    Raises RemoteProtocolError."""
    for what, topic in (("pubsub topic", pubsub_topic), ("content topic", message.content_topic)):
        problem = topic_problem(topic)
        if problem is not None:
            raise RemoteProtocolError(f"the {what} {problem}", reason=RejectReason.BAD_TOPIC)
    if message.timestamp is None:
        raise RemoteProtocolError(
            "a WakuMessage needs a timestamp", reason=RejectReason.NO_TIMESTAMP
        )
    check_timestamp(message.timestamp, now_ns, max_future_ns)
