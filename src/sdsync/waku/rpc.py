"""What every Waku request/response protocol shares: frames on a stream, RPC values
through their protobuf message, and refusals with a status.

Theory of operation
-------------------
A Waku node serves each protocol under its own libp2p protocol id. On a stream, each side
writes its RPCs as *frames*: an unsigned varint (LEB128) length prefix, then that many
bytes of protobuf. Each protocol's folder holds its schemas (field for field those of
@waku/proto 0.0.15) and an :class:`Rpc` dataclass per message: a proto3 ``optional``
field or an embedded message is ``None`` when absent; every other field has proto3's
default. Equal values give equal bytes, the bytes js-waku's encoder writes (but for a
sint64 of at most -2**53 with its low 32 bits zero, which protons-runtime 5.6 miswrites).
An embedded WakuMessage travels as its serialized bytes (the schemas declare it
``bytes``: same encoding), so the envelope's own decoder
:func:`~sdsync.wire.waku.decode_waku_message` bounds and checks it.

Whose fault: a value that cannot be encoded (a number out of its field's range, a hash
that is not 32 bytes) raises :class:`~sdsync.errors.LocalProtocolError` from ``to_bytes``
or the constructor. ``from_bytes`` raises only :class:`~sdsync.errors.RemoteProtocolError`:
``MALFORMED_RPC`` for bytes that do not parse or that parse into values the constructors
refuse; the embedded WakuMessage's own reasons (``OVERSIZED``, ``NOT_WAKU_MESSAGE``)
otherwise. Only structure is checked here; what a service makes of a well-formed request
is its own to judge, and a request it refuses is :class:`Refused` with the status to
answer.

Framing is the only I/O, and it is free of any event loop: :func:`read_frame` awaits a
``read(n)`` the transport supplies (between 1 and ``n`` bytes, ``b""`` at the end of the
stream). It reads the length prefix byte by byte and refuses it (``OVERSIZED``) as soon as
it exceeds ``max_length``, before a byte of the body is read or a buffer allocated. A
prefix longer than 10 bytes is ``MALFORMED_RPC``, a stream ending inside a frame is
``TRUNCATED_FRAME``, and one that ends cleanly before a frame gives ``None`` (js-waku's
relay node opens a metadata stream and closes it unused). How long to wait for bytes is
the transport's business: a deadline around the call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, Self, TypeVar

from google.protobuf.message import Message as ProtoMessage

from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError, ServiceUnavailable
from sdsync.wire.codec import uvarint
from sdsync.wire.untrusted import parse_untrusted
from sdsync.wire.waku import HASH_SIZE, MAX_WAKU_MESSAGE_BYTES, WakuMessage, decode_waku_message

#: Room for everything of an RPC around its WakuMessages (nwaku allows the same 64 KiB).
RPC_OVERHEAD_BYTES = 64 * 1024
#: A frame of any RPC carrying at most one WakuMessage: every request, a push, a response
#: other than the store's.
MAX_RPC_BYTES = MAX_WAKU_MESSAGE_BYTES + RPC_OVERHEAD_BYTES

MAX_UVARINT_BYTES = 10
_M = TypeVar("_M", bound=ProtoMessage)

Request = Callable[[str, bytes], Awaitable[bytes]]
"""Carry a request body to one peer under a protocol id; its response body (the host
frames both, and raises ``OSError``/``TimeoutError`` when the peer cannot answer)."""
Status = TypeVar("Status", bound=int)


# --- framing ---------------------------------------------------------------------------


def frame_prefix(length: int) -> bytes:
    """The uvarint length prefix of a frame of ``length`` bytes."""
    return uvarint(length)


def encode_frame(body: bytes) -> bytes:
    """``body`` behind its uvarint length prefix."""
    return frame_prefix(len(body)) + body


async def read_frame(
    read: Callable[[int], Awaitable[bytes]], max_length: int = MAX_RPC_BYTES
) -> bytes | None:
    """The body of the next frame, or ``None`` if the stream ends before one starts.

    ``read(n)`` returns between 1 and ``n`` bytes, or ``b""`` at the end of the stream.
    Raises only :class:`RemoteProtocolError`.
    """
    length = await _read_length(read, max_length)
    if length is None:
        return None
    body = bytearray()
    while len(body) < length:
        chunk = await read(length - len(body))
        if not chunk:
            raise RemoteProtocolError(
                f"stream ended {len(body)} bytes into a frame of {length}",
                reason=RejectReason.TRUNCATED_FRAME,
            )
        body += chunk
    return bytes(body)


async def _read_length(read: Callable[[int], Awaitable[bytes]], max_length: int) -> int | None:
    length = 0
    for index in range(MAX_UVARINT_BYTES):
        byte = await read(1)
        if not byte:
            if index == 0:
                return None
            raise RemoteProtocolError(
                "stream ended inside a length prefix", reason=RejectReason.TRUNCATED_FRAME
            )
        length |= (byte[0] & 0x7F) << (7 * index)
        # Later bytes only add to the length: refuse it before reading them.
        if length > max_length:
            raise RemoteProtocolError(
                f"frame of at least {length} bytes exceeds {max_length}",
                reason=RejectReason.OVERSIZED,
            )
        if not byte[0] & 0x80:
            return length
    raise RemoteProtocolError(
        f"length prefix longer than {MAX_UVARINT_BYTES} bytes", reason=RejectReason.MALFORMED_RPC
    )


# --- values ----------------------------------------------------------------------------


class Rpc(Generic[_M]):
    """What every RPC value shares: ``to_bytes`` and ``from_bytes`` through its protobuf
    message, the ``_pb_type`` each subclass names (for ``_M``)."""

    __slots__ = ()
    # Not a ClassVar: mypy allows no type variable in one.
    _pb_type: type[_M]

    def _to_pb(self) -> _M:
        raise NotImplementedError

    @classmethod
    def _from_pb(cls, parsed: _M) -> Self:
        raise NotImplementedError

    def to_bytes(self) -> bytes:
        try:
            return self._to_pb().SerializeToString()
        except ValueError as exc:  # a number out of its field's range, a lone surrogate
            raise LocalProtocolError(f"cannot encode {type(self).__name__}: {exc}") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> Self:
        """A peer's ``data`` parsed; raises only :class:`RemoteProtocolError`."""
        what = cls._pb_type.DESCRIPTOR.name
        parsed = parse_untrusted(cls._pb_type, data, what, RejectReason.MALFORMED_RPC)
        try:
            return cls._from_pb(parsed)
        except (ValueError, LocalProtocolError) as exc:
            # ValueError: an enum value we do not know; LocalProtocolError: a constructor
            # refused the peer's value.
            raise RemoteProtocolError(
                f"malformed {what}: {exc}", reason=RejectReason.MALFORMED_RPC
            ) from None


def optional_field(parsed: ProtoMessage, name: str) -> Any:
    """Field ``name`` of ``parsed`` (a proto3 optional or a message), or None when absent."""
    return getattr(parsed, name) if parsed.HasField(name) else None


def embedded_message(parsed: ProtoMessage, name: str) -> WakuMessage | None:
    """The embedded WakuMessage ``name``, decoded and checked, or None when absent."""
    data = optional_field(parsed, name)
    return None if data is None else decode_waku_message(data)


def message_bytes(message: WakuMessage | None) -> bytes | None:
    return None if message is None else message.to_bytes()


def check_hash_size(name: str, value: bytes | None) -> None:
    if value is not None and len(value) != HASH_SIZE:
        raise LocalProtocolError(f"{name} of {len(value)} bytes is not a {HASH_SIZE}-byte hash")


# --- refusals --------------------------------------------------------------------------


class Refused(Exception, Generic[Status]):  # noqa: N818 -- an answer, not a bug
    """A service request (LightPush, Filter) answered with ``status``, counted under
    ``reason`` (a metrics label)."""

    def __init__(self, status: Status, reason: str, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.reason = reason
        self.description = description


def refusal_reason(exc: RemoteProtocolError) -> str:
    """The fixed word ``exc`` is counted under: its :class:`~sdsync.errors.RejectReason`'s
    name (``malformed_rpc``...), or the finer word of a subclass
    (:class:`~sdsync.waku.messages.InvalidMessageError`'s ``bad_topic``...)."""
    return exc.reason.name.lower() if isinstance(exc.reason, RejectReason) else exc.reason


# --- a service's answers, as its clients read them --------------------------------------


class LightServiceError(ServiceUnavailable, ConnectionError):
    """A service node did not serve a light client's request: retry later, or elsewhere."""


class ServiceRefusedError(LightServiceError):
    """``service`` answered ``protocol_id`` with ``status`` (not 200) and ``description``."""

    def __init__(
        self, service: str, protocol_id: str, status: int | None, description: str | None
    ) -> None:
        code = "no status" if status is None else f"status {status}"
        super().__init__(f"{service} refused {protocol_id} with {code}: {description or '-'}")
        self.service = service
        self.protocol_id = protocol_id
        self.status = status
        self.description = description


def check_request_id(service: str, protocol_id: str, asked: str, answered: str) -> None:
    """A peer's answer must name the request it answers: RemoteProtocolError if not."""
    if answered != asked:
        raise RemoteProtocolError(
            f"{service} answered {protocol_id} request {answered[:80]!r}, not {asked}"
        )
