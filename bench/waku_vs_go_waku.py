"""Waku relay, LightPush and Filter: sdsync beside go-waku 0.9.0 and nwaku, in one run.

Every node runs on 127.0.0.1, each in a process of its own, as deployed. The reference
implementations (``--impls``, default ``go-waku,nwaku``): go-waku's binary comes from
``SDSYNC_GO_WAKU`` or ``../shared/tools/go-waku`` (:mod:`sdsync.testing.gowaku`), nwaku's
``wakunode2`` from ``SDSYNC_NWAKU`` or ``../shared/tools/nwaku`` (:mod:`sdsync.testing.nwaku`:
loopback only, RLN off, store off here, ``--log-level=INFO`` as go-waku's default rather
than the harness's DEBUG). Both take the same REST calls, so every row below is measured
the same way for either. Three measurements:

* **Relay**, messages/s between two nodes on shard 7 of cluster 1, at each payload size
  (100 B, 4 kB, 40 kB): for each implementation X, X → X (published by REST on one,
  counted from the other's REST message cache), sdsync → X and X → sdsync; then sdsync →
  sdsync (:class:`~sdsync.transport.libp2p.Libp2pTransport`, the receiver in a child
  process).
* **LightPush**, requests/s and p50/p99 latency served by each implementation
  (``--lightpush``) and by `sdsync store serve`: a raw Libp2pTransport client keeps
  ``--concurrency`` requests of ``/vac/waku/lightpush/2.0.0-beta1`` (the version all three
  serve) in flight; each service node relays to one relay peer, a node of the first of
  ``--impls``. Our store node also archives each message.
* **Filter**, pushes/s and p50/p99 latency (REST publish to push received) served by each
  implementation (``--filter``) and by `sdsync store serve`, to a raw Libp2pTransport
  subscriber taking the pushes with ``serve_pushes``; the messages come from a relay node
  of the first of ``--impls``, publishing by REST.

Every row does the same: a warm-up (``--warmup`` messages or requests, repeated until
they arrive, so meshes and subscriptions are formed), then ``--count`` more, timed by wall
clock from the first send to the last delivery (the receiver's CLOCK_MONOTONIC, which is
system-wide on Linux); nothing is timed inside a node. A row that loses messages says how
many arrived, and its rate is of those. Each publisher or counter that is a Python process
of this script does only that (``--role``), so no two Python roles share a GIL. REST
publishing and counting go through keep-alive HTTP connections; a REST publish (go-waku's
and nwaku's alike) is one HTTP call per message, so a publisher keeps
``--rest-connections`` (4) calls in flight, and may still bound the REST publisher rows
from above.

The LightPush and Filter tables also give each service node's CPU time per message (from
/proc, over the timed phase) and the client's CPU share: a client near 100 % means the
row measured the client, and the CPU per message is then the fairer comparison.

Timing never fails the run: the figures are printed, with ratios against each
implementation's own row (X → X, or served by X). Run it on a quiet machine;
``--count``/``--warmup`` small for a smoke run, ``--parts`` to measure only some of relay,
lightpush, filter, ``--impls`` only some implementations.

    .venv/bin/python bench/waku_vs_go_waku.py
    .venv/bin/python bench/waku_vs_go_waku.py --count 200 --warmup 20 --sizes 100,4000
    .venv/bin/python bench/waku_vs_go_waku.py --impls nwaku --parts lightpush,filter
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import functools
import http.client
import json
import os
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdsync.testing.gowaku import GoWaku, GoWakuOptions, go_waku_binary
from sdsync.testing.nwaku import Nwaku, NwakuOptions, nwaku_binary
from sdsync.transport.libp2p import Libp2pTransport, WakuRelayConfig
from sdsync.waku.filter.rpc import (
    FILTER_PUSH_PROTOCOL,
    FILTER_SUBSCRIBE_PROTOCOL,
    FilterSubscribeRequest,
    FilterSubscribeResponse,
    FilterSubscribeType,
    MessagePush,
)
from sdsync.waku.lightpush.rpc import LIGHTPUSH_V2_PROTOCOL, PushRequest, PushRpc
from sdsync.wire.waku import WakuMessage

TOPIC = "/sds/1/waku-bench"  # a channel; its content topic autoshards to 7 on cluster 1
CONTENT_TOPIC = TOPIC + "/proto"
SHARD = 7
PUBSUB_TOPIC = f"/waku/2/rs/1/{SHARD}"
WARM, TIMED = b"w", b"t"  # a payload's first byte
STAMP = slice(1, 9)  # then the sender's CLOCK_MONOTONIC in ns, big-endian
WAKU = WakuRelayConfig(cluster_id=1)
CACHE = "--rest-relay-cache-capacity=100000"  # both take it; a REST counter drains it
# The harness runs nwaku at DEBUG (a log line per message relayed); INFO is go-waku's default.
NWAKU_FLAGS = ("--log-level=INFO",)  # after the harness's flags: the last wins
PEERING_S, PEERING_TRIES = 30.0, 5  # a service node's connection to its relay peer
BINARIES: dict[str, Callable[[], str]] = {"go-waku": go_waku_binary, "nwaku": nwaku_binary}
POLL_S = 0.01


def payload(tag: bytes, size: int) -> bytes:
    """``size`` bytes (at least 9): ``tag``, the monotonic clock now, padding."""
    return (tag + time.monotonic_ns().to_bytes(8, "big")).ljust(size, b".")


# ----------------------------------------------------------------- the roles (child side)


class Rest:
    """A go-waku or nwaku node's REST API (the same calls) over one keep-alive connection."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        self.connection.request(method, path, body=data, headers=headers)
        response = self.connection.getresponse()
        return response.status, response.read()


TOPIC_PATH = "/relay/v1/messages/" + urllib.parse.quote(PUBSUB_TOPIC, safe="")


def publish_role(rest_port: int, size: int, warmup: int, count: int, connections: int) -> None:
    """Reads ``warm`` or ``go`` lines; publishes ``warmup`` or ``count`` messages through
    a node's REST API for each, over ``connections`` keep-alive connections at once (one
    HTTP call per message, so one connection would bound the rate), then prints
    ``sent <failures>``."""
    rests = [Rest(rest_port) for _ in range(connections)]
    with concurrent.futures.ThreadPoolExecutor(connections) as pool:
        for line in sys.stdin:
            tag, n = (WARM, warmup) if line.strip() == "warm" else (TIMED, count)
            shares = [n // connections + (i < n % connections) for i in range(connections)]
            failed = pool.map(_publish, rests, [tag] * connections, [size] * connections, shares)
            print(f"sent {sum(failed)}", flush=True)


def _publish(rest: Rest, tag: bytes, size: int, n: int) -> int:
    """``n`` messages published over ``rest``; how many the node refused (before its mesh
    formed: no peers)."""
    failures = 0
    for _ in range(n):
        message = {
            "payload": base64.b64encode(payload(tag, size)).decode(),
            "contentTopic": CONTENT_TOPIC,
            "timestamp": time.time_ns(),
        }
        status, _ = rest.call("POST", TOPIC_PATH, message)
        failures += status != 200
    return failures


class Tally:
    """A receiver's count: ``warm`` printed once ``warmup`` warm-up messages arrived,
    then ``done <timed> <last ns>`` once ``count`` timed ones did (or at the deadline)."""

    def __init__(self, warmup: int, count: int) -> None:
        self.warmup, self.count = warmup, count
        self.warm = self.timed = self.last_ns = 0

    def take(self, first_byte: int) -> None:
        if first_byte == WARM[0]:
            self.warm += 1
            if self.warm == self.warmup:
                print("warm", flush=True)
        elif first_byte == TIMED[0]:
            self.timed += 1
            self.last_ns = time.monotonic_ns()

    @property
    def complete(self) -> bool:
        return self.timed >= self.count

    def report(self) -> None:
        print(f"done {self.timed} {self.last_ns}", flush=True)


def count_rest_role(rest_port: int, warmup: int, count: int, patience: float) -> None:
    """Counts what a node's REST message cache receives, polling it."""
    rest = Rest(rest_port)
    rest.call("POST", "/relay/v1/subscriptions", [PUBSUB_TOPIC])
    print("ready", flush=True)
    tally = Tally(warmup, count)
    deadline = time.monotonic() + patience
    while not tally.complete and time.monotonic() < deadline:
        _, body = rest.call("GET", TOPIC_PATH)
        for message in json.loads(body) or []:
            tally.take(base64.b64decode(message["payload"][:4])[0])
        time.sleep(POLL_S)
    tally.report()


async def receive_sdsync_role(warmup: int, count: int, patience: float) -> None:
    """Counts what a Libp2pTransport relay node receives; prints its address first."""
    # No per-peer relay rate limit: the sender is the one peer, and its rate is measured.
    async with Libp2pTransport(waku=WAKU, relay_rate=None) as node:
        inbox = node.subscribe(TOPIC)
        print(f"ready {node.listen_addrs[0]}", flush=True)
        tally = Tally(warmup, count)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(patience):
                async for received in inbox:
                    tally.take(received.data[0])
                    if tally.complete:
                        break
        tally.report()


# ----------------------------------------------------------------- the driver's side


class Child:
    """This script in another process, in one ``--role``, speaking lines."""

    def __init__(self, process: asyncio.subprocess.Process, name: str) -> None:
        self.process, self.name = process, name

    @classmethod
    async def start(cls, name: str, *args: str) -> Child:
        process = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--role", name, *args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        return cls(process, name)

    async def line(self, timeout_s: float) -> str | None:
        """Its next line, or None if none came within ``timeout_s``."""
        assert self.process.stdout is not None
        try:
            raw = await asyncio.wait_for(self.process.stdout.readline(), timeout_s)
        except TimeoutError:
            return None
        if not raw:
            raise RuntimeError(f"the {self.name} process ended (code {self.process.returncode})")
        return raw.decode().strip()

    def tell(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


@dataclass(frozen=True)
class Node:
    """A go-waku or nwaku node this run started: what the bench needs of it."""

    impl: str
    address: str
    rest_port: int
    pid: int
    handle: GoWaku | Nwaku

    @property
    def peer_id(self) -> str:
        return self.address.rsplit("/p2p/", 1)[1]

    async def holds(self, peer: Node) -> bool:
        """Whether it connects to ``peer`` within PEERING_S and is still connected a second
        later."""
        deadline = time.monotonic() + PEERING_S
        while peer.peer_id not in await asyncio.to_thread(self.handle.connected_peers):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        return peer.peer_id in await asyncio.to_thread(self.handle.connected_peers)


@dataclass
class Options:
    warmup: int
    count: int
    patience: float
    concurrency: int
    light_size: int
    rest_connections: int
    binaries: dict[str, str]  # implementation -> its binary, for each of --impls
    tmp: Path
    nodes: list[GoWaku | Nwaku] = field(default_factory=list)

    @property
    def impls(self) -> list[str]:
        return list(self.binaries)

    def node(
        self,
        impl: str,
        static_nodes: tuple[str, ...] = (),
        *,
        cache: bool = False,
        lightpush: bool = False,
        filter: bool = False,
    ) -> Node:
        """A relay node of ``impl`` on shard 7, up; ``cache``: its REST message cache
        large enough for a counter; ``lightpush``/``filter``: serving them."""
        binary, directory = self.binaries[impl], self.tmp / f"{impl}-{len(self.nodes)}"
        extra = [CACHE] if cache else []
        started: GoWaku | Nwaku
        if impl == "go-waku":
            flags = GoWakuOptions(
                static_nodes=static_nodes, lightpush=lightpush, filter=filter, extra=extra
            )
            started = GoWaku(binary, directory, flags)
        else:
            flags = NwakuOptions(
                store=False, static_nodes=static_nodes, lightpush=lightpush, filter=filter,
                extra=[*NWAKU_FLAGS, *extra],
            )  # fmt: skip
            started = Nwaku(binary, directory, flags)
        self.nodes.append(started)  # closed by _stop_nodes even if it never comes up
        address = started.wait_up()
        assert started.process is not None
        return Node(impl, address, started.rest_port, started.process.pid, started)

    async def peered(self, impl: str, peer: Node, **flags: bool) -> Node:
        """A node of ``impl`` dialling ``peer``, once it holds that connection. nwaku
        sometimes drops a go-waku peer right after connecting ("waku metadata request
        failed: read failed: Stream Closed!") and never dials it again: such a node is
        stopped and another started, up to PEERING_TRIES times."""
        for _ in range(PEERING_TRIES):
            node = self.node(impl, (peer.address,), **flags)
            if await node.holds(peer):
                return node
            print(f"({impl} did not hold its connection to {peer.impl}: started again)")
            node.handle.close()
        raise RuntimeError(f"{impl} never held a connection to {peer.impl}")

    def child_args(self) -> list[str]:
        counts = ["--warmup", str(self.warmup), "--count", str(self.count)]
        return [*counts, "--rest-connections", str(self.rest_connections)]


@dataclass
class Result:
    """What a timed phase delivered: how many, in how long; latencies if measured."""

    delivered: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    service_cpu_s: float = 0.0  # the service node's CPU time over the timed phase
    client_cpu_s: float = 0.0  # this process's (the client's), likewise

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, share: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


Sender = Callable[[str], Awaitable[None]]  # "warm" or "go"


def rest_sender(publisher: Child) -> Sender:
    async def send(what: str) -> None:
        publisher.tell(what)
        if what == "warm":  # the timed phase's "sent" is read after it
            await publisher.line(600)

    return send


def sdsync_sender(node: Libp2pTransport, size: int, options: Options) -> Sender:
    async def send(what: str) -> None:
        tag, n = (WARM, options.warmup) if what == "warm" else (TIMED, options.count)
        for _ in range(n):
            await node.publish(TOPIC, payload(tag, size))

    return send


async def timed_relay(send: Sender, receiver: Child, options: Options) -> Result:
    """Warm-up rounds until the receiver has one, then the timed phase."""
    deadline = time.monotonic() + options.patience
    while True:
        await send("warm")
        if await receiver.line(5.0) == "warm":
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"no warm-up round reached the {receiver.name} receiver")
    start = time.monotonic_ns()
    await send("go")
    done = await receiver.line(options.patience + 30)
    assert done is not None and done.startswith("done "), done
    delivered, last_ns = map(int, done.split()[1:])
    return Result(delivered, (last_ns - start) / 1e9)


@contextlib.asynccontextmanager
async def children(*starts: Awaitable[Child]) -> AsyncIterator[list[Child]]:
    started: list[Child] = []
    try:
        for start in starts:
            started.append(await start)
        yield started
    finally:
        for child in started:
            await child.close()


async def impl_to_impl(impl: str, size: int, options: Options) -> Result:
    a = options.node(impl, cache=True)
    b = options.node(impl, (a.address,), cache=True)
    args = options.child_args()
    async with children(
        Child.start("count-rest", "--rest-port", str(b.rest_port), *args, *_patience(options)),
        Child.start("publish-rest", "--rest-port", str(a.rest_port), "--size", str(size), *args),
    ) as (counter, publisher):
        await counter.line(30)
        return await timed_relay(rest_sender(publisher), counter, options)


async def sdsync_to(impl: str, size: int, options: Options) -> Result:
    b = options.node(impl, cache=True)
    args = [*options.child_args(), *_patience(options)]
    async with children(Child.start("count-rest", "--rest-port", str(b.rest_port), *args)) as (
        counter,
    ):
        await counter.line(30)
        async with Libp2pTransport(peers=[b.address], waku=WAKU) as node:
            node.subscribe(TOPIC)
            await node.wait_for_mesh(TOPIC, 1, options.patience)
            return await timed_relay(sdsync_sender(node, size, options), counter, options)


async def to_sdsync(impl: str, size: int, options: Options) -> Result:
    args = options.child_args()
    async with children(Child.start("receive-sdsync", *args, *_patience(options))) as (receiver,):
        ready = await receiver.line(30)
        assert ready is not None
        a = options.node(impl, (ready.split()[1],))
        rest = ["--rest-port", str(a.rest_port), "--size", str(size)]
        async with children(Child.start("publish-rest", *rest, *args)) as (publisher,):
            return await timed_relay(rest_sender(publisher), receiver, options)


async def sdsync_to_sdsync(size: int, options: Options) -> Result:
    async with children(
        Child.start("receive-sdsync", *options.child_args(), *_patience(options))
    ) as (receiver,):
        ready = await receiver.line(30)
        assert ready is not None
        async with Libp2pTransport(peers=[ready.split()[1]], waku=WAKU) as node:
            node.subscribe(TOPIC)
            await node.wait_for_mesh(TOPIC, 1, options.patience)
            return await timed_relay(sdsync_sender(node, size, options), receiver, options)


def _patience(options: Options) -> list[str]:
    return ["--patience", str(options.patience)]


Measure = Callable[[int, Options], Awaitable[Result]]


def relay_pairs(impls: list[str]) -> dict[str, Measure]:
    """The relay rows: X -> X, sdsync -> X and X -> sdsync for each implementation X,
    then sdsync -> sdsync."""
    pairs: dict[str, Measure] = {}
    for impl in impls:
        pairs[f"{impl} -> {impl}"] = functools.partial(impl_to_impl, impl)
        pairs[f"sdsync -> {impl}"] = functools.partial(sdsync_to, impl)
        pairs[f"{impl} -> sdsync"] = functools.partial(to_sdsync, impl)
    pairs["sdsync -> sdsync"] = sdsync_to_sdsync
    return pairs


# ----------------------------------------------------------------- services


class StoreServe:
    """`sdsync store serve` relaying shard 7 (LightPush and Filter on), its relay peer
    ``relay_peer``."""

    def __init__(self, process: asyncio.subprocess.Process, address: str) -> None:
        self.process, self.address = process, address

    @classmethod
    async def start(cls, data_dir: Path, relay_peer: str) -> StoreServe:
        data_dir.mkdir(parents=True)
        with (data_dir / "stderr.log").open("wb") as log:  # py-libp2p's warnings
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sdsync.cli", "store", "serve", "--data-dir", str(data_dir),
                "--listen", "127.0.0.1:0", "--retention", "none", "--relay-shard", str(SHARD),
                "--relay-peer", relay_peer,
                # The load is the point: the per-peer rate limit would answer it 429.
                "--lightpush-rate-limit", "off",
                stdout=asyncio.subprocess.PIPE, stderr=log,
            )  # fmt: skip
        assert process.stdout is not None
        for _ in range(2):  # "listening on <url> …", then "relay on <multiaddrs>, …"
            line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        address = line.split()[4].rstrip(",").split(",")[0]
        return cls(process, address)

    async def close(self) -> None:
        self.process.terminate()
        await self.process.wait()


@dataclass
class Service:
    """A LightPush/Filter service node: its multiaddr and process id."""

    address: str
    pid: int

    def cpu_s(self) -> float:
        """Its CPU time so far, user and system (Linux /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def service(kind: str, peer: Node, options: Options, **flags: bool) -> AsyncIterator[Service]:
    """A service node of ``kind`` (an implementation, or our store) whose relay peer is
    ``peer``."""
    if kind in options.binaries:
        node = await options.peered(kind, peer, **flags)
        yield Service(node.address, node.pid)
        return
    store = await StoreServe.start(options.tmp / f"store-{uuid.uuid4().hex[:8]}", peer.address)
    try:
        yield Service(store.address, store.process.pid)
    finally:
        await store.close()


async def timed(service: Service, phase: Awaitable[Result]) -> Result:
    """``phase``'s result with the CPU time the service and this process spent in it."""
    service_before, client_before = service.cpu_s(), time.process_time()
    result = await phase
    result.service_cpu_s = service.cpu_s() - service_before
    result.client_cpu_s = time.process_time() - client_before
    return result


def light_client() -> Libp2pTransport:
    # It relays nothing, but names shard 7 in its metadata, or go-waku and nwaku drop it.
    return Libp2pTransport(waku=WAKU, announce_shards=(SHARD,))


async def lightpush_once(client: Libp2pTransport, address: str, size: int) -> float | None:
    """One LightPush request; its latency in ms, or None if it was refused."""
    message = WakuMessage(payload(TIMED, size), CONTENT_TOPIC, timestamp=time.time_ns())
    rpc = PushRpc(uuid.uuid4().hex, request=PushRequest(PUBSUB_TOPIC, message))
    start = time.perf_counter()
    try:
        answer = await client.request(address, LIGHTPUSH_V2_PROTOCOL, rpc.to_bytes(), timeout_s=10)
    except (OSError, TimeoutError):
        return None
    elapsed = (time.perf_counter() - start) * 1000
    response = PushRpc.from_bytes(answer).response
    return elapsed if response is not None and response.is_success else None


async def lightpush_row(kind: str, options: Options) -> Result:
    sink = options.node(options.impls[0])  # the same relay peer for every row
    async with service(kind, sink, options, lightpush=True) as node, light_client() as client:
        deadline = time.monotonic() + options.patience
        warmed = 0
        while warmed < options.warmup:  # until the service's relay mesh has formed
            warmed += await lightpush_once(client, node.address, options.light_size) is not None
            if time.monotonic() > deadline:
                raise RuntimeError(f"{kind} never accepted a LightPush request")
        return await timed(node, lightpush_phase(client, node.address, options))


async def lightpush_phase(client: Libp2pTransport, address: str, options: Options) -> Result:
    """``--count`` requests, ``--concurrency`` at a time."""
    pending = iter(range(options.count))
    latencies: list[float] = []

    async def worker() -> None:
        for _ in pending:
            latency = await lightpush_once(client, address, options.light_size)
            if latency is not None:
                latencies.append(latency)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(options.concurrency)))
    return Result(len(latencies), time.perf_counter() - start, latencies)


class Pushes:
    """Filter pushes a subscriber takes: warm-up ones counted, timed ones with latency."""

    def __init__(self) -> None:
        self.warm = 0
        self.latencies_ms: list[float] = []
        self.last_ns = 0

    async def take(self, peer: str, frame: bytes) -> None:
        message = MessagePush.from_bytes(frame).waku_message
        if message is None:
            return
        data = message.payload
        if data[:1] == WARM:
            self.warm += 1
        elif data[:1] == TIMED:
            self.last_ns = time.monotonic_ns()
            sent = int.from_bytes(data[STAMP], "big")
            self.latencies_ms.append((self.last_ns - sent) / 1e6)


async def subscribe(client: Libp2pTransport, address: str) -> None:
    request = FilterSubscribeRequest(
        uuid.uuid4().hex, FilterSubscribeType.SUBSCRIBE, PUBSUB_TOPIC, (CONTENT_TOPIC,)
    )
    answer = await client.request(address, FILTER_SUBSCRIBE_PROTOCOL, request.to_bytes())
    response = FilterSubscribeResponse.from_bytes(answer)
    if response.status_code != 200:
        raise RuntimeError(f"Filter subscription refused: {response}")


async def until(check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


async def filter_row(kind: str, options: Options) -> Result:
    source = options.node(options.impls[0])  # the same source for every row
    pushes = Pushes()
    client = light_client()
    await client.serve_pushes(FILTER_PUSH_PROTOCOL, pushes.take)
    args = ["--rest-port", str(source.rest_port), "--size", str(options.light_size)]
    async with (
        service(kind, source, options, filter=True) as node,
        client,
        children(Child.start("publish-rest", *args, *options.child_args())) as (publisher,),
    ):
        await subscribe(client, node.address)
        deadline = time.monotonic() + options.patience
        while True:  # until the service's relay mesh with the source has formed
            publisher.tell("warm")
            await publisher.line(600)
            if await until(lambda: pushes.warm >= options.warmup, 5.0):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no warm-up push came from {kind}")
        return await timed(node, filter_phase(publisher, pushes, options))


async def filter_phase(publisher: Child, pushes: Pushes, options: Options) -> Result:
    """``--count`` messages published at the source, until all are pushed (or patience)."""
    start = time.monotonic_ns()
    publisher.tell("go")
    await until(lambda: len(pushes.latencies_ms) >= options.count, options.patience)
    seconds = (pushes.last_ns - start) / 1e9
    return Result(len(pushes.latencies_ms), seconds, pushes.latencies_ms)


# ----------------------------------------------------------------- the report


def ratios(rate: float, anchors: list[float]) -> str:
    return " ".join(f"{rate / anchor:>5.2f}x" if anchor else "     -" for anchor in anchors)


def relay_table(
    results: dict[tuple[str, int], Result], sizes: list[int], count: int, impls: list[str]
) -> None:
    names = " and ".join(f"{impl} -> {impl}'s" for impl in impls)
    print(f"\nRelay, messages/s between two nodes ({count} per cell; x: ratios to {names})")
    width = 10 + 7 * len(impls)
    print(f"{'':<20}" + "".join(f"{size:>{width - 2},} B" for size in sizes))
    for pair in relay_pairs(impls):
        cells = []
        for size in sizes:
            result = results[pair, size]
            anchors = [results[f"{impl} -> {impl}", size].rate for impl in impls]
            short = "" if result.delivered == count else f" [{result.delivered}]"
            cells.append(f"{result.rate:>9,.0f} {ratios(result.rate, anchors)}{short}".rjust(width))
        print(f"{pair:<20}" + "".join(cells))


def service_table(
    title: str, unit: str, results: dict[str, Result | None], count: int, impls: list[str]
) -> None:
    print(f"\n{title} ({count} each; CPU: the service's ms per message, the client's share)")
    header = f"{'served by':<20}{unit:>10}" + "".join(f"{'x ' + impl:>10}" for impl in impls)
    print(
        f"{header}{'p50 ms':>9}{'p99 ms':>9}{'delivered':>11}{'svc CPU ms':>12}{'client CPU':>12}"
    )
    anchors = [getattr(results[impl], "rate", 0.0) for impl in impls]
    for kind, result in results.items():
        if result is None:
            print(f"{kind:<20}{'not measured':>12}")
            continue
        per_message = 1000 * result.service_cpu_s / max(1, result.delivered)
        client_share = result.client_cpu_s / result.seconds if result.seconds > 0 else 0.0
        against = "".join(
            f"{result.rate / anchor:>9.2f}x" if anchor else f"{'-':>10}" for anchor in anchors
        )
        print(
            f"{kind:<20}{result.rate:>10,.0f}{against}{result.percentile(0.5):>9.1f}"
            f"{result.percentile(0.99):>9.1f}{result.delivered:>11}{per_message:>12.2f}"
            f"{client_share:>11.0%}"
        )


async def run(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    parts = set(args.parts.split(","))
    impls = args.impls.split(",")
    unknown = set(impls) - set(BINARIES)
    if unknown or not impls:
        raise SystemExit(f"--impls: {sorted(unknown)} unknown; choose from {list(BINARIES)}")
    with tempfile.TemporaryDirectory(prefix="waku-bench-") as tmp:
        options = Options(
            args.warmup, args.count, args.patience, args.concurrency, args.light_size,
            args.rest_connections, {impl: BINARIES[impl]() for impl in impls}, Path(tmp),
        )  # fmt: skip
        try:
            if "relay" in parts:
                relay: dict[tuple[str, int], Result] = {}
                for size in sizes:
                    for pair, measure in relay_pairs(impls).items():
                        relay[pair, size] = await _alone(measure(size, options), options)
                relay_table(relay, sizes, args.count, impls)
            kinds = (*impls, "sdsync store serve")
            if "lightpush" in parts:
                pushed = {k: await _row(k, lightpush_row(k, options), options) for k in kinds}
                title = f"LightPush 2.0.0-beta1, {args.light_size} B, {args.concurrency} in flight"
                title += f", relayed to {impls[0]}"
                service_table(title, "req/s", pushed, args.count, impls)
            if "filter" in parts:
                filtered = {k: await _row(k, filter_row(k, options), options) for k in kinds}
                title = f"Filter pushes, {args.light_size} B, published on {impls[0]}"
                service_table(title, "pushes/s", filtered, args.count, impls)
        finally:
            _stop_nodes(options)


async def _row(kind: str, measure: Awaitable[Result], options: Options) -> Result | None:
    """A service row, or None (the reason printed) if it could not be measured."""
    try:
        return await _alone(measure, options)
    except (RuntimeError, OSError) as exc:
        print(f"({kind}: not measured: {str(exc).splitlines()[0]})", flush=True)
        return None


async def _alone(measure: Awaitable[Result], options: Options) -> Result:
    """``measure``, then the go-waku and nwaku nodes it started stopped."""
    try:
        return await measure
    finally:
        _stop_nodes(options)


def _stop_nodes(options: Options) -> None:
    for node in options.nodes:
        node.close()
    options.nodes.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,4000,40000", help="relay payload bytes, a list")
    parser.add_argument("--count", type=int, default=2000, help="timed messages per cell")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--patience", type=float, default=120.0, help="seconds a cell may take")
    parser.add_argument("--concurrency", type=int, default=8, help="LightPush requests in flight")
    parser.add_argument("--light-size", type=int, default=100, help="LightPush/Filter bytes")
    parser.add_argument(
        "--rest-connections", type=int, default=4, help="a REST publisher's connections"
    )
    parser.add_argument("--parts", default="relay,lightpush,filter", help="what to measure")
    parser.add_argument(
        "--impls", default="go-waku,nwaku", help="the implementations beside sdsync, a list"
    )
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--rest-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "publish-rest":
        publish_role(args.rest_port, args.size, args.warmup, args.count, args.rest_connections)
    elif args.role == "count-rest":
        count_rest_role(args.rest_port, args.warmup, args.count, args.patience)
    elif args.role == "receive-sdsync":
        asyncio.run(receive_sdsync_role(args.warmup, args.count, args.patience))
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
