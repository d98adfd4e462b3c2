"""The libp2p host's counters on a real store node's ``/metrics`` (issue 27): a refused
connection, a handshake that timed out, a timed-out stream and a rejected request are
each seen there, read from the host at scrape time."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from storetest import running
from testdeps import require

from sdsync.errors import RemoteProtocolError
from sdsync.store import SqlArchive, StoreNode

libp2p = require("sdsync.transport.libp2p", "needs the 'p2p' extra")
patches = require("sdsync.transport.libp2p_patches", "needs the 'p2p' extra")

ATTACKER_IP = "127.0.0.2"  # local on Linux; not 127.0.0.1, the honest client's
SLOW = "/sdsync-test/slow/1"
HANDSHAKE_S = 1.0
PATIENCE_S = 30.0  # a liveness bound


async def scrape(node: StoreNode) -> dict[tuple[str, str], float]:
    """``/metrics`` of ``node`` over HTTP: (sample name, its one label's value) -> value."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{node.url}/metrics") as response,
    ):
        assert response.status == 200
        text = await response.text()
    return {
        (sample.name, next(iter(sample.labels.values()), "")): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("sdsync_store_libp2p_")
        for sample in family.samples
    }


async def until_scraped(node: StoreNode, name: str, label: str, value: float) -> None:
    async with asyncio.timeout(PATIENCE_S):
        while (await scrape(node)).get((name, label)) != value:
            await asyncio.sleep(0.1)


def raw_connection(port: int, ip: str = ATTACKER_IP) -> socket.socket:
    """A TCP connection from ``ip`` that never handshakes."""
    sock = socket.socket()
    sock.bind((ip, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def test_refused_connections_and_timed_out_streams_show_on_metrics(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    limits = patches.ConnectionLimits(per_ip=1, handshake_timeout_s=HANDSHAKE_S)

    async def slow(peer: str, request: bytes) -> bytes:
        await asyncio.sleep(PATIENCE_S)
        return request

    async def echo(peer: str, request: bytes) -> bytes:
        return request

    async def scenario() -> None:
        async with (
            libp2p.Libp2pTransport(limits=limits) as host,
            running(sqlite_archive, tmp_path, waku=host) as node,
            libp2p.Libp2pTransport() as client,
        ):
            await host.serve(SLOW, slow, timeout_s=0.5, max_request_bytes=16)
            before = await scrape(node)
            assert ("sdsync_store_libp2p_stream_timeouts_total", SLOW) not in before

            address = host.listen_addrs[0]  # /ip4/127.0.0.1/tcp/PORT/p2p/ID
            with pytest.raises((ConnectionError, RemoteProtocolError, TimeoutError)):
                await client.request(address, SLOW, b"hello", timeout_s=PATIENCE_S)
            with pytest.raises((ConnectionError, RemoteProtocolError, TimeoutError)):
                await client.request(address, SLOW, b"x" * 100, timeout_s=PATIENCE_S)
            await until_scraped(node, "sdsync_store_libp2p_stream_timeouts_total", SLOW, 1)
            await until_scraped(node, "sdsync_store_libp2p_rejected_total", "oversized", 1)

            port = int(address.split("/")[4])
            held = raw_connection(port)  # its IP's one connection, until its deadline
            refused = raw_connection(port)
            try:
                name = "sdsync_store_libp2p_connections_refused_total"
                await until_scraped(node, name, "per-IP limit", 1)
                await until_scraped(node, name, "handshake timeout", 1)
            finally:
                held.close()
                refused.close()
            # The honest peer, from its own address, was served throughout.
            await host.serve("/sdsync-test/echo/1", echo)
            assert await client.request(address, "/sdsync-test/echo/1", b"ok") == b"ok"

    asyncio.run(scenario())
