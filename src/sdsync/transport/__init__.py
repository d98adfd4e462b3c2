"""Transports: the Waku nodes SDS bytes travel through — a Waku node over py-libp2p
(:class:`Libp2pNode`; :class:`Libp2pTransport` is one with the relay's SDS transport over
itself) and a light client of service nodes (:class:`WakuLightTransport`) — and,
re-exported, the contracts they keep (:mod:`sdsync.waku.node`). Their in-memory doubles
are :mod:`sdsync.testing.memory`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sdsync.waku.node import (
    Envelope,
    Received,
    Transport,
    WakuClient,
    WakuCounters,
    WakuHost,
    WakuNode,
    WakuRequester,
)
from sdsync.waku.relay.topics import WakuRelayConfig

if TYPE_CHECKING:
    from sdsync.transport.libp2p import Libp2pNode, Libp2pTransport
    from sdsync.transport.waku_light import WakuLightTransport

__all__ = [
    "Envelope",
    "Libp2pNode",
    "Libp2pTransport",
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
_LAZY = {
    "Libp2pNode": "libp2p",
    "Libp2pTransport": "libp2p",
    "WakuLightTransport": "waku_light",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"sdsync.transport.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
