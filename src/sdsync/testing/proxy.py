"""A reverse proxy on loopback that says whose each connection is, as a TLS or WebSocket
proxy in front of a node does (docs/network.md, "Behind TLS").

Theory of operation
-------------------
Behind a real proxy every client reaches the node from the proxy's address, and the
proxy names the client in ``X-Forwarded-For``: the address it heard that client from. A
test's clients all live on 127.0.0.1 and most cannot choose their source address (a
browser, py-libp2p's WebSocket transport), so :class:`Proxy` tells them apart by where
they connect instead: each of its listening ports (:meth:`Proxy.port_for`) stands for
clients at one address, and every connection to that port is forwarded to ``upstream``
(from ``source``, the proxy's own address as the node sees it) with that address
appended to its first request head (the HTTP request or WebSocket upgrade request).
The address is header text: it may name any address, none is ever dialled.

After the head it is a byte pipe both ways, until either side closes: nothing after the
first request of a connection is rewritten (a keep-alive HTTP connection's later
requests go as they came). ``upstream`` is read at each connection, so the proxy's
ports may be handed out before the node behind them listens (the node must be told
them, ``--web-address``, before it starts) and ``upstream`` set once it does.

:class:`Proxy` runs on the caller's event loop (``async with Proxy(...)``);
:class:`ProxyThread` runs one on its own loop in a thread, for synchronous tests (a
Playwright sync-API test cannot run an event loop of its own in its thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

__all__ = ["LOOPBACK", "Proxy", "ProxyThread"]

LOOPBACK = "127.0.0.1"
#: What a connection's first request head may hold before it is given up.
HEAD_LIMIT = 64 * 1024
_CHUNK = 65536
_T = TypeVar("_T")


class Proxy:
    """A reverse proxy of HTTP and WebSocket connections on 127.0.0.1, forwarding to
    ``upstream`` (host, port) from ``source``. Each of its ports stands for clients at one
    address (:meth:`port_for`), which it appends to the first request head's
    X-Forwarded-For, as a proxy appends the address it hears a client from (module doc)."""

    def __init__(self, upstream: tuple[str, int], source: str) -> None:
        self.upstream, self.source = upstream, source
        self._servers: list[asyncio.Server] = []
        self._writers: set[asyncio.StreamWriter] = set()

    async def port_for(self, client: str) -> int:
        """A new port of the proxy on 127.0.0.1, whose connections it says are ``client``'s."""
        server = await asyncio.start_server(
            functools.partial(self._forward, client), LOOPBACK, 0, limit=HEAD_LIMIT
        )
        self._servers.append(server)
        port: int = server.sockets[0].getsockname()[1]
        return port

    async def _forward(
        self, client: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._writers.add(writer)
        try:
            with contextlib.suppress(
                ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError
            ):
                head = await reader.readuntil(b"\r\n\r\n")
                up_reader, up_writer = await asyncio.open_connection(
                    *self.upstream, local_addr=(self.source, 0)
                )
                self._writers.add(up_writer)
                try:
                    up_writer.write(head[:-2] + f"X-Forwarded-For: {client}\r\n\r\n".encode())
                    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
                finally:
                    self._writers.discard(up_writer)
            writer.close()
        finally:
            self._writers.discard(writer)

    async def close(self) -> None:
        """Stops listening and closes every connection under way, both of its sides."""
        for server in self._servers:
            server.close()
        for writer in list(self._writers):
            writer.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """What ``reader`` brings, written to ``writer`` until it ends; then ``writer`` closed."""
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
    writer.close()


class ProxyThread:
    """A :class:`Proxy` on an event loop of its own, in a daemon thread, for synchronous
    code: ``with ProxyThread(upstream) as proxy: port = proxy.port_for("198.51.100.1")``.
    Leaving it closes the proxy, cancels what is still forwarding and ends the thread."""

    def __init__(
        self, upstream: tuple[str, int], source: str = LOOPBACK, timeout_s: float = 30.0
    ) -> None:
        self.proxy = Proxy(upstream, source)
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sdsync-proxy", daemon=True)

    @property
    def upstream(self) -> tuple[str, int]:
        return self.proxy.upstream

    @upstream.setter
    def upstream(self, upstream: tuple[str, int]) -> None:
        """Where connections from now on are forwarded (read at each connection)."""
        self.proxy.upstream = upstream

    def port_for(self, client: str) -> int:
        """:meth:`Proxy.port_for`, from any thread."""
        return self._call(self.proxy.port_for(client))

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            await self.proxy.close()
        # asyncio.run cancels the connections still being forwarded, and waits for them.

    def _call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("the proxy's thread is not running")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(self.timeout_s)

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._started.wait(self.timeout_s):
            raise RuntimeError("the proxy's thread did not start")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(self.timeout_s)
