"""A node whose key was rotated comes back under a new peer id (issue 37): the page reads
`config.json` again and reconnects by itself, without a reload; a terminal chat, which was
given the old address, says in one line which peer id it expected and which answered.

The node runs on fixed ports with the chat page; a page and a relay chat are in a channel
through it. The node is stopped, its key file moved away (docs/store.md, "Rotating the
key"), and started again with the same arguments: a new key, a new peer id, the same
ports. A line typed in the page during the outage is sent once the page has found the
node under its new identity, and reads "sent" (the rotated node accepted its LightPush).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chatprocess import TypedChat, wait_for
from test_chat_browser import CHAT_OPTIONS, PAGE_TIMERS, WAIT_S, Page
from test_node_restart import fixed_node, free_ports

pytestmark = pytest.mark.xdist_group("many-processes")

CHANNEL = "rotation"


def peer_id(addr: str) -> str:
    return addr.rsplit("/p2p/", 1)[1]


def test_the_page_finds_a_rotated_node_and_the_chat_names_both_ids(
    tmp_path: Path, browser: Any
) -> None:
    ports = free_ports(3)
    data_dir = tmp_path / "node"
    page: Page | None = None
    chat: TypedChat | None = None
    try:
        with fixed_node(data_dir, ports) as node:
            old = peer_id(node.relay_addrs[0])
            tcp = next(a for a in node.relay_addrs if "/ws" not in a)
            page = Page(browser, node.url)
            page.open(f"channel={CHANNEL}&name=pa&{PAGE_TIMERS}")
            args = ["--peer", tcp, *CHAT_OPTIONS]
            chat = TypedChat(tmp_path, "ct", CHANNEL, args, patience_s=WAIT_S)
            wait_for(chat.has_mesh, "the node in the chat's mesh", WAIT_S)
        (data_dir / "nodekey").rename(tmp_path / "nodekey.old")
        page.send("pa typed while rotating")
        wait_for(
            lambda: page.badge_of("pa typed while rotating") == "waiting for the node",
            "the line waiting while the node is down",
            WAIT_S,
        )
        with fixed_node(data_dir, ports) as rotated:
            new = peer_id(rotated.relay_addrs[0])
            assert new != old
            wait_for(lambda: page.connects() == 2, "the page connected to the new id", WAIT_S)
            wait_for(
                lambda: page.state_of("pa typed while rotating") == "sent",
                "the line typed during the outage sent to the rotated node",
                WAIT_S,
            )
            line = f"expected peer {old} but {new} answered at its address"
            wait_for(lambda: line in chat.text(), "the chat's one line naming both ids", WAIT_S)
            assert chat.text().count(line) == 1, "said more than once"
        assert page.problems == []
    finally:
        if chat is not None:
            chat.stop()
        if page is not None:
            page.close()
