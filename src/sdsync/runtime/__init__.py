"""Runtime: the sans-I/O scheduling driver, durable state, the asyncio ReliableChannel, and
the ReliabilityManager facade (the reliability API over many channels)."""

from sdsync.runtime.clock import system_clock_ms
from sdsync.runtime.driver import CatchUp, ChannelDriver, Published, QueryStore, Step, Transmit
from sdsync.runtime.event_log import Delivery, EventLimits, EventsDiscarded, PeriodicSync
from sdsync.runtime.history import SqliteHistoryStore
from sdsync.runtime.manager import (
    OwnMessage,
    ReliabilityManager,
    UnwrapResult,
    WaitingMessage,
    Wrapped,
)
from sdsync.runtime.policy import RuntimeConfig
from sdsync.runtime.profiles import PROFILES, Profile, profile
from sdsync.runtime.reliable import ReliableChannel, StoreClient
from sdsync.runtime.state import ChannelState, LogRecord, state_path

__all__ = [
    "PROFILES",
    "CatchUp",
    "ChannelDriver",
    "ChannelState",
    "Delivery",
    "EventLimits",
    "EventsDiscarded",
    "LogRecord",
    "OwnMessage",
    "PeriodicSync",
    "Profile",
    "Published",
    "QueryStore",
    "ReliabilityManager",
    "ReliableChannel",
    "RuntimeConfig",
    "SqliteHistoryStore",
    "Step",
    "StoreClient",
    "Transmit",
    "UnwrapResult",
    "WaitingMessage",
    "Wrapped",
    "profile",
    "state_path",
    "system_clock_ms",
]
