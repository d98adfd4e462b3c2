"""Waku Sync between `sdsync store serve` and nwaku's store nodes, over libp2p.

Each test runs real processes on 127.0.0.1 only: nwaku (``nwaku_nodes``: cluster 1,
shard 7, ``--store-sync=true``, rounds every 5 s, 2 s of relay jitter) and our store
node with the same settings. Messages are put into one archive only before the nodes
meet (nwaku: published on its relay while it has no peer; ours: the ingestion API), so
nothing but Waku Sync can bring them to the other side:

* both ways: nwaku's messages reach our archive and ours reach nwaku's, the same hashes;
* a mixed fleet, nwaku – sdsync – nwaku, with messages injected at each: all three end
  with the union (the two nwaku nodes reach each other's only through us);
* our node killed with SIGKILL while nwaku's messages stream in, and started again on
  the same archive: nothing it had archived is lost, and it ends with all of them (600
  messages of 2 kB in ``make test``, 5,000 in ``make soak``).

Every wait is a liveness bound, never a speed requirement, and fails with the logs.
"""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from storeprocess import (
    CONTENT_TOPIC,
    SYNC_TOKEN,
    TOPIC,
    archived_hashes,
    ingest_messages,
    store_serve,
)
from testdeps import require

from sdsync.testing.hostile import soak_scale
from sdsync.testing.nwaku import Nwaku, NwakuOptions

require("sdsync.transport.libp2p", "needs the 'p2p' extra")

pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("many-processes")]

SYNC = NwakuOptions(store_sync=True, store_sync_interval_s=5, store_sync_relay_jitter_s=2)
OUR_SYNC = [
    *("--store-sync-interval", "5", "--store-sync-relay-jitter", "2", "--token", SYNC_TOKEN)
]
PATIENCE_S = 120.0  # several rounds of 5 s; convergence normally takes one or two
Start = Callable[..., Nwaku]


def publish_into(node: Nwaku, count: int, tag: str, size: int = 16) -> None:
    """``count`` fresh messages published on ``node``'s relay (it archives its own)."""
    for index in range(count):
        payload = f"{tag} {index} ".encode().ljust(size, b".")
        node.relay_publish(
            TOPIC,
            {
                "payload": base64.b64encode(payload).decode(),
                "contentTopic": CONTENT_TOPIC,
                "timestamp": time.time_ns(),
            },
        )


def nwaku_hashes(node: Nwaku) -> set[str]:
    return set(node.store_hashes(pubsub_topic=TOPIC))


def wait_for_sets(
    probes: dict[str, Callable[[], set[str]]], want: set[str], logs: Callable[[], str]
) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while True:
        held = {name: probe() for name, probe in probes.items()}
        if all(h == want for h in held.values()):
            return
        if time.monotonic() > deadline:
            counts = {
                name: f"{len(h & want)}/{len(want)} (+{len(h - want)})" for name, h in held.items()
            }
            pytest.fail(f"not synced within {PATIENCE_S} s: {counts}\n{logs()}")
        time.sleep(1.0)


def tail(text: str, chars: int = 4000) -> str:
    return text[-chars:]


def test_sync_both_ways(nwaku_nodes: Start, tmp_path: Path) -> None:
    nwaku = nwaku_nodes(SYNC)
    publish_into(nwaku, 15, "nwaku")
    theirs = _wait_held(nwaku, 15)
    with store_serve(
        tmp_path / "ours", TOPIC, flags=[*OUR_SYNC, "--relay-peer", nwaku.address]
    ) as ours:
        mine = ingest_messages(ours, 15, "ours")
        assert not mine & theirs
        wait_for_sets(
            {"sdsync": lambda: archived_hashes(ours.url), "nwaku": lambda: nwaku_hashes(nwaku)},
            mine | theirs,
            lambda: f"--- sdsync\n{tail(''.join(ours.stderr))}\n--- nwaku\n{nwaku.log_tail()}",
        )
        assert ours.metric("sdsync_store_ingested_messages_total", source="waku-sync") == 15


def test_mixed_fleet_converges(nwaku_nodes: Start, tmp_path: Path) -> None:
    first, second = nwaku_nodes(SYNC, name="a"), nwaku_nodes(SYNC, name="b")
    publish_into(first, 10, "a")
    publish_into(second, 10, "b")
    want = _wait_held(first, 10) | _wait_held(second, 10)
    flags = [*OUR_SYNC, "--relay-peer", first.address, "--relay-peer", second.address]
    with store_serve(tmp_path / "ours", TOPIC, flags=flags) as ours:
        want |= ingest_messages(ours, 10, "ours")
        wait_for_sets(
            {
                "sdsync": lambda: archived_hashes(ours.url),
                "nwaku a": lambda: nwaku_hashes(first),
                "nwaku b": lambda: nwaku_hashes(second),
            },
            want,
            lambda: (
                f"--- sdsync\n{tail(''.join(ours.stderr))}\n--- a\n{first.log_tail()}"
                f"\n--- b\n{second.log_tail()}"
            ),
        )
    assert first.address.rsplit("/", 1)[1] not in second.connected_peers()


def test_killed_mid_sync_loses_nothing(nwaku_nodes: Start, tmp_path: Path) -> None:
    nwaku = nwaku_nodes(SYNC)
    count = soak_scale(600, 5000)
    publish_into(nwaku, count, "nwaku", size=2048)
    want = _wait_held(nwaku, count)
    data_dir = tmp_path / "ours"
    with _serve_raw(data_dir, nwaku.address) as (process, url, log):
        deadline = time.monotonic() + PATIENCE_S
        while not (held := archived_hashes(url)):
            assert time.monotonic() < deadline, f"nothing synced\n{tail(log())}\n{nwaku.log_tail()}"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    # What the archive held when killed, it still holds (SQLite's WAL): read it back.
    with store_serve(data_dir, TOPIC, flags=[*OUR_SYNC, "--relay-peer", nwaku.address]) as ours:
        assert held <= archived_hashes(ours.url)
        wait_for_sets(
            {"sdsync": lambda: archived_hashes(ours.url)},
            want,
            lambda: f"--- sdsync\n{tail(''.join(ours.stderr))}\n--- nwaku\n{nwaku.log_tail()}",
        )
    assert len(held) <= count


def _wait_held(node: Nwaku, count: int) -> set[str]:
    """The hashes ``node`` archived, once it holds ``count``."""

    def held() -> set[str] | None:
        hashes = nwaku_hashes(node)
        return hashes if len(hashes) >= count else None

    return node.wait_until(held, f"nwaku to archive its {count} messages", timeout_s=PATIENCE_S)


@contextmanager
def _serve_raw(
    data_dir: Path, peer: str
) -> Iterator[tuple[subprocess.Popen[str], str, Callable[[], str]]]:
    """Our store node as a bare process (killed by the test, not stopped)."""
    argv = [sys.executable, "-m", "sdsync.cli", "store", "serve", "--data-dir", str(data_dir)]
    argv += ["--listen", "127.0.0.1:0", "--retention", "none", "--relay-shard", "7"]
    argv += [*OUR_SYNC, "--relay-peer", peer]
    log_path = data_dir.parent / "killed.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert process.stdout is not None
        listening = process.stdout.readline()
        assert listening.startswith("sdsync store: listening on http://"), log_path.read_text()
        yield process, listening.split()[4], log_path.read_text
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
