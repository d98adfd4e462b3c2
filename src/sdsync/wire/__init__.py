"""Wire format: SDS protobuf messages, byte-compatible with @waku/sds."""

from sdsync.wire.codec import (
    DEFAULT_LIMITS,
    HistoryEntry,
    Message,
    MessageKind,
    WireLimits,
    classify,
    decode,
    encode,
    message_id_for,
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
