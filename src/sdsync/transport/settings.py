"""The settings of a libp2p Waku node: what its constructor takes and its threads read.

Theory of operation
-------------------
A :class:`~sdsync.transport.libp2p.Libp2pNode` is configured once, in its constructor;
what it took and checked there is one frozen :class:`HostSettings`, which both of its
threads read and neither changes (:mod:`sdsync.transport.libp2p_shared`). Two groups of
knobs have types of their own, which callers build: :class:`GossipParams` (Waku Relay's
gossipsub) and :class:`ConnectionLimits` (the bounds on inbound connections, which
:class:`~sdsync.transport.libp2p_patches.BoundedSwarm` enforces).

Plain data: this module imports no py-libp2p (its types appear in annotations only), so
a command line that only builds settings need not load the p2p stack.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sdsync.waku.ratelimit import RateLimit
from sdsync.waku.relay.topics import WakuRelayConfig

if TYPE_CHECKING:
    import multiaddr
    from libp2p.crypto.keys import KeyPair

#: Bytes of messages a relay node's gossip cache holds at most (see
#: :class:`~sdsync.transport.libp2p_patches.KeyedMessageCache`): 5 s of a 12 MiB/s shard
#: at the default heartbeat, whatever the number of peers flooding it.
MESSAGE_CACHE_BYTES = 64 * 2**20


@dataclass(frozen=True, slots=True)
class GossipParams:
    """Gossipsub knobs; defaults suit a small group on one machine or a LAN."""

    degree: int = 6
    degree_low: int = 4
    degree_high: int = 12
    heartbeat_interval_s: int = 1
    # The gossip message cache (what IWANT is answered from) holds this many bytes at
    # most, the oldest going first, counted in Libp2pNode.mcache_evicted.
    message_cache_bytes: int = MESSAGE_CACHE_BYTES
    # Redial configured peers that are not connected (they may start later, or restart):
    # first after this long, doubling while the dials fail up to redial_max_s
    # (transport/redial.py).
    redial_interval_s: float = 1.0
    redial_max_s: float = 8.0
    dial_timeout_s: float = 5.0


OUTBOUND_RESERVE = 50
"""Connections py-libp2p keeps for outbound dials, out of ``max_connections``."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Bounds on a host's inbound connections (threat model: one unauthenticated remote
    host opening connections it never uses, or never finishes).

    ``per_ip``: connections from one IP address at once, handshaking or established
    (nwaku's colocation limit, 5 by default; 0: none). Addresses in ``exempt_ips`` are
    not counted per IP; none by default, loopback included: behind a local TLS or
    WebSocket proxy every client comes from 127.0.0.1, so exempting it let one client
    hold every connection. A WebSocket connection from an address in ``trusted_proxies``
    counts as its client's, the one the proxy names in ``X-Forwarded-For``
    (:mod:`~sdsync.transport.forwarded`); none is trusted by default. ``pending``:
    handshakes (security and muxer negotiation) in progress at once, from all addresses,
    ``pending_per_ip`` of them from one address (:mod:`~sdsync.transport.handshakes`: an
    old one gives its slot to a newcomer when all are taken). ``handshake_timeout_s``: a
    connection not upgraded by then is closed. ``max_connections``: py-libp2p's total,
    of which all but the :data:`OUTBOUND_RESERVE` kept for outbound dials may be inbound.
    """

    per_ip: int = 5
    pending: int = 128
    pending_per_ip: int = 5
    handshake_timeout_s: float = 10.0
    max_connections: int = 300
    exempt_ips: frozenset[str] = frozenset()
    trusted_proxies: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class HostSettings:
    """A node's settings, as its constructor took and checked them (its docs say what
    each means)."""

    key_pair: KeyPair
    peer_id: str
    listen: tuple[multiaddr.Multiaddr, ...]
    content_topic: Callable[[str], str]
    waku: WakuRelayConfig
    gossip: GossipParams
    # False: a light client's host, which mounts no gossipsub at all.
    relay: bool
    # Shards our metadata names besides those we relay: a light client relays none,
    # yet a node on its cluster (go-waku) drops a peer that names no shard.
    announce_shards: tuple[int, ...]
    limits: ConnectionLimits
    max_message_bytes: int
    # A relayed message's timestamp may be this far ahead of clock_ns() (as the
    # archive's): further, it is neither delivered nor relayed.
    clock_ns: Callable[[], int]
    max_future_ns: int
    # Bytes of valid relay frames one forwarding peer may bring (None: no limit); more
    # are dropped by the validator, neither delivered nor relayed, and counted.
    relay_rate: RateLimit | None
    # The same, for all the peers seen from one IP address together (None: no such bound).
    relay_rate_per_ip: RateLimit | None
    drop_rate: float
    seed: int | None

    def route(self, topic: str) -> tuple[str, str | None]:
        """:meth:`~sdsync.waku.relay.topics.WakuRelayConfig.route` with our content topics."""
        return self.waku.route(topic, self.content_topic)
