"""The reliability API through `sdsync reliability serve` against the same calls in-process.

Two participants: alice wraps, bob unwraps, N messages of 64 bytes one after the other
(each wrap's bytes go straight to bob's unwrap). The same workload runs three ways, back
to back in one run:

* ``in-process``: two :class:`~sdsync.ReliabilityManager` objects in this process (the
  anchor);
* ``grpc``: two ``sdsync reliability serve`` processes on 127.0.0.1 (port 0), called
  through a Python gRPC client (``WrapOutgoingMessage`` on alice's, ``UnwrapReceivedMessage``
  on bob's), each with an ``Events`` subscriber draining its stream on a thread;
* ``grpc+state``: the same with ``--state-dir`` (SQLite, ``synchronous=NORMAL``) on both.

Printed per way: wrap+unwrap pairs per second, p50/p99 of a wrap call and of an unwrap
call, and the ratio of each to the in-process figure. The first 100 messages warm up and
are not counted. Syncs and resends are pushed out of the way (10-minute intervals). Every
unwrap must give back the payload just wrapped with no missing dependency, or the run
stops with an error: a fast wrong answer is not a result. Timing never fails the run.

    .venv/bin/python bench/reliability_grpc.py [--messages 2000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from sdsync import ReliabilityManager
from sdsync.reliability import reliability_pb2 as pb
from sdsync.reliability import reliability_pb2_grpc as pb_grpc
from sdsync.runtime import RuntimeConfig

WARM_UP = 100
PAYLOAD = b"x" * 64
CHANNEL = "bench"
QUIET_MS = 600_000  # no syncs or resends while measuring
QUIET_FLAGS = ("--sync-interval-ms", str(QUIET_MS), "--resend-interval-ms", str(QUIET_MS))


@dataclass
class Result:
    way: str
    messages: int
    pairs_per_s: float
    wrap_p50_us: float
    wrap_p99_us: float
    unwrap_p50_us: float
    unwrap_p99_us: float


#: bytes in; the payload for the application and the missing dependencies out.
Unwrap = Callable[[bytes], tuple[bytes | None, list[str]]]


def measure(way: str, wrap: Callable[[bytes], bytes], unwrap: Unwrap, messages: int) -> Result:
    wraps: list[int] = []
    unwraps: list[int] = []
    started = 0.0
    for i in range(WARM_UP + messages):
        if i == WARM_UP:
            started = time.perf_counter()
        payload = PAYLOAD + i.to_bytes(4, "big")
        t0 = time.perf_counter_ns()
        data = wrap(payload)
        t1 = time.perf_counter_ns()
        got, missing = unwrap(data)
        t2 = time.perf_counter_ns()
        if got != payload or missing:
            raise SystemExit(f"{way}: message {i} unwrapped as {got!r}, missing {missing}")
        if i >= WARM_UP:
            wraps.append(t1 - t0)
            unwraps.append(t2 - t1)
    seconds = time.perf_counter() - started
    return Result(
        way,
        messages,
        messages / seconds,
        percentile(wraps, 0.50),
        percentile(wraps, 0.99),
        percentile(unwraps, 0.50),
        percentile(unwraps, 0.99),
    )


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1_000


def in_process(messages: int) -> Result:
    runtime = RuntimeConfig(sync_interval_ms=QUIET_MS, resend_interval_ms=QUIET_MS)
    alice = ReliabilityManager("alice", runtime=runtime)
    bob = ReliabilityManager("bob", runtime=runtime)
    bob.open_channel(CHANNEL)

    def wrap(payload: bytes) -> bytes:
        return alice.wrap_outgoing_message(payload, CHANNEL)

    def unwrap(data: bytes) -> tuple[bytes | None, list[str]]:
        result = bob.unwrap_received_message(data)
        return result.payload, result.missing_dependencies

    return measure("in-process", wrap, unwrap, messages)


@contextmanager
def server(participant: str, logs: Path, state_dir: Path | None) -> Iterator[str]:
    """A ``reliability serve`` process on 127.0.0.1; its address."""
    command = [sys.executable, "-m", "sdsync.cli", "reliability", "serve"]
    command += ["--listen", "127.0.0.1:0", "--participant", participant, *QUIET_FLAGS]
    if state_dir is not None:
        command += ["--state-dir", str(state_dir)]
    env = {k: v for k, v in os.environ.items() if k != "SDSYNC_RELIABILITY_TOKEN"}
    with logs.open("ab") as stderr:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
        )
    try:
        assert process.stdout is not None
        first = process.stdout.readline().strip()
        if not first.startswith("listening on "):
            raise SystemExit(f"the server did not start: {first!r}; see {logs}")
        yield first.removeprefix("listening on ")
    finally:
        process.terminate()
        process.wait(60)


def drain(stub: pb_grpc.ReliabilityStub) -> Callable[[], None]:
    """Follow the server's event stream on a thread, so its queue never fills."""
    stream = stub.Events(pb.EventsRequest())

    def follow() -> None:
        try:
            for _ in stream:
                pass
        except grpc.RpcError:
            pass  # cancelled at the end

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()

    def stop() -> None:
        stream.cancel()
        thread.join(10)

    return stop


def over_grpc(way: str, messages: int, root: Path, durable: bool) -> Result:
    with ExitStack() as stack:
        stubs = []
        for name in ("alice", "bob"):
            state = root / f"{way}-{name}" if durable else None
            address = stack.enter_context(server(name, root / f"{way}-{name}.log", state))
            channel = stack.enter_context(grpc.insecure_channel(address))
            stub = pb_grpc.ReliabilityStub(channel)
            stack.callback(drain(stub))
            stub.OpenChannel(pb.OpenChannelRequest(channel_id=CHANNEL))
            stubs.append(stub)
        alice, bob = stubs

        def wrap(payload: bytes) -> bytes:
            request = pb.WrapOutgoingMessageRequest(channel_id=CHANNEL, payload=payload)
            return bytes(alice.WrapOutgoingMessage(request).data)

        def unwrap(data: bytes) -> tuple[bytes | None, list[str]]:
            answer = bob.UnwrapReceivedMessage(pb.UnwrapReceivedMessageRequest(data=data))
            payload = bytes(answer.payload) if answer.HasField("payload") else None
            return payload, list(answer.missing_dependencies)

        return measure(way, wrap, unwrap, messages)


def report(results: list[Result]) -> None:
    anchor = results[0]
    print(
        f"{'way':<12} {'pairs/s':>9} {'ratio':>6} {'wrap p50':>9} {'p99':>8} "
        f"{'unwrap p50':>11} {'p99':>8} {'p50 ratio (wrap, unwrap)':>26}"
    )
    for r in results:
        print(
            f"{r.way:<12} {r.pairs_per_s:>9,.0f} {r.pairs_per_s / anchor.pairs_per_s:>6.3f} "
            f"{r.wrap_p50_us:>7,.0f}µs {r.wrap_p99_us:>6,.0f}µs "
            f"{r.unwrap_p50_us:>9,.0f}µs {r.unwrap_p99_us:>6,.0f}µs "
            f"{r.wrap_p50_us / anchor.wrap_p50_us:>12.1f}× "
            f"{r.unwrap_p50_us / anchor.unwrap_p50_us:>11.1f}×"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2_000)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sdsync-bench-") as tmp:
        root = Path(tmp)
        results = [
            in_process(args.messages),
            over_grpc("grpc", args.messages, root, durable=False),
            over_grpc("grpc+state", args.messages, root, durable=True),
        ]
    print(f"{args.messages:,} messages of {len(PAYLOAD) + 4} bytes, alice wraps, bob unwraps")
    report(results)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")


if __name__ == "__main__":
    main()
