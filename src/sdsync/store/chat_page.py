"""The chat page: ``/chat/`` on a store node started with ``--web``.

Theory of operation
-------------------
The page is a js-waku light node in the browser (``web/`` in the repository: its sources
and lockfile; ``make web`` bundles them into ``web/chat/chat.js`` of this package, and
``chat.json`` beside it records the hashes it was built from).  Everything it needs comes
from the node that serves it: ``index.html``, ``chat.css`` and ``chat.js`` are static
(:data:`ASSETS`), and ``config.json`` (:class:`ChatPage`) tells the page where its light
node dials, which cluster and shards the node relays, and the longest text it takes.

The page dials the node's own WebSocket relay listeners (``…/tcp/PORT/ws``), or, behind a
TLS proxy, the addresses the operator names (``--web-address /dns4/chat.example/tcp/443/wss``);
the node's peer id is appended to each.  The Content-Security-Policy lets the page run
only its own script and open WebSockets only to those addresses (:func:`headers`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources

from aiohttp import web

from sdsync.errors import LocalProtocolError
from sdsync.waku.lightpush.service import ServedTopics
from sdsync.waku.store.model import MAX_HASHES

__all__ = ["CHAT_PREFIX", "ChatPage", "chat_app", "chat_page", "websocket_origin"]

CHAT_PREFIX = "/chat"
ASSETS = {
    "chat.js": "text/javascript",
    "chat.css": "text/css",
    "chat.json": "application/json",
}
"""The page's files besides ``index.html`` (in ``web/chat/``), served at
``/chat/<name>``, and their types."""
MAX_TEXT_BYTES = 64 * 1024
"""The longest text the page sends.  A WakuMessage may hold 150 KiB + 4 KiB
(:data:`~sdsync.wire.waku.MAX_WAKU_MESSAGE_BYTES`); @waku/sds
wraps the text with up to 200 causal history entries and a 10,000-entry bloom filter
(about 55 kB in all), and a chat line needs nothing near the rest."""
_WEB = resources.files("sdsync.store") / "web" / "chat"


@dataclass(frozen=True)
class ChatPage:
    """``config.json``: what the page's light node needs to know of this node."""

    peers: tuple[str, ...]
    """Multiaddrs the page dials, each ending in ``/p2p/<this node's id>``."""
    cluster_id: int
    num_shards: int
    pubsub_topics: tuple[str, ...]
    """The pubsub topics the node relays: a channel on another shard is refused."""
    max_text_bytes: int = MAX_TEXT_BYTES
    max_hashes_per_query: int = MAX_HASHES
    """The most message hashes one store query may name: the page asks for more in parts."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()


def chat_page(
    listen_addrs: Sequence[str], served: ServedTopics, advertise: Sequence[str] = ()
) -> ChatPage:
    """The page of a node listening on ``listen_addrs`` (each ``…/p2p/<id>``) and relaying
    ``served``; it dials ``advertise`` if given, else the node's WebSocket listeners."""
    peer_ids = {addr.rsplit("/p2p/", 1)[1] for addr in listen_addrs if "/p2p/" in addr}
    if len(peer_ids) != 1:
        raise LocalProtocolError(f"no single peer id in the relay's addresses {listen_addrs}")
    (peer_id,) = peer_ids
    if advertise:
        peers = tuple(f"{addr.rstrip('/')}/p2p/{peer_id}" for addr in advertise)
    else:
        peers = tuple(addr for addr in listen_addrs if "/ws/" in addr or "/wss/" in addr)
    if not peers:
        raise LocalProtocolError(
            "the chat page needs a WebSocket relay listener (--relay-listen …/tcp/PORT/ws)"
        )
    for addr in peers:
        websocket_origin(addr)
    return ChatPage(
        peers=peers,
        cluster_id=served.cluster_id,
        num_shards=served.shard_count,
        pubsub_topics=tuple(dict.fromkeys(topic for topic, _ in served.topics)),
    )


def websocket_origin(multiaddr: str) -> str:
    """``ws://host:port`` or ``wss://host:port`` of a WebSocket multiaddr (for the CSP);
    LocalProtocolError for any other address."""
    parts = multiaddr.strip("/").split("/")
    if len(parts) >= 5 and parts[2] == "tcp" and parts[3].isdigit():
        kind, host, port, rest = parts[0], parts[1], parts[3], parts[4:]
        scheme = {"ws": "ws", "wss": "wss", "tls": "wss"}.get(rest[0])
        if scheme == "wss" and rest[0] == "tls" and rest[1:2] != ["ws"]:
            scheme = None
        if kind in ("ip4", "ip6", "dns", "dns4", "dns6") and scheme is not None:
            return f"{scheme}://{f'[{host}]' if kind == 'ip6' else host}:{port}"
    raise LocalProtocolError(f"{multiaddr} is not a WebSocket address (…/tcp/PORT/ws or /wss)")


def headers(page: ChatPage) -> dict[str, str]:
    """The page's Content-Security-Policy and the rest: no inline script or style, no
    framing, WebSockets only to the node."""
    origins = " ".join(dict.fromkeys(websocket_origin(addr) for addr in page.peers))
    return {
        "Content-Security-Policy": (
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
            f"connect-src 'self' {origins}; base-uri 'none'; form-action 'self'; "
            "frame-ancestors 'none'"
        ),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }


def chat_app(page: ChatPage) -> web.Application:
    """The routes under :data:`CHAT_PREFIX`: the page, its files and ``config.json``.

    The files are read once; each answer carries its sha256 as ETag, so a reload costs a
    304, and ``chat.js`` (about 1 MB) goes gzip-compressed to a browser that takes it."""
    sent = headers(page)
    files = {"": (_WEB.joinpath("index.html").read_bytes(), "text/html")}
    files |= {name: (_WEB.joinpath(name).read_bytes(), kind) for name, kind in ASSETS.items()}
    files["config.json"] = (page.to_json(), "application/json")
    tags = {name: f'"{hashlib.sha256(body).hexdigest()}"' for name, (body, _) in files.items()}

    async def serve_file(request: web.Request) -> web.Response:
        name = request.match_info.get("name", "")
        if name not in files:
            raise web.HTTPNotFound()
        tag = tags[name]
        if request.headers.get("If-None-Match") == tag:
            return web.Response(status=304, headers={**sent, "ETag": tag})
        body, kind = files[name]
        response = web.Response(
            body=body, content_type=kind, headers={**sent, "ETag": tag, "Vary": "Accept-Encoding"}
        )
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            response.enable_compression(web.ContentCoding.gzip)
        return response

    app = web.Application()
    app.add_routes([web.get("/", serve_file), web.get("/{name}", serve_file)])
    return app
