"""The REST port under connection attacks (issue 27, row 26, and its leftovers).

Half-sent requests and connections that never send a byte used to be held forever
(aiohttp's keep-alive timer defaults to 3,630 s): 600 of them held 600 descriptors.  The
node now closes every connection that has not sent a whole request head within
``HttpLimits.idle_timeout_s`` of opening it or of its last answer, and counts it;
meanwhile /health and a query answer.

One address could also open as many connections as the node had descriptors: now the
connections past ``HttpLimits.max_connections_per_ip`` are closed as soon as they open,
and counted, loopback included; another address is served meanwhile, and the attacker's
once it lets go.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
from storetest import running

from sdsync.store import SqlArchive, StoreNode
from sdsync.store.server import HttpLimits

IDLE_S = 1.0  # the test's timeout, small so the test is short
PATIENCE_S = 30.0  # a liveness bound: how long past IDLE_S a close may take
HALF_SENT = 200
SILENT = 50


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection (reads until EOF or a reset)."""
    try:
        while await reader.read(4096):
            pass
    except ConnectionError:
        pass
    return True


def closes(node: StoreNode, reason: str) -> float:
    value = node.metrics.registry.get_sample_value(
        "sdsync_store_http_connections_closed_total", {"reason": reason}
    )
    return value or 0.0


def test_the_default_idle_timeout_is_nginx_client_header_timeout() -> None:
    assert HttpLimits().idle_timeout_s == 60.0


def test_half_sent_and_silent_connections_are_closed_while_health_answers(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def scenario() -> None:
        # No per-IP cap here: every attacker shares the test's address.
        http = HttpLimits(idle_timeout_s=IDLE_S, max_connections_per_ip=0)
        async with running(sqlite_archive, tmp_path, http=http) as node:
            host, port = "127.0.0.1", node.port
            held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
            for i in range(HALF_SENT + SILENT):
                reader, writer = await asyncio.open_connection(host, port)
                if i < HALF_SENT:  # a request line and one header, never the blank line
                    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
                    await writer.drain()
                held.append((reader, writer))
            started = time.monotonic()
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{node.url}/health") as response:
                    assert response.status == 200
                async with session.get(
                    f"{node.url}/store/v3/messages", params={"pubsubTopic": "/waku/2/rs/1/0"}
                ) as response:
                    assert response.status == 200
            async with asyncio.timeout(IDLE_S + PATIENCE_S):
                assert all(await asyncio.gather(*(closed(r) for r, _ in held)))
            # Not before the timeout: an honest slow client gets the whole of it.
            assert time.monotonic() - started >= IDLE_S * 0.5
            assert closes(node, "idle_timeout") == HALF_SENT + SILENT
            for _, writer in held:
                writer.close()

    asyncio.run(scenario())


def test_an_idle_keep_alive_connection_is_closed_after_its_answer(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with running(
            sqlite_archive, tmp_path, http=HttpLimits(idle_timeout_s=IDLE_S)
        ) as node:
            reader, writer = await asyncio.open_connection("127.0.0.1", node.port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            async with asyncio.timeout(IDLE_S + PATIENCE_S):
                assert await closed(reader)
            writer.close()
            assert closes(node, "idle_timeout") == 1

    asyncio.run(scenario())


CAP = HttpLimits().max_connections_per_ip
EXTRA = 20
HONEST_IP = "127.0.0.2"  # local on Linux: another address than the attacker's 127.0.0.1
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def served(connection: Connection) -> bool:
    """Whether ``connection`` answers GET /health (False: the server closed it)."""
    reader, writer = connection
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        return (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    except (ConnectionError, asyncio.IncompleteReadError):
        return False


async def health_from(url: str, local_ip: str) -> bool:
    """GET /health on a fresh connection from ``local_ip``: whether it answered 200."""
    connector = aiohttp.TCPConnector(local_addr=(local_ip, 0), force_close=True)
    try:
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.get(f"{url}/health") as response,
        ):
            return response.status == 200
    except aiohttp.ClientConnectionError:
        return False


def test_the_default_cap_is_64_connections_per_ip_loopback_included() -> None:
    assert CAP == 64
    assert HttpLimits().exempt_ips == frozenset()


def test_connections_past_the_per_ip_cap_are_closed_at_once_and_counted(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def scenario() -> None:
        # The idle timeout (60 s) is longer than PATIENCE_S: a close seen here is the cap's.
        async with running(sqlite_archive, tmp_path) as node:
            attack = [
                await asyncio.open_connection("127.0.0.1", node.port) for _ in range(CAP + EXTRA)
            ]
            started = time.monotonic()
            assert await health_from(node.url, HONEST_IP)  # another address: served
            honest_s = time.monotonic() - started
            async with asyncio.timeout(PATIENCE_S):
                answered = await asyncio.gather(*(served(c) for c in attack))
            assert sum(answered) == CAP  # the first CAP still served, the rest closed
            assert closes(node, "per_ip_limit") == EXTRA
            assert closes(node, "idle_timeout") == 0
            assert not await health_from(node.url, "127.0.0.1")  # still at its cap
            for _, writer in attack:
                writer.close()
            async with asyncio.timeout(PATIENCE_S):  # its slots come back as they close
                while not await health_from(node.url, "127.0.0.1"):
                    await asyncio.sleep(0.05)
            assert honest_s < PATIENCE_S

    asyncio.run(scenario())


def test_an_exempt_address_is_not_capped(sqlite_archive: SqlArchive, tmp_path: Path) -> None:
    async def scenario() -> None:
        http = HttpLimits(max_connections_per_ip=2, exempt_ips=frozenset({"127.0.0.1"}))
        async with running(sqlite_archive, tmp_path, http=http) as node:
            held = [await asyncio.open_connection("127.0.0.1", node.port) for _ in range(5)]
            async with asyncio.timeout(PATIENCE_S):
                assert all(await asyncio.gather(*(served(c) for c in held)))
            assert closes(node, "per_ip_limit") == 0
            for _, writer in held:
                writer.close()

    asyncio.run(scenario())
