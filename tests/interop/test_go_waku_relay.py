"""`sdsync chat` and js-waku relay nodes speaking SDS share a channel through a go-waku node.

A go-waku node (0.9.0, cluster 1, shard 7, its metadata check on) is the one link between
two halves of a group, all on 127.0.0.1:

    js A — chat C — go-waku — chat D — js B

The chats dial go-waku and their own js-waku relay node (waku_relay/relay.mjs, @waku/sds
0.8 on @waku/sdk 0.0.27); nobody else knows anybody's address and peer exchange is off,
so everything that crosses from one half to the other is relayed by go-waku: chat to
chat, chat to js-waku and js-waku to js-waku, both ways. Every participant sends; at the
end all four logs hold the same messages in the same order, and go-waku's own relay saw
every participant's messages.

The js-waku nodes cannot be go-waku's direct peers: @waku/sdk 0.0.27 offers only mplex
(go-waku 0.9.0 only yamux), and it writes its metadata shards in field 2, which go-waku
reads as none ("invalid shard count"); the chats beside them speak both. Bounded waits
everywhere (liveness only); every process is ended in ``finally``.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chatprocess import ChatProcess, assert_same_logs, sends, wait_for
from waku_drivers import WakuDriver, sds_relay_nodes

from sdsync.errors import RemoteProtocolError
from sdsync.testing.gowaku import GoWaku
from sdsync.wire import decode

pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("many-processes")]

CHANNEL = "go-waku-chat"
CONTENT_TOPIC = f"/sds/1/{CHANNEL}/proto"
PUBSUB_TOPIC = "/waku/2/rs/1/7"  # every /sds/1/... content topic autoshards here on cluster 1
N = 5  # messages per participant
PATIENCE_S = 90  # liveness bound of a whole run; it normally takes 10-20 s
TIMERS = {"sync_interval_ms": 300, "retry_ms": 1000, "repair_min_ms": 200, "repair_max_ms": 1000}
CHAT_FLAGS = [
    *(arg for name, ms in TIMERS.items() for arg in (f"--{name.replace('_', '-')}", str(ms))),
    "--quiet-ms",
    "3000",
    "--channel",
    CHANNEL,
    "--wait-converged",
    str(PATIENCE_S - 30),
    "--min-peers",
    "3",
    "--min-mesh",
    "2",  # go-waku and its js-waku node
    "--print-log",
]


@pytest.fixture
def js_nodes() -> Iterator[list[WakuDriver]]:
    yield from sds_relay_nodes(CONTENT_TOPIC, "js-A", "js-B")


def sds_texts(go_waku: GoWaku) -> set[str]:
    """The contents of the SDS messages in go-waku's relay cache (emptied as it is read)."""
    texts = set()
    for message in go_waku.relay_messages(PUBSUB_TOPIC):
        try:
            content = decode(base64.b64decode(message["payload"])).content
        except RemoteProtocolError:
            continue
        if content:  # sync messages carry none
            texts.add(content.decode())
    return texts


def test_chats_and_js_waku_nodes_converge_through_go_waku(
    tmp_path: Path, go_waku_nodes: Any, js_nodes: list[WakuDriver]
) -> None:
    go_waku: GoWaku = go_waku_nodes()
    go_waku.relay_subscribe(PUBSUB_TOPIC)
    a, b = js_nodes
    for seed, (node, sender) in enumerate(((a, "A"), (b, "B")), start=1):
        started = node.ok("sds_start", channel=CHANNEL, sender=sender, seed=seed, **TIMERS)
        assert started["pubsub_topic"] == PUBSUB_TOPIC
    chats: list[ChatProcess] = []
    try:
        for name, seed, js in (("C", 3, a), ("D", 4, b)):
            peers = ["--peer", go_waku.address, "--peer", js.started["multiaddrs"][0]]
            args = [*CHAT_FLAGS, "--seed", str(seed), *peers, *sends(name.lower(), N)]
            chats.append(ChatProcess(tmp_path, name, args, patience_s=PATIENCE_S))
        for node in (a, b):  # its chat in its mesh
            node.ok("wait_subscribers", pubsub_topic=PUBSUB_TOPIC, timeout_ms=30_000)
        for i in range(N):
            for node, prefix in ((a, "a"), (b, "b")):
                node.ok("sds_send", text=f"{prefix}{i:02d}")
        py_logs = [chat.finish() for chat in chats]
        assert py_logs[0] == py_logs[1], "the two chats' logs differ"

        def js_caught_up() -> list[dict[str, Any]] | None:
            replies = [node.ok("sds_log") for node in (a, b)]
            done = all(r["log"] == py_logs[0] and r["status"]["outgoing"] == 0 for r in replies)
            return replies if done else None

        wait_for(js_caught_up, "the JS logs equal to the chats'", timeout_s=60)
    finally:
        for chat in chats:
            chat.stop()

    texts = Counter(f"{p}{i:02d}" for p in "abcd" for i in range(N))
    assert_same_logs(py_logs, texts)
    # go-waku relayed every participant's messages (the only path between the halves).
    assert set(texts) <= sds_texts(go_waku), go_waku.log()[-3000:]
    assert "invalid shard count" not in go_waku.log()
