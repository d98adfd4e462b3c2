"""Transports: how SDS bytes travel between participants."""

from sdsync.transport.base import Received, Transport
from sdsync.transport.memory import MemoryNetwork, MemoryTransport

__all__ = ["MemoryNetwork", "MemoryTransport", "Received", "Transport"]
