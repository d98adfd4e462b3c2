"""`sdsync chat` and js-waku relay nodes speaking SDS (@waku/sds 0.0.8) share one channel.

Two js-waku relay nodes (waku_relay/relay.mjs with its sds_* ops) and two `sdsync chat`
processes, all on 127.0.0.1, in a ring: JS A — JS B — chat D — chat C — JS A. Every one of
them drops 20 % of the messages it receives, every one sends, and at the end all four logs
are the same, in the same order: SDS repaired the losses in both directions across the
JS/Python link. Bounded waits everywhere; every process is ended in `finally`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chatprocess import ChatProcess, assert_same_logs, sends, wait_for
from waku_drivers import WakuDriver, sds_relay_nodes

pytestmark = pytest.mark.interop

CHANNEL = "waku-chat"
CONTENT_TOPIC = f"/sds/1/{CHANNEL}/proto"
PUBSUB_TOPIC = "/waku/2/rs/1/7"  # every /sds/1/... content topic autoshards here on cluster 1
N = 10  # messages per participant
DROP_RATE = 0.2
PATIENCE_S = 150  # liveness bound of a whole run; it normally takes 15-30 s
TIMERS = {"sync_interval_ms": 300, "retry_ms": 1000, "repair_min_ms": 200, "repair_max_ms": 1000}
CHAT_FLAGS = [
    *(arg for name, ms in TIMERS.items() for arg in (f"--{name.replace('_', '-')}", str(ms))),
    "--drop-rate",
    str(DROP_RATE),
    # Long enough that the JS nodes, still repairing, find us there after we converged.
    "--quiet-ms",
    "3000",
    "--channel",
    CHANNEL,
    "--wait-converged",
    str(PATIENCE_S - 30),
    "--min-peers",
    "3",
    "--print-log",
]


def start_chat(tmp: Path, name: str, seed: int, peers: list[str]) -> ChatProcess:
    args = [*CHAT_FLAGS, "--seed", str(seed), *(arg for peer in peers for arg in ("--peer", peer))]
    return ChatProcess(tmp, name, [*args, *sends(name.lower(), N)], patience_s=PATIENCE_S)


@pytest.fixture
def js_nodes() -> Iterator[list[WakuDriver]]:
    yield from sds_relay_nodes(CONTENT_TOPIC, "js-A", "js-B")


def test_the_sds_ops_of_two_js_nodes_alone(js_nodes: list[WakuDriver]) -> None:
    """The driver's own check, so that the test below can fail only for sdsync's reasons."""
    a, b = js_nodes
    assert a.request("sds_send", text="early")["error"].startswith(
        "sds_send bad request: no SDS participant"
    )
    b.ok("dial", multiaddr=a.started["multiaddrs"][0])
    for seed, (node, sender) in enumerate(((a, "A"), (b, "B")), start=1):
        node.ok("sds_start", channel=CHANNEL, sender=sender, drop_rate=0.3, seed=seed, **TIMERS)
        node.ok("wait_subscribers", pubsub_topic=PUBSUB_TOPIC)
    assert a.request("sds_start", channel=CHANNEL, sender="A")["error"].endswith("is running")
    for i in range(N):
        for node, prefix in ((a, "a"), (b, "b")):
            node.ok("sds_send", text=f"{prefix}{i:02d}")

    def converged() -> list[dict[str, Any]] | None:
        replies = [node.ok("sds_log") for node in (a, b)]
        done = replies[0]["log"] == replies[1]["log"] and len(replies[0]["log"]) == 2 * N
        return replies if done and all(r["status"]["outgoing"] == 0 for r in replies) else None

    replies = wait_for(converged, "two JS participants converged", timeout_s=60)
    assert all(reply["status"]["dropped"] > 0 for reply in replies)
    [entry] = [e for e in replies[0]["log"] if e["text"] == "a00"]
    assert entry["sender_id"] == "A"


def test_js_waku_relay_nodes_and_sdsync_chats_converge_over_a_lossy_link(
    tmp_path: Path, js_nodes: list[WakuDriver]
) -> None:
    a, b = js_nodes
    b.ok("dial", multiaddr=a.started["multiaddrs"][0])  # the ring: A - B - D - C - A
    for seed, (node, sender) in enumerate(((a, "A"), (b, "B")), start=1):
        started = node.ok(
            "sds_start", channel=CHANNEL, sender=sender, drop_rate=DROP_RATE, seed=seed, **TIMERS
        )
        assert started["pubsub_topic"] == PUBSUB_TOPIC
    chats: list[ChatProcess] = []
    try:
        a_address, b_address = (node.started["multiaddrs"][0] for node in (a, b))
        chats.append(start_chat(tmp_path, "C", 3, [a_address]))
        chats.append(start_chat(tmp_path, "D", 4, [chats[0].address(), b_address]))
        # What the chat prints for whoever joins from js-waku: the topics the JS nodes use.
        topics = wait_for(
            lambda: re.search(r"Waku relay: (.*)", chats[0].err.read_text()), "C", PATIENCE_S
        )
        assert topics.group(1) == f"content topic {CONTENT_TOPIC} on {PUBSUB_TOPIC}"
        for node in (a, b):  # the other JS node and its chat
            node.ok("wait_subscribers", pubsub_topic=PUBSUB_TOPIC, count=2, timeout_ms=30_000)
        for i in range(N):
            for node, prefix in ((a, "a"), (b, "b")):
                node.ok("sds_send", text=f"{prefix}{i:02d}")
        py_logs = [chat.finish() for chat in chats]
        assert py_logs[0] == py_logs[1], "the two chats' logs differ"

        def js_caught_up() -> list[dict[str, Any]] | None:
            replies = [node.ok("sds_log") for node in (a, b)]
            done = all(r["log"] == py_logs[0] and r["status"]["outgoing"] == 0 for r in replies)
            return replies if done else None

        js = wait_for(js_caught_up, "the JS logs equal to the chats'", timeout_s=60)
        assert all(chat.dropped() > 0 for chat in chats), "the chats' --drop-rate was not applied"
    finally:
        for chat in chats:
            chat.stop()

    assert_same_logs(py_logs, Counter(f"{p}{i:02d}" for p in "abcd" for i in range(N)))
    assert all(reply["status"]["dropped"] > 0 for reply in js), "the JS drop was not applied"
