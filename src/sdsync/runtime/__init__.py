"""Runtime: the sans-I/O scheduling driver and the asyncio ReliableChannel around it."""

from sdsync.runtime.driver import ChannelDriver, QueryStore, Step, Transmit
from sdsync.runtime.memory_store import MemoryStore
from sdsync.runtime.policy import RuntimeConfig
from sdsync.runtime.reliable import ReliableChannel, StoreClient

__all__ = [
    "ChannelDriver",
    "MemoryStore",
    "QueryStore",
    "ReliableChannel",
    "RuntimeConfig",
    "Step",
    "StoreClient",
    "Transmit",
]
