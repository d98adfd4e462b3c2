"""Transports: how SDS bytes travel between participants, and the Waku node contract
(:mod:`sdsync.transport.waku_node`) that the store and the chat run on."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sdsync.transport.base import Envelope, Received, Transport, WakuRelayConfig
from sdsync.transport.memory import MemoryNetwork, MemoryTransport
from sdsync.transport.memory_waku import MemoryWakuNode
from sdsync.transport.waku_node import (
    WakuClient,
    WakuCounters,
    WakuHost,
    WakuNode,
    WakuRequester,
)

if TYPE_CHECKING:
    from sdsync.transport.libp2p import Libp2pTransport
    from sdsync.transport.waku_light import WakuLightTransport

__all__ = [
    "Envelope",
    "Libp2pTransport",
    "MemoryNetwork",
    "MemoryTransport",
    "MemoryWakuNode",
    "Received",
    "Transport",
    "WakuClient",
    "WakuCounters",
    "WakuHost",
    "WakuLightTransport",
    "WakuNode",
    "WakuRelayConfig",
    "WakuRequester",
]

# py-libp2p takes about a second to import: load it only for those who use it.
_LAZY = {"Libp2pTransport": "libp2p", "WakuLightTransport": "waku_light"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"sdsync.transport.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
