"""A loopback UDP transport for tests that run participants in separate processes.

Every publication is sent as one datagram to each known peer address; the retrieval hint
is sha256 of the bytes on both sides. Topics are ignored: one socket carries one channel.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

from sdsync.transport import Received


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, queue: asyncio.Queue[Received]) -> None:
        self.queue = queue

    def datagram_received(self, data: bytes, addr: tuple[str | bytes, int]) -> None:
        self.queue.put_nowait(Received(data, hashlib.sha256(data).digest()))

    def error_received(self, exc: Exception) -> None:
        pass  # a peer that is down (ICMP port unreachable): it will hear resends later


class UdpTransport:
    def __init__(self) -> None:
        self.peers: list[tuple[str, int]] = []
        self._queue: asyncio.Queue[Received] = asyncio.Queue()
        self._socket: asyncio.DatagramTransport | None = None

    async def open(self) -> int:
        """Bind a free port on 127.0.0.1 and return it."""
        loop = asyncio.get_running_loop()
        self._socket, _ = await loop.create_datagram_endpoint(
            lambda: _Protocol(self._queue), local_addr=("127.0.0.1", 0)
        )
        port: int = self._socket.get_extra_info("sockname")[1]
        return port

    async def publish(self, topic: str, data: bytes) -> bytes | None:
        assert self._socket is not None
        for peer in self.peers:
            self._socket.sendto(data, peer)
        return hashlib.sha256(data).digest()

    def subscribe(self, topic: str) -> AsyncIterator[Received]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[Received]:
        while True:
            yield await self._queue.get()

    async def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
