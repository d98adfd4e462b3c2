"""Libp2pTransport under a hostile peer's connections (issue 27, rows 1, 2, 3 and 6), on
loopback: each attack runs against a real host while an honest peer must still be served.

The honest peer dials from 127.0.0.1; the attacker comes from 127.0.0.2 (also this
machine, on Linux), a different IP as far as the host can tell, but for row 1, whose
churn is no attack on the per-IP limit: it dials from 127.0.0.1, exempted there.
``SDSYNC_SOAK=1`` opens and closes 2,000 connections instead of 300.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import threading
import time

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.tools.anyio_service import background_trio_service
from transporttest import run, until

from sdsync.testing.hostile import soak_scale
from sdsync.transport import Libp2pTransport
from sdsync.transport.libp2p import GossipParams
from sdsync.transport.settings import ConnectionLimits

ECHO = "/sdsync/test/echo/1"
ATTACKER_IP = "127.0.0.2"
#: An honest request is answered within this (a liveness bound, not a measurement).
HONEST_S = 20.0
CHURN = soak_scale(300, 2_000)
#: The attacker's connections in flight at once (each opened and closed in turn).
ATTACKERS = 16
TOPIC = "/sds/1/hostile"
#: A published message leaves the gossip cache within this: 5 one-second heartbeats,
#: with room for a loaded machine.
CACHE_BOUND_S = 20.0
LOOPBACK = frozenset({"127.0.0.1"})


async def serving(**options: object) -> tuple[Libp2pTransport, str]:
    """A light client's host answering ECHO; and its address."""
    server = Libp2pTransport(relay=False, **options)  # type: ignore[arg-type]

    async def echo(peer: str, request: bytes) -> bytes:
        return request

    await server.serve(ECHO, echo)
    await server.start()
    return server, server.listen_addrs[0]


async def served(address: str) -> bool:
    """Does an honest peer, dialling afresh, get its request answered in time?"""
    honest = Libp2pTransport(relay=False)
    await honest.start()
    try:
        return await honest.request(address, ECHO, b"honest", timeout_s=HONEST_S) == b"honest"
    except (ConnectionError, TimeoutError):
        return False
    finally:
        await honest.close()


class Attacker:
    """Connection attempts by fresh identities, ``ATTACKERS`` at once, from a trio loop
    in a thread of its own; each dials, then closes at once, or once :meth:`release`
    is called (``hold``)."""

    def __init__(self, address: str, *, hold: bool = False) -> None:
        self.info = info_from_p2p_addr(multiaddr.Multiaddr(address))
        self.hold = hold
        self.released = threading.Event()
        self.connected = 0
        self.failed = 0

    def run(self, count: int) -> None:
        trio.run(self._main, count)

    def release(self) -> None:
        self.released.set()

    async def _main(self, count: int) -> None:
        left = [count]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                try:
                    await self._one()
                except Exception:
                    self.failed += 1

        async with trio.open_nursery() as nursery:
            for _ in range(ATTACKERS):
                nursery.start_soon(worker)

    async def _one(self) -> None:
        host = new_host(key_pair=create_new_key_pair(os.urandom(32)))
        network = host.get_network()
        host.get_peerstore().add_addrs(self.info.peer_id, self.info.addrs, 600)
        async with background_trio_service(network):
            with trio.fail_after(10):
                await network.dial_peer(self.info.peer_id)
            self.connected += 1
            while self.hold and not self.released.is_set():
                await trio.sleep(0.05)
            await network.close_peer(self.info.peer_id)


def test_connections_opened_and_closed_free_their_slots() -> None:
    """Row 1: py-libp2p freed an inbound slot only when the swarm ended: after 250
    connections in the host's life every dial was refused."""

    async def scenario() -> None:
        server, address = await serving(limits=ConnectionLimits(exempt_ips=LOOPBACK))
        try:
            attacker = Attacker(address)
            started = time.monotonic()
            await asyncio.to_thread(attacker.run, CHURN)
            elapsed = time.monotonic() - started
            print(f"{CHURN} connections, {attacker.failed} failed, in {elapsed:.1f} s")
            assert attacker.connected >= CHURN * 0.95, (attacker.connected, attacker.failed)
            assert await served(address)
        finally:
            await server.close()

    run(scenario)


def test_sockets_that_never_handshake_are_bounded_per_ip_and_cut() -> None:
    """Row 3: 260 TCP sockets from one IP that never start a handshake held every slot;
    now one IP holds ``pending_per_ip`` of them, each closed at the handshake deadline,
    and the rest are closed at once, by the per-IP connection or handshake bound."""

    async def scenario() -> None:
        limits = ConnectionLimits(handshake_timeout_s=3.0)
        server, address = await serving(limits=limits)
        port = int(address.split("/")[4])
        sockets = []
        try:
            for _ in range(260):
                sock = socket.socket()
                sock.bind((ATTACKER_IP, 0))
                sock.connect(("127.0.0.1", port))
                sockets.append(sock)
            refused = server.connections_refused
            held = limits.pending_per_ip
            closed_at_once = ("per-IP limit", "pending handshakes per IP")
            await until(lambda: sum(refused[r] for r in closed_at_once) >= 260 - held)
            assert await served(address)  # while all 260 are held open
            await until(lambda: refused["handshake timeout"] >= held)
            assert sum(refused[r] for r in closed_at_once) == 260 - held
        finally:
            for sock in sockets:
                sock.close()
            await server.close()

    run(scenario)


def test_one_ip_holds_at_most_its_share_of_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row 2: connections held from one IP with fresh identities crowded out honest
    peers; now one IP holds at most ``per_ip`` (nwaku's colocation limit), counted."""

    async def scenario() -> None:
        server, address = await serving()
        per_ip = server.limits.per_ip
        attempts = 40
        attacker = Attacker(address, hold=True)
        # Every dial leaves from ATTACKER_IP while the attack runs (the honest peer's after).
        monkeypatch.setattr(
            trio,
            "open_tcp_stream",
            functools.partial(trio.open_tcp_stream, local_address=ATTACKER_IP),
        )
        attack = asyncio.ensure_future(asyncio.to_thread(attacker.run, attempts))
        try:
            await until(lambda: attacker.connected + attacker.failed == attempts)
            monkeypatch.undo()
            assert attacker.connected == per_ip
            assert server.connections_refused["per-IP limit"] >= attempts - per_ip
            assert len(await server.connected_peers()) == per_ip
            assert await served(address)  # while the attacker holds its connections
        finally:
            monkeypatch.undo()
            attacker.release()
            await attack
            await server.close()

    run(scenario)


def test_message_cache_empties_without_mesh_peers() -> None:
    """Row 6: py-libp2p's adaptive gossip rated a node without mesh peers unhealthy and
    slowed its heartbeat to 30-60 s, so its message cache (5 heartbeats) held every
    message for minutes. With adaptive gossip off it holds them ~5 heartbeats."""

    async def scenario() -> None:
        node = Libp2pTransport()
        node.subscribe(TOPIC)
        await node.start()
        router = node._relaying("test").router
        try:

            async def judge_health_now() -> None:
                router.last_health_update = 0  # its health is judged every 30 s otherwise

            await node._call(judge_health_now)
            await asyncio.sleep(3 * node.gossip.heartbeat_interval_s)
            for n in range(20):
                await node.publish(TOPIC, b"unheard %d" % n)
            await until(lambda: len(router.mcache.msgs) == 20)
            started = time.monotonic()
            while router.mcache.msgs:
                assert time.monotonic() - started < CACHE_BOUND_S, router.heartbeat_interval
                await asyncio.sleep(0.1)
        finally:
            await node.close()

    run(scenario)


def test_message_cache_is_bounded_in_bytes_oldest_first() -> None:
    """Row 6 in bytes: heartbeats bound how long the gossip cache holds a message, not
    how many bytes a flood puts in it meanwhile. 4 MB published into a 1 MiB cache (with
    a heartbeat too slow to shift anything out) leaves it within 1 MiB, the oldest
    evicted and counted, the newest still answerable and announced."""
    budget = 2**20
    flood = 40

    async def scenario() -> None:
        node = Libp2pTransport(
            gossip=GossipParams(heartbeat_interval_s=600, message_cache_bytes=budget)
        )
        node.subscribe(TOPIC)
        await node.start()
        router = node._relaying("test").router
        try:
            for n in range(flood):
                await node.publish(TOPIC, b"flood %03d " % n + bytes(100_000))
            await until(lambda: node.mcache_evicted + len(router.mcache.msgs) == flood)
            cache = router.mcache
            assert 0 < cache.bytes <= budget
            assert sum(m.ByteSize() for m in cache.msgs.values()) == cache.bytes
            kept = len(cache.msgs)
            assert node.mcache_evicted == flood - kept >= flood - 11
            newest = [b"flood %03d " % n for n in range(flood - kept, flood)]
            assert [m.data[m.data.index(b"flood") :][:10] for m in cache.msgs.values()] == newest
            pubsub_topic = node.waku.pubsub_topic(node.content_topic(TOPIC))
            assert cache.window(pubsub_topic) == list(cache.msgs)
        finally:
            await node.close()

    run(scenario)
