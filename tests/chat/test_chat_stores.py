"""The stores of ``sdsync chat --store``: a REST URL or a Waku store peer each, asked in
order, the next one only while one is unavailable (sdsync.chat.stores). The real thing,
processes and all: tests/cli/test_chat.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from sdsync.chat.stores import StoreChoice, open_stores
from sdsync.store import HttpStoreClient, Page, StoreQuery, StoreUnavailableError, WakuStoreClient
from sdsync.testing.memory import MemoryNetwork
from sdsync.waku.node import Received
from sdsync.waku.rpc import MAX_RPC_BYTES
from sdsync.waku.store.client import StoreQueries
from sdsync.waku.store.rpc import STORE_QUERY_PROTOCOL, StoreQueryRequest, StoreQueryResponse
from sdsync.wire import HistoryEntry

ENTRIES = (HistoryEntry("m1", b"\x01" * 32),)


class Store(StoreQueries):
    def __init__(self, name: str, answer: list[Received] | None) -> None:
        self.name = name
        self.answer = answer  # None: unavailable
        self.asked = 0

    async def query(self, query: StoreQuery) -> Page:
        raise AssertionError("fetch is what the chat asks")

    async def fetch(self, channel_id: str, entries: tuple[HistoryEntry, ...]) -> list[Received]:
        self.asked += 1
        if self.answer is None:
            raise StoreUnavailableError(f"{self.name} is busy")
        return self.answer


def test_the_next_store_is_asked_only_while_one_is_unavailable() -> None:
    frame = Received(b"sds", b"\x01" * 32)
    busy, first, second = Store("busy", None), Store("first", [frame]), Store("second", [])
    choice = StoreChoice([busy, first, second])
    assert asyncio.run(choice.fetch("0", ENTRIES)) == [frame]
    assert (busy.asked, first.asked, second.asked) == (1, 1, 0)
    assert (choice.fetches, choice.fetched, choice.unavailable) == (1, 1, 1)


def test_when_no_store_answers_the_runtime_hears_it() -> None:
    # An OSError: ReliableChannel asks again at its next store query.
    choice = StoreChoice([Store("a", None), Store("b", None)])
    with pytest.raises(StoreUnavailableError, match="b is busy"):
        asyncio.run(choice.fetch("0", ENTRIES))
    assert choice.unavailable == 2


def test_a_url_is_a_rest_api_and_a_multiaddr_a_waku_store_peer_over_our_host() -> None:
    """The Waku store peer is asked through the chat's node, with room for a store's
    large answers (above an ordinary RPC's bound)."""
    net = MemoryNetwork()
    chat, store = net.waku_node("chat"), net.waku_node("store")
    asked: list[str] = []

    async def answer(peer: str, request: bytes) -> bytes:
        asked.append(peer)
        padding = "x" * MAX_RPC_BYTES
        query = StoreQueryRequest.from_bytes(request)
        return StoreQueryResponse(query.request_id, 200, padding).to_bytes()

    async def scenario() -> None:
        await store.serve(STORE_QUERY_PROTOCOL, answer)
        choice = open_stores(["http://127.0.0.1:8645", store.listen_addrs[0]], chat)
        rest, waku = choice.stores
        assert isinstance(rest, HttpStoreClient) and rest.base_url == "http://127.0.0.1:8645"
        assert isinstance(waku, WakuStoreClient) and waku.name == store.listen_addrs[0]
        assert await waku.fetch("0", ENTRIES) == []
        assert asked == [chat.peer_id]

    asyncio.run(scenario())


class Listing(Store):
    """A store whose catch-up lists ``frames`` two a page and yields the unseen ones of
    each; ``fails_after`` pages in, it goes away."""

    def __init__(self, name: str, frames: list[Received], fails_after: int | None) -> None:
        super().__init__(name, [])
        self.frames = frames
        self.fails_after = fails_after

    async def catch_up(
        self,
        content_topic: str,
        start_ms: int,
        end_ms: int,
        page_size: int,
        unseen: Callable[[list[bytes]], list[bytes]],
    ) -> AsyncIterator[list[Received]]:
        self.asked += 1
        for number, first in enumerate(range(0, len(self.frames), 2)):
            if number == self.fails_after:
                raise StoreUnavailableError(f"{self.name} went away")
            page = self.frames[first : first + 2]
            wanted = unseen([f.retrieval_hint or b"" for f in page])
            if found := [f for f in page if f.retrieval_hint in wanted]:
                yield found


def test_a_catch_up_cut_off_midway_goes_on_at_the_next_store_without_refetching() -> None:
    frames = [Received(b"sds %d" % i, bytes([i]) * 32) for i in range(4)]
    seen: set[bytes] = set()  # the channel's: every frame handed over is seen

    def unseen(hashes: list[bytes]) -> list[bytes]:
        return [h for h in hashes if h not in seen]

    async def catch_up(choice: StoreChoice) -> list[list[Received]]:
        pages = []
        async for page in choice.catch_up("/sds/1/0/proto", 0, 1, 2, unseen):
            seen.update(f.retrieval_hint or b"" for f in page)
            pages.append(page)
        return pages

    gone, second = Listing("gone", frames, fails_after=1), Listing("second", frames, None)
    choice = StoreChoice([gone, second])
    assert asyncio.run(catch_up(choice)) == [frames[:2], frames[2:]]
    assert (gone.asked, second.asked) == (1, 1)
    assert (choice.catch_ups, choice.caught_up, choice.unavailable) == (1, 4, 1)
