"""Messages for the store tests: seeded, spread over hours and content topics."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from sdsync.store import Archive, NodeConfig, StoredMessage, StoreNode
from sdsync.waku.node import WakuNode
from sdsync.wire.waku import WakuMessage

PUBSUB = "/waku/2/rs/1/0"
T0 = 1_700_000_000 * 10**9
HOUR = 3_600 * 10**9
# A node clock at which the default Store Sync window is exactly [T0, T0 + HOUR): the
# window a responder serves is the recent past, so nodes syncing T0 data run at this time.
SYNC_NOW = T0 + HOUR + 20 * 10**9
TOKEN = "test-token"


def make_message(
    rng: random.Random,
    timestamp: int,
    *,
    content_topic: str = "/app/1/chat/proto",
    pubsub_topic: str = PUBSUB,
    meta: bytes = b"",
) -> StoredMessage:
    waku = WakuMessage(
        payload=rng.randbytes(rng.randrange(1, 64)),
        content_topic=content_topic,
        timestamp=timestamp,
        meta=meta,
    )
    return StoredMessage.of(pubsub_topic, waku)


def make_messages(
    n: int,
    seed: int = 1,
    *,
    start: int = T0,
    span: int = 3 * HOUR,
    topics: tuple[str, ...] = ("/app/1/chat/proto", "/app/1/acks/proto", "/other/1/x/proto"),
) -> list[StoredMessage]:
    """``n`` messages at random times in [start, start + span), over ``topics``."""
    rng = random.Random(seed)
    return [
        make_message(rng, start + rng.randrange(span), content_topic=topics[i % len(topics)])
        for i in range(n)
    ]


def in_order(messages: list[StoredMessage]) -> list[StoredMessage]:
    return sorted(messages, key=lambda m: (m.timestamp, m.message_hash))


@contextlib.asynccontextmanager
async def running(
    archive: Archive,
    tmp: Path,
    *,
    clock_ns: Callable[[], int] = time.time_ns,
    waku: WakuNode | None = None,
    serve_light: bool = False,
    **config: Any,
) -> AsyncIterator[StoreNode]:
    """A store node on a free loopback port, stopped (and its archive closed) on exit; on
    ``waku``, serving light clients there if ``serve_light``."""
    settings: dict[str, Any] = {"token": TOKEN, "retention": ()} | config
    node_config = NodeConfig(data_dir=tmp, port=0, **settings)
    node = StoreNode(archive, node_config, clock_ns=clock_ns, waku=waku, light_clients=serve_light)
    await node.start()
    try:
        yield node
    finally:
        await node.stop()


def sync_now() -> int:
    return SYNC_NOW
