"""End to end: a ReliableChannel's two-phase store catch-up against a real store node,
through its REST API (HttpStoreClient) and its Waku store protocol (WakuStoreClient,
answered on the node itself: no libp2p in between).

Three participants share an in-memory Waku relay that, as a real one does, hands every
frame over with its Waku message hash and puts every publication in the store. Alice
sends three messages everyone hears, then two that bob does not hear (nothing names
them later, so only a catch-up can find them). Then each catches up: the listing has all
five hashes for everyone, and what is fetched is exactly what each has not seen — bob
the two he missed, carol (who heard everything) and alice (who sent everything) nothing.
Nothing else is in the store: no syncs, resends or repairs run in the test's time.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from storetest import TOKEN, running
from test_waku_store import direct

from sdsync.core import ChannelConfig, MessageDelivered, RepairConfig
from sdsync.runtime import ReliableChannel, RuntimeConfig
from sdsync.store import (
    HttpStoreClient,
    Page,
    SqlArchive,
    StoredMessage,
    StoreNode,
    StoreQuery,
    StoreUnavailableError,
    WakuStoreClient,
)
from sdsync.waku.node import Received
from sdsync.waku.relay.topics import default_content_topic
from sdsync.waku.store.client import StoreQueries
from sdsync.wire.waku import WakuMessage

SHARD = "/waku/2/rs/1/7"
RUNTIME = RuntimeConfig(
    sync_interval_ms=10**9,  # no syncs, resends or sweeps' queries in the test's time
    resend_interval_ms=600_000,
    incoming_sweep_ms=10**9,
    store_catchup_interval_ms=10**9,  # at start, then when the test says back_online()
    store_catchup_page_size=2,  # five messages: three pages
)
CONFIG = ChannelConfig(causal_history_size=2, repair=RepairConfig(enabled=False))
# A liveness bound, not a performance assertion.
PATIENCE_S = 60


class Relay:
    """A Waku relay in memory: a publication goes to the store node and to every other
    participant not ``away``, as ``Received(sds_bytes, waku_message_hash)``."""

    def __init__(self, store: HttpStoreClient) -> None:
        self.store = store
        self.away: set[str] = set()
        self.queues: dict[str, asyncio.Queue[Received]] = {}
        self.published: list[bytes] = []  # the Waku hash of each publication, in order

    def transport(self, name: str) -> RelayTransport:
        return RelayTransport(self, name)


class RelayTransport:
    def __init__(self, relay: Relay, name: str) -> None:
        self.relay = relay
        self.name = name

    async def publish(self, topic: str, data: bytes) -> bytes | None:
        waku = WakuMessage(data, default_content_topic(topic), timestamp=time.time_ns())
        stored = StoredMessage.of(SHARD, waku)
        await self.relay.store.post([stored])
        self.relay.published.append(stored.message_hash)
        for name, queue in self.relay.queues.items():
            if name != self.name and name not in self.relay.away:
                queue.put_nowait(Received(data, stored.message_hash))
        return stored.message_hash

    def subscribe(self, topic: str) -> AsyncIterator[Received]:
        # Attached now, not at the first iteration: nothing published meanwhile is lost.
        queue = self.relay.queues.setdefault(self.name, asyncio.Queue())
        return _frames(queue)

    async def close(self) -> None:
        self.relay.queues.pop(self.name, None)


async def _frames(queue: asyncio.Queue[Received]) -> AsyncIterator[Received]:
    while True:
        yield await queue.get()


class Counting(StoreQueries):
    """A store client that counts what its store sent: hashes listed (``include_data``
    false), and the hashes of the messages it fetched with their data. Its next
    ``fail_fetches`` queries with data find the store unavailable."""

    def __init__(self, inner: StoreQueries) -> None:
        self.inner = inner
        self.name = inner.name
        self.hashes_per_query = inner.hashes_per_query
        self.listed = 0
        self.fetched: list[bytes] = []
        self.fail_fetches = 0

    async def query(self, query: StoreQuery) -> Page:
        if query.include_data and self.fail_fetches:
            self.fail_fetches -= 1
            raise StoreUnavailableError(f"{self.name} went away")
        page = await self.inner.query(query)
        if query.include_data:
            self.fetched += [m.message_hash for m in page.messages]
        else:
            self.listed += len(page.hashes)
        return page


Reader = Callable[[StoreNode], StoreQueries]
READERS: dict[str, Reader] = {
    "rest": lambda node: HttpStoreClient(node.url),
    "waku": lambda node: WakuStoreClient(direct(node)),
}


@pytest.fixture(params=sorted(READERS))
def reader(request: pytest.FixtureRequest) -> Reader:
    return READERS[request.param]


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(PATIENCE_S):
        while not condition():
            await asyncio.sleep(0.02)


async def catch_up_now(channel: ReliableChannel) -> None:
    """One more catch-up, run to its end (a success: the counter moves)."""
    done = channel.catch_ups
    channel.catch_up_now()
    await until(lambda: channel.catch_ups == done + 1)


def delivered(channel: ReliableChannel) -> list[str]:
    return [e.message_id for e in channel.pending_events() if isinstance(e, MessageDelivered)]


@asynccontextmanager
async def group(
    archive: SqlArchive, tmp_path: Path, reader: Reader
) -> AsyncIterator[tuple[Relay, dict[str, ReliableChannel], dict[str, Counting]]]:
    """Alice, bob and carol on one relay, each catching up through its own counting
    client of one store node; started, and their first catch-up (an empty store) done."""
    async with AsyncExitStack() as stack:
        node = await stack.enter_async_context(running(archive, tmp_path))
        writer = await stack.enter_async_context(HttpStoreClient(node.url, token=TOKEN))
        relay = Relay(writer)
        stores: dict[str, Counting] = {}
        channels: dict[str, ReliableChannel] = {}
        for seed, name in enumerate(("alice", "bob", "carol")):
            inner = reader(node)
            if isinstance(inner, HttpStoreClient):
                stack.push_async_callback(inner.close)
            stores[name] = Counting(inner)
            channels[name] = channel = ReliableChannel(
                relay.transport(name),
                "chat",
                name,
                config=CONFIG,
                runtime=RUNTIME,
                store=stores[name],
                rng=random.Random(seed),
            )
            stack.push_async_callback(channel.close)
            await channel.start()
        await until(lambda: all(c.catch_ups == 1 for c in channels.values()))
        yield relay, channels, stores


def test_a_catch_up_fetches_only_what_the_channel_has_not_seen(
    sqlite_archive: SqlArchive, tmp_path: Path, reader: Reader
) -> None:
    async def scenario() -> None:
        async with group(sqlite_archive, tmp_path, reader) as (relay, channels, stores):
            alice, bob, carol = channels["alice"], channels["bob"], channels["carol"]
            heard = [await alice.send(f"everyone hears #{i}".encode()) for i in range(3)]
            await until(lambda: len(bob.channel.log) == len(carol.channel.log) == 3)
            relay.away = {"bob"}
            missed = [await alice.send(f"bob misses #{i}".encode()) for i in range(2)]
            relay.away = set()
            await until(lambda: len(carol.channel.log) == 5)
            assert delivered(bob) == heard and len(delivered(carol)) == 5
            assert len(relay.published) == 5  # alice's messages, and nothing else
            missed_hashes = relay.published[3:]

            for channel in channels.values():
                await catch_up_now(channel)
            assert {n: s.listed for n, s in stores.items()} == {"alice": 5, "bob": 5, "carol": 5}
            assert stores["bob"].fetched == missed_hashes
            assert stores["carol"].fetched == stores["alice"].fetched == []
            assert delivered(bob) == missed and bob.caught_up_messages == 2
            assert bob.channel.log_ids() == [*heard, *missed]

            # What the catch-up brought is seen now: the next one fetches nothing.
            await catch_up_now(bob)
            assert stores["bob"].listed == 10 and stores["bob"].fetched == missed_hashes
            assert delivered(bob) == []

    asyncio.run(scenario())


def test_a_store_gone_between_listing_and_fetching_is_asked_again(
    sqlite_archive: SqlArchive, tmp_path: Path, reader: Reader
) -> None:
    """The listing's first page answered, the fetch after it unavailable: the catch-up
    failed (nothing delivered, the caught-up time stays); the next one asks the same
    window again and brings what bob missed, once."""

    async def scenario() -> None:
        async with group(sqlite_archive, tmp_path, reader) as (relay, channels, stores):
            alice, bob = channels["alice"], channels["bob"]
            relay.away = {"bob"}
            missed = [await alice.send(f"bob misses #{i}".encode()) for i in range(3)]
            before = bob.driver.caught_up_ms
            stores["bob"].fail_fetches = 1
            bob.back_online()
            await until(
                lambda: not stores["bob"].fail_fetches and not bob.driver.sync_status().catching_up
            )
            assert bob.catch_ups == 1 and bob.driver.caught_up_ms == before
            assert stores["bob"].listed == 2 and stores["bob"].fetched == []  # page one
            assert delivered(bob) == []

            await catch_up_now(bob)
            assert len(relay.published) == 3 and stores["bob"].fetched == relay.published
            assert delivered(bob) == missed
            assert bob.driver.caught_up_ms is not None and before is not None
            assert bob.driver.caught_up_ms > before

    asyncio.run(scenario())
