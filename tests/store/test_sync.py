"""Store Sync between two in-process nodes over loopback HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest
from storetest import HOUR, T0, make_message, make_messages, running, sync_now

from sdsync.reconcile import METHODS, Method
from sdsync.store import SqlArchive, StoredMessage, open_archive
from sdsync.store.sync import sync_with_peer

WINDOW = (T0, T0 + HOUR)
Case = tuple[list[StoredMessage], list[StoredMessage]]


@pytest.fixture(params=["sqlite", "postgresql"])
def archives(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[SqlArchive, SqlArchive]]:
    """Two fresh archives on the same backend."""
    if request.param == "sqlite":
        urls = [str(tmp_path / f"{side}.sqlite3") for side in "ab"]
    else:
        cluster = request.getfixturevalue("pg_cluster")
        urls = [
            cluster.create_database(f"sync_{os.getpid()}_{uuid.uuid4().hex[:12]}") for _ in "ab"
        ]
    a, b = (open_archive(url) for url in urls)
    yield a, b
    a.close()
    b.close()


def _split(messages: list[StoredMessage], seed: int, keep: float) -> Case:
    """Each side keeps a random ``keep`` share of ``messages``, independently."""
    rng = random.Random(seed)
    return (
        [m for m in messages if rng.random() < keep],
        [m for m in messages if rng.random() < keep],
    )


def _equal_timestamps(n: int, seed: int) -> list[StoredMessage]:
    """Many messages on few timestamps: items that differ only by hash."""
    rng = random.Random(seed)
    stamps = [T0 + rng.randrange(HOUR) for _ in range(12)]
    return [make_message(rng, rng.choice(stamps)) for _ in range(n)]


CASES: dict[str, Case] = {
    "both-empty": ([], []),
    "one-empty": (make_messages(300, seed=2, span=HOUR), []),
    "other-empty": ([], make_messages(300, seed=3, span=HOUR)),
    "identical": (make_messages(300, seed=4, span=HOUR),) * 2,
    "disjoint": (make_messages(200, seed=5, span=HOUR), make_messages(200, seed=6, span=HOUR)),
    "overlap": _split(make_messages(1_500, seed=7, span=HOUR), seed=8, keep=0.8),
    "equal-timestamps": _split(_equal_timestamps(600, seed=9), seed=10, keep=0.7),
}
# Outside the window on each side: a sync must leave these alone.
OUTSIDE = (
    make_messages(40, seed=11, start=T0 - HOUR, span=HOUR),
    make_messages(40, seed=12, start=T0 + HOUR, span=HOUR),
)


def hashes(messages: Iterable[StoredMessage]) -> set[bytes]:
    return {m.message_hash for m in messages}


def in_window(archive: SqlArchive) -> set[bytes]:
    return {h for _, h in archive.items(*WINDOW)}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES)
def test_two_nodes_end_with_identical_windows(
    archives: tuple[SqlArchive, SqlArchive], tmp_path: Path, case: str, method: Method
) -> None:
    """Both directions at once; a second round finds nothing; outside the window untouched."""
    a, b = archives
    ours, theirs = CASES[case]
    a.insert([*ours, *OUTSIDE[0]])
    b.insert([*theirs, *OUTSIDE[1]])
    ours_h, theirs_h = hashes(ours), hashes(theirs)

    async def scenario() -> None:
        async with (
            running(a, tmp_path / "a", clock_ns=sync_now) as node_a,
            running(b, tmp_path / "b", clock_ns=sync_now) as node_b,
        ):
            report = await sync_with_peer(node_a, node_b.url, WINDOW, method=method)
            again = await sync_with_peer(node_a, node_b.url, WINDOW, method=method)
            assert (report.have, report.need) == (len(ours_h - theirs_h), len(theirs_h - ours_h))
            assert (report.sent, report.peer_stored) == (report.have, report.have)
            assert (report.received, report.stored) == (report.need, report.need)
            assert (again.have, again.need, again.sent, again.received) == (0, 0, 0, 0)
            assert in_window(a) == in_window(b) == ours_h | theirs_h
            assert hashes(a.messages()) - in_window(a) == hashes(OUTSIDE[0])
            assert hashes(b.messages()) - in_window(b) == hashes(OUTSIDE[1])

    asyncio.run(scenario())


def test_item_arrays_match_the_sorted_scan(archive: SqlArchive) -> None:
    messages = [*make_messages(700, seed=13, span=3 * HOUR), *_equal_timestamps(100, seed=14)]
    archive.insert(messages)
    for start, end in [(T0, T0 + 3 * HOUR), (T0 + HOUR // 3, T0 + 2 * HOUR + 7), (0, 1)]:
        stamps, blob = archive.item_arrays(start, end)
        assert stamps.dtype == np.int64 and blob.shape == (len(stamps), 32)
        loaded = sorted(zip(stamps.tolist(), (bytes(row) for row in blob), strict=True))
        assert loaded == list(archive.items(start, end))
