"""Store Sync: two archives that differ in 1 %, synced over HTTP; and window snapshot loads.

**Sync.** Two SQLite archives share ``--messages`` messages (default 100,000, one hour)
except ``--differ`` of them (default 1 %), half missing on each side. The responder is
``sdsync store serve`` in its own process; the initiator runs in this one
(:func:`sdsync.store.sync.sync_with_peer`, what ``sdsync store sync`` runs), on fresh copies
of both archives for every method (RBSR, Prolly, RIBLT, and RIBLT again with both sides'
symbol caches filled by a round and a snapshot before, as a node's periodic rounds leave
them). The anchor, in the same run, is
what a store can do without Store Sync: list the peer's hashes over the v3 REST API (100
per page), diff locally, fetch what is missing by hash (50 per request) and post what the
peer lacks (with its token). Bytes are HTTP bodies both ways, counted by an aiohttp trace
for every method alike; round trips are sequential HTTP requests; time is the whole
round, snapshots, reconciliation and transfer included. Every run is checked: both
windows end identical.

**Snapshot load.** For each backend, an archive of ``--load-items`` messages (default 1M,
one hour) is loaded into a ``MemoryItemStore`` in bulk (``Archive.item_arrays``, then
``MemoryItemStore.from_arrays``) and, as the anchor, row by row (``Archive.items`` into
``MemoryItemStore(items)``). PostgreSQL is a throwaway local cluster.

    .venv/bin/python bench/store_sync.py
    .venv/bin/python bench/store_sync.py --messages 20000 --load-items 100000 --backends sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from sdsync.reconcile import METHODS, MemoryItemStore
from sdsync.store import HttpStoreClient, SqlArchive, StoredMessage, StoreQuery, open_archive
from sdsync.store.sync import ArchiveKeeper, sync_with_peer
from sdsync.store.sync.snapshot import snapshot
from sdsync.testing.pgcluster import TempCluster, free_port, start_cluster
from sdsync.waku.store.model import MAX_PAGE_SIZE
from sdsync.wire.waku import WakuMessage

PUBSUB = "/waku/2/rs/1/0"
TOPICS = [f"/app/1/topic-{i}/proto" for i in range(50)]
HOUR_NS = 3_600 * 10**9
# A responder serves only windows of its recent past (its sync policy): the hour synced
# ends two hours ago, and the responder's --sync-window reaches back a day, so the window
# stays acceptable however long the bench runs.
T0 = (time.time_ns() // HOUR_NS - 3) * HOUR_NS
WINDOW = (T0, T0 + HOUR_NS)
RESPONDER_SYNC_WINDOW_S = 86_400
TOKEN = "bench-token"
BATCH = 10_000
POST_CHUNK = 1_000
WARM = "riblt, warm"
"""RIBLT again, with both sides' symbol caches filled by earlier rounds."""


def generate(n: int, seed: int, payload: tuple[int, int] = (100, 300)) -> list[StoredMessage]:
    rng = random.Random(seed)
    return [
        StoredMessage.of(
            PUBSUB,
            WakuMessage(
                payload=rng.randbytes(rng.randrange(*payload)),
                content_topic=TOPICS[rng.randrange(len(TOPICS))],
                timestamp=T0 + rng.randrange(HOUR_NS),
            ),
        )
        for _ in range(n)
    ]


def fill(url: str, messages: list[StoredMessage]) -> None:
    archive = open_archive(url)
    ordered = sorted(messages, key=lambda m: m.timestamp)  # arrival order
    for start in range(0, len(ordered), BATCH):
        archive.insert(ordered[start : start + BATCH])
    archive.close()


def window_hashes(url: str) -> set[bytes]:
    archive = open_archive(url)
    try:
        return {h for _, h in archive.items(*WINDOW)}
    finally:
        archive.close()


# -- sync over HTTP


@dataclass
class Run:
    method: str
    bytes_out: int = 0
    bytes_in: int = 0
    requests: int = 0
    seconds: float = 0.0
    moved: int = 0
    exact: bool = False

    @property
    def total(self) -> int:
        return self.bytes_out + self.bytes_in


def counting_session(run: Run) -> aiohttp.ClientSession:
    """A client session that adds every request and response body to ``run``."""
    trace = aiohttp.TraceConfig()

    async def sent(_: Any, __: SimpleNamespace, params: Any) -> None:
        run.bytes_out += len(params.chunk)

    async def received(_: Any, __: SimpleNamespace, params: Any) -> None:
        run.bytes_in += len(params.chunk)

    async def ended(_: Any, __: SimpleNamespace, ___: Any) -> None:
        run.requests += 1

    trace.on_request_chunk_sent.append(sent)
    trace.on_response_chunk_received.append(received)
    trace.on_request_end.append(ended)
    return aiohttp.ClientSession(trace_configs=[trace], timeout=aiohttp.ClientTimeout(total=600))


@contextmanager
def responder(db: str, data_dir: Path) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sdsync.cli", "store", "serve", "--db", db, "--token", TOKEN,
         "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}", "--retention", "none",
         "--sync-window", str(RESPONDER_SYNC_WINDOW_S)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"store did not start: {line!r}")
        yield line.split()[4]
    finally:
        process.terminate()
        process.wait(timeout=60)


async def store_sync(run: Run, ours: str, peer: str, twin: str | None = None) -> None:
    """One round; with ``twin`` (a copy of the peer's archive), after a round between the
    twin and the peer and a snapshot of ours, which fill both sides' RIBLT symbol caches
    as a node's earlier rounds would."""
    archive = open_archive(ours)
    host = ArchiveKeeper(archive)
    try:
        if twin is not None:
            await prime(host, peer, twin)
        async with counting_session(run) as http:
            started = time.perf_counter()
            report = await sync_with_peer(
                host,
                peer,
                WINDOW,
                method=next(m for m in METHODS if run.method.startswith(m)),
                session=http,
            )
            run.seconds = time.perf_counter() - started
        run.moved = report.sent + report.received
    finally:
        archive.close()


async def prime(host: ArchiveKeeper, peer: str, twin: str) -> None:
    archive = open_archive(twin)
    try:
        report = await sync_with_peer(ArchiveKeeper(archive), peer, WINDOW, method="riblt")
    finally:
        archive.close()
    assert report.have == report.need == 0
    await snapshot(host, WINDOW, "riblt")


async def v3_sync(run: Run, ours: str, peer: str) -> None:
    """The anchor: list the peer's window, diff here, fetch and post the differences."""
    archive = open_archive(ours)
    try:
        async with counting_session(run) as http:
            started = time.perf_counter()
            client = HttpStoreClient(peer, token=TOKEN, session=http)
            theirs: set[bytes] = set()
            query = StoreQuery(
                time_start=WINDOW[0], time_end=WINDOW[1] - 1, pagination_limit=MAX_PAGE_SIZE
            )
            async for page in client.pages(query):
                theirs.update(page.hashes)
            mine = {h for _, h in await asyncio.to_thread(lambda: list(archive.items(*WINDOW)))}
            fetched = await client.get(sorted(theirs - mine))
            await asyncio.to_thread(archive.insert, fetched)
            lacking = await asyncio.to_thread(archive.get, sorted(mine - theirs))
            for start in range(0, len(lacking), POST_CHUNK):
                await client.post(lacking[start : start + POST_CHUNK])
            run.seconds = time.perf_counter() - started
        run.moved = len(fetched) + len(lacking)
    finally:
        archive.close()


def sync_runs(args: argparse.Namespace, work: Path) -> list[Run]:
    n, d = args.messages, round(args.messages * args.differ)
    print(f"generating {n:,} messages, {d:,} differences…", flush=True)
    messages = generate(n, args.seed)
    only_a, only_b = set(messages[: d // 2]), set(messages[d // 2 : d])
    base_a, base_b = str(work / "base-a.sqlite3"), str(work / "base-b.sqlite3")
    fill(base_a, [m for m in messages if m not in only_b])
    fill(base_b, [m for m in messages if m not in only_a])
    union = {m.message_hash for m in messages}
    runs = []
    for k, method in enumerate(["v3 (anchor)", *METHODS, WARM]):
        run = Run(method)
        ours, theirs = str(work / f"{k}-a.sqlite3"), str(work / f"{k}-b.sqlite3")
        shutil.copy(base_a, ours)
        shutil.copy(base_b, theirs)
        print(f"[{method}] syncing…", flush=True)
        with responder(theirs, work / f"{k}-state") as peer:
            if method.startswith("v3"):
                asyncio.run(v3_sync(run, ours, peer))
            else:
                twin = shutil.copy(base_b, work / f"{k}-twin.sqlite3") if method == WARM else None
                asyncio.run(store_sync(run, ours, peer, None if twin is None else str(twin)))
        run.exact = run.moved == d and window_hashes(ours) == window_hashes(theirs) == union
        runs.append(run)
    return runs


# -- snapshot loads


def bulk_load(archive: SqlArchive) -> MemoryItemStore:
    return MemoryItemStore.from_arrays(*archive.item_arrays(*WINDOW))


def timed(load: Callable[[], MemoryItemStore]) -> tuple[float, MemoryItemStore]:
    started = time.perf_counter()
    store = load()
    return time.perf_counter() - started, store


def first(pair: tuple[float, MemoryItemStore]) -> float:
    return pair[0]


def load_times(url: str, n: int, seed: int) -> tuple[float, float]:
    fill(url, generate(n, seed, payload=(20, 60)))
    archive = open_archive(url)
    try:
        # Best of two, each way: the first read of a fresh archive also warms the cache.
        bulk_s, bulk = min((timed(lambda: bulk_load(archive)) for _ in range(2)), key=first)
        rows_s, rows = min(
            (timed(lambda: MemoryItemStore(archive.items(*WINDOW))) for _ in range(2)), key=first
        )
    finally:
        archive.close()
    assert len(bulk) == len(rows) == n and bulk.summary(0, n) == rows.summary(0, n)
    return bulk_s, rows_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--differ", type=float, default=0.01, help="share of messages")
    parser.add_argument("--load-items", type=int, default=1_000_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # still run the finally blocks

    loads: dict[str, tuple[float, float]] = {}
    cluster: TempCluster | None = None
    with tempfile.TemporaryDirectory(prefix="sdsync-bench-") as tmp:
        work = Path(tmp)
        try:
            runs = sync_runs(args, work) if args.messages else []
            for backend in args.backends.split(",") if args.load_items else []:
                print(f"[load {backend}] {args.load_items:,} items…", flush=True)
                if backend == "sqlite":
                    url = str(work / "load.sqlite3")
                else:
                    cluster = cluster or start_cluster()
                    url = cluster.create_database("load")
                loads[backend] = load_times(url, args.load_items, args.seed)
        finally:
            if cluster is not None:
                cluster.stop()
    report(runs, loads, args)


def report(runs: list[Run], loads: dict[str, tuple[float, float]], args: Any) -> None:
    if runs:
        d = round(args.messages * args.differ)
        print(f"\nsync over HTTP: {args.messages:,} messages, {d:,} differences (half each side)")
        anchor = runs[0]
        print(
            f"{'method':<12}{'bytes out':>12}{'bytes in':>12}{'total':>12}{'×v3':>7}"
            f"{'requests':>10}{'×v3':>7}{'time s':>8}{'×v3':>7}  exact"
        )
        for r in runs:
            print(
                f"{r.method:<12}{r.bytes_out:>12,}{r.bytes_in:>12,}{r.total:>12,}"
                f"{r.total / anchor.total:>7.3f}{r.requests:>10,}"
                f"{r.requests / anchor.requests:>7.3f}{r.seconds:>8.2f}"
                f"{r.seconds / anchor.seconds:>7.3f}  {'yes' if r.exact else 'NO'}"
            )
    if loads:
        print(f"\nsnapshot load, {args.load_items:,} items in the window (s)")
        print(f"{'backend':<12}{'bulk':>8}{'per row':>10}{'speed-up':>10}")
        for backend, (bulk_s, rows_s) in loads.items():
            print(f"{backend:<12}{bulk_s:>8.2f}{rows_s:>10.2f}{rows_s / bulk_s:>9.1f}x")


if __name__ == "__main__":
    main()
