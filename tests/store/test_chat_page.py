"""``/chat/`` on a node: the page's files and config.json, the CSP naming only the node's
WebSocket addresses, ETags and gzip, and the addresses a page may be told to dial."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import aiohttp
import pytest
from storetest import running

from sdsync.errors import LocalProtocolError
from sdsync.store import SqlArchive
from sdsync.store.chat_page import (
    CHAT_PREFIX,
    MAX_TEXT_BYTES,
    ChatPage,
    chat_app,
    chat_page,
    websocket_origin,
)
from sdsync.waku.lightpush.service import ServedTopics

PEER = "16Uiu2HAmPeer"
LISTEN = [f"/ip4/127.0.0.1/tcp/6000/p2p/{PEER}", f"/ip4/127.0.0.1/tcp/6001/ws/p2p/{PEER}"]
IDENTITY = {"Accept-Encoding": "identity"}  # compressed only where asked for
SERVED = ServedTopics((("/waku/2/rs/1/7", None), ("/waku/2/rs/1/7", "/x/1/y/proto")))


def test_the_page_dials_the_websocket_listeners_with_the_node_id() -> None:
    page = chat_page(LISTEN, SERVED)
    assert page == ChatPage(
        peers=(f"/ip4/127.0.0.1/tcp/6001/ws/p2p/{PEER}",),
        cluster_id=1,
        num_shards=8,
        pubsub_topics=("/waku/2/rs/1/7",),
        max_text_bytes=MAX_TEXT_BYTES,
        max_hashes_per_query=100,
    )


def test_behind_a_tls_proxy_the_page_dials_the_addresses_given() -> None:
    page = chat_page(LISTEN, SERVED, advertise=["/dns4/chat.example/tcp/443/wss/"])
    assert page.peers == (f"/dns4/chat.example/tcp/443/wss/p2p/{PEER}",)


def test_a_page_needs_a_websocket_address() -> None:
    with pytest.raises(LocalProtocolError, match="WebSocket relay listener"):
        chat_page(LISTEN[:1], SERVED)
    with pytest.raises(LocalProtocolError, match="not a WebSocket address"):
        chat_page(LISTEN, SERVED, advertise=["/ip4/10.0.0.1/tcp/443"])
    with pytest.raises(LocalProtocolError, match="no single peer id"):
        chat_page(["/ip4/127.0.0.1/tcp/6001/ws"], SERVED)


@pytest.mark.parametrize(
    ("multiaddr", "origin"),
    [
        ("/ip4/127.0.0.1/tcp/6001/ws/p2p/x", "ws://127.0.0.1:6001"),
        ("/ip6/::1/tcp/6001/ws", "ws://[::1]:6001"),
        ("/dns4/chat.example/tcp/443/wss", "wss://chat.example:443"),
        ("/dns/chat.example/tcp/443/tls/ws/p2p/x", "wss://chat.example:443"),
    ],
)
def test_websocket_origins(multiaddr: str, origin: str) -> None:
    assert websocket_origin(multiaddr) == origin


@pytest.mark.parametrize(
    "multiaddr", ["/ip4/127.0.0.1/tcp/6000", "/ip4/1.2.3.4/tcp/x/ws", "/dns4/h/tcp/1/tls", "ws"]
)
def test_other_addresses_have_no_websocket_origin(multiaddr: str) -> None:
    with pytest.raises(LocalProtocolError):
        websocket_origin(multiaddr)


def test_a_node_serves_the_page_its_files_and_config(archive: SqlArchive, tmp_path: Path) -> None:
    page = chat_page(LISTEN, SERVED)

    async def scenario() -> None:
        mounts = {CHAT_PREFIX: chat_app(page)}
        async with (
            running(archive, tmp_path, mounts=mounts) as node,
            aiohttp.ClientSession(auto_decompress=False, headers=IDENTITY) as http,
        ):
            async with http.get(f"{node.url}/chat?channel=room", allow_redirects=False) as r:
                assert (r.status, r.headers["Location"]) == (302, "/chat/?channel=room")
            async with http.get(f"{node.url}/chat/") as r:
                assert r.status == 200 and r.content_type == "text/html"
                assert b'<script type="module" src="chat.js">' in await r.read()
                csp = r.headers["Content-Security-Policy"]
                assert "connect-src 'self' ws://127.0.0.1:6001;" in csp
                assert "script-src 'self';" in csp and "unsafe" not in csp
            async with http.get(f"{node.url}/chat/config.json") as r:
                assert json.loads(await r.read()) == {
                    "peers": list(page.peers),
                    "cluster_id": 1,
                    "num_shards": 8,
                    "pubsub_topics": ["/waku/2/rs/1/7"],
                    "max_text_bytes": MAX_TEXT_BYTES,
                    "max_hashes_per_query": 100,
                }
            gzipped = {"Accept-Encoding": "gzip, deflate"}
            async with http.get(f"{node.url}/chat/chat.js", headers=gzipped) as r:
                assert r.status == 200 and r.content_type == "text/javascript"
                assert r.headers["Content-Encoding"] == "gzip"
                body = gzip.decompress(await r.read())
                tag = r.headers["ETag"]
            shipped = Path(__file__).parents[2] / "src/sdsync/store/web/chat/chat.js"
            assert body == shipped.read_bytes()
            async with http.get(f"{node.url}/chat/chat.js", headers={"If-None-Match": tag}) as r:
                assert r.status == 304 and await r.read() == b""
            for missing in ("index.html.bak", "..%2Fstatus.css", "config.json/x"):
                async with http.get(f"{node.url}/chat/{missing}") as r:
                    assert r.status == 404, missing

    asyncio.run(scenario())
