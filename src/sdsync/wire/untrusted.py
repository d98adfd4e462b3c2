"""Protobuf bytes from a remote peer: whatever the parser refuses is the peer's fault."""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from sdsync.errors import RejectReason, RemoteProtocolError

M = TypeVar("M", bound=Message)


def parse_untrusted(message_type: type[M], data: bytes, what: str, reason: RejectReason) -> M:
    """``data`` parsed as ``message_type``; a parser failure raises
    :class:`~sdsync.errors.RemoteProtocolError` ("malformed ``what``: ...") with ``reason``."""
    parsed = message_type()
    try:
        parsed.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise RemoteProtocolError(f"malformed {what}: {exc}", reason=reason) from None
    return parsed
