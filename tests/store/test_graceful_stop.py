"""A graceful stop, as clients see it (issue 37): SIGTERM while a LightPush client, a
Filter subscriber, a store querier and a relay peer are connected over libp2p, an HTTP
client holds a keep-alive connection, and a push is in flight.

The push is held in flight by the test itself: it takes the archive's write lock first,
so the node, having relayed the pushed message (which the relay peer hears: the node is
handling it), waits to archive it. SIGTERM lands then; once the node refuses a new
stream (it is stopping), the lock is let go. The node must answer the push 200, then
close every connection cleanly, and exit 0 without a traceback.

Each libp2p client reaches the node through a TCP tap of the test's, which relays bytes
both ways and notes how the node's side of the connection ended: with a FIN (an orderly
close) or a reset (RST, "connection reset by peer"), and mirrors it to the client. A
clean close is, at the socket, a FIN from the node and never a reset; in the muxer, the
GoAway (normal termination) that py-libp2p's yamux logs on receipt, one per connection;
and each client knows at once it is disconnected (no hang). The HTTP keep-alive socket
reads its end (b"", a FIN), not ECONNRESET.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import logging
import signal
import socket
import sqlite3
import struct
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from storeprocess import SYNC_TOKEN, TOPIC, StoreProcess, store_serve
from testdeps import require

from sdsync.waku.filter.client import filter_request
from sdsync.waku.filter.rpc import FILTER_PUSH_PROTOCOL, FilterSubscribeType, MessagePush
from sdsync.waku.lightpush.client import lightpush_v3
from sdsync.waku.store.client import StoreUnavailableError, WakuStoreClient
from sdsync.waku.store.model import StoreQuery
from sdsync.wire.waku import WakuMessage

if TYPE_CHECKING:
    from sdsync.transport.libp2p import Libp2pNode

libp2p = require("sdsync.transport.libp2p", "needs the 'p2p' extra")

CONTENT_TOPIC = "/sds/1/graceful/proto"
FLAGS = ["--token", SYNC_TOKEN, "--lightpush-rate-limit", "off"]
# Liveness bounds only: each is met in well under a second on an idle machine.
PATIENCE_S = 30.0
# The node's archive waits this long for a write lock (SQLite's busy timeout) before it
# fails the push (503); the test holds the lock until the node is seen stopping, which
# takes a fraction of a second.
LOCK_LIMIT_S = 10.0
YAMUX_LOGGER = "libp2p.stream_muxer.yamux.yamux"


class Tap:
    """A TCP relay between one client and the node. ``ends`` says how each side ended its
    half of the connection, ``"fin"`` or ``"rst"``, the first time it did (``"node"``:
    what the client got from the node). The node's end is passed on as it came; a
    client's reset reaches the node as a FIN, so that how the node ends its side is still
    seen, and so is what the node sends after the client has gone (read, dropped)."""

    def __init__(self, node: tuple[str, int]) -> None:
        self.node = node
        self.ends: dict[str, str] = {}
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._lock = threading.Lock()
        self._aborted = False
        threading.Thread(target=self._serve, daemon=True, name="tap").start()

    def _serve(self) -> None:
        with self._server:
            client, _ = self._server.accept()  # one client, one connection
        node = socket.create_connection(self.node)
        for sock in (client, node):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=self._pump, args=("node", node, client), daemon=True).start()
        self._pump("client", client, node)

    def _pump(self, side: str, source: socket.socket, sink: socket.socket) -> None:
        passing = True
        while True:
            try:
                data = source.recv(65536)
            except ConnectionResetError:
                if self._ended(side, "rst"):
                    if side == "node":
                        self._abort(sink)
                    else:
                        with contextlib.suppress(OSError):
                            sink.shutdown(socket.SHUT_WR)
                return
            except OSError:
                return  # closed here, after the node's reset
            if not data:
                if self._ended(side, "fin"):
                    with contextlib.suppress(OSError):
                        sink.shutdown(socket.SHUT_WR)
                return
            if passing:
                try:
                    sink.sendall(data)
                except OSError:
                    passing = False  # the sink has gone: read on, to see how this side ends

    def _ended(self, side: str, how: str) -> bool:
        with self._lock:
            if self._aborted:
                return False  # what our own abort of this socket looks like
            self.ends.setdefault(side, how)
            return True

    def _abort(self, sock: socket.socket) -> None:
        """Reset ``sock`` as the node reset its side: its pump wakes and ends quietly."""
        with self._lock:
            self._aborted = True
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.shutdown(socket.SHUT_RD)
            sock.close()


class MuxerLog(logging.Handler):
    """What py-libp2p's yamux tells of the connections' ends, in the test process."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.go_aways: list[str] = []
        self.breaks: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Received GO_AWAY"):
            self.go_aways.append(message)
        elif "connection reset" in message.lower() or "closed unexpectedly" in message:
            self.breaks.append(message)


@contextlib.contextmanager
def muxer_log() -> Iterator[MuxerLog]:
    handler = MuxerLog()
    loggers = [logging.getLogger(YAMUX_LOGGER), logging.getLogger("libp2p.io.trio")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


def via(tap: Tap, service: str) -> str:
    """``service``'s multiaddr with the tap's port in place of the node's."""
    parts = service.split("/")
    parts[4] = str(tap.port)
    return "/".join(parts)


def new_message(text: str) -> WakuMessage:
    return WakuMessage(text.encode(), CONTENT_TOPIC, timestamp=time.time_ns())


async def until(condition: Callable[[], bool | Awaitable[bool]], what: str) -> None:
    """Poll ``condition()`` (maybe async) until true, within :data:`PATIENCE_S`."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        outcome = condition()
        if not isinstance(outcome, bool):
            outcome = await outcome
        if outcome:
            return
        assert time.monotonic() < deadline, f"still not {what} after {PATIENCE_S} s"
        await asyncio.sleep(0.02)


def keep_alive(url: str) -> socket.socket:
    """A socket on which the node answered one request and keeps the connection."""
    parsed = urllib.parse.urlsplit(url)
    assert parsed.hostname is not None and parsed.port is not None
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=PATIENCE_S)
    connection.request("GET", "/metrics")
    answer = connection.getresponse()
    answer.read()
    assert answer.status == 200 and not answer.will_close
    assert connection.sock is not None
    sock: socket.socket = connection.sock
    return sock


@dataclass
class Seen:
    """What the clients saw of the stop."""

    returncode: int
    push: object  # "ok", or what the in-flight push raised
    pushed_to_subscriber: bool  # the message in flight came by Filter too
    ends: dict[str, dict[str, str]]  # by client: its tap's ends
    http: object  # what the keep-alive socket read at the end, or raised


async def stop_under_clients(store: StoreProcess, archive: Path) -> Seen:
    """The scenario of the module."""
    service = store.relay_addrs[0]
    host, port = service.split("/")[2], int(service.split("/")[4])
    kinds = ("relay", "pusher", "subscriber", "querier")
    taps = {kind: Tap((host, port)) for kind in kinds}
    heard: list[WakuMessage] = []
    relayed: list[WakuMessage] = []

    async def on_push(peer: str, frame: bytes) -> None:
        message = MessagePush.from_bytes(frame).waku_message
        if message is not None:
            heard.append(message)

    async with (
        libp2p.Libp2pNode() as relay,
        libp2p.Libp2pNode(relay=False) as pusher,
        libp2p.Libp2pNode(relay=False) as subscriber,
        libp2p.Libp2pNode(relay=False) as querier,
    ):
        clients: dict[str, Libp2pNode] = {
            "relay": relay,
            "pusher": pusher,
            "subscriber": subscriber,
            "querier": querier,
        }

        async def hear_relay() -> None:
            async for envelope in relay.subscribe_envelopes(TOPIC):
                relayed.append(envelope.message)

        hearing = asyncio.create_task(hear_relay())
        await relay.connect(via(taps["relay"], service))
        assert await relay.wait_for_mesh(TOPIC, 1, PATIENCE_S)
        await subscriber.serve_pushes(FILTER_PUSH_PROTOCOL, on_push)
        to_filter = via(taps["subscriber"], service)
        await filter_request(
            functools.partial(subscriber.request, to_filter),
            to_filter,
            FilterSubscribeType.SUBSCRIBE,
            TOPIC,
            (CONTENT_TOPIC,),
        )
        store_client = WakuStoreClient.over(querier, via(taps["querier"], service))
        query = StoreQuery(pubsub_topic=TOPIC, content_topics=(CONTENT_TOPIC,))
        await store_client.query(query)
        to_push = via(taps["pusher"], service)
        push = functools.partial(lightpush_v3, functools.partial(pusher.request, to_push), to_push)
        first, in_flight = new_message("before the stop"), new_message("in flight")
        await push(TOPIC, first)
        await until(lambda: first in heard and first in relayed, "first push heard")
        http_socket = keep_alive(store.url)

        lock = sqlite3.connect(archive, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        pushing = asyncio.create_task(push(TOPIC, in_flight))
        await until(lambda: in_flight in relayed, "in-flight push relayed")
        store.process.send_signal(signal.SIGTERM)

        async def refused() -> bool:
            try:
                await store_client.query(query)
            except StoreUnavailableError:
                return True
            return False

        await until(refused, "a new stream refused")
        assert not pushing.done(), f"the push ended before the archive was free: {pushing!r}"
        lock.execute("ROLLBACK")
        lock.close()
        try:
            await asyncio.wait_for(asyncio.shield(pushing), PATIENCE_S)
            push_outcome: object = "ok"
        except Exception as exc:
            push_outcome = exc
        returncode = await asyncio.to_thread(store.process.wait, PATIENCE_S)

        for kind, client in clients.items():
            await until(functools.partial(_no_peers, client), f"{kind} disconnected")
        await until(lambda: all("node" in tap.ends for tap in taps.values()), "taps closed")
        http_socket.settimeout(PATIENCE_S)
        try:
            http_end: object = http_socket.recv(1)
        except OSError as exc:
            http_end = exc
        http_socket.close()
        hearing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hearing
    return Seen(
        returncode,
        push_outcome,
        in_flight in heard,
        {kind: dict(tap.ends) for kind, tap in taps.items()},
        http_end,
    )


async def _no_peers(node: Libp2pNode) -> bool:
    return not await node.connected_peers()


def test_sigterm_answers_the_push_in_flight_and_closes_every_client_cleanly(
    tmp_path: Path,
) -> None:
    with muxer_log() as muxer, store_serve(tmp_path, TOPIC, flags=FLAGS) as store:
        seen = asyncio.run(stop_under_clients(store, tmp_path / "store.sqlite3"))
        stderr = "".join(store.stderr)
        assert store.process.stdout is not None
        stdout = store.process.stdout.read()
    print(seen)
    assert seen.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert stdout.strip().endswith("sdsync store: stopped"), stdout
    assert seen.push == "ok", f"{seen.push!r} (a 503 if the lock was held {LOCK_LIMIT_S} s)"
    assert seen.pushed_to_subscriber, "the subscriber was not pushed the message in flight"
    for kind, end in seen.ends.items():
        assert end["node"] == "fin", f"the {kind}'s connection: {end}"
    assert len(muxer.go_aways) == len(seen.ends), muxer.go_aways
    assert all(m.endswith("Normal termination") for m in muxer.go_aways), muxer.go_aways
    assert not muxer.breaks, muxer.breaks
    assert seen.http == b"", f"the HTTP keep-alive connection ended with {seen.http!r}"
