"""A store node assembled from its options and run until a signal: what ``sdsync store
serve`` starts, so the command line only parses and prints.

Theory of operation
-------------------
A node without relay topics is the archive behind its HTTP API.  With relay topics, a
Waku relay host (:class:`~sdsync.transport.libp2p.Libp2pTransport`) is started first,
configured from :class:`RelayOptions`; the node archives what it relays, answers
store-query on it and, if asked, serves LightPush and Filter to light clients on the same
host.  With :class:`WebOptions`, the node also serves the chat page
(:mod:`sdsync.store.chat_page`) at ``/chat/``, which dials the relay host's WebSocket
listeners or the addresses given.  ``on_ready`` hears of the node once it listens, with
the relay's addresses and the protocols it serves.

On SIGINT or SIGTERM the node stops gracefully, in this order, each step bounded, so
that what it answered is kept and every client sees a clean close, not a reset:

1. the relay host takes no new connection (one that comes is closed unserved) and no
   new stream (one opened now is reset), and dials nobody; the HTTP API still serves;
2. the exchanges in progress on the host (a LightPush being archived, a store query, a
   Filter subscription, a sync session) finish, up to 5 s, and what is queued for relay
   goes out;
3. each libp2p connection closes cleanly: the muxer's GoAway, then the peer hangs up (py-
   and js-libp2p do at once) and our socket closes after reading all it sent, with a FIN;
   a peer still there after 2 s is closed from our side
   (:meth:`~sdsync.transport.libp2p.Libp2pNode.drain`);
4. the node stops (:meth:`~sdsync.store.node.StoreNode.stop`): the HTTP API stops
   accepting and lets its requests in progress finish (aiohttp's shutdown, which closes
   idle keep-alive connections with a FIN), the background tasks end, what was submitted
   to the archive is committed, and the archive closes;
5. the host's thread stops; the command exits 0.

A node without relay topics does step 4 alone.

py-libp2p is an optional extra: it is imported only for a node with relay topics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from sdsync.errors import LocalProtocolError
from sdsync.store.archive import SqlArchive
from sdsync.store.chat_page import CHAT_PREFIX, chat_app, chat_page
from sdsync.store.light_clients import LIGHT_PROTOCOLS
from sdsync.store.node import NodeConfig, StoreNode, serve
from sdsync.waku.ratelimit import DEFAULT_RELAY_RATE, DEFAULT_RELAY_RATE_PER_IP, RateLimit
from sdsync.waku.relay.topics import WakuRelayConfig
from sdsync.waku.store.rpc import STORE_QUERY_PROTOCOL
from sdsync.waku.sync import RBSR_PROTOCOL, RECONCILIATION_PROTOCOL, TRANSFER_PROTOCOL

if TYPE_CHECKING:
    from sdsync.transport.nodekey import NodeKey
    from sdsync.transport.settings import ConnectionLimits

__all__ = ["Ready", "RelayOptions", "WebOptions", "run_node"]


@dataclass(frozen=True)
class RelayOptions:
    """The relay host of a node with relay topics."""

    key: NodeKey | None = None
    """The host's identity (None: a new one, so a new peer id, at every start)."""
    listen: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",)
    peers: Sequence[str] = ()
    cluster_id: int = 1
    rate: RateLimit | None = DEFAULT_RELAY_RATE
    """Relay bytes one forwarding peer may bring (None: no limit)."""
    rate_per_ip: RateLimit | None = DEFAULT_RELAY_RATE_PER_IP
    """Relay bytes all the peers of one IP address may bring together (None: no limit)."""
    limits: ConnectionLimits | None = None
    """Connections per IP, handshakes and the total (None: the host's defaults)."""
    light_clients: bool = True
    """Serve LightPush and Filter to light clients."""
    store_sync: bool = False
    """Waku Sync is mounted (the node's ``waku_sync`` config)."""
    protocols: tuple[str, ...] = field(init=False)
    """What the host serves besides relay."""

    def __post_init__(self) -> None:
        sync = (
            (RECONCILIATION_PROTOCOL, TRANSFER_PROTOCOL, RBSR_PROTOCOL) if self.store_sync else ()
        )
        served = (STORE_QUERY_PROTOCOL, *(LIGHT_PROTOCOLS if self.light_clients else ()), *sync)
        object.__setattr__(self, "protocols", served)


@dataclass(frozen=True)
class WebOptions:
    """The chat page at ``/chat/`` (it needs a relay with a WebSocket listener)."""

    advertise: tuple[str, ...] = ()
    """Multiaddrs the page dials instead of the WebSocket listeners (a TLS proxy's
    ``/dns4/HOST/tcp/443/wss``); the node's ``/p2p/<id>`` is appended."""


Ready = Callable[[StoreNode, list[str]], None]
"""Told the node once it listens, and the relay host's addresses (none without relay)."""


async def run_node(
    archive: SqlArchive,
    config: NodeConfig,
    relay: RelayOptions,
    on_ready: Ready,
    web: WebOptions | None = None,
) -> None:
    """Run the node of ``config`` on ``archive`` until SIGINT or SIGTERM."""
    if web is not None and not (config.relay_topics and relay.light_clients):
        raise LocalProtocolError("the chat page needs the relay and its light services")
    if not config.relay_topics:
        return await serve(StoreNode(archive, config), on_ready=lambda node: on_ready(node, []))
    from sdsync.transport.libp2p import Libp2pTransport

    async with Libp2pTransport(
        key=relay.key,
        listen=relay.listen,
        peers=relay.peers,
        waku=WakuRelayConfig(cluster_id=relay.cluster_id),
        relay_rate=relay.rate,
        relay_rate_per_ip=relay.rate_per_ip,
        limits=relay.limits,
    ) as host:
        if web is not None:
            page = chat_page(host.listen_addrs, config.light_clients.served, web.advertise)
            config = replace(config, mounts={**config.mounts, CHAT_PREFIX: chat_app(page)})
        node = StoreNode(archive, config, waku=host, light_clients=relay.light_clients)
        await serve(
            node, on_ready=lambda node: on_ready(node, host.listen_addrs), before_stop=host.drain
        )
