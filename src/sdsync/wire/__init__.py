"""Wire format: SDS protobuf messages (byte-compatible with @waku/sds) and the Waku
envelope (WakuMessage) every Waku protocol carries; the protocols' own RPCs are in
:mod:`sdsync.waku`, a folder each."""

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
    message_id_for_sender,
)
from sdsync.wire.waku import WakuMessage, decode_waku_message, message_hash

__all__ = [
    "DEFAULT_LIMITS",
    "HistoryEntry",
    "Message",
    "MessageKind",
    "WakuMessage",
    "WireLimits",
    "classify",
    "decode",
    "decode_waku_message",
    "encode",
    "message_hash",
    "message_id_for",
    "message_id_for_sender",
]
