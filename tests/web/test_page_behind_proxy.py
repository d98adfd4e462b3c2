"""The chat page behind a local WebSocket proxy (issue 38, attack 4: "the loopback
exemption"), in Chromium: what docs/network.md ("Behind TLS: wss://") says of it.

A real ``sdsync store serve --web`` (tests/storeprocess.py) holds each IP address to 5
libp2p connections at once. Its pages dial it through a
:class:`~sdsync.testing.proxy.ProxyThread` forwarding to its WebSocket listener from
127.0.0.1, which appends the client's address to each upgrade request's
X-Forwarded-For, as Caddy does. Every page comes from 127.0.0.1, so the proxy tells them
apart by port: page *n* dials port *n*, which stands for client 198.51.100.*n* (header
text only). The node is told every port (``--web-address``, repeated, so that its
Content-Security-Policy admits each), and each page's browser context is handed a
``config.json`` naming its own port alone (a Playwright route): as each client of a real
proxy dials the one address from an address of its own.

Six pages (one more than the limit), each in its own browser context, join one channel:

* with ``--trusted-proxy 127.0.0.1`` each counts as its own client: all six connect, the
  node refuses none, and a line typed in the first and one in the last reach every page;
* without it every page is 127.0.0.1's: five connect; the sixth is refused, and refused
  again at each redial (the node counts each refusal; the page says "connecting…" and
  why), until one of the five leaves and it connects in that one's place.

Both with a WebSocket listener of its own and with TCP and WebSocket on one port
(``--web``'s default beside ``--relay-listen``'s: both ``127.0.0.1:0``), which py-libp2p
serves from one socket (its ``PortDemultiplexer``) and upgrades itself: this test found
that there every WebSocket client was address "", header or not, until the upgrade
request was kept on that path too (:mod:`sdsync.transport.libp2p_patches`).

Bounds are liveness bounds (``WAIT_S``), never measured times.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from chatprocess import wait_for
from storeprocess import StoreProcess, store_serve
from test_chat_browser import PAGE_TIMERS, PUBSUB, WAIT_S, Page

from sdsync.testing.proxy import LOOPBACK, ProxyThread
from sdsync.transport.settings import ConnectionLimits

# Chromium (six contexts) and a store node: never beside the other groups of processes.
pytestmark = pytest.mark.xdist_group("many-processes")

PER_IP = ConnectionLimits().per_ip
PAGES = PER_IP + 1
CLIENTS = [f"198.51.100.{n}" for n in range(1, PAGES + 1)]
CHANNEL = "proxied"
#: How a connection refused for its address is counted (either bound may close it first).
PER_IP_REASONS = ("per-IP limit", "pending handshakes per IP")
WS_ONLY = ("--relay-listen", f"/ip4/{LOOPBACK}/tcp/0/ws")
TRUSTED = ("--trusted-proxy", LOOPBACK)


def refused_per_ip(node: StoreProcess) -> float:
    return sum(
        node.metric("sdsync_store_libp2p_connections_refused_total", reason=reason)
        for reason in PER_IP_REASONS
    )


def refusals(node: StoreProcess, page: Page) -> float:
    """:func:`refused_per_ip` after half a second (/metrics is paced per address) spent in
    Playwright: its sync API runs the pages' route handlers (``config.json``) only while
    it is called."""
    page.page.wait_for_timeout(500)
    return refused_per_ip(node)


@dataclass
class Deployment:
    """A node behind the proxy, and the pages opened on it (each its own client)."""

    node: StoreProcess
    ports: list[int]  # the proxy's port for each of CLIENTS, in order
    browser: Any
    pages: list[Page] = field(default_factory=list)

    def join(self, n: int) -> Page:
        """Page ``n`` (from 1: client ``CLIENTS[n - 1]``) joins the channel as ``pn``; not
        waited for."""
        page = Page(self.browser, self.node.url)
        self.pages.append(page)
        port = self.ports[n - 1]

        def own_port(route: Any) -> None:
            try:
                answer = route.fetch()
            except Exception:  # Playwright's Error: the node is gone (the test is ending)
                route.abort()
                return
            config = answer.json()
            config["peers"] = [peer for peer in config["peers"] if f"/tcp/{port}/" in peer]
            route.fulfill(response=answer, json=config)

        page.context.route("**/chat/config.json", own_port)
        page.page.goto(f"{self.node.url}/chat/?channel={CHANNEL}&name=p{n}&{PAGE_TIMERS}")
        return page

    def connected(self, page: Page) -> None:
        """Waits until ``page`` is connected, subscribed and caught up; fails at once
        if the node refuses a connection for its address meanwhile."""

        def settled() -> bool:
            return state(page) == "connected" or refusals(self.node, page) > 0

        wait_for(settled, "the page connected or refused", WAIT_S)
        assert refused_per_ip(self.node) == 0, page.describe()
        page.wait_status("subscription", "subscribed")
        page.wait_status("catchup", "caught-up")


@contextmanager
def deployment(tmp_path: Path, browser: Any, *flags: str) -> Iterator[Deployment]:
    """A node with ``--web`` and ``flags`` whose page dials the proxy in front of its
    WebSocket listener; its pages are closed before it stops."""
    with ProxyThread((LOOPBACK, 0)) as proxy:  # its upstream is set once the node listens
        ports = [proxy.port_for(client) for client in CLIENTS]
        web = [f for port in ports for f in ("--web-address", f"/ip4/{LOOPBACK}/tcp/{port}/ws")]
        with store_serve(tmp_path, PUBSUB, flags=["--web", *web, *flags]) as node:
            ws = next(addr for addr in node.relay_addrs if "/ws/" in addr)
            proxy.upstream = (LOOPBACK, int(ws.split("/")[4]))
            with urllib.request.urlopen(f"{node.url}/chat/config.json", timeout=10) as answer:
                peers = json.loads(answer.read())["peers"]
            assert [int(peer.split("/")[4]) for peer in peers] == ports, peers
            deployed = Deployment(node, ports, browser)
            try:
                yield deployed
            finally:
                for page in deployed.pages:
                    page.close()


def state(page: Page) -> str | None:
    """The page's connection state (``#connection``'s data-state)."""
    value: str | None = page.page.get_attribute("#connection", "data-state")
    return value


@pytest.mark.parametrize(
    "listeners",
    [pytest.param(WS_ONLY, id="ws"), pytest.param((), id="tcp+ws-one-port")],
)
def test_behind_a_trusted_proxy_each_page_is_its_own_client(
    tmp_path: Path, browser: Any, listeners: tuple[str, ...]
) -> None:
    with deployment(tmp_path, browser, *listeners, *TRUSTED) as deployed:
        for n in range(1, PAGES + 1):
            deployed.connected(deployed.join(n))
        pages, node = deployed.pages, deployed.node
        assert [state(page) for page in pages] == ["connected"] * PAGES
        assert node.metric("sdsync_store_filter_subscribers") == PAGES
        first, last = "p1: hello, all", f"p{PAGES}: hello from the last"
        pages[0].send(first)
        pages[-1].send(last)
        for page in pages:
            page.shows(first, last)
        assert refused_per_ip(node) == 0
        assert [page.problems for page in pages] == [[]] * PAGES


def test_without_a_trusted_proxy_the_sixth_page_is_refused(tmp_path: Path, browser: Any) -> None:
    with deployment(tmp_path, browser, *WS_ONLY) as deployed:
        for n in range(1, PER_IP + 1):
            deployed.connected(deployed.join(n))
        node, five = deployed.node, list(deployed.pages)
        sixth = deployed.join(PAGES)
        # Refused, and refused again at its next dial (0.5 s after, doubling up to 8 s).
        wait_for(lambda: refusals(node, sixth) >= 2, "the sixth page refused twice", WAIT_S)
        assert state(sixth) == "connecting", sixth.describe()
        why = sixth.page.text_content("#connection") or ""
        assert f"cannot reach /ip4/{LOOPBACK}/tcp/{deployed.ports[-1]}/ws/p2p/" in why, why
        assert [state(page) for page in five] == ["connected"] * PER_IP
        assert node.metric("sdsync_store_filter_subscribers") == PER_IP
        # One of the five leaves: the sixth connects in its place.
        deployed.pages.remove(leaving := five.pop(0))
        leaving.close()
        sixth.wait_status("connection", "connected")
        sixth.wait_status("subscription", "subscribed")
        sixth.send(f"p{PAGES}: in at last")
        five[0].shows(f"p{PAGES}: in at last")
        assert [page.problems for page in deployed.pages] == [[]] * PER_IP
