"""A js-waku ReliableChannel and `sdsync chat` in one channel, through our service node.

Three processes on loopback: `sdsync store serve --relay-shard 7` (Waku relay, store,
LightPush, Filter), an interactive `sdsync chat` relaying through it (``--peer`` and
``--store`` its multiaddr), and a js-waku light node (waku_light/, ``@waku/sdk`` 0.0.36)
whose ``ReliableChannel`` uses the store node as its only service node: it sends by
LightPush, hears by Filter and fetches what it misses from the store by hash.

Lines typed in the chat and messages sent by the JS side, interleaved, appear on the other
side; each side's messages are acknowledged by the other (``message-acknowledged`` in JS,
``acknowledged by`` in the chat); a message published while the JS side had dropped its
Filter subscription is fetched from our store over ``/vac/waku/store-query/3.0.0`` once a
later message names it; and in the end the chat's log (``--print-log``) and the JS
channel's local log hold the same messages in the same order, (Lamport timestamp, message
id), with the same timestamps. Every wait is bounded; every process is ended in ``finally``.
"""

from __future__ import annotations

import base64
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chatprocess import TypedChat, assert_same_logs, wait_for
from storeprocess import StoreProcess, store_serve
from waku_drivers import WakuDriver, b64, light_node

from sdsync.waku.filter.rpc import FILTER_SUBSCRIBE_PROTOCOL
from sdsync.waku.lightpush.rpc import LIGHTPUSH_PROTOCOL
from sdsync.waku.store.rpc import STORE_QUERY_PROTOCOL
from sdsync.wire import decode

pytestmark = pytest.mark.interop

CHANNEL = "js-chat"  # the chat's --channel, and the JS channel's id
CONTENT_TOPIC = f"/sds/1/{CHANNEL}/proto"  # the chat's content topic for that channel
PUBSUB_TOPIC = "/waku/2/rs/1/7"  # its autoshard on cluster 1, as for every /sds/1/... topic
WAIT_S = 20.0  # a liveness bound: each step normally takes well under a second
JS_OPTIONS = {  # fast SDS timers, so that syncs (acknowledgements) come within a second
    "syncMinIntervalMs": 500,
    "retryIntervalMs": 1_000,
    "retrieveFrequencyMs": 500,
    "processTaskMinElapseMs": 100,
}
# The chat syncs often but resends and repairs only after the test is over: what the JS
# side missed can reach it only from the store.
CHAT_OPTIONS = ["--sync-interval-ms", "500", "--retry-ms", "60000"]
CHAT_OPTIONS += ["--repair-min-ms", "60000", "--repair-max-ms", "120000"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreProcess]:
    protocols = (STORE_QUERY_PROTOCOL, LIGHTPUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL)
    with store_serve(tmp_path / "store", PUBSUB_TOPIC, *protocols) as store:
        yield store


@pytest.fixture
def light(store: StoreProcess) -> Iterator[WakuDriver]:
    yield from light_node(store, "light")


def js_send(light: WakuDriver, text: str) -> str:
    """Sends ``text`` on the JS channel; its SDS message id (sha256 of the text)."""
    payload = b64(text.encode())
    message_id: str = light.ok("reliable_send", channel_id=CHANNEL, payload=payload)["message_id"]
    return message_id


def js_received(light: WakuDriver, text: str, timeout: float = WAIT_S) -> None:
    """Waits for the JS channel's ``message-received`` of ``text``."""
    payload = b64(text.encode())
    light.event(
        lambda e: e.get("type") == "message-received" and e["detail"].get("payload") == payload,
        timeout=timeout,
    )


def js_acknowledged(light: WakuDriver, message_ids: set[str]) -> None:
    """Waits for the JS channel's ``message-acknowledged`` of each of ``message_ids``."""
    pending = set(message_ids)
    while pending:
        event = light.event(
            lambda e: e.get("type") == "message-acknowledged" and e["detail"] in pending,
            timeout=WAIT_S,
        )
        pending.discard(event["detail"])


def js_log(light: WakuDriver, length: int) -> list[dict[str, Any]]:
    """The JS channel's local log, in its order, once it holds ``length`` messages, in the
    form of the chat's ``--print-log`` lines."""

    def complete() -> list[dict[str, Any]] | None:
        entries: list[dict[str, Any]] = light.ok("reliable_log", channel_id=CHANNEL)["log"]
        return entries if len(entries) == length else None

    log = wait_for(complete, f"{length} messages in the JS channel's log", WAIT_S)
    return [
        {
            "message_id": entry["message_id"],
            "sender_id": entry["sender_id"],
            "lamport_timestamp": int(entry["lamport_timestamp"]),
            "text": base64.b64decode(entry["payload"]).decode(),
        }
        for entry in log
    ]


def archived(light: WakuDriver, text: str) -> bool:
    """Whether our store holds the SDS message whose content is ``text`` (asked by the
    JS store client, over store-query)."""
    found = light.ok("store_query", content_topic=CONTENT_TOPIC)["messages"]
    return any(decode(base64.b64decode(m["payload"])).content == text.encode() for m in found)


def test_a_js_waku_reliable_channel_and_a_chat_talk_through_our_node(
    tmp_path: Path, store: StoreProcess, light: WakuDriver
) -> None:
    light.ok(
        "reliable_channel_create",
        channel_id=CHANNEL,
        sender_id="js",
        content_topic=CONTENT_TOPIC,
        options=JS_OPTIONS,
    )
    peer = ["--peer", store.relay_addrs[0], "--store", store.relay_addrs[0]]
    chat = TypedChat(tmp_path, "chat", CHANNEL, [*peer, *CHAT_OPTIONS], patience_s=WAIT_S)
    try:
        chat.shows(rf"content topic {CONTENT_TOPIC} on {PUBSUB_TOPIC}$", "its topics")
        # py-libp2p publishes to nobody before its mesh forms: the store node must be in it.
        wait_for(chat.has_mesh, "the store node in the chat's mesh", WAIT_S)

        # 1. Typed on each side in turn, each line seen on the other side before the next...
        js_ids: set[str] = set()
        chat_texts = []
        for i in range(3):
            chat_texts.append(typed := f"chat says {i}")
            chat.type(typed)
            js_received(light, typed)
            js_ids.add(js_send(light, f"js says {i}"))
            chat.shows(rf"js: js says {i}$", f"js says {i}")
        # ...and at once: concurrent messages, which only the log order (Lamport
        # timestamp, message id) places.
        chat_texts.append("chat, meanwhile")
        chat.type("chat, meanwhile")
        js_ids.add(js_send(light, "js, meanwhile"))
        js_received(light, "chat, meanwhile")
        chat.shows(r"js: js, meanwhile$", "js, meanwhile")

        # 2. Each side's messages are acknowledged by the other: the chat's messages and
        # syncs name the JS side's in their causal history, and the other way round.
        js_acknowledged(light, js_ids)
        for text in chat_texts:
            chat.shows(rf"{re.escape(text)} · acknowledged by js$", f"{text} acknowledged")

        # 3. Typed while the JS side hears nothing: our store archives it, and it does not
        # reach the JS side (which still sends and syncs).
        light.ok("reliable_unsubscribe", channel_id=CHANNEL)
        chat.type("while js was away")
        wait_for(lambda: archived(light, "while js was away"), "it in our store", WAIT_S)
        with pytest.raises(AssertionError):
            js_received(light, "while js was away", timeout=0.5)
        queries = store.metric("sdsync_store_queries_total", status="200")
        light.ok("reliable_subscribe", channel_id=CHANNEL)
        chat.type("js is back")
        js_received(light, "js is back")
        # That names the missed one in its causal history, with its Waku message hash as
        # the retrieval hint: the JS channel asks our store for it by that hash. (Nothing
        # else could bring it: the chat resends and repairs only after a minute, js-waku
        # sends repair requests after 30 s at the earliest.)
        js_received(light, "while js was away")
        assert store.metric("sdsync_store_queries_total", status="200") > queries
        chat.shows(r"while js was away · acknowledged by js$", "the missed one acknowledged")

        theirs = js_log(light, 10)
        chat.quit()
        ours = chat.print_log()
    finally:
        chat.stop()
    texts = [*chat_texts, "while js was away", "js is back"]
    texts += [*(f"js says {i}" for i in range(3)), "js, meanwhile"]
    assert_same_logs([ours, theirs], Counter(texts))
