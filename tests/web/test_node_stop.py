"""A browser's view of a graceful stop (issue 37): a js-waku chat page is subscribed
through a store node's WebSocket listener when the node gets SIGTERM. Every WebSocket the
page had open ends in a clean close (``wasClean``, code 1000: js-libp2p hung up at the
node's GoAway), not an abnormal one (1006: the socket died under it, which a node
cancelling its connections gave). Only the sockets open at the signal count: the page
redials at once, and those dials are refused.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from storeprocess import store_serve
from test_chat_browser import CHANNEL, PUBSUB, WAIT_S, Page

from sdsync.waku.filter.rpc import FILTER_SUBSCRIBE_PROTOCOL
from sdsync.waku.lightpush.rpc import LIGHTPUSH_PROTOCOL

pytestmark = pytest.mark.xdist_group("many-processes")

# The page's WebSockets, wrapped: when each opened, and how it was closed.
WATCH_SOCKETS = """
window.sockets = [];
const NativeWebSocket = window.WebSocket;
window.WebSocket = class extends NativeWebSocket {
  constructor(...args) {
    super(...args);
    const seen = {opened: false, close: null};
    window.sockets.push(seen);
    this.addEventListener('open', () => { seen.opened = true; });
    this.addEventListener('close', event => {
      seen.close = {code: event.code, wasClean: event.wasClean};
    });
  }
};
"""
OPEN_NOW = "window.sockets.flatMap((s, i) => s.opened && !s.close ? [i] : [])"


def test_a_page_sees_its_websockets_closed_cleanly_at_sigterm(tmp_path: Path, browser: Any) -> None:
    protocols = (LIGHTPUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL)
    with store_serve(tmp_path, PUBSUB, *protocols, flags=["--web"]) as node:
        page = Page(browser, node.url)
        page.page.add_init_script(WATCH_SOCKETS)
        page.open(f"channel={CHANNEL}&name=stopping")
        open_at_stop = page.page.evaluate(OPEN_NOW)
        node.process.send_signal(signal.SIGTERM)
        assert node.process.wait(timeout=WAIT_S) == 0, "".join(node.stderr)
        page.page.wait_for_function(
            "open => open.every(i => window.sockets[i].close)",
            arg=open_at_stop,
            timeout=WAIT_S * 1000,
        )
        closes = page.page.evaluate("open => open.map(i => window.sockets[i].close)", open_at_stop)
        stderr = "".join(node.stderr)
    assert open_at_stop, "the page had no WebSocket open"
    assert all(c == {"code": 1000, "wasClean": True} for c in closes), closes
    assert "Traceback" not in stderr, stderr
