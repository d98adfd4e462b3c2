"""Nothing the node forwarded is lost (issue 37, the relay path): `sdsync store serve` is
killed with SIGKILL at a random moment while a relay peer publishes a steady load through
it to another relay peer; after the restart on the same data dir (same node key), every
message the other peer heard from the node is in the archive.

Whatever a relay peer hears it may acknowledge (an SDS peer puts it in the bloom filter of
its next message, and the sender stops resending it), so the node must have committed a
relay message before it forwards it: the message would otherwise be kept by the network
and missing from the store for good.  The listening peer is connected to the node alone,
so every message it heard was forwarded by the node.  A light client asking the node's
store meanwhile checks the same of the store's answers: whatever an answer held before
the kill is still held after it.  Writers post batches to the node's ingestion API all
along, so that its archive is as busy as a node's may be when a relay message comes.

The kill lands at a moment drawn from the seed, and again after each restart: 3 kills of
one seed in `make test`, 20 kills of each of 5 seeds in `make soak`.  Messages in flight at
the kill that nobody heard may or may not be kept.  Before the node waited for its commit,
4 runs of `make test`'s 3 kills out of 4 lost forwarded messages (1 to 24, at the first or
second kill); without the writers, 3 kills in 81 did.

The last test shows the order itself, in one process: while the archive's insert is held,
the node forwards nothing, and a copy of the message from a second peer meanwhile is
neither archived nor forwarded a second time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from storeprocess import (
    SYNC_TOKEN,
    TOPIC,
    StoreProcess,
    archived_hashes,
    post_messages,
    store_serve,
)
from storetest import running
from testdeps import require
from transporttest import nothing_more

from sdsync.errors import RemoteProtocolError
from sdsync.store import SqlArchive, StoreQuery, WakuStoreClient
from sdsync.waku.messages import StoredMessage
from sdsync.wire.waku import WakuMessage

if TYPE_CHECKING:
    from sdsync.transport.libp2p import Libp2pNode

libp2p = require("sdsync.transport.libp2p", "needs the 'p2p' extra")

SOAK = os.environ.get("SDSYNC_SOAK") == "1"
KILLS = 20 if SOAK else 3
CONTENT_TOPIC = "/sds/1/kill-relay/proto"
POSTED_CONTENT_TOPIC = "/sds/1/kill-relay-posted/proto"
WRITERS = 2
WRITER_BATCH = 50
FLAGS = ["--token", SYNC_TOKEN]
PATIENCE_S = 30.0  # liveness bounds only: a mesh forms within a heartbeat or two
QUERY_EVERY_S = 0.05


@dataclass
class Witnessed:
    """What the node's peers saw of it before its kills (hashes, hex)."""

    heard: set[str] = field(default_factory=set)  # forwarded to the listening relay peer
    answered: set[str] = field(default_factory=set)  # in a store answer to the light client
    published: int = 0


async def publish_until(publisher: Libp2pNode, tag: str, stop: threading.Event) -> int:
    """Messages one after another, as fast as the publisher's outbox takes them."""
    count = 0
    while not stop.is_set():
        message = WakuMessage(f"{tag} {count}".encode(), CONTENT_TOPIC, timestamp=time.time_ns())
        await publisher.publish_message(TOPIC, message)
        count += 1
        await asyncio.sleep(0)  # the other tasks of this loop listen and query
    return count


def write_until(url: str, tag: str, stop: threading.Event) -> None:
    """Batches into the ingestion API until the node goes away: the archive is busy with
    other writers, as a node's may be, while the relay waits for it."""
    batch = 0
    while not stop.is_set():
        messages = [
            WakuMessage(
                f"{tag} {batch} {i}".encode(), POSTED_CONTENT_TOPIC, timestamp=time.time_ns()
            )
            for i in range(WRITER_BATCH)
        ]
        try:
            post_messages(url, messages, timeout_s=10)
        except OSError:
            return  # the node is gone
        batch += 1


async def listen(listener: Libp2pNode, witnessed: Witnessed) -> None:
    async for envelope in listener.subscribe_envelopes(TOPIC):
        witnessed.heard.add(envelope.message_hash.hex())


async def query_until(
    light: Libp2pNode, service: str, witnessed: Witnessed, stop: threading.Event
) -> None:
    """The newest page of the topic, again and again, until the node is gone."""
    store = WakuStoreClient.over(light, service)
    query = StoreQuery(
        pubsub_topic=TOPIC,
        content_topics=(CONTENT_TOPIC,),
        pagination_forward=False,
        pagination_limit=100,
    )
    while not stop.is_set():
        try:
            page = await store.query(query)
        except (OSError, RemoteProtocolError):  # gone, or dying (StoreUnavailableError)
            return
        witnessed.answered.update(h.hex() for h in page.hashes)
        await asyncio.sleep(QUERY_EVERY_S)


async def load_then_kill(
    store: StoreProcess, phase: int, witnessed: Witnessed, kill_after_s: float
) -> None:
    """A publisher and a listener meshed with the node alone, a light client querying its
    store, writers posting to it; SIGKILL lands ``kill_after_s`` into the publisher's
    load."""
    service = store.relay_addrs[0]
    node_id = service.rsplit("/p2p/", 1)[1]
    publisher = libp2p.Libp2pNode(peers=[service])
    publisher.subscribe_envelopes(TOPIC)  # joins the topic, so that a mesh forms
    listener = libp2p.Libp2pNode(peers=[service])
    light = libp2p.Libp2pNode(relay=False)
    stop = threading.Event()  # the load's, in this loop and in the writers' threads
    async with contextlib.AsyncExitStack() as stack:
        for peer in (publisher, listener, light):
            await stack.enter_async_context(peer)
        listening = asyncio.create_task(listen(listener, witnessed))
        assert await publisher.wait_for_mesh(TOPIC, 1, PATIENCE_S)
        assert await listener.wait_for_mesh(TOPIC, 1, PATIENCE_S)
        publishing = asyncio.create_task(publish_until(publisher, f"relay {phase}", stop))
        querying = asyncio.create_task(query_until(light, service, witnessed, stop))
        writers = [
            asyncio.create_task(
                asyncio.to_thread(write_until, store.url, f"post {phase}.{n}", stop)
            )
            for n in range(WRITERS)
        ]
        await asyncio.sleep(kill_after_s)
        # Heard from the node, or from nobody: the listener knows no other peer.
        assert await listener.connected_peers() == [node_id]
        store.process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(store.process.wait)
        stop.set()
        witnessed.published += await publishing
        await querying
        await asyncio.gather(*writers)
        # What the listener's host took before the kill reaches its loop in a moment;
        # one that has not by then only goes unchecked.
        await asyncio.sleep(0.5)
    await listening  # its subscription ended with the listener


@pytest.mark.parametrize("seed", range(1, 6) if SOAK else [1])
def test_every_message_forwarded_or_answered_survives_sigkill(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    witnessed = Witnessed()
    for phase in range(KILLS):
        with store_serve(tmp_path, TOPIC, flags=FLAGS) as store:
            asyncio.run(load_then_kill(store, phase, witnessed, rng.uniform(0.5, 3.0)))
        with store_serve(tmp_path, TOPIC, flags=FLAGS) as store:
            archived = archived_hashes(store.url)
        missing_heard = witnessed.heard - archived
        missing_answered = witnessed.answered - archived
        assert not missing_heard and not missing_answered, (
            f"after kill {phase + 1}: {len(missing_heard)} of {len(witnessed.heard)} "
            f"messages the node forwarded and {len(missing_answered)} of "
            f"{len(witnessed.answered)} it answered in a store query are missing"
        )
    # The load was real: every kill found the node forwarding and answering.
    assert len(witnessed.heard) >= 10 * KILLS and len(witnessed.answered) >= 10 * KILLS
    print(
        f"seed {seed}: {KILLS} kills, {witnessed.published} published, "
        f"{len(witnessed.heard)} forwarded and {len(witnessed.answered)} answered, all archived"
    )


def test_the_node_forwards_a_relay_message_once_committed_and_once_only(
    sqlite_archive: SqlArchive, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held, inserting = threading.Event(), threading.Event()
    insert = sqlite_archive.insert

    def held_insert(messages: Iterable[StoredMessage]) -> int:
        inserting.set()
        held.wait(PATIENCE_S)
        return insert(messages)

    monkeypatch.setattr(sqlite_archive, "insert", held_insert)

    async def scenario() -> None:
        host = libp2p.Libp2pTransport()
        await host.start()
        publishers = [libp2p.Libp2pNode(peers=host.listen_addrs) for _ in range(2)]
        for publisher in publishers:
            publisher.subscribe_envelopes(TOPIC)  # joins the topic, so that a mesh forms
        listener = libp2p.Libp2pNode(peers=host.listen_addrs)
        heard = listener.subscribe_envelopes(TOPIC)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(host.close)
            node = await stack.enter_async_context(
                running(sqlite_archive, tmp_path, waku=host, relay_topics=(TOPIC,))
            )
            for peer in (*publishers, listener):
                await stack.enter_async_context(peer)
                assert await peer.wait_for_mesh(TOPIC, 1, PATIENCE_S)
            message = WakuMessage(b"held", CONTENT_TOPIC, timestamp=time.time_ns())
            await publishers[0].publish_message(TOPIC, message)
            assert await asyncio.to_thread(inserting.wait, PATIENCE_S)
            await publishers[1].publish_message(TOPIC, message)  # the same bytes: a twin
            assert await nothing_more(heard, within_s=1.0), "forwarded before its commit"
            held.set()
            async with asyncio.timeout(PATIENCE_S):
                envelope = await anext(heard)
            assert envelope.message == message
            assert sqlite_archive.get([envelope.message_hash])
            samples = node.metrics.registry.get_sample_value
            assert samples("sdsync_store_ingested_messages_total", {"source": "relay"}) == 1
            assert samples("sdsync_store_duplicate_messages_total", {"source": "relay"}) == 0

    asyncio.run(scenario())
