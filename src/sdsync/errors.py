"""Errors that say whose fault they are.

Every failure sdsync reports is an :class:`SdsError`. It is always one of two kinds:

* :class:`LocalProtocolError` — *our caller* misused the API (an empty payload, an
  unknown message id, a bad option). Fix the calling code. :class:`InputError` is the
  same kind of fault in the pipeline's inputs: a file the caller named is unreadable or
  has the wrong columns (exit code 2).
* :class:`RemoteProtocolError` — *a remote peer* sent data we cannot accept (malformed
  bytes, oversized frames, wrong field sizes, an impossible message kind). Drop it and
  carry on; it changes no state. Its :class:`RejectReason` says which of these it was, for
  counting and logging: the message is for people and is never parsed.

A third family is nobody's fault and not an :class:`SdsError`: something we depend on is
*unavailable*, and every such error is a :class:`ServiceUnavailable`, so a caller that
means "try again later" catches that one class — a store that cannot be reached or is
busy (:class:`sdsync.waku.store.client.StoreUnavailableError`, an ``OSError`` too), a
store node with too many queries in flight (:class:`sdsync.store.served.QueriesBusy`), a
database that fails (:class:`sdsync.store.archive.ArchiveUnavailable`, the driver's
error as its cause), a light client's service nodes that took no request
(:class:`sdsync.waku.rpc.LightServiceError`, a ``ConnectionError`` too).
Retry later; what was done before the failure stays done. A peer that is reachable but
does not speak a protocol at all is a :class:`ProtocolNotSupportedError` (a
``ConnectionError``, not a ServiceUnavailable): asking it again will not help, asking
another peer may.

Code that decodes untrusted input lets nothing but :class:`RemoteProtocolError` escape.
"""

from __future__ import annotations

import enum
from typing import Literal


class ServiceUnavailable(Exception):  # noqa: N818 -- a condition to retry, not a bug
    """Something we depend on cannot serve now (a peer, a store, a database): nobody's
    fault; try again later, or elsewhere. The base of every such error (see the module),
    beside whatever standard base each also has (``OSError`` for the network's)."""


class SdsError(Exception):
    """Base class of every error raised by sdsync."""

    kind: Literal["local", "remote"]


class LocalProtocolError(SdsError):
    """The local caller broke the API contract; state is unchanged."""

    kind = "local"


class RejectReason(enum.StrEnum):
    """What was wrong with a remote peer's input: the ``reason`` of a RemoteProtocolError.

    The values are the stable labels rejected frames are counted under
    (``ReliableChannel.rejected``, ``Libp2pTransport.rejected``). The envelope's three,
    ``MESSAGE_TOO_LARGE``, ``MALFORMED`` and ``NO_KIND`` keep the labels these counters
    used to cut out of the error message (its text up to the first colon, digits as N).
    """

    #: Any other violation, told by the message: the default, for decoders whose
    #: rejections nobody counts by category (store answers, reconciliation frames).
    PROTOCOL_VIOLATION = "protocol violation"

    # The Waku envelope (sdsync.wire.waku, checked by the libp2p transport).
    #: A WakuMessage frame larger than the transport's ``max_message_bytes``, or a
    #: length-prefixed Waku RPC frame beyond its ``max_length`` (sdsync.waku.rpc).
    OVERSIZED = "oversized"
    #: Bytes that do not parse as a WakuMessage, or one without a content topic.
    NOT_WAKU_MESSAGE = "not a WakuMessage"
    #: A WakuMessage whose content topic is not the one its pubsub topic carries.
    WRONG_CONTENT_TOPIC = "wrong content topic"

    # The Waku request/response protocols (sdsync.waku.rpc): store, LightPush,
    # Filter, metadata.
    #: A length prefix longer than 10 bytes, or a frame that does not parse as the RPC
    #: expected or holds a value out of range (a hash that is not 32 bytes, an unknown type).
    MALFORMED_RPC = "malformed Waku RPC"
    #: A stream that ended inside a frame: in its length prefix or its body.
    TRUNCATED_FRAME = "truncated frame"
    #: A peer's content topic that is not ``/application/version/name/encoding``.
    MALFORMED_CONTENT_TOPIC = "malformed content topic"
    #: A relayed WakuMessage without a timestamp (14/WAKU2-MESSAGE: Waku relay requires one).
    NO_TIMESTAMP = "no timestamp"
    #: A Waku relay message with ``from``, ``seqno``, a signature or a key (StrictNoSign).
    SIGNED_RELAY_MESSAGE = "signed relay message"
    #: A pubsub or content topic no archive can store (not UTF-8, a NUL, too long).
    BAD_TOPIC = "bad topic"
    #: A WakuMessage timestamp that is zero or negative.
    TIMESTAMP_NOT_POSITIVE = "timestamp not positive"
    #: A WakuMessage timestamp further ahead of our clock than the allowed variance.
    TIMESTAMP_IN_FUTURE = "timestamp in future"

    # The SDS message (sdsync.wire.codec), judged against its WireLimits.
    #: An SDS message larger than ``WireLimits.max_message_bytes``.
    MESSAGE_TOO_LARGE = "message of N bytes exceeds the limit of N"
    #: Bytes that do not parse as an SDS message, or a history entry in it that does not.
    MALFORMED = "malformed SDS message"
    #: Neither a Lamport timestamp nor content: not a content, sync or ephemeral message.
    NO_KIND = "neither content, sync nor ephemeral"
    #: A Lamport timestamp beyond ``WireLimits.max_lamport_timestamp``.
    IMPLAUSIBLE_LAMPORT = "lamport timestamp beyond any plausible clock"
    #: A message, or an entry of its causal history or repair requests, without an id.
    EMPTY_MESSAGE_ID = "empty message_id"
    #: An id, a retrieval hint, the bloom filter, the causal history or the repair
    #: requests beyond its bound in WireLimits.
    FIELD_TOO_LARGE = "field beyond its limit"


class RemoteProtocolError(SdsError):
    """A remote peer sent data that violates the protocol; state is unchanged.

    ``reason`` is the label to count it by, a :class:`RejectReason`; the message tells
    the details. (A subclass may count under finer labels of its own: a short fixed word,
    never data from the peer.)
    """

    kind = "remote"
    reason: str

    def __init__(
        self, message: str, *, reason: RejectReason = RejectReason.PROTOCOL_VIOLATION
    ) -> None:
        super().__init__(message)
        self.reason = reason


class OutgoingBufferFullError(LocalProtocolError):
    """The outgoing buffer holds as many unacknowledged messages as it may; nothing was sent.

    Wait for acknowledgements (or give up on old messages) and send again.
    """


class MessageTooLargeError(LocalProtocolError):
    """The message a payload would become is larger than peers accept
    (``WireLimits.max_message_bytes``); nothing was sent or changed."""


class SchemaVersionError(LocalProtocolError):
    """Stored data (an archive, a state file) at a schema version this release does not
    know; nothing was written.  The operator's to settle — retrying cannot help, and no
    peer sent it — so the message names both versions and what to do instead."""

    def __init__(self, whose: str, found: int, supported: int, instead: str) -> None:
        """``whose``: what the data is, as the message begins (``"the archive's"``);
        ``instead``: what else to use (``"use another --db"``)."""
        if found > supported:
            why = f"it was written by a newer sdsync; upgrade sdsync or {instead}"
        else:
            why = f"no sdsync writes that version; {instead}"
        versions = f"schema version is {found} and this sdsync's is {supported}"
        super().__init__(f"{whose} {versions}: {why}")
        self.found = found
        self.supported = supported


class OptionError(LocalProtocolError):
    """An option of a run (``option``: the field's name, as the library spells it) is
    wrong; the message is about its value and names no command-line flag, so a command
    line can say which of its flags set it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


class InputError(SdsError):
    """Bad input files: unreadable, a missing column, a wrong type. Exit code 2.

    The caller's fault, like :class:`LocalProtocolError`, but reported with the file
    (``path``) and ``column`` where known, and kept apart from API misuse.
    """

    kind = "local"

    def __init__(self, message: str, *, path: str | None = None, column: str | None = None):
        super().__init__(message)
        self.path = path
        self.column = column


class ProtocolNotSupportedError(ConnectionError):
    """``peer`` is reachable but refused ``protocol_id`` (multistream-select answered
    "na"): neither our fault nor a malformed answer, and retrying that peer will not help.

    Distinct from a peer that cannot be reached (a plain ``ConnectionError``) and from one
    that does not answer in time (``TimeoutError``).
    """

    def __init__(self, peer: str, protocol_id: str) -> None:
        super().__init__(f"{peer} does not speak {protocol_id}")
        self.peer = peer
        self.protocol_id = protocol_id
