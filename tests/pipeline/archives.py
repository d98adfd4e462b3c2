"""Store archives for tests: Parquet with the store's columns, built with pyarrow."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sdsync.store.schema import ARCHIVE_SCHEMA

Item = tuple[int, bytes]


def random_items(n: int, rng: random.Random, *, start: int = 1_700_000_000 * 10**9) -> list[Item]:
    """``n`` items at random nanosecond times over about an hour."""
    return [(start + rng.randrange(3_600 * 10**9), rng.randbytes(32)) for _ in range(n)]


def archive_table(rows: list[Item]) -> pa.Table:
    """``rows`` in the store's archive columns, in the order given."""
    return pa.table(
        {
            "message_hash": pa.array([h for _, h in rows], pa.binary()),
            "timestamp": pa.array([t for t, _ in rows], pa.int64()),
            "pubsub_topic": pa.array(["/waku/2/rs/1/0"] * len(rows)),
            "content_topic": pa.array(["/app/1/chat/proto"] * len(rows)),
            "payload": pa.array([b"p"] * len(rows), pa.binary()),
            "meta": pa.array([None] * len(rows), pa.binary()),
            "version": pa.array([0] * len(rows), pa.int32()),
        },
        schema=ARCHIVE_SCHEMA,
    )


def write_archive(directory: Path, items: Iterable[Item], *, files: int = 1) -> Path:
    """Write ``items`` as an archive directory of ``files`` Parquet files."""
    rows = list(items)
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        pq.write_table(archive_table(rows[f::files]), directory / f"part-{f:03d}.parquet")
    return directory
