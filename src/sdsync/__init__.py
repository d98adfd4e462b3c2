"""sdsync: Scalable Data Sync for distributed logs.

The public API is small: a sans-I/O :class:`MessageChannel` (one participant in one
channel), the :class:`ReliabilityManager` facade over many channels (the reliability API,
from :mod:`sdsync.runtime`), the wire codec, and two error types that say whose fault a
failure is.
"""

from sdsync.core import (
    BloomParams,
    ChannelConfig,
    Event,
    HistoryStore,
    MessageChannel,
    RepairConfig,
)
from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError, SdsError
from sdsync.runtime import ReliabilityManager, UnwrapResult
from sdsync.wire import HistoryEntry, Message, MessageKind, WireLimits, decode, encode

__version__ = "0.1.0"

__all__ = [
    "BloomParams",
    "ChannelConfig",
    "Event",
    "HistoryEntry",
    "HistoryStore",
    "LocalProtocolError",
    "Message",
    "MessageChannel",
    "MessageKind",
    "RejectReason",
    "ReliabilityManager",
    "RemoteProtocolError",
    "RepairConfig",
    "SdsError",
    "UnwrapResult",
    "WireLimits",
    "__version__",
    "decode",
    "encode",
]
