"""Clients recover by themselves when their node is killed and comes back (issue 37).

A store node with the chat page runs on fixed ports (as an operator runs one); two
browser pages, a terminal chat on relay and a light one (`--light`: LightPush and Filter)
talk in one channel through it. The node is killed with SIGKILL and started again with
the same arguments, so with the same peer id (its kept node key) at the same addresses.

During the outage page A and both chats type a line, which the page shows as "waiting
for the node" (not "sent"), and not "caught up" either; page B types one and its tab is
closed before the node is back. Without a reload or a restart, every client reconnects;
page B, opened again, still holds its line (localStorage) and sends it; every line typed
during the outage reaches everyone and is acknowledged (and then no longer kept), and
the lines after it too. `make soak` repeats the restart 20 times.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from chatprocess import TypedChat, wait_for
from storeprocess import StoreProcess, store_serve
from test_chat_browser import CHAT_OPTIONS, PAGE_TIMERS, PUBSUB, WAIT_S, Page, chat_says

from sdsync.testing.hostile import soak_scale
from sdsync.waku.filter.rpc import FILTER_SUBSCRIBE_PROTOCOL
from sdsync.waku.lightpush.rpc import LIGHTPUSH_PROTOCOL

pytestmark = pytest.mark.xdist_group("many-processes")

CHANNEL = "restarts"
# Reconnecting after a restart: the page redials every 0.5 s doubling to 8 s, the chat
# every second; 10 s is the promise, WAIT_S the test's patience on a loaded machine.
RECONNECT_S = 10.0


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@contextmanager
def fixed_node(data_dir: Path, ports: list[int]) -> Iterator[StoreProcess]:
    http, tcp, ws = ports
    flags = ["--web", "--listen", f"127.0.0.1:{http}"]
    flags += ["--relay-listen", f"/ip4/127.0.0.1/tcp/{tcp}"]
    flags += ["--relay-listen", f"/ip4/127.0.0.1/tcp/{ws}/ws"]
    protocols = (LIGHTPUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL)
    with store_serve(data_dir, PUBSUB, *protocols, flags=flags) as node:
        yield node


def test_pages_and_a_chat_reconnect_after_the_node_is_killed_and_restarted(
    tmp_path: Path, browser: Any
) -> None:
    restarts = soak_scale(1, 20)
    ports = free_ports(3)
    data_dir = tmp_path / "node"
    pages: list[Page] = []
    chat: TypedChat | None = None
    light: TypedChat | None = None
    texts: list[str] = []
    reconnect_s: list[float] = []
    with fixed_node(data_dir, ports) as node:
        addresses = node.relay_addrs
        tcp = next(a for a in addresses if "/ws" not in a)
        pages = [Page(browser, node.url), Page(browser, node.url)]
        try:
            for page, name in zip(pages, ("ra", "rb"), strict=True):
                page.open(f"channel={CHANNEL}&name={name}&{PAGE_TIMERS}")
            args = ["--peer", tcp, "--store", tcp, *CHAT_OPTIONS]
            chat = TypedChat(tmp_path, "rt", CHANNEL, args, patience_s=WAIT_S)
            light_args = ["--light", "--service", tcp, *CHAT_OPTIONS]
            light = TypedChat(tmp_path, "rl", CHANNEL, light_args, patience_s=WAIT_S)
            wait_for(chat.has_mesh, "the node in the chat's mesh", WAIT_S)
            wait_for(light.has_mesh, "the light chat subscribed at the node", WAIT_S)
            say(pages, [chat, light], texts, "before")
            node.process.kill()
            node.process.wait()
            for restart in range(restarts):
                outage = [f"ra down {restart}", f"rt down {restart}", f"rl down {restart}"]
                pages[0].send(outage[0])
                chat.type(outage[1])
                light.type(outage[2])
                # Page B types a line, and its tab is closed before the node is back.
                closed = f"rb closed {restart}"
                pages[1].send(closed)
                outage.append(closed)
                texts += outage
                for page, line in ((pages[0], outage[0]), (pages[1], closed)):
                    page.wait_status("catchup", "waiting")  # no "caught up" while down
                    wait_for(
                        lambda p=page, t=line: p.badge_of(t) == "waiting for the node",
                        "the line typed during the outage waiting, not sent",
                        WAIT_S,
                    )
                pages[1].page.close()
                with fixed_node(data_dir, ports) as again:
                    assert sorted(again.relay_addrs) == sorted(addresses)  # same peer id and ports
                    started = time.monotonic()
                    wait_for(
                        lambda n=restart + 2: pages[0].connects() == n,
                        "page A connected again",
                        WAIT_S,
                    )
                    # The closed tab, opened again: its line is still there, and goes out.
                    pages[1].page = pages[1]._new_page()
                    pages[1].open(f"channel={CHANNEL}&{PAGE_TIMERS}")
                    reached = rf"reached peer {again.relay_addrs[0].rsplit('/', 1)[1]} again"
                    wait_for(
                        lambda n=restart + 1, r=reached: len(re.findall(r, chat.text())) == n,
                        "the chat reconnected",
                        WAIT_S,
                    )
                    reconnect_s.append(time.monotonic() - started)
                    for page in pages:
                        page.shows(*texts)
                    for typed in (chat, light):
                        for line in outage:
                            if not line.startswith(typed.name):
                                chat_says(typed, line.split()[0], line)
                    for page, line in ((pages[0], outage[0]), (pages[1], closed)):
                        wait_for(
                            lambda p=page, t=line: p.state_of(t) == "acknowledged",
                            "the outage line acknowledged",
                            WAIT_S,
                        )
                        assert p_pending(page) == [], "an acknowledged line is still kept"
                    say(pages, [chat, light], texts, f"after {restart}")
                    if restart + 1 < restarts:
                        again.process.kill()
                        again.process.wait()
        finally:
            for typed in (chat, light):
                if typed is not None:
                    typed.stop()
            for page in pages:
                page.close()
    print(f"reconnected after each restart within {max(reconnect_s):.1f} s: {reconnect_s}")
    assert [page.problems for page in pages] == [[], []]


def p_pending(page: Page) -> list[Any]:
    """The lines the page keeps in localStorage until they are acknowledged."""
    kept: list[Any] = page.page.evaluate(
        "() => Object.keys(localStorage).filter(k => k.startsWith('sdsync.chat.pending.'))"
        ".flatMap(k => JSON.parse(localStorage.getItem(k)))"
    )
    return kept


def say(pages: list[Page], chats: list[TypedChat], texts: list[str], when: str) -> None:
    """Each member says one line; each sees every other's."""
    lines = [f"ra {when}", f"rb {when}", *(f"{c.name} {when}" for c in chats)]
    pages[0].send(lines[0])
    pages[1].send(lines[1])
    for chat in chats:
        chat.type(f"{chat.name} {when}")
    texts += lines
    for page in pages:
        page.shows(*lines)
    for chat in chats:  # a chat shows its own line with its state: not matched here
        for line in lines:
            if not line.startswith(chat.name):
                chat_says(chat, line.split()[0], line)
