"""The node gives the memory a load freed back to the system (sdsync.store.memory).

When to give back is checked against a scripted allocator; that giving back returns
memory, against this process's own malloc (glibc; skipped elsewhere) and SQLite; the
node's periodic check, on an in-process node's ``/metrics``. The attacks it answers, on a
real node: tests/store/test_hostile_node.py.
"""

from __future__ import annotations

import asyncio
import ctypes
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import pytest
from storetest import running

from sdsync.store import SqlArchive, StoredMessage
from sdsync.store.memory import (
    Glibc,
    MemoryReturn,
    UnsupportedAllocatorError,
    allocator,
    resident_bytes,
)
from sdsync.wire import WakuMessage

_MB = 2**20


class Scripted:
    """An allocator whose bytes in use the test sets, and a process RSS beside it."""

    def __init__(self) -> None:
        self.used = 100 * _MB
        self.rss = 200 * _MB
        self.trims = 0
        self.freed_on_trim = 0

    def in_use(self) -> int:
        return self.used

    def trim(self) -> None:
        self.trims += 1
        self.rss -= self.freed_on_trim


def test_memory_is_given_back_as_a_load_grows_once_it_ends_and_once_settled() -> None:
    malloc, caches, counted, now = Scripted(), [0], [], [0.0]

    def release() -> None:
        caches[0] += 1
        malloc.used -= 20 * _MB

    memory = MemoryReturn(
        malloc,
        release,
        slack_bytes=32 * _MB,
        settle_s=15.0,
        rss=lambda: malloc.rss,
        clock=lambda: now[0],
        counted=counted.append,
    )
    malloc.rss += 31 * _MB
    assert memory.check() is None  # grew, but by less than the slack
    malloc.rss += 2 * _MB
    malloc.used += 200 * _MB
    malloc.freed_on_trim = 5 * _MB
    assert memory.check() == 5 * _MB  # a load is growing it: trimmed, caches kept
    assert (malloc.trims, caches[0]) == (1, 0)
    malloc.used -= 31 * _MB
    now[0] = 10.0
    assert memory.check() is None  # freed less than the slack since its high
    malloc.used -= 2 * _MB
    malloc.freed_on_trim = 150 * _MB
    assert memory.check() == 150 * _MB  # the load ended: caches emptied, then trimmed
    assert (malloc.trims, caches[0]) == (2, 1)
    now[0] = 24.0
    assert memory.check() is None  # nothing moved, not settled yet
    now[0] = 25.0
    malloc.freed_on_trim = 1 * _MB
    assert memory.check() == 1 * _MB  # settled: once more, caches too
    assert (malloc.trims, caches[0]) == (3, 2)
    now[0] = 100.0
    assert memory.check() is None  # and no more
    assert counted == [5 * _MB, 150 * _MB, 1 * _MB]


def glibc_or_skip() -> Glibc:
    try:
        return allocator()
    except UnsupportedAllocatorError as exc:
        pytest.skip(str(exc))


BLOCK = 64 * 1024  # under malloc's mmap threshold: from an arena


def fragment(total: int) -> Callable[[], list[bytes]]:
    """``total`` bytes in blocks allocated by a thread of their own; returns the freeing
    of all but every sixteenth block (returned), so that what is freed lies between live
    blocks, where malloc does not give it back by itself."""
    blocks: list[bytes] = []
    worker = threading.Thread(
        target=lambda: blocks.extend(b"\1" * BLOCK for _ in range(total // BLOCK))
    )
    worker.start()
    worker.join()

    def free() -> list[bytes]:
        kept = blocks[::16]
        blocks.clear()
        return kept

    return free


def test_freed_memory_held_by_malloc_goes_back_to_the_system() -> None:
    glibc = glibc_or_skip()
    free = fragment(96 * _MB)
    memory = MemoryReturn(glibc, lambda: None)
    before = resident_bytes()
    kept = free()
    assert resident_bytes() > before - 16 * _MB  # freed, but still the process's
    returned = memory.check()
    assert returned is not None and returned >= 64 * _MB, returned
    assert resident_bytes() < before - 64 * _MB
    assert len(kept) == 96 * _MB // BLOCK // 16


def sqlite_memory_used() -> Callable[[], int]:
    """SQLite's own count of the bytes it holds, read from the library the sqlite3 module
    loaded (a shared one; skipped if it is built in)."""
    sqlite3.connect(":memory:").close()
    maps = Path("/proc/self/maps").read_text().split()
    loaded = [path for path in maps if "/libsqlite3.so" in path]
    if not loaded:
        pytest.skip("SQLite is not a shared library here")
    library = ctypes.CDLL(loaded[0])
    library.sqlite3_memory_used.restype = ctypes.c_int64
    return lambda: int(library.sqlite3_memory_used())


def test_release_memory_empties_every_connections_page_cache(sqlite_archive: SqlArchive) -> None:
    used = sqlite_memory_used()
    rng = random.Random(7)
    now = time.time_ns()
    sqlite_archive.insert(
        StoredMessage.of("/waku/2/rs/1/0", WakuMessage(rng.randbytes(4_000), "/a/1/b/p", now - i))
        for i in range(2_000)
    )
    before = used()
    # Each thread reads every message through its own connection, which caches them.
    with ThreadPoolExecutor(3) as threads:
        read = list(threads.map(lambda _: sum(1 for _ in sqlite_archive.messages()), range(3)))
    assert read == [2_000] * 3
    cached = used() - before
    assert cached > 3 * 6 * _MB  # three copies of the 8 MB archive, about
    sqlite_archive.release_memory()
    assert used() < before + cached / 10
    assert sum(1 for _ in sqlite_archive.messages()) == 2_000


def test_a_node_gives_back_what_a_load_freed_and_counts_it(
    sqlite_archive: SqlArchive, tmp_path: Path
) -> None:
    glibc_or_skip()

    async def metric(url: str, name: str) -> float:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
            lines = (await response.text()).splitlines()
        return next(float(line.split()[-1]) for line in lines if line.startswith(name + " "))

    async def scenario() -> None:
        async with running(sqlite_archive, tmp_path, memory_check_s=0.05) as node:
            free = fragment(96 * _MB)
            kept = free()
            async with asyncio.timeout(30):
                while await metric(node.url, "sdsync_store_memory_returned_bytes_total") < 64 * _MB:
                    await asyncio.sleep(0.05)
            assert await metric(node.url, "sdsync_store_memory_returns_total") >= 1
            assert len(kept) == 96 * _MB // BLOCK // 16

    asyncio.run(scenario())
