"""Clients behind a local proxy (issue 38, attack 4: "the loopback exemption").

A node used to exempt 127.0.0.1 from its per-IP libp2p limits, yet behind a local TLS or
WebSocket proxy (docs/network.md, "Behind TLS") 127.0.0.1 is every client's address: 250
connections from it were all held while honest dials were refused. Now loopback is held
to the limits like any address, and a node told ``--trusted-proxy 127.0.0.1`` counts a
connection or request from the proxy as the client's that the proxy names in
``X-Forwarded-For``; anyone else's header is ignored.

Each test runs a real ``sdsync store serve`` (tests/storeprocess.py) attacked on
loopback by the raw py-libp2p hosts of tests/store/test_hostile_node.py. The proxy is
:class:`Proxy`, in this process; the client addresses it names are 127.0.0.x. The two
attacks (250 connections from 127.0.0.1; a greedy client behind a trusted proxy) are
watched as test_hostile_node.py's rows are: an honest peer served throughout, the
node's RSS growth bounded, and its RSS back within 50 MB of its start within 60 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import multiaddr
import pytest
from hypothesis import given
from hypothesis import strategies as st
from storeprocess import StoreProcess
from testdeps import require
from transporttest import PATIENCE_S, run

from sdsync.errors import OptionError
from sdsync.store.settings import plan_node
from sdsync.testing.hostile import Watched, assert_given_back
from sdsync.testing.proxy import Proxy
from sdsync.transport.forwarded import client_ip
from sdsync.transport.settings import ConnectionLimits
from sdsync.waku.store.rpc import STORE_QUERY_PROTOCOL, StoreQueryResponse

require("sdsync.transport.libp2p", "needs the 'p2p' extra")

from libp2p import new_host  # noqa: E402
from libp2p.abc import IHost  # noqa: E402
from libp2p.crypto.ed25519 import create_new_key_pair  # noqa: E402
from libp2p.peer.peerinfo import info_from_p2p_addr  # noqa: E402
from test_hostile_node import (  # noqa: E402
    ATTACK_PATIENCE_S,
    HOLD_RSS_BUDGET,
    HOLD_S,
    HONEST_QUERY,
    ONE_DIAL,
    Attackers,
    assert_served,
    attack,
    node,
    refused_connections,
    report,
    settled,
    watch,
)

from sdsync.transport import Libp2pTransport  # noqa: E402

LOOPBACK = "127.0.0.1"
HONEST_IP = "127.0.0.3"
HELD = 250
PER_IP = ConnectionLimits().per_ip
#: How a connection refused for its address is counted (either bound may close it first).
PER_IP_REASONS = ("per-IP limit", "pending handshakes per IP")


def refused_per_ip(store: StoreProcess) -> float:
    return sum(refused_connections(store, reason) for reason in PER_IP_REASONS)


# -- the client's address, read from a header


TRUSTED = frozenset({"127.0.0.1", "10.0.0.2"})


@pytest.mark.parametrize(
    ("peer", "headers", "client"),
    [
        ("127.0.0.9", ["203.0.113.7"], "127.0.0.9"),  # not a trusted proxy: not read
        ("127.0.0.1", [], "127.0.0.1"),  # the proxy's own request
        ("127.0.0.1", ["203.0.113.7"], "203.0.113.7"),
        ("127.0.0.1", ["198.51.100.1, 203.0.113.7"], "203.0.113.7"),  # the client's own entry
        ("127.0.0.1", ["198.51.100.1", "203.0.113.7"], "203.0.113.7"),  # two header lines
        ("127.0.0.1", ["198.51.100.1, 203.0.113.7, 10.0.0.2"], "203.0.113.7"),  # a chain
        ("127.0.0.1", ["10.0.0.2, 127.0.0.1"], "10.0.0.2"),  # trusted all the way
        ("127.0.0.1", [" 2001:DB8::1 "], "2001:db8::1"),
        ("127.0.0.1", ["203.0.113.7:4431"], "127.0.0.1"),  # garbage: the proxy's address
        ("127.0.0.1", ["unknown"], "127.0.0.1"),
        ("127.0.0.1", [""], "127.0.0.1"),
        ("127.0.0.1", ["203.0.113.7, garbage, 10.0.0.2"], "10.0.0.2"),
    ],
)
def test_the_client_is_the_last_address_a_trusted_proxy_appended(
    peer: str, headers: list[str], client: str
) -> None:
    assert client_ip(peer, headers, TRUSTED) == client


ADDRESSES = st.ip_addresses().map(str)
ENTRIES = st.one_of(ADDRESSES, st.text(max_size=40))


@given(peer=ADDRESSES, headers=st.lists(st.lists(ENTRIES, max_size=6).map(", ".join)))
def test_any_header_yields_an_address_it_may_name_and_never_raises(
    peer: str, headers: list[str]
) -> None:
    untrusted = client_ip(peer, headers, frozenset())
    assert untrusted == peer
    client = client_ip(peer, headers, frozenset({peer}))
    named = [entry.strip() for value in headers for entry in value.split(",")]
    assert client == peer or client in addresses(named)


def addresses(entries: list[str]) -> set[str]:
    """The entries that are IP addresses, as Python spells them."""
    found = set()
    for entry in entries:
        with contextlib.suppress(ValueError):
            found.add(str(ipaddress.ip_address(entry)))
    return found


def test_loopback_is_exempt_only_when_named_and_a_bad_proxy_is_refused(tmp_path: Path) -> None:
    assert ConnectionLimits().exempt_ips == frozenset()
    plan = plan_node(
        {"data_dir": tmp_path, "relay_shard": [0], "trusted_proxy": ["::1", "127.0.0.1"]},
        identity=False,
    )
    assert plan.relay.limits is not None
    assert plan.relay.limits.exempt_ips == frozenset()
    assert plan.relay.limits.trusted_proxies == {"::1", "127.0.0.1"}
    assert plan.config.http.trusted_proxies == {"::1", "127.0.0.1"}
    with pytest.raises(OptionError) as refused:
        plan_node({"data_dir": tmp_path, "trusted_proxy": ["localhost"]}, identity=False)
    assert refused.value.option == "trusted_proxy"


# -- libp2p over TCP, from loopback


async def honest_query(store: StoreProcess, clients: Attackers) -> None:
    """A store query by one of ``clients`` (a fresh identity); raises unless answered 200."""
    answers: list[int | None] = []

    async def query(host: IHost) -> None:
        answer = await clients.ask(host, STORE_QUERY_PROTOCOL, HONEST_QUERY)
        answers.append(StoreQueryResponse.from_bytes(answer).status_code)

    await clients.run(1, 1, query)
    if answers != [200]:
        raise AssertionError(f"honest store query: {answers}, {clients.failed} failed")


async def held(
    attackers: Attackers,
    attempts: int,
    while_held: Callable[[], Awaitable[None]],
    at_once: int | None = None,
) -> None:
    """``attempts`` connections by ``attackers``, ``at_once`` at a time (all by
    default; one refused makes way for the next), each held until ``while_held`` has run
    once all were admitted or refused."""
    concurrency = at_once or attempts
    holding = asyncio.ensure_future(attackers.run(attempts, concurrency, attackers.hold))
    try:
        async with asyncio.timeout(ATTACK_PATIENCE_S):
            while attackers.connected + attackers.failed < attempts:
                await asyncio.sleep(0.05)
        await while_held()
    finally:
        attackers.released.set()
        await holding


def test_connections_from_loopback_are_held_to_the_per_ip_limit(tmp_path: Path) -> None:
    """HELD fresh identities from 127.0.0.1 connect at once and hold their connections,
    each refused one trying again as another (2 * HELD attempts). Before (loopback
    exempt, as ``SDSYNC_HOSTILE_NODE_FLAGS='--relay-exempt-ip 127.0.0.1'`` makes it) they
    held 249 of the node's 250 inbound connections, and 19 of 39 honest store queries
    from 127.0.0.3 failed meanwhile. Now 5 are admitted, the rest refused and counted,
    and the honest peer is served throughout."""
    with node(tmp_path) as store:
        attackers = Attackers(store, LOOPBACK)
        honest = functools.partial(honest_query, store, Attackers(store, HONEST_IP))

        async def hold() -> None:
            await held(attackers, 2 * HELD, lambda: asyncio.sleep(HOLD_S), at_once=HELD)

        result = attack(store, hold, honest)
        back = settled(store, result)
        refused = refused_per_ip(store)
        figures = f"{refused:.0f} per-IP; {attackers.connected}/{2 * HELD} held from 127.0.0.1"
        report("loopback", result, figures, back)
        assert attackers.connected == PER_IP, attackers.failed
        assert refused == 2 * HELD - PER_IP
        assert_served(result)
        assert result.rss_growth < HOLD_RSS_BUDGET, result
        assert_given_back(back, result)


def test_loopback_named_exempt_is_not_held_to_the_limit(tmp_path: Path) -> None:
    """``--relay-exempt-ip 127.0.0.1`` brings the old behaviour back."""
    count = 4 * PER_IP
    with node(tmp_path, "--relay-exempt-ip", LOOPBACK) as store:
        attackers = Attackers(store, LOOPBACK)
        asyncio.run(held(attackers, count, lambda: asyncio.sleep(0)))
        assert attackers.connected == count, attackers.failed
        assert refused_per_ip(store) == 0


# -- libp2p over WebSocket, through a proxy


def proxy(store: StoreProcess, source: str) -> Proxy:
    """A :class:`Proxy` to ``store``'s WebSocket listener, connecting from ``source``."""
    ws = next(addr for addr in store.relay_addrs if "/ws/" in addr)
    return Proxy((LOOPBACK, int(ws.split("/")[4])), source)


class ThroughProxy(Attackers):
    """:class:`Attackers` dialling the node's WebSocket listener through ``port`` of a
    :class:`Proxy`."""

    def __init__(self, store: StoreProcess, port: int) -> None:
        super().__init__(store)
        peer_id = store.relay_addrs[0].rsplit("/", 1)[1]
        address = f"/ip4/{LOOPBACK}/tcp/{port}/ws/p2p/{peer_id}"
        self.target = info_from_p2p_addr(multiaddr.Multiaddr(address))

    def host(self) -> IHost:
        return new_host(
            key_pair=create_new_key_pair(os.urandom(32)),
            enable_websocket=True,
            connection_config=ONE_DIAL,
        )


WS_LISTEN = "/ip4/127.0.0.1/tcp/0/ws"
WS_FLAGS = ("--relay-listen", WS_LISTEN)


@pytest.mark.parametrize(
    "listen", [[WS_LISTEN], ["/ip4/127.0.0.1/tcp/0", WS_LISTEN]], ids=["ws", "tcp+ws-one-port"]
)
def test_a_websocket_peers_ip_is_its_socket_or_the_client_a_trusted_proxy_names(
    listen: list[str],
) -> None:
    """What every per-IP budget of a peer asks (``peer_ip``: LightPush, relay bytes,
    store answers, Filter): a WebSocket peer had none at all (py-libp2p's connection
    reports no address), so those budgets passed it by. TCP and WebSocket on one port
    are one socket, whose WebSocket upgrades py-libp2p makes itself (``--web``'s
    default): there too (tests/web/test_page_behind_proxy.py found it)."""

    async def peer_ip(node: Libp2pTransport, address: str) -> str | None:
        async with Libp2pTransport(relay=False, listen=[WS_LISTEN]) as client:
            await client.connect(address)
            async with asyncio.timeout(PATIENCE_S):
                while client.peer_id not in await node.connected_peers():
                    await asyncio.sleep(0.05)
            return await node.peer_ip(client.peer_id)

    async def scenario() -> None:
        limits = ConnectionLimits(trusted_proxies=frozenset({LOOPBACK}))
        async with Libp2pTransport(relay=False, listen=listen, limits=limits) as node:
            ws = next(addr for addr in node.listen_addrs if "/ws/" in addr)
            async with Proxy((LOOPBACK, int(ws.split("/")[4])), LOOPBACK) as forwarding:
                port = await forwarding.port_for("127.0.0.5")
                proxied = f"/ip4/{LOOPBACK}/tcp/{port}/ws/p2p/{node.peer_id}"
                assert await peer_ip(node, proxied) == "127.0.0.5"
                assert await peer_ip(node, ws) == LOOPBACK

    run(scenario)


FORWARDED = 2 * PER_IP  # connections held for one forwarded client


def test_a_trusted_proxys_clients_are_each_held_to_their_own_limit(tmp_path: Path) -> None:
    """Through a proxy at 127.0.0.1 named ``--trusted-proxy``: a client (127.0.0.5)
    holds 5 connections of the 10 it tries (each held HOLD_S), while another (127.0.0.6)
    is served, once they are all held and on every probe meanwhile. Before, every
    WebSocket connection counted as one address: the other client was refused."""
    with node(tmp_path, *WS_FLAGS, "--trusted-proxy", LOOPBACK) as store:

        async def scenario() -> tuple[Watched, ThroughProxy, ThroughProxy]:
            async with proxy(store, LOOPBACK) as forwarding:
                greedy = ThroughProxy(store, await forwarding.port_for("127.0.0.5"))
                other = ThroughProxy(store, await forwarding.port_for("127.0.0.6"))

                async def while_held() -> None:
                    await honest_query(store, other)
                    await asyncio.sleep(HOLD_S)

                async with watch(store, functools.partial(honest_query, store, other)) as seen:
                    await held(greedy, FORWARDED, while_held)
                return seen.result, greedy, other

        result, greedy, other = asyncio.run(scenario())
        back = settled(store, result)
        refused = refused_per_ip(store)
        figures = (
            f"{refused:.0f} per-IP; {greedy.connected}/{FORWARDED} held for 127.0.0.5,"
            f" {other.connected} for 127.0.0.6"
        )
        report("trusted proxy", result, figures, back)
        assert greedy.connected == PER_IP, greedy.failed
        assert other.connected >= result.probes + 1, other.failed
        assert refused == FORWARDED - PER_IP
        assert_served(result)
        assert result.rss_growth < HOLD_RSS_BUDGET, result
        assert_given_back(back, result)


def test_forwarded_for_from_an_untrusted_address_is_not_believed(tmp_path: Path) -> None:
    """The same proxy connecting from 127.0.0.2, which the node does not trust: the
    addresses it names are ignored, its connections are 127.0.0.2's, 5 at most."""
    with node(tmp_path, *WS_FLAGS, "--trusted-proxy", LOOPBACK) as store:

        async def scenario() -> None:
            async with proxy(store, "127.0.0.2") as forwarding:
                greedy = ThroughProxy(store, await forwarding.port_for("127.0.0.5"))
                other = ThroughProxy(store, await forwarding.port_for("127.0.0.6"))
                await held(greedy, PER_IP, lambda: other.run(1, 1, other.leave))
                assert greedy.connected == PER_IP, greedy.failed
                assert other.connected == 0

        asyncio.run(scenario())
        assert refused_per_ip(store) == 1


# -- HTTP


PACE = 3  # --http-pages-rate-limit 3/60s: the 4th request of an address is answered 429


async def status_codes(url: str, forwarded_for: list[str], source: str = LOOPBACK) -> list[int]:
    """``GET /status`` once per entry of ``forwarded_for``, from ``source``, each sending
    that entry as its X-Forwarded-For."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        codes = []
        for entry in forwarded_for:
            headers = {"X-Forwarded-For": entry}
            async with session.get(f"{url}/status", headers=headers) as response:
                codes.append(response.status)
        return codes


async def answered(port: int, count: int) -> int:
    """Of ``count`` HTTP connections from 127.0.0.1 held open at once, how many are
    answered ``GET /health``."""
    connections = [await asyncio.open_connection(LOOPBACK, port) for _ in range(count)]
    served = 0
    for reader, writer in connections:
        with contextlib.suppress(ConnectionError):
            writer.write(b"GET /health HTTP/1.1\r\nHost: node\r\n\r\n")
            await writer.drain()
            served += (await reader.readline()).startswith(b"HTTP/1.1 200")
    for _, writer in connections:
        writer.close()
    return served


HTTP_FLAGS = ("--http-pages-rate-limit", f"{PACE}/60s", "--http-max-connections-per-ip", "2")


def test_http_limits_follow_forwarded_for_from_a_trusted_proxy(tmp_path: Path) -> None:
    """Pacing counts the client a trusted proxy names; the proxy's own connections are
    not capped per IP (it pools them for all its clients); a header from anyone else is
    ignored."""
    with node(tmp_path, *HTTP_FLAGS, "--trusted-proxy", LOOPBACK) as store:
        port = int(store.url.rsplit(":", 1)[1])

        async def scenario() -> None:
            five = ["127.0.0.5"] * (PACE + 1)
            assert await status_codes(store.url, five) == [200] * PACE + [429]
            assert await status_codes(store.url, ["127.0.0.6"]) == [200]
            spoofed = [f"127.0.0.{7 + n}" for n in range(PACE + 1)]
            untrusted = await status_codes(store.url, spoofed, source="127.0.0.2")
            assert untrusted == [200] * PACE + [429]
            assert await answered(port, 4) == 4

        asyncio.run(scenario())


def test_without_a_trusted_proxy_forwarded_for_is_ignored(tmp_path: Path) -> None:
    with node(tmp_path, *HTTP_FLAGS) as store:
        port = int(store.url.rsplit(":", 1)[1])

        async def scenario() -> None:
            spoofed = [f"127.0.0.{5 + n}" for n in range(PACE + 1)]
            assert await status_codes(store.url, spoofed) == [200] * PACE + [429]
            assert await answered(port, 4) == 2

        asyncio.run(scenario())
