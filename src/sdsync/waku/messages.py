"""The messages Waku services take in, and what each checks of them before keeping one.

Theory of operation
-------------------
A :class:`StoredMessage` is a WakuMessage together with the pubsub topic it was
published on and its deterministic message hash.  The hash is *checked* when the value
is built, so every StoredMessage in the process is one whose hash matches its content:
the archive, the HTTP ingestion, Store Resume and Waku Sync can therefore all trust it.
Messages come from elsewhere (tools, peers, other stores), so a mismatch is a
:class:`~sdsync.errors.RemoteProtocolError`.

What is refused carries a *reason*, a short fixed word (``bad_topic``,
``timestamp_in_future``, ...) that the node counts in
``sdsync_store_refused_total{route, reason}``: :class:`InvalidMessageError`.
:func:`check_ingestible` is what every ingestion path (HTTP, relay, LightPush, Store
Resume, Store Sync, Waku Sync) checks beyond the hash: topics a backend can store and
index, a size nwaku would relay, and a plausible timestamp — positive and at most
:data:`~sdsync.wire.waku.DEFAULT_TIMESTAMP_VARIANCE_S` ahead of the node's clock
(nwaku's ``MaxMessageTimestampVariance``).  Old messages are fine: Store Resume and the
syncs exist to bring them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdsync.errors import RejectReason, RemoteProtocolError
from sdsync.wire import waku
from sdsync.wire.waku import DEFAULT_TIMESTAMP_VARIANCE_S, MAX_WAKU_MESSAGE_BYTES, WakuMessage


class InvalidMessageError(RemoteProtocolError):
    """A message (or an ingestion request) refused, with the ``reason`` it is counted
    under (a metrics label: a short fixed word, never data from the request)."""

    def __init__(self, reason: str, description: str) -> None:
        super().__init__(description)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as archived: its hash, its pubsub topic and the WakuMessage itself."""

    message_hash: bytes
    pubsub_topic: str
    message: WakuMessage

    def __post_init__(self) -> None:
        if self.message.timestamp is None:
            raise InvalidMessageError(
                "no_timestamp", "a message without a timestamp cannot be archived"
            )
        if self.message.ephemeral:
            raise InvalidMessageError("ephemeral", "ephemeral messages are not archived")
        try:
            actual = self.message.hash(self.pubsub_topic)
        except UnicodeEncodeError:  # a lone surrogate, as JSON can spell it
            raise InvalidMessageError("bad_topic", "a topic is not valid UTF-8 text") from None
        if actual != self.message_hash:
            raise InvalidMessageError(
                "hash_mismatch",
                f"message hash {self.message_hash.hex()} does not match the message content",
            )

    @classmethod
    def of(cls, pubsub_topic: str, message: WakuMessage) -> StoredMessage:
        """The stored form of ``message`` heard on ``pubsub_topic`` (hash computed)."""
        return cls(message.hash(pubsub_topic), pubsub_topic, message)

    @classmethod
    def from_columns(
        cls,
        message_hash: bytes,
        timestamp: int,
        pubsub_topic: str,
        content_topic: str,
        payload: bytes,
        meta: bytes | None,
        version: int,
    ) -> StoredMessage:
        """Rebuild a message from the archive's columns (re-checking its hash)."""
        message = WakuMessage(
            payload=bytes(payload),
            content_topic=content_topic,
            timestamp=timestamp,
            meta=bytes(meta or b""),
            version=version,
        )
        return cls(bytes(message_hash), pubsub_topic, message)

    @property
    def timestamp(self) -> int:
        return self.message.timestamp  # type: ignore[return-value]  # checked on creation


#: The store's refusal labels for the shared message checks of sdsync.wire.waku.
_LABELS: dict[str, str] = {
    RejectReason.BAD_TOPIC: "bad_topic",
    RejectReason.NO_TIMESTAMP: "no_timestamp",
    RejectReason.TIMESTAMP_NOT_POSITIVE: "timestamp_not_positive",
    RejectReason.TIMESTAMP_IN_FUTURE: "timestamp_in_future",
}


def check_timestamp(timestamp: int, now_ns: int, max_future_ns: int) -> None:
    """Refuse a timestamp that is not positive, or more than ``max_future_ns`` ahead of
    ``now_ns``: :class:`InvalidMessageError` with reason ``timestamp_not_positive`` or
    ``timestamp_in_future``.  Old timestamps pass."""
    try:
        waku.check_timestamp(timestamp, now_ns, max_future_ns)
    except RemoteProtocolError as exc:
        raise InvalidMessageError(_LABELS[exc.reason], str(exc)) from None


def check_ingestible(
    message: StoredMessage,
    now_ns: int,
    max_future_ns: int = int(DEFAULT_TIMESTAMP_VARIANCE_S * 1e9),
) -> None:
    """What every ingestion path checks before archiving ``message`` (its hash is checked
    already): storable topics (reason ``bad_topic``), nwaku's maximum message size
    (``too_large``) and a plausible timestamp (:func:`check_timestamp`).  Raises
    :class:`InvalidMessageError`."""
    msg = message.message
    try:
        waku.check_relayable(msg, message.pubsub_topic, now_ns, max_future_ns)
    except RemoteProtocolError as exc:
        raise InvalidMessageError(_LABELS[exc.reason], str(exc)) from None
    size = len(msg.payload) + len(msg.meta) + len(msg.content_topic.encode())
    if size > MAX_WAKU_MESSAGE_BYTES:
        raise InvalidMessageError(
            "too_large", f"a message of {size} bytes exceeds {MAX_WAKU_MESSAGE_BYTES}"
        )
