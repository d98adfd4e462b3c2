"""`sdsync store serve` as a process, relaying and archiving one shard: what js-waku,
go-waku and our chats are tested against (tests/interop, tests/chat, tests/cli)."""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sdsync.wire.waku import WakuMessage

__all__ = [
    "CONTENT_TOPIC",
    "SYNC_TOKEN",
    "TOPIC",
    "StoreProcess",
    "archived_hashes",
    "ingest_messages",
    "post_messages",
    "store_serve",
]
TOPIC = "/waku/2/rs/1/7"
CONTENT_TOPIC = "/sds/1/sync/proto"
SYNC_TOKEN = "sync-test"


@dataclass
class StoreProcess:
    process: subprocess.Popen[str]
    url: str
    relay_addrs: list[str]
    stderr: list[str]  # its log, as it comes

    def metric(self, name: str, **labels: str) -> float:
        """The first sample of ``name`` with ``labels`` on its /metrics, 0.0 if none."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            lines = response.read().decode().splitlines()
        wanted = [f'{key}="{value}"' for key, value in labels.items()]
        for line in lines:
            if line.startswith((name + "{", name + " ")) and all(w in line for w in wanted):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def wait_logged(self, text: str, count: int, timeout_s: float = 10.0) -> None:
        """Until ``count`` lines of its log hold ``text``."""
        deadline = time.monotonic() + timeout_s
        while len([line for line in self.stderr if text in line]) < count:
            assert time.monotonic() < deadline, "".join(self.stderr)
            time.sleep(0.05)


@contextmanager
def store_serve(
    data_dir: Path, pubsub_topic: str, *protocols: str, flags: Sequence[str] = ()
) -> Iterator[StoreProcess]:
    """`sdsync store serve` on ``data_dir``, relaying and archiving ``pubsub_topic`` (a
    shard of cluster 1) and offering ``protocols`` on its relay host, with ``flags``
    besides; ended by SIGTERM."""
    shard = pubsub_topic.rsplit("/", 1)[1]
    argv = [sys.executable, "-m", "sdsync.cli", "store", "serve", "--data-dir", str(data_dir)]
    argv += ["--listen", "127.0.0.1:0", "--retention", "none", "--relay-shard", shard, *flags]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(process.stderr or ()), daemon=True).start()
    try:
        assert process.stdout is not None
        listening, relay = process.stdout.readline(), process.stdout.readline()
        assert listening.startswith("sdsync store: listening on http://"), listening
        match = re.match(r"sdsync store: relay on (.+?), archiving (.+?) \(Waku relay", relay)
        assert match and pubsub_topic in match[2].split(", "), relay
        for protocol in protocols:
            assert protocol in relay
        yield StoreProcess(process, listening.split()[4], match[1].split(", "), stderr)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def ingest_messages(store: StoreProcess, count: int, tag: str) -> set[str]:
    """``count`` messages on :data:`TOPIC`, a millisecond apart and ending now, posted to
    the store's ingestion API (it runs with ``--token SYNC_TOKEN``); their hashes (hex)."""
    now = time.time_ns()
    messages = [
        WakuMessage(f"{tag} {i}".encode(), CONTENT_TOPIC, timestamp=now - (count - i) * 10**6)
        for i in range(count)
    ]
    assert post_messages(store.url, messages) == count
    return {m.hash(TOPIC).hex() for m in messages}


def post_messages(url: str, messages: Sequence[WakuMessage], timeout_s: float = 30.0) -> int:
    """POST ``messages`` (on :data:`TOPIC`) to the ingestion API of the node at ``url`` (it
    runs with ``--token SYNC_TOKEN``); how many it stored. Raises OSError (an HTTPError for
    an answer that is not 2xx) when it does not answer them."""
    entries = [
        {
            "messageHash": "0x" + m.hash(TOPIC).hex(),
            "pubsubTopic": TOPIC,
            "message": {
                "payload": base64.b64encode(m.payload).decode(),
                "contentTopic": m.content_topic,
                "timestamp": m.timestamp,
            },
        }
        for m in messages
    ]
    request = urllib.request.Request(
        f"{url}/store/v3/messages",
        data=json.dumps({"messages": entries}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {SYNC_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        stored: int = json.loads(answer.read())["stored"]
        return stored


def archived_hashes(url: str) -> set[str]:
    """Every hash our store holds on the topic (paged through its REST API)."""
    hashes: set[str] = set()
    cursor = ""
    while True:
        params = {"pubsubTopic": TOPIC, "pageSize": "100", "includeData": "false"}
        if cursor:
            params["cursor"] = cursor
        with urllib.request.urlopen(
            f"{url}/store/v3/messages?{urllib.parse.urlencode(params)}", timeout=30
        ) as answer:
            page = json.loads(answer.read())
        hashes |= {m["messageHash"].removeprefix("0x") for m in page["messages"]}
        cursor = page.get("paginationCursor") or ""
        if not cursor:
            return hashes
