"""Whose connection it is when it comes through a trusted reverse proxy.

Theory of operation
-------------------
Behind a local TLS or WebSocket proxy (docs/network.md, "Behind TLS") every client
reaches the node from the proxy's address. Every per-IP bound — libp2p connections and
handshakes, an address's LightPush, relay and store-answer budgets, HTTP page pacing —
would then hold all the proxy's clients to one address's share, which one client alone
could use up. A proxy names the client it carries in ``X-Forwarded-For``, appending the
address that connected to it to whatever list the request already held: only the
entries a trusted proxy appended can be believed, the rest are the client's own words.

So :func:`client_ip` starts from the connection's peer and, while the address it stands
at is a trusted proxy's, steps one entry left in the list; the first address that is
not trusted is the client. The header of a peer that is not trusted is never read, so a
client cannot choose its own address by sending one. An entry that is not an IP address
(a port appended, ``unknown``, garbage) ends the walk at the trusted proxy that passed
it on: its clients then share its limits, which is what they did before they were told
apart, and no header can make it raise.

The HTTP API applies it to each request (:mod:`sdsync.store.server`), the libp2p host to
each WebSocket upgrade request (:class:`~sdsync.transport.libp2p_patches.BoundedSwarm`).
Plain data: no I/O, no p2p stack.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

__all__ = ["FORWARDED_FOR", "canonical_ip", "client_ip"]

FORWARDED_FOR = "X-Forwarded-For"


def canonical_ip(text: str) -> str:
    """``text``, an IPv4 or IPv6 address, as Python spells it (so that two spellings of
    one address compare equal); ValueError if it is not one."""
    return str(ipaddress.ip_address(text.strip()))


def client_ip(peer: str, forwarded_for: Iterable[str], trusted: frozenset[str]) -> str:
    """The client a connection from ``peer`` is for: ``peer`` itself unless it is in
    ``trusted`` (canonical addresses), else read from the ``X-Forwarded-For`` values it
    sent, in the order they came (see the module)."""
    if peer not in trusted:
        return peer
    entries = [entry for value in forwarded_for for entry in value.split(",")]
    client = peer
    for entry in reversed(entries):
        if client not in trusted:
            break
        try:
            client = canonical_ip(entry)
        except ValueError:
            break
    return client
