"""Waku Sync between two `sdsync store serve` processes over real libp2p: RBSR, not XOR.

Each node gets messages the other lacks through its ingestion API before they meet; B
dials A (``--relay-peer``) and both run rounds every 2 s. Both archives must end with the
union, and both must say (``GET /admin/v1/info``, ``waku_sync.recent``) that the rounds
between them ran RBSR over ``/sdsync/store-sync/rbsr/1.0.0``.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from storeprocess import (
    SYNC_TOKEN,
    TOPIC,
    archived_hashes,
    ingest_messages,
    store_serve,
)
from testdeps import require

from sdsync.waku.sync import RBSR_PROTOCOL

require("sdsync.transport.libp2p", "needs the 'p2p' extra")

pytestmark = pytest.mark.xdist_group("many-processes")

FLAGS = ["--store-sync-interval", "2", "--store-sync-relay-jitter", "1", "--token", SYNC_TOKEN]
PATIENCE_S = 120.0  # a liveness bound: a few rounds of 2 s


def info(url: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/admin/v1/info", headers={"Authorization": f"Bearer {SYNC_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return dict(json.loads(answer.read()))


def test_two_sdsync_nodes_sync_by_rbsr_over_libp2p(tmp_path: Path) -> None:
    with store_serve(tmp_path / "a", TOPIC, RBSR_PROTOCOL, flags=FLAGS) as a:
        only_a = ingest_messages(a, 40, "a")
        flags = [*FLAGS, "--relay-peer", a.relay_addrs[0]]
        with store_serve(tmp_path / "b", TOPIC, RBSR_PROTOCOL, flags=flags) as b:
            only_b = ingest_messages(b, 25, "b")
            union = only_a | only_b
            deadline = time.monotonic() + PATIENCE_S
            while not archived_hashes(a.url) == archived_hashes(b.url) == union:
                assert time.monotonic() < deadline, "".join(a.stderr[-50:] + b.stderr[-50:])
                time.sleep(0.5)
            rounds = [r for node in (a, b) for r in info(node.url)["waku_sync"]["recent"]]
            assert rounds
            assert {r.get("method") for r in rounds if r["outcome"] == "ok"} == {"rbsr"}
