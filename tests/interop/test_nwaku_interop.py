"""nwaku, the reference Waku node, and sdsync: relay, store and the light protocols, both ways.

Each test runs real processes on 127.0.0.1 only: nwaku (``wakunode2`` from the
``nwaku_nodes`` fixture, cluster 1, 8 shards, shard 7, RLN off), `sdsync chat` and
`sdsync store serve --relay-shard 7`.

* relay: two chats whose only peer is nwaku converge (identical logs), and nwaku's own
  archive holds every message of theirs, under the hash we compute; when nwaku is killed
  and started again (same key and ports), the chats find it again by themselves and what
  they typed meanwhile reaches the other;
* store, nwaku serving: a chat whose only link is ``--store <nwaku>`` catches up the SDS
  messages published into nwaku (a time-range listing, then the messages by hash, over
  ``/vac/waku/store-query/3.0.0``);
* store, we serve: nwaku's store v3 client (``GET /store/v3/messages?peerAddr=<our store>``)
  reads our archive: the same hashes, by content topic and time range, in pages forward
  and backward, by hash;
* light, nwaku serving: two ``sdsync chat --light --service <nwaku>`` converge over its
  LightPush v3 and Filter;
* light, we serve: an nwaku light node (``--lightpushnode``/``--filternode`` = our store
  node) publishes through our LightPush and receives through our Filter.

Every wait is a liveness bound, never a speed requirement, and fails with the logs of the
processes involved. Without an nwaku binary the tests skip naming SDSYNC_NWAKU (in CI,
where .ci/run exports it, they fail).
"""

from __future__ import annotations

import base64
import contextlib
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from chatprocess import ChatProcess, TypedChat, assert_same_logs, sends, wait_for
from go_waku_steps import archived
from storeprocess import StoreProcess, store_serve
from testdeps import require

from sdsync.core import MessageChannel
from sdsync.errors import RemoteProtocolError
from sdsync.testing.nwaku import Nwaku, NwakuOptions
from sdsync.waku.filter.rpc import FILTER_SUBSCRIBE_PROTOCOL
from sdsync.waku.lightpush.rpc import LIGHTPUSH_PROTOCOL
from sdsync.wire import decode
from sdsync.wire.waku import WakuMessage

require("sdsync.transport.libp2p", "needs the 'p2p' extra")

# Processes, like the other chat and go-waku ones: never beside the other process groups.
pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("many-processes")]

PUBSUB_TOPIC = "/waku/2/rs/1/7"  # every /sds/1/... content topic autoshards here on cluster 1
N = 8  # messages per chat
PATIENCE_S = 120.0  # liveness bound of a group of processes; they normally take 10-20 s
WAIT_S = 60.0  # liveness bound of one step; each normally takes about a second
FAST = [
    *("--sync-interval-ms", "300", "--retry-ms", "1000"),
    *("--repair-min-ms", "200", "--repair-max-ms", "1000"),
    *("--store-query-ms", "500", "--quiet-ms", "3000", "--print-log"),
]
Start = Callable[..., Nwaku]


def content_topic(channel: str) -> str:
    return f"/sds/1/{channel}/proto"


def rest_message(message: WakuMessage) -> dict[str, Any]:
    """``message`` as nwaku's REST API takes it."""
    fields: dict[str, Any] = {
        "payload": base64.b64encode(message.payload).decode(),
        "contentTopic": message.content_topic,
        "timestamp": message.timestamp,
    }
    if message.meta:
        fields["meta"] = base64.b64encode(message.meta).decode()
    return fields


def waku_message(entry: dict[str, Any]) -> WakuMessage:
    """A WakuMessage as nwaku's REST API writes it (a store entry's ``message``, a Filter
    message)."""
    return WakuMessage(
        base64.b64decode(entry["payload"]),
        entry["contentTopic"],
        timestamp=int(entry["timestamp"]),
        meta=base64.b64decode(entry.get("meta") or ""),
        version=int(entry.get("version") or 0),
    )


def our_hashes(store: StoreProcess, topic: str) -> list[str]:
    """The hashes (hex) our store archived on ``topic``, oldest first."""
    return [e["messageHash"].removeprefix("0x") for e in archived(store, PUBSUB_TOPIC, topic)]


@contextlib.contextmanager
def showing_logs(*nodes: Nwaku, store: StoreProcess | None = None) -> Iterator[None]:
    """A failed assertion inside ends with the logs of ``nodes`` and of our ``store``."""
    try:
        yield
    except AssertionError as exc:
        logs = [f"--- nwaku {n.directory.name}'s log:\n{n.log_tail(4000)}" for n in nodes]
        if store is not None:
            logs.append(f"--- our store's log:\n{''.join(store.stderr)[-3000:]}")
        raise AssertionError("\n".join([str(exc), *logs])) from None


def archived_sds(nwaku: Nwaku, topic: str) -> dict[str, str]:
    """What nwaku archived on ``topic``: each SDS content message's id and text, after
    checking that the hash nwaku reports is the one we compute (RFC 14)."""
    found = {}
    for entry in nwaku.store_messages(PUBSUB_TOPIC, contentTopics=topic, includeData=True):
        message = waku_message(entry["message"])
        assert message.hash(PUBSUB_TOPIC).hex() == entry["messageHash"], entry
        try:
            sds = decode(message.payload)
        except RemoteProtocolError:
            continue
        if sds.content:  # sync messages carry none
            found[sds.message_id] = sds.content.decode()
    return found


def chats(tmp_path: Path, channel: str, flags: list[str]) -> list[list[dict[str, Any]]]:
    """Chats A and B in ``channel``, each sending N messages with ``flags``: their logs."""
    group = ["--channel", channel, "--wait-converged", str(PATIENCE_S - 30), "--min-peers", "1"]
    started: list[ChatProcess] = []
    try:
        for seed, name in enumerate("AB", start=1):
            own = ["--seed", str(seed), "--state-dir", str(tmp_path / name)]
            args = [*FAST, *group, *flags, *own, *sends(name.lower(), N)]
            started.append(ChatProcess(tmp_path, name, args, patience_s=PATIENCE_S))
        return [chat.finish() for chat in started]
    finally:
        for chat in started:
            chat.stop()


# -- relay ------------------------------------------------------------------------------


def test_two_chats_converge_through_nwaku_which_archives_every_message(
    tmp_path: Path, nwaku_nodes: Start
) -> None:
    channel = "nwaku-relay"
    nwaku = nwaku_nodes()
    with showing_logs(nwaku):
        logs = chats(tmp_path, channel, ["--peer", nwaku.address, "--min-mesh", "1"])
        texts = Counter(f"{p}{i:02d}" for p in "ab" for i in range(N))
        assert_same_logs(logs, texts)
        # nwaku relayed them (the chats' only path) and archived every one.
        expected = {e["message_id"]: e["text"] for e in logs[0]}
        nwaku.wait_until(
            lambda: archived_sds(nwaku, content_topic(channel)) == expected,
            "every message of the chats in its archive",
            WAIT_S,
        )


def test_chats_find_nwaku_again_after_it_is_killed_and_restarted(
    tmp_path: Path, nwaku_nodes: Start
) -> None:
    channel = "nwaku-restart"
    nwaku = nwaku_nodes()
    flags = ["--peer", nwaku.address, "--store", nwaku.address, *FAST[:4]]
    typed = [TypedChat(tmp_path, name, channel, flags, patience_s=WAIT_S) for name in ("ka", "kb")]
    try:
        with showing_logs(nwaku):
            for chat in typed:
                wait_for(chat.has_mesh, f"nwaku in {chat.name}'s mesh", WAIT_S)
            talk(typed, "before")
            address = nwaku.address
            nwaku.kill()
            down = f"cannot reach peer {nwaku.peer_id}"
            for chat in typed:
                chat.type(f"{chat.name} during")
                wait_for(lambda c=chat: down in c.text(), f"{chat.name} saw the outage", WAIT_S)
            assert nwaku.restart() == address
            reached = f"reached peer {nwaku.peer_id} again"
            for chat in typed:
                wait_for(lambda c=chat: reached in c.text(), f"{chat.name} reconnected", WAIT_S)
                assert chat.text().count(reached) == 1
            for chat, other in zip(typed, typed[::-1], strict=True):
                chat.shows(rf"{other.name}: {other.name} during$", f"{other.name}'s outage line")
            talk(typed, "after")
    finally:
        for chat in typed:
            chat.stop()


def talk(typed: list[TypedChat], when: str) -> None:
    """Each chat types a line; the other shows it."""
    for chat in typed:
        chat.type(f"{chat.name} {when}")
    for chat, other in zip(typed, typed[::-1], strict=True):
        chat.shows(rf"{other.name}: {other.name} {when}$", f"{other.name}'s {when!r}")


# -- store ------------------------------------------------------------------------------


def test_a_chat_catches_up_from_nwakus_store(tmp_path: Path, nwaku_nodes: Start) -> None:
    channel = "nwaku-catch-up"
    topic = content_topic(channel)
    nwaku = nwaku_nodes()
    # Alice's SDS messages, published into nwaku by REST (nwaku archives what it relays,
    # no peer needed); nobody relays them to the chat, which has no peer at all.
    alice = MessageChannel(channel, "alice", now_ms=time.time_ns() // 10**6)
    hashes = []
    for i in range(N):
        out = alice.send(f"x{i:02d}".encode(), now_ms=time.time_ns() // 10**6)
        message = WakuMessage(out.data, topic, timestamp=time.time_ns())
        nwaku.relay_publish(PUBSUB_TOPIC, rest_message(message))
        hashes.append(message.hash(PUBSUB_TOPIC).hex())
    nwaku.wait_until(
        lambda: nwaku.store_hashes(PUBSUB_TOPIC, contentTopics=topic) == hashes,
        "Alice's messages archived",
        WAIT_S,
    )
    # Killed and started again (same node key, ports and archive): same peer, same archive.
    address = nwaku.address
    nwaku.kill()
    assert nwaku.restart() == address
    assert nwaku.store_hashes(PUBSUB_TOPIC, contentTopics=topic) == hashes
    flags = ["--channel", channel, "--store", nwaku.address, "--min-peers", "1"]
    flags += ["--wait-converged", str(PATIENCE_S - 30), *FAST]
    chat = ChatProcess(tmp_path, "B", flags, patience_s=PATIENCE_S)
    with showing_logs(nwaku):
        try:
            log = chat.finish()
        finally:
            chat.stop()
        assert [(e["sender_id"], e["text"]) for e in log] == [
            ("alice", f"x{i:02d}") for i in range(N)
        ]
        err = chat.err.read_text()
        caught_up = re.search(r"caught up (\d+) time\(s\), (\d+) message\(s\)", err)
        assert caught_up and int(caught_up[2]) == N, err[-3000:]


def test_nwakus_store_client_reads_our_archive(tmp_path: Path, nwaku_nodes: Start) -> None:
    topic = content_topic("nwaku-store-client")
    probe_topic = content_topic("nwaku-store-probe")
    with store_serve(tmp_path / "store", PUBSUB_TOPIC) as store:
        ours = store.relay_addrs[0]
        # No archive of its own: every answer below can only come from ours.
        nwaku = nwaku_nodes(NwakuOptions(store=False, static_nodes=[ours]))
        with showing_logs(nwaku, store=store):
            # Until the relay mesh has formed a publish may reach nobody: probe.
            def probe_archived() -> list[str]:
                probe = WakuMessage(b"probe", probe_topic, timestamp=time.time_ns())
                nwaku.relay_publish(PUBSUB_TOPIC, rest_message(probe))
                time.sleep(0.3)
                return our_hashes(store, probe_topic)

            wait_for(probe_archived, "a probe nwaku published archived by our store", WAIT_S)

            base = time.time_ns() - 10**9  # in the past: our store refuses the far future
            stamps = [base + i * 1_000 for i in range(5)]
            messages = [
                WakuMessage(f"m{i}".encode(), topic, timestamp=stamps[i], meta=b"meta %d" % i)
                for i in range(5)
            ]
            for message in messages:
                nwaku.relay_publish(PUBSUB_TOPIC, rest_message(message))
            hashes = [m.hash(PUBSUB_TOPIC).hex() for m in messages]
            wait_for(lambda: our_hashes(store, topic) == hashes, "all archived by us", WAIT_S)

            def read(**params: Any) -> list[list[str]]:
                pages = nwaku.store_pages(PUBSUB_TOPIC, ours, contentTopics=topic, **params)
                return [[e["messageHash"] for e in page] for page in pages]

            # By content topic, with the data: our hashes, our messages.
            entries = nwaku.store_messages(
                PUBSUB_TOPIC, ours, contentTopics=topic, includeData=True
            )
            assert [e["messageHash"] for e in entries] == hashes
            assert [waku_message(e["message"]) for e in entries] == messages
            assert {e["pubsubTopic"] for e in entries} == {PUBSUB_TOPIC}
            # A time range, inclusive at both ends.
            assert read(startTime=stamps[1], endTime=stamps[3]) == [hashes[1:4]]
            # Pages of 2, forward and backward (each page in time order, as nwaku's own).
            assert read(pageSize=2) == [hashes[0:2], hashes[2:4], hashes[4:]]
            assert read(pageSize=2, ascending=False) == [hashes[3:5], hashes[1:3], hashes[0:1]]
            # By hash (no content filter with hashes): exactly those, an unknown one ignored.
            asked = [hashes[4], hashes[1], bytes(32).hex()]
            by_hash = nwaku.store_hashes(peer_addr=ours, hashes=",".join("0x" + h for h in asked))
            assert sorted(by_hash) == sorted(asked[:2])


def test_a_node_key_is_the_same_identity_in_nwaku_and_ours(nwaku_nodes: Start) -> None:
    """``--nodekey`` means what nwaku's means: the same 64 hex characters, the same peer
    id, so an operator can move a node's identity between the two."""
    from sdsync.transport.nodekey import NodeKey

    nwaku = nwaku_nodes()
    assert NodeKey.from_hex(nwaku.nodekey).peer_id == nwaku.peer_id


# -- light protocols ---------------------------------------------------------------------


def test_light_chats_converge_through_nwakus_lightpush_and_filter(
    tmp_path: Path, nwaku_nodes: Start
) -> None:
    channel = "nwaku-light"
    # nwaku refuses a LightPush it has no relay peer to publish to: give it one.
    relay_peer = nwaku_nodes(NwakuOptions(store=False), name="relay-peer")
    service = nwaku_nodes(
        NwakuOptions(lightpush=True, filter=True, static_nodes=[relay_peer.address]),
        name="service",
    )
    service.wait_connected(relay_peer.peer_id)
    with showing_logs(service, relay_peer):
        logs = chats(tmp_path, channel, ["--light", "--service", service.address])
        assert_same_logs(logs, Counter(f"{p}{i:02d}" for p in "ab" for i in range(N)))
        expected = {e["message_id"]: e["text"] for e in logs[0]}
        service.wait_until(
            lambda: archived_sds(service, content_topic(channel)) == expected,
            "every message of the light chats in its archive",
            WAIT_S,
        )


def test_an_nwaku_light_node_pushes_and_filters_through_our_store_node(
    tmp_path: Path, nwaku_nodes: Start
) -> None:
    topic = content_topic("nwaku-light-client")
    probe_topic = content_topic("nwaku-light-probe")
    with store_serve(
        tmp_path / "store", PUBSUB_TOPIC, LIGHTPUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL
    ) as store:
        ours = store.relay_addrs[0]
        # A relay (and store) node beside our store, and a light node whose only service
        # node is our store.
        relay = nwaku_nodes(NwakuOptions(static_nodes=[ours]), name="relay")
        light = nwaku_nodes(
            NwakuOptions(relay=False, store=False, lightpush_node=ours, filter_node=ours),
            name="light",
        )
        with showing_logs(relay, light, store=store):

            def probe_archived() -> list[str]:
                probe = WakuMessage(b"probe", probe_topic, timestamp=time.time_ns())
                relay.relay_publish(PUBSUB_TOPIC, rest_message(probe))
                time.sleep(0.3)
                return our_hashes(store, probe_topic)

            wait_for(probe_archived, "a probe nwaku relayed archived by our store", WAIT_S)
            subscribed = light.filter_subscribe(PUBSUB_TOPIC, topic)
            assert subscribed.get("statusDesc") == "OK", subscribed

            # 1. LightPush through our store: archived by it, relayed to nwaku's relay.
            pushed = [
                WakuMessage(f"push {i}".encode(), topic, timestamp=time.time_ns()) for i in range(5)
            ]
            for message in pushed:
                # HTTP 200 with the relay peers our store published to (nwaku's relay).
                answer = light.lightpush(PUBSUB_TOPIC, rest_message(message))
                assert answer == {"relayPeerCount": 1}, answer
            hashes = [m.hash(PUBSUB_TOPIC).hex() for m in pushed]
            wait_for(lambda: our_hashes(store, topic) == hashes, "pushes archived by us", WAIT_S)
            relay.wait_until(
                lambda: set(hashes) <= set(relay.store_hashes(PUBSUB_TOPIC, contentTopics=topic)),
                "the pushes relayed to nwaku",
                WAIT_S,
            )

            # 2. Filter from our store: what nwaku relays reaches the light node.
            relayed = [
                WakuMessage(f"relayed {i}".encode(), topic, timestamp=time.time_ns())
                for i in range(5)
            ]
            for message in relayed:
                relay.relay_publish(PUBSUB_TOPIC, rest_message(message))
            heard: list[WakuMessage] = []

            def all_heard() -> bool:
                heard.extend(waku_message(m) for m in light.filter_messages(topic))
                return set(relayed) <= set(heard)

            light.wait_until(all_heard, "every relayed message pushed by Filter", WAIT_S)
            # Nothing but the messages on its content topic.
            assert set(heard) <= set(relayed) | set(pushed), heard
