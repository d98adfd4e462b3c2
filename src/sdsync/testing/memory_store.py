"""A store node in memory: archives every frame it hears, answers fetches by hint or id
and catch-ups by the time it heard each frame (its topics carried on the content topics
:func:`~sdsync.waku.relay.topics.default_content_topic` names), listing a window's hints and
handing over only the frames the channel has not seen, as a real store's two phases do.

Test tooling: it stands in for a store node where a test wants no archive and no
network, and implements the same :class:`~sdsync.runtime.reliable.StoreClient` as the
real clients (:mod:`sdsync.store.client`, :mod:`sdsync.waku.store.service`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from sdsync.errors import RemoteProtocolError
from sdsync.runtime.clock import system_clock_ms
from sdsync.waku.node import Received, Transport
from sdsync.waku.relay.topics import default_content_topic
from sdsync.wire import HistoryEntry, decode


class MemoryStore:
    def __init__(self, transport: Transport, topics: list[str]) -> None:
        self.transport = transport
        self.topics = topics
        self.by_hint: dict[bytes, Received] = {}
        self.by_id: dict[tuple[str, str], Received] = {}
        # content topic -> (time heard, frame), in the order heard
        self.heard: dict[str, list[tuple[int, Received]]] = {}
        self.fetched = 0  # frames catch-ups took (the unseen ones of what they listed)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._archive(topic, self.transport.subscribe(topic)))
            for topic in self.topics
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _archive(self, topic: str, frames: AsyncIterator[Received]) -> None:
        heard = self.heard.setdefault(default_content_topic(topic), [])
        async for frame in frames:
            try:
                message = decode(frame.data)
            except RemoteProtocolError:
                continue  # a store keeps only what it can index
            if frame.retrieval_hint is not None:
                self.by_hint[frame.retrieval_hint] = frame
            self.by_id[(message.channel_id, message.message_id)] = frame
            heard.append((system_clock_ms(), frame))

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

    async def catch_up(
        self,
        content_topic: str,
        start_ms: int,
        end_ms: int,
        page_size: int,
        unseen: Callable[[list[bytes]], list[bytes]],
    ) -> AsyncIterator[list[Received]]:
        listed = [f for t, f in self.heard.get(content_topic, ()) if start_ms <= t <= end_ms]
        for start in range(0, len(listed), page_size):
            page = listed[start : start + page_size]
            wanted = set(unseen([f.retrieval_hint for f in page if f.retrieval_hint is not None]))
            # A frame without a hint has no hash to list: it always goes.
            found = [f for f in page if f.retrieval_hint is None or f.retrieval_hint in wanted]
            self.fetched += len(found)
            if found:
                yield found
