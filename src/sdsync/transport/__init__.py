"""Transports: how SDS bytes travel between participants."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sdsync.transport.base import Envelope, Received, Transport
from sdsync.transport.memory import MemoryNetwork, MemoryTransport

if TYPE_CHECKING:
    from sdsync.transport.libp2p import Libp2pTransport

__all__ = [
    "Envelope",
    "Libp2pTransport",
    "MemoryNetwork",
    "MemoryTransport",
    "Received",
    "Transport",
]

# py-libp2p takes about a second to import: load it only for those who use it.
_LAZY = {"Libp2pTransport"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from sdsync.transport import libp2p

        return getattr(libp2p, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
