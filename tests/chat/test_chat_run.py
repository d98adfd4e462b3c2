"""One run of the chat (sdsync.chat.run_chat) and the flags that configure it: --min-peers
(participants heard from, for converged) and --min-mesh (mesh peers to wait for before
sending) reach the places that use them, and the transport is a Waku relay of the cluster
and shard given (--cluster-id, --shard). In process, the libp2p transport replaced by one
over a MemoryNetwork that records what the run asked of its mesh."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sdsync.chat import ChatOptions, run_chat
from sdsync.chat.run import PeerWatch
from sdsync.cli import chat as chat_cli
from sdsync.cli.main import app
from sdsync.runtime import ReliableChannel, RuntimeConfig
from sdsync.testing.memory import MemoryNetwork, MemoryTransport
from sdsync.transport import libp2p as libp2p_module
from sdsync.transport.libp2p import WakuRelayConfig
from sdsync.waku.node import Received
from sdsync.wire import HistoryEntry

FAST = RuntimeConfig(sync_interval_ms=100, resend_interval_ms=200, incoming_sweep_ms=50)


def options_from_the_command_line(monkeypatch: pytest.MonkeyPatch, *args: str) -> ChatOptions:
    seen: list[ChatOptions] = []

    def chat_main(options: ChatOptions) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(chat_cli, "chat_main", chat_main)
    result = CliRunner().invoke(app, ["chat", *args])
    assert result.exit_code == 0, result.output
    return seen[0]


def test_min_peers_and_min_mesh_are_separate_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    default = options_from_the_command_line(monkeypatch)
    assert (default.min_peers, default.min_mesh) == (0, 1)
    given = options_from_the_command_line(monkeypatch, "--min-peers", "3", "--min-mesh", "2")
    assert (given.min_peers, given.min_mesh) == (3, 2)
    # --min-mesh 0: send without waiting for anyone.
    assert options_from_the_command_line(monkeypatch, "--min-mesh", "0").min_mesh == 0


def test_a_negative_min_mesh_is_bad_usage() -> None:
    result = CliRunner().invoke(app, ["chat", "--min-mesh", "-1"])
    assert result.exit_code == 2


STORE_PEER = "/ip4/127.0.0.1/tcp/60000/ws/p2p/12D3KooWEyoppNCUx8Yx66oV9fJnriXwCcXwDDUA2kj6vnc6iDEp"


def test_store_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    default = options_from_the_command_line(monkeypatch)
    assert default.stores == ()
    assert default.runtime.store_query_ms == RuntimeConfig().store_query_ms
    given = options_from_the_command_line(
        monkeypatch,
        *("--store", "http://127.0.0.1:8645", "--store", STORE_PEER),
        *("--store-query-ms", "300"),
    )
    # In the order given: the first is asked first.
    assert given.stores == ("http://127.0.0.1:8645", STORE_PEER)
    # A store is asked at a sweep of the incoming buffer: never less often than that.
    assert (given.runtime.store_query_ms, given.runtime.incoming_sweep_ms) == (300, 300)


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("127.0.0.1:8645", "neither an http(s) URL"),
        ("ftp://store", "neither an http(s) URL"),
        ("/ip4/127.0.0.1/tcp/60000", "names no peer"),
        ("/ip4/127.0.0.1/tcp/x/p2p/abc", "is not a multiaddr"),
    ],
)
def test_a_store_that_is_neither_a_url_nor_a_peer_is_bad_usage(value: str, complaint: str) -> None:
    result = CliRunner().invoke(app, ["chat", "--store", value])
    assert result.exit_code == 2
    assert complaint in " ".join(result.output.split())


def test_cluster_and_shard_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    default = options_from_the_command_line(monkeypatch)
    assert (default.cluster_id, default.shard) == (1, None)  # autosharding in The Waku Network
    given = options_from_the_command_line(monkeypatch, "--cluster-id", "42", "--shard", "3")
    assert (given.cluster_id, given.shard) == (42, 3)
    for flag in ("--cluster-id", "--shard"):
        assert CliRunner().invoke(app, ["chat", flag, "-1"]).exit_code == 2


@pytest.mark.parametrize(
    ("cluster_id", "shard", "pubsub_topic"),
    [(1, None, "/waku/2/rs/1/7"), (42, 3, "/waku/2/rs/42/3")],
)
def test_the_chat_is_a_waku_relay_and_says_on_which_topics(
    monkeypatch: pytest.MonkeyPatch, cluster_id: int, shard: int | None, pubsub_topic: str
) -> None:
    options = ChatOptions(
        name="me", channel="probe", cluster_id=cluster_id, shard=shard, print_log=True
    )
    made: list[dict[str, Any]] = []
    screen = io.StringIO()
    assert run_beside_one_peer(monkeypatch, options, [], made, screen) == 0
    assert made[0]["waku"] == WakuRelayConfig(cluster_id=cluster_id, shard=shard)
    # What a js-waku relay node needs to join (/sds/1/probe/proto autoshards to 7).
    assert f"content topic /sds/1/probe/proto on {pubsub_topic}" in screen.getvalue()


class RecordingTransport(MemoryTransport):
    """What run_chat uses of Libp2pTransport, over a MemoryNetwork."""

    def __init__(self, network: MemoryNetwork, mesh_waits: list[tuple[int, float]]) -> None:
        super().__init__(network, "me")
        self.mesh_waits = mesh_waits
        self.listen_addrs = ["/memory/me"]
        self.received = self.randomly_dropped = self.publish_failures = 0
        self.rejected: dict[str, int] = {}

    async def start(self) -> None:
        pass

    async def wait_for_mesh(self, topic: str, count: int, timeout_s: float) -> bool:
        self.mesh_waits.append((count, timeout_s))
        return True

    async def connected_peers(self) -> list[str]:
        return ["bob"]


def run_beside_one_peer(
    monkeypatch: pytest.MonkeyPatch,
    options: ChatOptions,
    mesh_waits: list[tuple[int, float]],
    made: list[dict[str, Any]] | None = None,
    screen: io.StringIO | None = None,
) -> int:
    """run_chat's exit code, in a group of two: the chat and bob, who acknowledges. The
    transport's arguments go to ``made``, what the chat prints to ``screen``."""
    network = MemoryNetwork(seed=5)

    def transport(**arguments: Any) -> RecordingTransport:
        if made is not None:
            made.append(arguments)
        return RecordingTransport(network, mesh_waits)

    async def scenario() -> int:
        bob = ReliableChannel(network.transport("bob"), options.channel, "bob", runtime=FAST)
        await bob.start()
        try:
            return await run_chat(options, Console(file=screen or io.StringIO(), width=200))
        finally:
            await bob.close()

    monkeypatch.setattr(libp2p_module, "Libp2pTransport", transport)
    return asyncio.run(scenario())


@pytest.mark.parametrize(("min_peers", "converged"), [(1, True), (2, False)])
def test_min_peers_is_for_converged_and_min_mesh_for_the_wait_before_sending(
    monkeypatch: pytest.MonkeyPatch, min_peers: int, converged: bool
) -> None:
    options = ChatOptions(
        name="me",
        sends=("hello",),
        wait_converged_s=3.0,
        quiet_ms=300,
        min_peers=min_peers,
        min_mesh=4,
        runtime=FAST,
    )
    mesh_waits: list[tuple[int, float]] = []
    code = run_beside_one_peer(monkeypatch, options, mesh_waits)
    # One other participant: converged needs no more than that; the mesh wait asks for
    # exactly --min-mesh, whatever --min-peers is.
    assert code == (0 if converged else 1)
    assert mesh_waits == [(4, 3.0)]


class EmptyStore:
    """A store with nothing in it; it counts the catch-ups asked of it."""

    def __init__(self) -> None:
        self.windows: list[tuple[int, int]] = []

    async def fetch(self, channel_id: str, entries: tuple[HistoryEntry, ...]) -> list[Received]:
        return []

    async def catch_up(
        self,
        content_topic: str,
        start_ms: int,
        end_ms: int,
        page_size: int,
        unseen: Callable[[list[bytes]], list[bytes]],
    ) -> AsyncIterator[list[Received]]:
        self.windows.append((start_ms, end_ms))
        return
        yield


def test_peers_back_after_none_make_the_channel_catch_up_at_once() -> None:
    """Peers at start are not a reconnection (the channel caught up at start anyway); all
    peers gone and then one back is: the catch-up that was an interval away runs now."""
    start = 1_700_000_000_000
    now = [start]
    store, net = EmptyStore(), MemoryNetwork()
    me, a, b = net.waku_node("me"), net.waku_node("a"), net.waku_node("b")
    runtime = RuntimeConfig(
        sync_interval_ms=10**9, incoming_sweep_ms=10**9, store_catchup_interval_ms=300_000
    )

    async def scenario() -> None:
        channel = ReliableChannel(
            MemoryNetwork().transport("me"),
            "0",
            "me",
            runtime=runtime,
            store=store,
            clock=lambda: now[0],
        )
        await channel.start()
        try:
            await until(lambda: channel.catch_ups == 1)  # the one at start
            assert channel.driver.next_due() == start + 300_000
            watch = PeerWatch(me, channel)
            for moment, connected, back in [
                (1_000, [], False),  # not connected yet
                (2_000, [a], False),  # connected: the first time is no reconnection
                (3_000, [], False),  # every peer gone
                (4_000, [], False),
                (5_000, [b], True),  # back
                (6_000, [b], False),
            ]:
                now[0] = start + moment
                for peer in await me.connected_peers():
                    me.disconnect(peer)
                for node in connected:
                    await me.connect(node.listen_addrs[0])
                assert await watch.check() is back
                if back:
                    assert channel.driver.next_due() == start + moment
                    # The timer loop wakes for it (the clock stands still: nothing else
                    # could make it run a catch-up now).
                    await until(lambda: channel.catch_ups == 2)
            assert store.windows == [(start - 20_000, start), (start - 20_000, start + 5_000)]
        finally:
            await channel.close()

    asyncio.run(scenario())


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(60):  # a liveness bound, not a performance assertion
        while not condition():
            await asyncio.sleep(0.01)


def test_send_with_nobody_to_send_to_is_bad_usage() -> None:
    """Issue 39: `--send` with no peer exited 0, its message sent to nobody."""
    result = CliRunner().invoke(app, ["chat", "--send", "hello"])
    assert result.exit_code == 2
    assert "has nobody to send to" in " ".join(result.output.split())
    # Waiting for chats that dial this one is a way to have somebody.
    ChatOptions(name="me", sends=("hello",), wait_converged_s=5.0)


def test_a_quiet_period_the_wait_cannot_hold_is_bad_usage() -> None:
    """Issue 39: docs/chat.md's `--wait-converged 60` could never converge under the
    default quiet period of 3 x 30 s; that default is now at most a third of the wait,
    and a --quiet-ms as long as the wait is refused."""
    assert ChatOptions(name="me", wait_converged_s=60.0).quiet_s == 20.0
    assert ChatOptions(name="me").quiet_s == 3 * RuntimeConfig().sync_interval_ms / 1000
    result = CliRunner().invoke(app, ["chat", "--wait-converged", "5", "--quiet-ms", "5000"])
    assert result.exit_code == 2
    assert "--quiet-ms is as long as the wait" in " ".join(result.output.split())
