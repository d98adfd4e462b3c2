"""A store node in memory: archives every frame it hears, answers fetches by hint or id.

Stands in for the real store node (its REST API arrives with the store component) in
tests and examples; it implements the same :class:`~sdsync.runtime.reliable.StoreClient`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sdsync.errors import RemoteProtocolError
from sdsync.transport.base import Received, Transport
from sdsync.wire import HistoryEntry, decode


class MemoryStore:
    def __init__(self, transport: Transport, topics: list[str]) -> None:
        self.transport = transport
        self.topics = topics
        self.by_hint: dict[bytes, Received] = {}
        self.by_id: dict[tuple[str, str], Received] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._archive(self.transport.subscribe(topic)))
            for topic in self.topics
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _archive(self, frames: AsyncIterator[Received]) -> None:
        async for frame in frames:
            try:
                message = decode(frame.data)
            except RemoteProtocolError:
                continue  # a store keeps only what it can index
            if frame.retrieval_hint is not None:
                self.by_hint[frame.retrieval_hint] = frame
            self.by_id[(message.channel_id, message.message_id)] = frame

    async def fetch(self, channel_id: str, entries: tuple[HistoryEntry, ...]) -> list[Received]:
        found = []
        for entry in entries:
            frame = None
            if entry.retrieval_hint is not None:
                frame = self.by_hint.get(entry.retrieval_hint)
            if frame is None:
                frame = self.by_id.get((channel_id, entry.message_id))
            if frame is not None:
                found.append(frame)
        return found
