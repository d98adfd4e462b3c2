"""One run of the chat: a participant of one channel over Waku Relay.

Theory of operation
-------------------
One process is one participant of one channel: a :class:`ReliableChannel` over a
:class:`~sdsync.transport.Libp2pTransport` in its Waku mode, whose state directory holds
the chat's identity (:mod:`sdsync.chat.identity`) next to the channel's own state, so a
restart resumes. The Waku mode is what lets a js-waku relay node join the channel: the
channel's topic ``/sds/1/<channel>`` travels as the content topic
``/sds/1/<channel>/proto`` on the pubsub topic ``/waku/2/rs/<cluster>/<shard>``, the shard
given (static sharding) or derived from the content topic (autosharding); the run prints
both at start, for whoever joins from js-waku.

With ``light`` (``--light``) the run relays nothing: a
:class:`~sdsync.transport.waku_light.WakuLightTransport` publishes by LightPush and
receives by Filter through the ``services`` given (nwaku, go-waku, ``sdsync store
serve``), which are also its store peers unless ``stores`` are given; "the mesh" a
scripted run waits for is then the services holding its Filter subscription.

A :class:`ChatSession` shows the channel's events. Interactive, lines typed on stdin are
sent; scripted (``sends``, ``wait_converged_s``, ``print_log``), the texts are sent in
order, the run waits until converged and then lingers one more quiet period before it
ends — peers still catching up may need its syncs and repairs — and the local log is
printed as JSON lines on stdout. Two numbers of peers are asked for, and they differ in any
group that is not a full mesh: ``min_mesh``, the gossipsub neighbours to wait for before the
first send (py-libp2p publishes to nobody before its mesh forms), and ``min_peers``, the
participants heard from before converged (relayed through others, so it can be the whole
group even in a line of chats each connected to the previous one).

With ``stores`` (``--store``, :mod:`sdsync.chat.stores`) the channel fetches the messages
it misses by their retrieval hints from store nodes: over their REST API, or as Waku store
peers over this run's own libp2p host, and catches up from them periodically (everything
on its content topic since the last time; at start, the time it was away). A Waku store
peer is asked once at start whether it speaks store v3: one that does not (go-waku serves
only the legacy store) is named in a one-line error, rather than asked in vain all run
long. Interactive, a
catch-up is a status line when it starts and ends; a scripted run reports how many
messages it fetched and how many catch-ups found. A :class:`PeerWatch` polls the
transport's connected peers: when they come back after all were lost (network down, the
machine asleep, the node restarted), what was published meanwhile reached us through
nobody and ours reached nobody, so the channel catches up and resends at once
(:meth:`~sdsync.runtime.ReliableChannel.back_online`) rather than at its next interval.
(py-libp2p has no connection events we could subscribe to from here;
a poll a second costs one hand-over to its thread.)
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rich.console import Console
from rich.markup import escape

from sdsync.chat.identity import Identity, load_identity, save_identity
from sdsync.chat.session import ChatSession
from sdsync.chat.stores import (
    StoreChoice,
    check_peer_address,
    open_stores,
    refuse_stores_without_v3,
    store_kind,
)
from sdsync.core import ChannelConfig
from sdsync.errors import OptionError, OutgoingBufferFullError
from sdsync.runtime import ReliableChannel, RuntimeConfig
from sdsync.waku.node import WakuClient
from sdsync.waku.relay.topics import TWN_CLUSTER_ID

if TYPE_CHECKING:
    from collections import Counter

    from sdsync.chat.identity import Identity
    from sdsync.waku.relay.topics import WakuRelayConfig

DEFAULT_LISTEN = "/ip4/127.0.0.1/tcp/0"
PEER_POLL_S = 1.0


class ChatTransport(WakuClient, Protocol):
    """What a chat asks of its transport: a Waku client (a relay node,
    :class:`~sdsync.transport.libp2p.Libp2pTransport`, or a light client,
    :class:`~sdsync.transport.waku_light.WakuLightTransport`) that starts, waits for its
    mesh and reports what it received and dropped."""

    @property
    def listen_addrs(self) -> list[str]: ...

    @property
    def received(self) -> int: ...

    @property
    def randomly_dropped(self) -> int: ...

    @property
    def rejected(self) -> Counter[str]: ...

    @property
    def publish_failures(self) -> int: ...

    async def start(self) -> None: ...

    async def wait_for_mesh(self, topic: str, count: int, timeout_s: float) -> bool: ...


class PeerWatch:
    """Tells the channel it is back online when the transport has peers again after it had
    some and then none (not at start: the channel catches up then anyway)."""

    def __init__(self, transport: WakuClient, channel: ReliableChannel) -> None:
        self.transport = transport
        self.channel = channel
        self._connected_once = False
        self._lost = False

    async def check(self) -> bool:
        """One look at the peers; True when it found them back and told the channel."""
        if not await self.transport.connected_peers():
            self._lost = self._connected_once
            return False
        back, self._lost, self._connected_once = self._lost, False, True
        if back:
            self.channel.back_online()
        return back

    async def run(self, poll_s: float = PEER_POLL_S) -> None:
        while True:
            await self.check()
            await asyncio.sleep(poll_s)


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """One run of the chat, as the flags of ``sdsync chat`` describe it."""

    channel: str = "0"
    name: str | None = None
    state_dir: Path | None = None
    listen: str | None = None
    peers: tuple[str, ...] = ()
    stores: tuple[str, ...] = ()  # http(s) URLs and multiaddrs, asked in this order
    light: bool = False
    services: tuple[str, ...] = ()  # of a light client, in order of preference
    drop_rate: float = 0.0
    seed: int | None = None
    sends: tuple[str, ...] = ()
    send_interval_ms: int = 0
    wait_converged_s: float | None = None
    quiet_ms: int | None = None
    min_peers: int = 0
    min_mesh: int = 1
    cluster_id: int = TWN_CLUSTER_ID
    shard: int | None = None  # None: autosharding of the content topic
    print_log: bool = False
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    config: ChannelConfig = field(default_factory=ChannelConfig)

    def __post_init__(self) -> None:
        for store in self.stores:
            store_kind(store)  # refused now, not when a message goes missing
        for service in self.services:
            check_peer_address("services", service)
        if self.light and not self.services:
            raise OptionError(
                "light",
                "needs at least one service (a multiaddr): a Waku service node "
                "(LightPush and Filter) to publish and receive through",
            )
        if self.services and not self.light:
            raise OptionError("services", "is for light chats")
        if self.light and self.peers:
            raise OptionError(
                "peers", "is for relay; a light chat reaches the others through its services"
            )
        wait_ms = None if self.wait_converged_s is None else self.wait_converged_s * 1000
        if self.quiet_ms is not None and wait_ms is not None and self.quiet_ms >= wait_ms:
            raise OptionError(
                "quiet_ms", "is as long as the wait for converged, which can then never hold"
            )
        if self.sends and not (self.peers or self.services) and self.wait_converged_s is None:
            raise OptionError(
                "sends",
                "has nobody to send to: name peers (services, if light), or wait for the "
                "group to converge, so that other chats can dial this one",
            )

    @property
    def store_peers(self) -> tuple[tuple[str, str], ...]:
        """The stores to ask, each with the option that named it: ``stores``, else a light
        chat's ``services``."""
        if self.stores:
            return tuple(("stores", store) for store in self.stores)
        return tuple(("services", service) for service in self.services)

    @property
    def scripted(self) -> bool:
        return bool(self.sends) or self.wait_converged_s is not None or self.print_log

    @property
    def quiet_s(self) -> float:
        """Default: three sync intervals, so every peer has synced meanwhile, but at most
        a third of the time to wait for converged, which must leave room for it."""
        if self.quiet_ms is not None:
            return self.quiet_ms / 1000
        quiet_s = 3 * self.runtime.sync_interval_ms / 1000
        return min(quiet_s, self.wait_converged_s / 3) if self.wait_converged_s else quiet_s


async def run_chat(options: ChatOptions, console: Console) -> int:
    """The whole chat; returns the exit code."""
    from sdsync.waku.relay.topics import WakuRelayConfig, default_content_topic

    identity = load_identity(options.state_dir, options.name)
    waku = WakuRelayConfig(cluster_id=options.cluster_id, shard=options.shard)
    transport = _transport(options, identity, waku)
    await transport.start()
    try:
        address = transport.listen_addrs[0]
        if options.state_dir is not None:
            bound = address.split("/p2p/")[0]
            save_identity(options.state_dir, Identity(identity.participant_id, identity.key, bound))
        console.print(f"listening on {address}", highlight=False, soft_wrap=True)
        console.print(
            f"you are {escape(identity.participant_id)} in channel {escape(options.channel)}",
            highlight=False,
            soft_wrap=True,
        )
        store_peers = options.store_peers
        stores = open_stores([s for _, s in store_peers], transport) if store_peers else None
        await refuse_stores_without_v3(store_peers, transport)
        channel = ReliableChannel(
            transport,
            options.channel,
            identity.participant_id,
            config=options.config,
            runtime=options.runtime,
            store=stores,
            rng=random.Random(options.seed),
            state_dir=options.state_dir,
        )
        content_topic = default_content_topic(channel.topic)
        how = f"light client of {len(options.services)} service(s)" if options.light else "relay"
        console.print(
            f"Waku {how}: content topic {content_topic} on {waku.pubsub_topic(content_topic)}",
            highlight=False,
            soft_wrap=True,
        )
        session = ChatSession(channel, console)
        if channel.state is not None:
            session.resume()
        if stores is not None and channel.channel.log.total == 0:
            # New to the channel: its history, as the page shows it (a channel counts as
            # caught up at its creation, which suits an application's new channel).
            channel.driver.restore_caught_up(None)
        await channel.start()
        background = [
            asyncio.create_task(session.pump(channel.events())),
            # Back from losing every peer: resend now, and catch up now (with a store).
            asyncio.create_task(PeerWatch(transport, channel).run()),
        ]
        try:
            if options.scripted:
                return await _script(session, transport, stores, options)
            await _interact(session, transport)
            return 0
        finally:
            for task in background:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await channel.close()
            if stores is not None:
                await stores.close()
    finally:
        await transport.close()


def _transport(options: ChatOptions, identity: Identity, waku: WakuRelayConfig) -> ChatTransport:
    from sdsync.transport.libp2p import Libp2pTransport
    from sdsync.transport.waku_light import WakuLightTransport, announced_shards

    listen = [options.listen or identity.listen or DEFAULT_LISTEN]
    topics = [f"/sds/1/{options.channel}"]
    if options.light:
        return WakuLightTransport(
            options.services,
            listen=listen,
            key=identity.key,
            waku=waku,
            topics=topics,
            drop_rate=options.drop_rate,
            seed=options.seed,
        )
    return Libp2pTransport(
        listen=listen,
        peers=options.peers,
        key=identity.key,
        drop_rate=options.drop_rate,
        seed=options.seed,
        waku=waku,
        # Named from the start: go-waku drops a peer of its cluster that names no shard,
        # and the store peers are asked before the channel joins its shard.
        announce_shards=announced_shards(waku, topics),
    )


async def _script(
    session: ChatSession,
    transport: ChatTransport,
    stores: StoreChoice | None,
    options: ChatOptions,
) -> int:
    topic = session.channel.topic
    patience = options.wait_converged_s if options.wait_converged_s is not None else 10.0
    # Only the neighbours we are connected to are in our mesh, however many participants
    # the group has: --min-peers (participants heard from) cannot be the number to wait for.
    if options.sends and not await transport.wait_for_mesh(topic, options.min_mesh, patience):
        neighbours = "service(s) with our subscription" if options.light else "peer(s) in"
        session.say(
            f"fewer than {options.min_mesh} {neighbours} the channel's mesh (--min-mesh) "
            f"after {patience:g} s; sending anyway",
            style="yellow",
        )
    for index, text in enumerate(options.sends):
        if index and options.send_interval_ms:
            await asyncio.sleep(options.send_interval_ms / 1000)
        await session.send(text)
    # Sent to nobody, and not staying to resend: that is no success.
    leaving = options.wait_converged_s is None
    code = 1 if options.sends and leaving and not await transport.mesh_peers(topic) else 0
    if code:
        session.say("nobody was in the channel's mesh: sent to nobody", style="red")
    if options.wait_converged_s is not None:
        converged = await session.wait_converged(
            options.wait_converged_s, options.quiet_s, options.min_peers
        )
        failed = session.failed()
        unmet = "; ".join(session.unmet(options.quiet_s, options.min_peers))
        session.say(
            "converged"
            if converged
            else f"not converged after {options.wait_converged_s:g} s: {unmet}",
            style="green" if converged else "red",
        )
        if converged:
            # Peers that are not there yet may still need our syncs and repairs.
            await asyncio.sleep(options.quiet_s)
        if failed:
            session.say(f"{len(failed)} message(s) failed", style="red")
        code = 0 if converged and not failed else 1
    session.say(
        f"frames received {transport.received}, dropped by --drop-rate "
        f"{transport.randomly_dropped}, rejected {sum(transport.rejected.values())}; "
        f"publications failed {transport.publish_failures}",
        style="dim",
    )
    if stores is not None:
        session.say(
            f"store: fetched {stores.fetched} message(s) in {stores.fetches} answer(s), "
            f"{stores.unavailable} time(s) unavailable; caught up {stores.catch_ups} "
            f"time(s), {session.channel.caught_up_messages} message(s) we did not have",
            style="dim",
        )
    if options.print_log:
        for line in session.log():
            sys.stdout.write(line.to_json() + "\n")
        sys.stdout.flush()
    return code


async def _interact(session: ChatSession, transport: ChatTransport) -> None:
    session.say("type a message and Enter to send; /log, /peers, /quit", style="dim")
    async for text in _stdin_lines():
        command = text.strip()
        if command == "/quit":
            return
        if command == "/log":
            for line in session.log():
                status = session.status.get(line.message_id, "")
                suffix = f" · {status}" if status else ""
                session.say(f"{escape(line.sender_id)}: {escape(line.text)}{suffix}")
            continue
        if command == "/peers":
            peers = await transport.mesh_peers(session.channel.topic)
            session.say(f"{len(peers)} peer(s) in the channel: {', '.join(peers) or '-'}")
            continue
        if command:
            try:
                await session.send(command)
            except OutgoingBufferFullError as exc:  # the user may wait and type it again
                session.say(f"[red]not sent:[/red] {escape(str(exc))}")


async def _stdin_lines() -> AsyncIterator[str]:
    """Lines typed on stdin, without blocking the event loop; ends at end of input.

    A daemon thread reads (stdin may be a file, a pipe or a terminal alike); it is left
    blocked in read() at exit, which ends with the process.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(queue.put_nowait, line.rstrip("\n"))
        loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=read, name="chat-stdin", daemon=True).start()
    while (line := await queue.get()) is not None:
        yield line
