"""Store Sync between three `sdsync store serve` processes on loopback, through a kill -9.

Each node is fed (through the authenticated POST) a different 80 % of the same 20,000
messages, all inside the sync window, before it knows any peer. Restarted with the other
two as peers, periodic rounds every second must make the three archives identical (hash
sets compared through the v3 API). One node is killed with SIGKILL as soon as it has
received sync frames — before the transfer that fills its gaps, in practice — and
restarted on the same archive; it must converge too.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import aiohttp
from storetest import TOKEN, make_messages

from sdsync.store import HttpStoreClient, StoredMessage, StoreQuery
from sdsync.waku.store.model import MAX_PAGE_SIZE

MINUTE = 60 * 10**9
TOTAL = 20_000
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GUARD_S = 300.0  # against hanging only; nothing asserts how long convergence takes
SERVE = [
    sys.executable,
    "-m",
    "sdsync.cli",
    "store",
    "serve",
    "--retention",
    "none",
    "--sync-interval",
    "1",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """One `sdsync store serve` process on a fixed port and data directory."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.data_dir = data_dir
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None

    def spawn(self, peers: list[str]) -> None:
        """Start serving (syncing every second with ``peers``); :meth:`ready` waits for it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = (self.data_dir / "stderr.log").open("a")
        self.process = subprocess.Popen(
            [
                *SERVE,
                "--data-dir",
                str(self.data_dir),
                "--listen",
                f"127.0.0.1:{self.port}",
                *(arg for peer in peers for arg in ("--peer", peer)),
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "SDSYNC_STORE_TOKEN": TOKEN},
        )

    def ready(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        line = self.process.stdout.readline()
        assert f"listening on {self.url}" in line, line + self.stderr()

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self._close_log()

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._close_log()
        return self.process.returncode

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def stderr(self) -> str:
        return (self.data_dir / "stderr.log").read_text()


def _start(nodes: list[Node], peers: list[list[str]]) -> None:
    for node, its_peers in zip(nodes, peers, strict=True):
        node.spawn(its_peers)
    for node in nodes:
        node.ready()


async def _feed(http: aiohttp.ClientSession, node: Node, messages: list[StoredMessage]) -> None:
    async with HttpStoreClient(node.url, token=TOKEN, session=http) as client:
        for start in range(0, len(messages), 4_000):
            batch = messages[start : start + 4_000]
            # Sync runs meanwhile, so some may be there already: stored + duplicates.
            assert (await client.post(batch))["received"] == len(batch)


async def _count(http: aiohttp.ClientSession, node: Node) -> int:
    async with http.get(f"{node.url}/admin/v1/info", headers=AUTH) as response:
        return int((await response.json())["messages"])


async def _metric(http: aiohttp.ClientSession, node: Node, name: str, label: str) -> float:
    async with http.get(f"{node.url}/metrics") as response:
        text = await response.text()
    match = re.search(rf"^sdsync_store_{name}_total{{{label}}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def _hashes(http: aiohttp.ClientSession, node: Node) -> set[bytes]:
    """Every hash the node serves, read page by page through the v3 API."""
    found: set[bytes] = set()
    async with HttpStoreClient(node.url, session=http) as client:
        async for page in client.pages(StoreQuery(pagination_limit=MAX_PAGE_SIZE)):
            found.update(page.hashes)
    return found


def test_three_serve_processes_converge_through_a_kill(tmp_path: Path) -> None:
    now = time.time_ns()
    messages = make_messages(TOTAL, seed=31, start=now - 50 * MINUTE, span=45 * MINUTE)
    everything = {m.message_hash for m in messages}
    nodes = [Node(tmp_path / f"node{i}", _free_port()) for i in range(3)]
    peers = [[other.url for other in nodes if other is not node] for node in nodes]
    victim = nodes[2]
    try:
        # Fed first, without peers: no sync yet, so that the kill below lands mid-sync.
        _start(nodes, [[], [], []])

        async def feed() -> None:
            async with aiohttp.ClientSession() as http:
                for i, node in enumerate(nodes):
                    # Node i lacks every fifth message starting at i: a different 20 % each.
                    await _feed(http, node, [m for k, m in enumerate(messages) if k % 5 != i])
                    assert await _count(http, node) == TOTAL * 4 // 5

        asyncio.run(feed())
        assert [node.stop() for node in nodes] == [0, 0, 0]
        _start(nodes, peers)

        async def catch_the_victim_syncing() -> int:
            async with aiohttp.ClientSession() as http:
                deadline = time.monotonic() + GUARD_S
                while await _metric(http, victim, "sync_bytes", 'direction="received"') == 0:
                    assert time.monotonic() < deadline, victim.stderr()
                    await asyncio.sleep(0.01)
                return await _count(http, victim)

        held_when_killed = asyncio.run(catch_the_victim_syncing())
        victim.kill()
        victim.spawn(peers[2])
        victim.ready()

        async def converge() -> None:
            async with aiohttp.ClientSession() as http:
                # Committed inserts survive SIGKILL (SQLite WAL).
                assert await _count(http, victim) >= held_when_killed
                deadline = time.monotonic() + GUARD_S
                while [await _count(http, n) for n in nodes] != [TOTAL] * 3:
                    assert time.monotonic() < deadline, "\n".join(n.stderr() for n in nodes)
                    await asyncio.sleep(0.2)
                for node in nodes:
                    assert await _hashes(http, node) == everything
                # Only sync could fill the survivors' gaps (the victim's counters restarted).
                for node in nodes[:2]:
                    assert await _metric(http, node, "ingested_messages", 'source="sync"') > 0

        asyncio.run(converge())
    finally:
        codes = [node.stop() for node in nodes]
    assert codes == [0, 0, 0]
