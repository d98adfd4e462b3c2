"""An nwaku node on 127.0.0.1, for interop tests.

nwaku (``wakunode2``, the reference Waku node in Nim) is the implementation the Waku specs
are written against. :func:`nwaku_binary` finds it: the path in ``SDSYNC_NWAKU``, else what
``../shared/tools/nwaku/wakunode2-path`` (beside the repository) prints. :class:`Nwaku`
runs one node on loopback only, with a fixed node key (a :meth:`~Nwaku.restart` keeps its
peer id, ports and archive), its log in a file, and talks to its REST API. Nothing here
waits without a bound: each wait names what it waited for and ends with the node's log.

Hashes come back from nwaku's REST API as ``0x``-prefixed hex (its own archive and, as
a store client, another node's); every hash this module returns is normalized to
lowercase hex without the prefix (base64 too is accepted, should a build answer so).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sdsync.testing.tools import SHARED_TOOLS, free_port, rest_call, tool_binary

ENV = "SDSYNC_NWAKU"
# The repository checked out beside shared/, as in CI.
WAKU_PATH = SHARED_TOOLS / "nwaku" / "wakunode2-path"
START_S = 60.0  # liveness bound of a start; it normally takes about a second
STOP_S = 15.0
LOG_TAIL = 6000  # characters of the log a failure shows
MAX_PAGES = 1000  # a cursor that never ends the reading fails rather than loops

T = TypeVar("T")


class NwakuUnavailableError(RuntimeError):
    """No nwaku binary could be found; the message says how to provide one."""


class NwakuError(RuntimeError):
    """nwaku did not do what was asked (or not in time); the message ends with its log."""


def nwaku_binary() -> str:
    """The ``wakunode2`` binary, or :class:`NwakuUnavailableError` saying why there is none."""
    return tool_binary(ENV, WAKU_PATH, "nwaku `wakunode2`", NwakuUnavailableError)


@dataclass(frozen=True)
class NwakuOptions:
    """What the node runs. The defaults: a relay and store node on shard 7 of cluster 1
    (where every ``/sds/1/...`` content topic autoshards, 8 shards as in The Waku Network),
    RLN off. ``lightpush_node`` and ``filter_node`` make it a light client of that service
    node (``--lightpushnode``, ``--filternode``); ``extra`` flags go last."""

    cluster_id: int = 1
    num_shards: int = 8
    shards: Sequence[int] = (7,)
    relay: bool = True
    store: bool = True
    filter: bool = False
    lightpush: bool = False
    store_sync: bool = False
    store_sync_interval_s: int | None = None
    store_sync_range_s: int | None = None
    store_sync_relay_jitter_s: int | None = None
    static_nodes: Sequence[str] = ()
    lightpush_node: str | None = None
    filter_node: str | None = None
    extra: Sequence[str] = ()


class Nwaku:
    """One nwaku node on 127.0.0.1 in ``directory``: its archive ``store.sqlite3`` and its
    log ``nwaku.log`` there. Started at construction; :meth:`wait_up` waits for it."""

    def __init__(self, binary: str, directory: Path, options: NwakuOptions | None = None) -> None:
        self.options = options if options is not None else NwakuOptions()
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.tcp_port, self.rest_port = free_port(), free_port()
        self.nodekey = secrets.token_hex(32)
        self.log_path = directory / "nwaku.log"
        self.address = ""  # its multiaddr with /p2p/<id>, once wait_up() returned
        self.argv = [binary, *self._flags()]
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._start()

    def _flags(self) -> list[str]:
        o = self.options
        flags = [
            f"--cluster-id={o.cluster_id}",
            f"--num-shards-in-network={o.num_shards}",
            *(f"--shard={shard}" for shard in o.shards),
            "--listen-address=127.0.0.1",
            f"--tcp-port={self.tcp_port}",
            "--nat=extip:127.0.0.1",  # --nat=none is refused; the default tries UPnP
            f"--nodekey={self.nodekey}",
            f"--relay={_flag(o.relay)}",
            f"--store={_flag(o.store)}",
            f"--filter={_flag(o.filter)}",
            f"--lightpush={_flag(o.lightpush)}",
            *(f"--staticnode={address}" for address in o.static_nodes),
            "--rest=true",
            "--rest-address=127.0.0.1",
            f"--rest-port={self.rest_port}",
            "--rest-admin=true",
            "--rln-relay=false",
            "--discv5-discovery=false",
            "--dns-discovery=false",
            "--peer-exchange=false",
            "--rendezvous=false",
            "--metrics-server=false",
            "--ip-colocation-limit=0",  # every peer here is on 127.0.0.1
            "--log-level=DEBUG",
        ]
        if o.store:
            flags.append(f"--store-message-db-url=sqlite://{self.directory / 'store.sqlite3'}")
        if o.store_sync:
            flags.append("--store-sync=true")
            for name, value in (
                ("interval", o.store_sync_interval_s),
                ("range", o.store_sync_range_s),
                ("relay-jitter", o.store_sync_relay_jitter_s),
            ):
                if value is not None:
                    flags.append(f"--store-sync-{name}={value}")
        if o.lightpush_node:
            flags.append(f"--lightpushnode={o.lightpush_node}")
        if o.filter_node:
            flags.append(f"--filternode={o.filter_node}")
        return [*flags, *o.extra]

    def _start(self) -> None:
        self.starts += 1
        with self.log_path.open("ab") as log:
            if self.starts > 1:
                log.write(f"\n----- sdsync.testing.nwaku: start {self.starts} -----\n".encode())
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                env={**os.environ, "NO_COLOR": "1"},  # chronicles colours its text otherwise
            )

    # -- waiting --------------------------------------------------------------------------

    def failure(self, what: str) -> NwakuError:
        """An error saying ``what``, ending with the tail of the node's log."""
        return NwakuError(f"nwaku ({self.directory.name}): {what}\n--- its log:\n{self.log_tail()}")

    def wait_until(self, probe: Callable[[], T | None], what: str, timeout_s: float = 30.0) -> T:
        """``probe()``'s first true value, polled; :class:`NwakuError` with the log if the
        node exits or ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.running():
                raise self.failure(f"exited ({self._returncode()}) while waiting for {what}")
            found = probe()
            if found:
                return found
            if time.monotonic() > deadline:
                raise self.failure(f"not within {timeout_s} s: {what}")
            time.sleep(0.2)

    def wait_up(self, timeout_s: float = START_S) -> str:
        """Its multiaddr, once its REST API lists it and its TCP port accepts connections."""

        def listening() -> str | None:
            try:
                info = self.rest("GET", "/debug/v1/info", timeout_s=2.0)
            except (OSError, ValueError):
                return None
            mine = [a for a in info.get("listenAddresses") or [] if f"/tcp/{self.tcp_port}/" in a]
            if not mine:
                return None
            try:
                with socket.create_connection(("127.0.0.1", self.tcp_port), timeout=2.0):
                    return str(mine[0])
            except OSError:
                return None

        self.address = self.wait_until(listening, "its REST API and TCP port", timeout_s)
        return self.address

    def wait_connected(self, peer_id: str, timeout_s: float = 30.0) -> None:
        """Until ``peer_id`` is among its connected peers."""
        self.wait_until(
            lambda: peer_id in self.connected_peers(), f"connected to {peer_id}", timeout_s
        )

    # -- REST -----------------------------------------------------------------------------

    @property
    def peer_id(self) -> str:
        if not self.address:
            raise self.failure("no address yet: call wait_up() first")
        return self.address.rsplit("/p2p/", 1)[1]

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def rest(self, method: str, path: str, body: Any = None, *, timeout_s: float = 10.0) -> Any:
        """One call to its REST API (:func:`~sdsync.testing.tools.rest_call`)."""
        return rest_call(self.rest_url + path, method, body, timeout_s=timeout_s)

    def connected_peers(self) -> set[str]:
        """The peer ids it is connected to (``GET /admin/v1/peers``)."""
        peers = self.rest("GET", "/admin/v1/peers")
        return {
            str(peer["multiaddr"]).rsplit("/p2p/", 1)[-1]
            for peer in peers or []
            if _connected(peer)
        }

    def relay_subscribe(self, *pubsub_topics: str) -> None:
        """Keep the REST message cache of these topics (read by :meth:`relay_messages`)."""
        self.rest("POST", "/relay/v1/subscriptions", list(pubsub_topics))

    def relay_messages(self, pubsub_topic: str) -> list[dict[str, Any]]:
        """What the REST cache holds for ``pubsub_topic``; reading it empties it."""
        return list(self.rest("GET", "/relay/v1/messages/" + _quoted(pubsub_topic)) or [])

    def relay_publish(self, pubsub_topic: str, message: dict[str, Any]) -> None:
        """Publish on relay; ``message`` as nwaku's REST takes it (``payload`` base64,
        ``contentTopic``, ``timestamp`` in ns, optional ``meta`` base64)."""
        self.rest("POST", "/relay/v1/messages/" + _quoted(pubsub_topic), message)

    def lightpush(self, pubsub_topic: str, message: dict[str, Any]) -> Any:
        """Publish through its LightPush service node (``POST /lightpush/v3/message``);
        its answer: ``{"relayPeerCount": n}`` (HTTP 200) when the service took it; a refusal
        raises ``urllib.error.HTTPError``."""
        return self.rest(
            "POST",
            "/lightpush/v3/message",
            {"pubsubTopic": pubsub_topic, "message": message},
            timeout_s=30.0,
        )

    def filter_subscribe(self, pubsub_topic: str, *content_topics: str) -> Any:
        """Subscribe at its Filter service node (``POST /filter/v2/subscriptions``)."""
        body = {
            "requestId": secrets.token_hex(8),
            "contentFilters": list(content_topics),
            "pubsubTopic": pubsub_topic,
        }
        return self.rest("POST", "/filter/v2/subscriptions", body, timeout_s=30.0)

    def filter_messages(self, content_topic: str) -> list[dict[str, Any]]:
        """What Filter pushed to it on ``content_topic`` since the last read."""
        return list(self.rest("GET", "/filter/v2/messages/" + _quoted(content_topic)) or [])

    # -- store ----------------------------------------------------------------------------

    def store_query(
        self, pubsub_topic: str | None = None, peer_addr: str | None = None, **params: Any
    ) -> dict[str, Any]:
        """One page of ``GET /store/v3/messages``: its own archive, or with ``peer_addr``
        that peer's (nwaku as a store v3 client). Its ``messages`` with hashes normalized
        (lowercase hex, no ``0x``), ``paginationCursor`` as nwaku wrote it (pass it back as
        ``cursor``). :class:`NwakuError` unless its ``statusCode`` is 200: nwaku forwards a
        remote failure as HTTP 200 with the status inside."""
        query: dict[str, str] = {k: _param(v) for k, v in params.items() if v is not None}
        if pubsub_topic is not None:
            query["pubsubTopic"] = pubsub_topic
        if peer_addr is not None:
            query["peerAddr"] = peer_addr
        answer = self.rest(
            "GET", "/store/v3/messages?" + urllib.parse.urlencode(query), timeout_s=30.0
        )
        if not isinstance(answer, dict) or answer.get("statusCode") != 200:
            raise self.failure(f"store query {query} answered {answer!r}")
        for entry in answer.get("messages") or []:
            entry["messageHash"] = normalized_hash(entry["messageHash"])
        return answer

    def store_pages(
        self, pubsub_topic: str | None = None, peer_addr: str | None = None, **params: Any
    ) -> Iterator[list[dict[str, Any]]]:
        """Each page's entries, following the cursor until a page comes without one."""
        params.pop("cursor", None)
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            answer = self.store_query(pubsub_topic, peer_addr, **params, cursor=cursor)
            yield list(answer.get("messages") or [])
            cursor = answer.get("paginationCursor")
            if not cursor:
                return
        raise self.failure(f"store query {params} still had a cursor after {MAX_PAGES} pages")

    def store_messages(
        self, pubsub_topic: str | None = None, peer_addr: str | None = None, **params: Any
    ) -> list[dict[str, Any]]:
        """Every entry of every page (see :meth:`store_query`), in the order answered."""
        return [e for page in self.store_pages(pubsub_topic, peer_addr, **params) for e in page]

    def store_hashes(
        self, pubsub_topic: str | None = None, peer_addr: str | None = None, **params: Any
    ) -> list[str]:
        """The hashes (lowercase hex) of :meth:`store_messages`."""
        return [
            str(e["messageHash"]) for e in self.store_messages(pubsub_topic, peer_addr, **params)
        ]

    # -- the process ----------------------------------------------------------------------

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = LOG_TAIL) -> str:
        return self.log()[-chars:]

    def close(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within STOP_S."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL, and wait for it to be gone."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=STOP_S)
        if self.process.poll() is None:
            raise self.failure("still running after SIGKILL")

    def restart(self, timeout_s: float = START_S) -> str:
        """Stopped (SIGTERM) if running, started again with the same argv (node key, ports,
        archive): its multiaddr once up, the same as before."""
        self.close()
        self._start()
        return self.wait_up(timeout_s)


def normalized_hash(value: str) -> str:
    """A message hash as nwaku may write it (``0x`` hex, hex, or base64), in lowercase hex."""
    text = value.strip()
    if text[:2].lower() == "0x":
        return bytes.fromhex(text[2:]).hex()
    with contextlib.suppress(ValueError):
        if len(text) == 64:
            return bytes.fromhex(text).hex()
    try:
        raw = base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"not a message hash: {value!r}") from None
    if len(raw) != 32:
        raise ValueError(f"not a 32-byte message hash: {value!r}")
    return raw.hex()


def _connected(peer: dict[str, Any]) -> bool:
    """Whether an ``/admin/v1/peers`` entry is connected (nwaku writes ``"connected"`` as
    ``"Connected"``, or per protocol in older versions)."""
    state = peer.get("connected")
    if isinstance(state, str):
        return state.lower() == "connected"
    if isinstance(state, bool):
        return state
    return any(p.get("connected") is True for p in peer.get("protocols") or [])


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return _flag(value)
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _quoted(topic: str) -> str:
    return urllib.parse.quote(topic, safe="")


__all__ = [
    "ENV",
    "Nwaku",
    "NwakuError",
    "NwakuOptions",
    "NwakuUnavailableError",
    "normalized_hash",
    "nwaku_binary",
]
