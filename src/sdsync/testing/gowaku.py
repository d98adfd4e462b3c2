"""A go-waku node on 127.0.0.1, for interop tests and benchmarks.

go-waku (the Go Waku node that status-go uses) is a second, independent implementation of
the protocols sdsync speaks. :func:`go_waku_binary` finds its ``waku`` binary: the path in
``SDSYNC_GO_WAKU``, else what ``../shared/tools/go-waku/waku-path`` (beside the repository)
prints. :class:`GoWaku` runs one node on loopback only, its log in a file, and talks to its
REST API. Nothing here waits without a bound: each wait names what it waited for and ends
with the node's log.
"""

from __future__ import annotations

import secrets
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdsync.testing.tools import SHARED_TOOLS, free_port, rest_call, tool_binary

ENV = "SDSYNC_GO_WAKU"
# The repository checked out beside shared/, as in CI.
WAKU_PATH = SHARED_TOOLS / "go-waku" / "waku-path"
START_S = 30.0


class GoWakuUnavailableError(RuntimeError):
    """No go-waku binary could be found; the message says how to provide one."""


def go_waku_binary() -> str:
    """The go-waku binary, or :class:`GoWakuUnavailableError` saying why there is none."""
    return tool_binary(ENV, WAKU_PATH, "go-waku `waku`", GoWakuUnavailableError)


@dataclass(frozen=True)
class GoWakuOptions:
    """What the node runs; the defaults are a relay node on shard 7 of cluster 1 (where
    every ``/sds/1/...`` content topic autoshards) with its metadata check on."""

    cluster_id: int = 1
    pubsub_topics: Sequence[str] = ("/waku/2/rs/1/7",)
    relay: bool = True
    store: bool = False
    lightpush: bool = False
    filter: bool = False
    static_nodes: Sequence[str] = ()
    max_message_size: str = "1MiB"
    extra: Sequence[str] = ()


class GoWaku:
    """One go-waku node on 127.0.0.1 in ``directory``, its log in ``go-waku.log`` there."""

    def __init__(self, binary: str, directory: Path, options: GoWakuOptions | None = None) -> None:
        options = options if options is not None else GoWakuOptions()
        self.options = options
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.tcp_port, self.rest_port = free_port(), free_port()
        self.log_path = directory / "go-waku.log"
        self.address = ""  # its multiaddr with /p2p/<id>, once wait_up() returned
        argv = [
            binary,
            "--address=127.0.0.1",
            f"--tcp-port={self.tcp_port}",
            f"--ext-multiaddr=/ip4/127.0.0.1/tcp/{self.tcp_port}",
            f"--nodekey={secrets.token_hex(32)}",
            f"--cluster-id={options.cluster_id}",
            f"--relay={str(options.relay).lower()}",
            *(f"--pubsub-topic={t}" for t in options.pubsub_topics),
            *(f"--staticnode={a}" for a in options.static_nodes),
            f"--max-msg-size={options.max_message_size}",
            "--rest",
            "--rest-address=127.0.0.1",
            f"--rest-port={self.rest_port}",
            "--rest-admin",
            "--discv5-discovery=false",
            "--dns-discovery=false",
            "--peer-exchange=false",
            "--relay-peer-exchange=false",
            "--log-encoding=nocolor",
            *self._service_flags(),
            *options.extra,
        ]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, cwd=directory
            )

    def _service_flags(self) -> list[str]:
        flags = []
        if self.options.store:
            db = self.directory / "store.db"
            flags += ["--store", f"--store-message-db-url=sqlite3://{db}"]
        if self.options.lightpush:
            flags.append("--lightpush")
        if self.options.filter:
            flags.append("--filter")
        return flags

    @property
    def peer_id(self) -> str:
        return self.address.rsplit("/p2p/", 1)[1]

    def rest(self, method: str, path: str, body: Any = None, *, timeout_s: float = 10.0) -> Any:
        """One call to its REST API (:func:`~sdsync.testing.tools.rest_call`)."""
        return rest_call(
            f"http://127.0.0.1:{self.rest_port}{path}", method, body, timeout_s=timeout_s
        )

    def wait_up(self, timeout_s: float = START_S) -> str:
        """go-waku's multiaddr once its REST API answers; RuntimeError (with the log) if
        it exits or does not answer in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"go-waku exited {self.process.returncode}:\n{self.log()}")
            try:
                info = self.rest("GET", "/debug/v1/info", timeout_s=2.0)
                break
            except OSError:
                if time.monotonic() > deadline:
                    log = self.log()
                    raise RuntimeError(f"go-waku's REST API did not answer:\n{log}") from None
                time.sleep(0.2)
        [address] = [a for a in info["listenAddresses"] if f"/tcp/{self.tcp_port}/" in a]
        self.address = str(address)
        return self.address

    def connected_peers(self) -> set[str]:
        peers = self.rest("GET", "/admin/v1/peers")
        return {peer["id"] for peer in peers or [] if peer.get("connected")}

    def relay_subscribe(self, *pubsub_topics: str) -> None:
        """Keep the REST message cache of these topics (read by :meth:`relay_messages`)."""
        self.rest("POST", "/relay/v1/subscriptions", list(pubsub_topics))

    def relay_publish(self, pubsub_topic: str, message: dict[str, Any]) -> None:
        """Publish on relay; ``message`` as go-waku's REST takes it (base64 payload,
        ``contentTopic``, ``timestamp`` in ns)."""
        self.rest("POST", "/relay/v1/messages/" + _quoted(pubsub_topic), message)

    def relay_messages(self, pubsub_topic: str) -> list[dict[str, Any]]:
        """What the REST cache holds for ``pubsub_topic``; reading it empties it."""
        return list(self.rest("GET", "/relay/v1/messages/" + _quoted(pubsub_topic)) or [])

    def store_v3_query(self, peer_address: str, **params: str) -> dict[str, Any]:
        """go-waku's store-v3 *client*: asks ``peer_address`` and returns its answer."""
        query = urllib.parse.urlencode({"peerAddr": peer_address, **params})
        answer = self.rest("GET", f"/store/v3/messages?{query}", timeout_s=30.0)
        if not isinstance(answer, dict):
            raise RuntimeError(f"go-waku's store client answered {answer!r}")
        return answer

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _quoted(pubsub_topic: str) -> str:
    return urllib.parse.quote(pubsub_topic, safe="")
