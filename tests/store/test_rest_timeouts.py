"""The REST port under idle-connection attack (issue 27, row 26).

Half-sent requests and connections that never send a byte used to be held forever
(aiohttp's keep-alive timer defaults to 3,630 s): 600 of them held 600 descriptors.  The
node now closes every connection that has not sent a whole request head within
``HttpLimits.idle_timeout_s`` of opening it or of its last answer; meanwhile /health and
a query answer.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
from storetest import running

from sdsync.store import SqlArchive
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


def test_the_default_idle_timeout_is_nginx_client_header_timeout() -> None:
    assert HttpLimits().idle_timeout_s == 60.0


def test_half_sent_and_silent_connections_are_closed_while_health_answers(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with running(
            sqlite_archive, tmp_path, http=HttpLimits(idle_timeout_s=IDLE_S)
        ) as node:
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

    asyncio.run(scenario())
