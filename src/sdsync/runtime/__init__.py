"""Runtime: scheduling of the core's periodic work (sans-I/O driver), and later I/O."""

from sdsync.runtime.driver import ChannelDriver, QueryStore, Step, Transmit
from sdsync.runtime.policy import RuntimeConfig

__all__ = ["ChannelDriver", "QueryStore", "RuntimeConfig", "Step", "Transmit"]
