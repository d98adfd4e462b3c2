"""The js-waku drivers (waku_relay/relay.mjs, waku_light/light.mjs) as Python objects,
and helpers around the `sdsync store serve` process they are tested against
(tests/storeprocess.py).

Each driver is a Node process speaking JSON lines (see the README.md in its folder): a first
line saying whether its node started, then one reply per request, with ``{"event": ...}``
lines in between. Every read here has a deadline, so a driver that hangs fails its test
instead of stalling the suite, and :meth:`WakuDriver.close` always ends the process.
"""

from __future__ import annotations

import base64
import json
import queue
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from peers import line_process
from storeprocess import StoreProcess
from testdeps import in_ci

from sdsync.waku.rpc import MAX_RPC_BYTES, encode_frame

if TYPE_CHECKING:
    from sdsync.transport.libp2p import Libp2pTransport

HERE = Path(__file__).parent
RELAY_DIR = HERE / "waku_relay"
LIGHT_DIR = HERE / "waku_light"

Event = dict[str, Any]


def require_driver(folder: Path, *packages: str) -> None:
    """Skip unless Node and ``folder``'s packages (@waku/sdk and ``packages``) are
    installed; in CI, fail instead."""
    missing = [
        package
        for package in ("@waku/sdk", *packages)
        if not (folder / "node_modules" / package).is_dir()
    ]
    if shutil.which("node") is None:
        problem = "Node.js is not installed"
    elif missing:
        problem = (
            f"{', '.join(missing)} not installed in {folder}: run `npm ci` there (make test does)"
        )
    else:
        return
    if in_ci():
        pytest.fail(f"{problem}; CI is set, so every test dependency must be installed")
    pytest.skip(problem)


class DriverError(AssertionError):
    """A driver answered ok=false, went silent or died: the test's failure."""


class WakuDriver:
    def __init__(self, name: str, argv: list[str], *, start_timeout: float = 30.0) -> None:
        self.name = name
        self.proc = line_process(argv, stderr=subprocess.PIPE)
        # Threads read the pipes, so that every read here can time out and a chatty
        # stderr never fills its pipe; the last of it goes into failure messages.
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: deque[str] = deque(maxlen=40)
        self._events: list[Event] = []
        threading.Thread(target=self._pump, name=f"{name}-stdout", daemon=True).start()
        threading.Thread(target=self._pump_stderr, name=f"{name}-stderr", daemon=True).start()
        try:
            self.started = self._next(time.monotonic() + start_timeout, "its first line")
        except BaseException:
            self.close()
            raise

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        self._stderr.extend(self.proc.stderr)

    def stderr_tail(self) -> str:
        return "".join(self._stderr)

    def _fail(self, what: str) -> DriverError:
        return DriverError(f"{self.name}: {what}\n--- its stderr ---\n{self.stderr_tail()}")

    def _next(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise self._fail(f"no {waiting_for} in time") from None
        if line is None:
            self._lines.put(None)  # every later read sees the end too
            raise self._fail(f"exited (code {self.proc.poll()}) while waiting for {waiting_for}")
        parsed: dict[str, Any] = json.loads(line)
        return parsed

    def request(self, op: str, *, timeout: float = 15.0, **fields: Any) -> dict[str, Any]:
        """The reply to one request; events printed meanwhile are kept for :meth:`event`."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise self._fail(f"cannot take {op}: {exc}") from exc
        deadline = time.monotonic() + timeout
        while "event" in (line := self._next(deadline, f"the reply to {op}")):
            self._events.append(line)
        return line

    def ok(self, op: str, *, timeout: float = 15.0, **fields: Any) -> dict[str, Any]:
        reply = self.request(op, timeout=timeout, **fields)
        if not reply.get("ok"):
            raise self._fail(str(reply.get("error")))  # it names the op
        return reply

    def event(self, match: Callable[[Event], bool], *, timeout: float = 15.0) -> Event:
        """The first event, kept or still to come, that ``match``es (taken off the list)."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for index in range(seen, len(self._events)):
                if match(self._events[index]):
                    return self._events.pop(index)
            seen = len(self._events)
            line = self._next(deadline, "a matching event")
            if "event" not in line:
                raise self._fail(f"a reply nobody asked for: {line}")
            self._events.append(line)

    def close(self) -> None:
        """Asks the driver to stop, then kills it if it has not within 5 s."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write('{"op":"stop"}\n')
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass  # it has gone already, or was closed before
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> WakuDriver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def relay_argv(
    *,
    cluster_id: int = 1,
    shards: Iterable[int] = (),
    content_topics: Iterable[str] = (),
    ws: bool = False,
) -> list[str]:
    argv = ["node", str(RELAY_DIR / "relay.mjs"), "--cluster-id", str(cluster_id)]
    argv += [arg for shard in shards for arg in ("--shard", str(shard))]
    argv += [arg for topic in content_topics for arg in ("--content-topic", topic)]
    return [*argv, "--ws"] if ws else argv


def light_argv(
    peer: str,
    *,
    cluster_id: int = 1,
    require: Iterable[str] = ("store", "lightpush", "filter"),
    timeout_ms: int = 10_000,
) -> list[str]:
    return [
        "node",
        str(LIGHT_DIR / "light.mjs"),
        "--peer",
        peer,
        "--cluster-id",
        str(cluster_id),
        f"--require={','.join(require)}",  # "=": an empty list must stay one argument
        "--timeout-ms",
        str(timeout_ms),
    ]


def light_node(store: StoreProcess, name: str, **options: Any) -> Iterator[WakuDriver]:
    """A js-waku light node whose one service node is ``store`` (``options``: light_argv's),
    for a fixture to ``yield from``."""
    require_driver(LIGHT_DIR)
    driver = WakuDriver(name, light_argv(store.relay_addrs[0], **options))
    try:
        assert driver.started["ok"], driver.started
        yield driver
    finally:
        driver.close()


def sds_relay_nodes(content_topic: str, *names: str) -> Iterator[list[WakuDriver]]:
    """js-waku relay nodes running @waku/sds on ``content_topic``, one per name, for a
    fixture to ``yield from``."""
    require_driver(RELAY_DIR, "@waku/sds")
    nodes: list[WakuDriver] = []
    try:
        for name in names:
            nodes.append(WakuDriver(name, relay_argv(content_topics=[content_topic])))
            assert nodes[-1].started["ok"], nodes[-1].started
        yield nodes
    finally:
        for node in nodes:
            node.close()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@asynccontextmanager
async def connected_client(store: StoreProcess) -> AsyncIterator[tuple[Libp2pTransport, str]]:
    """A Waku-mode libp2p host connected to ``store``'s relay host, and that host's peer id."""
    from sdsync.transport.libp2p import Libp2pTransport, WakuRelayConfig

    async with Libp2pTransport(waku=WakuRelayConfig()) as client:
        address = store.relay_addrs[0]
        await client.connect(address)
        yield client, address.rsplit("/", 1)[1]


async def send_cut_frames(client: Libp2pTransport, server: str, protocol: str) -> None:
    """What a misbehaving client sends the peer ``server``: two ``protocol`` streams, each
    closed inside a frame, one of 40 bytes and one longer than MAX_RPC_BYTES."""
    from libp2p.peer.id import ID

    trio_side = client._running()

    async def write() -> None:
        for body in (b"\x42" * 40, bytes(MAX_RPC_BYTES + 1)):
            stream = await trio_side.host.new_stream(ID.from_base58(server), [protocol])  # type: ignore[list-item]
            await stream.write(encode_frame(body)[:16])
            await stream.close()

    await client._call(write)
