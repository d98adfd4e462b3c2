"""Store query load: concurrent v3 REST queries against a large archive, SQLite vs PostgreSQL.

For each backend the bench fills an archive with ``--messages`` messages (default one
million: 24 hours, one pubsub topic, 50 content topics, 100-300 byte payloads) through
``Archive.insert`` in batches (that is the ingest rate it reports), starts
``sdsync store serve`` on it as a separate process (after gathering planner statistics,
as after any bulk load), and drives ``--concurrency``
clients issuing ``--queries`` queries over HTTP, a mix of what store clients ask:

* ``topic-1h``   — one content topic, one hour, with data, 20 per page (history);
* ``hashes-20``  — 20 message hashes, with data (SDS retrieval-hint fetches);
* ``deep-page``  — a time range resumed from a cursor at a random point, 100 per page;
* ``latest``     — one content topic, newest page first (backward), with data.

It prints p50 and p99 latency per kind and overall for each backend, and the ratio of
PostgreSQL to SQLite (the anchor) in the same run.  PostgreSQL is a throwaway local
cluster (fsync off) unless ``--pg-url`` names one.

    .venv/bin/python bench/store_query_load.py                  # 1M messages, both
    .venv/bin/python bench/store_query_load.py --messages 100000 --backends sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from sdsync.store import StoredMessage, open_archive
from sdsync.testing.pgcluster import TempCluster, free_port, start_cluster
from sdsync.wire.waku import WakuMessage

PUBSUB = "/waku/2/rs/1/0"
TOPICS = [f"/app/1/topic-{i}/proto" for i in range(50)]
T0 = 1_700_000_000 * 10**9
DAY_NS = 86_400 * 10**9
HOUR_NS = 3_600 * 10**9
BATCH = 10_000


def generate(n: int, seed: int) -> list[StoredMessage]:
    rng = random.Random(seed)
    return [
        StoredMessage.of(
            PUBSUB,
            WakuMessage(
                payload=rng.randbytes(rng.randrange(100, 300)),
                content_topic=TOPICS[rng.randrange(len(TOPICS))],
                timestamp=T0 + rng.randrange(DAY_NS),
            ),
        )
        for _ in range(n)
    ]


def fill(url: str, messages: list[StoredMessage]) -> float:
    """Insert in batches, in arrival (timestamp) order as a node hears them; msg/s."""
    archive = open_archive(url)
    started = time.perf_counter()
    for start in range(0, len(messages), BATCH):
        archive.insert(messages[start : start + BATCH])
    elapsed = time.perf_counter() - started
    assert archive.count() == len(messages)
    archive.close()
    settle(url)
    return len(messages) / elapsed


def settle(url: str) -> None:
    """Gather planner statistics, as after any bulk load (not counted as ingest time)."""
    if url.startswith("postgresql://"):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE) messages")
    else:
        with contextlib.closing(sqlite3.connect(url)) as conn:
            conn.execute("ANALYZE")


def query_mix(rng: random.Random, hashes: list[bytes]) -> tuple[str, dict[str, str]]:
    roll = rng.random()
    topic = TOPICS[rng.randrange(len(TOPICS))]
    if roll < 0.4:
        start = T0 + rng.randrange(DAY_NS - HOUR_NS)
        return "topic-1h", {
            "includeData": "true",
            "pubsubTopic": PUBSUB,
            "contentTopics": topic,
            "startTime": str(start),
            "endTime": str(start + HOUR_NS),
        }
    if roll < 0.7:
        picked = rng.sample(hashes, 20)
        return "hashes-20", {
            "includeData": "true",
            "hashes": ",".join("0x" + h.hex() for h in picked),
        }
    if roll < 0.9:
        return "deep-page", {
            "includeData": "true",
            "startTime": str(T0),
            "endTime": str(T0 + DAY_NS),
            "cursor": "0x" + rng.choice(hashes).hex(),
            "pageSize": "100",
        }
    return "latest", {
        "includeData": "true",
        "pubsubTopic": PUBSUB,
        "contentTopics": topic,
        "ascending": "false",
    }


async def load(
    url: str, hashes: list[bytes], queries: int, concurrency: int, seed: int
) -> dict[str, list[float]]:
    latencies: dict[str, list[float]] = defaultdict(list)
    rng = random.Random(seed)
    plan = [query_mix(rng, hashes) for _ in range(queries)]
    remaining = iter(plan)

    async def client(session: aiohttp.ClientSession) -> None:
        for kind, params in remaining:
            started = time.perf_counter()
            async with session.get(f"{url}/store/v3/messages", params=params) as response:
                body = await response.json()
            latencies[kind].append(time.perf_counter() - started)
            if response.status != 200:  # small archives may answer an empty page
                raise RuntimeError(f"{kind}: HTTP {response.status}: {body.get('statusDesc')}")

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return latencies


def serve(db: str, data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sdsync.cli", "store", "serve", "--db", db,
         "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}", "--retention", "none",
         # Every client comes from 127.0.0.1: the per-IP cap would refuse --concurrency > 64.
         "--http-max-connections-per-ip", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    if "listening" not in line:
        process.kill()
        raise RuntimeError(f"store did not start: {line!r}")
    return process, line.split()[4]


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] * 1000


def run_backend(
    name: str, db: str, messages: list[StoredMessage], args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    print(f"[{name}] inserting {len(messages):,} messages…", flush=True)
    rate = fill(db, messages)
    print(f"[{name}] ingest {rate:,.0f} msg/s; querying…", flush=True)
    process, url = serve(db, work / f"{name}-state")
    try:
        hashes = [m.message_hash for m in messages]
        asyncio.run(load(url, hashes, args.queries // 10, args.concurrency, args.seed + 1))  # warm
        started = time.perf_counter()
        latencies = asyncio.run(load(url, hashes, args.queries, args.concurrency, args.seed))
        elapsed = time.perf_counter() - started
    finally:
        process.terminate()
        process.wait(timeout=30)
    every = [x for values in latencies.values() for x in values]
    result: dict[str, Any] = {"ingest": rate, "qps": len(every) / elapsed}
    for kind, values in [*sorted(latencies.items()), ("all", every)]:
        result[kind] = (percentile(values, 50), percentile(values, 99), len(values))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=4_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--pg-url", help="an existing PostgreSQL database (default: throwaway)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    # Killed with SIGTERM, still stop the server process and the cluster (finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))

    print(f"generating {args.messages:,} messages…", flush=True)
    messages = sorted(generate(args.messages, args.seed), key=lambda m: m.timestamp)
    results: dict[str, dict[str, Any]] = {}
    cluster: TempCluster | None = None
    with tempfile.TemporaryDirectory(prefix="sdsync-bench-") as tmp:
        work = Path(tmp)
        try:
            for backend in args.backends.split(","):
                if backend == "sqlite":
                    db = str(work / "store.sqlite3")
                else:
                    if args.pg_url is None:
                        cluster = start_cluster()
                    db = args.pg_url or (cluster.create_database("bench") if cluster else "")
                results[backend] = run_backend(backend, db, messages, args, work)
        finally:
            if cluster is not None:
                cluster.stop()
    report(results, args)


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\n{args.messages:,} messages, {args.queries:,} queries, "
        f"{args.concurrency} concurrent clients (latency in ms)"
    )
    kinds = ["topic-1h", "hashes-20", "deep-page", "latest", "all"]
    backends = list(results)
    header = f"{'query':<10}" + "".join(f"{b + ' p50':>16}{b + ' p99':>16}" for b in backends)
    print(header)
    for kind in kinds:
        cells = "".join(
            f"{results[b][kind][0]:>16.1f}{results[b][kind][1]:>16.1f}" for b in backends
        )
        print(f"{kind:<10}{cells}")
    for b in backends:
        print(f"{b}: ingest {results[b]['ingest']:,.0f} msg/s, {results[b]['qps']:,.0f} queries/s")
    if {"sqlite", "postgresql"} <= set(results):
        sq, pg = results["sqlite"], results["postgresql"]
        print(
            f"postgresql/sqlite: p50 {pg['all'][0] / sq['all'][0]:.2f}x, "
            f"p99 {pg['all'][1] / sq['all'][1]:.2f}x, ingest {pg['ingest'] / sq['ingest']:.2f}x"
        )


if __name__ == "__main__":
    main()
