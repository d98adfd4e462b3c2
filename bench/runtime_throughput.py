"""End-to-end throughput of ReliableChannel over MemoryTransport, with and without SQLite.

N participants share one channel on an in-process network (no loss, no latency). They
publish M content messages round robin as fast as ``send()`` returns; the clock stops when
every participant's application has taken every message of the others from ``events()``.
Each mode runs in the same process, back to back, on the same workload:

* ``memory``: no ``state_dir`` (the anchor);
* ``normal``: ``state_dir``, SQLite WAL with ``synchronous=NORMAL`` (survives kill -9);
* ``full``:   ``state_dir``, SQLite WAL with ``synchronous=FULL`` (also survives power loss:
  an fsync per step).

Printed: messages/s end to end, SQLite commits per second, bytes on disk per message, and
each mode's rate as a ratio of the in-memory one.

Then ``--scale N`` (default 20,000; 100,000 for the full claim) checks that the cost of a
step does not grow with the log: one stored channel (sans-I/O driver, no network) receives
N messages of a peer, keeping only 5,000 log entries in memory, and the bench prints its
receive+commit rate over the first and the last 1,000 messages, their ratio, the database
size and how long reopening it takes. Timing never fails the run.

    .venv/bin/python bench/runtime_throughput.py [--participants 4] [--messages 1000] [--small]
        [--scale 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sdsync.core import BloomParams, ChannelConfig, MessageChannel, MessageDelivered
from sdsync.runtime import ChannelDriver, ChannelState, ReliableChannel, RuntimeConfig
from sdsync.runtime.event_log import DURABLE_EVENTS
from sdsync.testing.memory import MemoryNetwork

# Syncs, sweeps and resends are not what is measured: keep them out of the way.
RUNTIME = RuntimeConfig(sync_interval_ms=600_000, resend_interval_ms=600_000)


@dataclass
class Result:
    mode: str
    messages: int
    seconds: float
    commits: int
    disk_bytes: int

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


async def run(mode: str, participants: int, messages: int, config: ChannelConfig) -> Result:
    net = MemoryNetwork(seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        members = [
            ReliableChannel(
                net.transport(f"p{i}"),
                "bench",
                f"p{i}",
                config=config,
                runtime=RUNTIME,
                rng=random.Random(i),
                state_dir=None if mode == "memory" else Path(tmp) / f"p{i}",
                synchronous="FULL" if mode == "full" else "NORMAL",
            )
            for i in range(participants)
        ]
        commits = [0] * participants
        if mode != "memory":
            for i, m in enumerate(members):
                commit = m.state.commit  # type: ignore[union-attr]

                def counting(_i=i, _commit=commit):  # type: ignore[no-untyped-def]
                    commits[_i] += 1
                    return _commit()

                m.state.commit = counting  # type: ignore[union-attr, method-assign]
        for m in members:
            await m.start()
        expected = messages - messages // participants  # what each one receives
        done = [asyncio.Event() for _ in members]

        async def consume(i: int, member: ReliableChannel) -> None:
            got = 0
            async for event in member.events():
                if isinstance(event, MessageDelivered):
                    got += 1
                    if got >= expected:
                        done[i].set()
                        return

        consumers = [asyncio.create_task(consume(i, m)) for i, m in enumerate(members)]
        start = time.perf_counter()
        for n in range(messages):
            await members[n % participants].send(f"message {n}".encode())
            await asyncio.sleep(0)  # let receivers keep up, as a real loop would
        for event in done:
            await event.wait()
        seconds = time.perf_counter() - start
        for task in consumers:
            await task
        disk = 0
        for m in members:
            await m.close()
        if mode != "memory":
            disk = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
        return Result(mode, messages, seconds, sum(commits), disk)


def scale(n: int) -> None:
    config = ChannelConfig(
        bloom=BloomParams(1_000, 0.001), causal_history_size=20, max_log_entries=5_000
    )
    start = 1_700_000_000_000
    sender = MessageChannel("bench", "sender", now_ms=start, config=config)
    wires = [sender.send(f"message {i}".encode(), start + i).data for i in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "receiver.sqlite"

        def open_receiver() -> tuple[ChannelDriver, ChannelState]:
            channel = MessageChannel("bench", "receiver", now_ms=start, config=config)
            driver = ChannelDriver(channel, RUNTIME, random.Random(0), start)
            return driver, ChannelState(path, driver)

        driver, state = open_receiver()
        marks = {0, 1_000, n - 1_000, n}
        times: dict[int, float] = {}
        for i, data in enumerate(wires):
            if i in marks:
                times[i] = time.perf_counter()
            step = driver.receive(data, start + i)
            # As the owner does: number the events, commit them with the step, and the
            # application acknowledges them (stored with the next commit).
            numbered = state.events.record(e for e in step.events if isinstance(e, DURABLE_EVENTS))
            state.commit()
            if numbered:
                state.events.ack(numbered[-1].seq or 0)
        times[n] = time.perf_counter()
        state.close()
        size = sum(f.stat().st_size for f in Path(tmp).iterdir())
        opened = time.perf_counter()
        driver, state = open_receiver()
        reopen = time.perf_counter() - opened
        assert len(state.history()) == n
        assert state.events.unacknowledged == 0  # acknowledged, and stored at close
        state.close()
    first = 1_000 / (times[1_000] - times[0])
    last = 1_000 / (times[n] - times[n - 1_000])
    print(f"\nscale: one stored channel receiving {n} messages (5,000 in memory)")
    print(
        f"receive+commit msg/s: first 1k {first:.0f}, last 1k {last:.0f}, ratio {last / first:.2f}"
    )
    print(f"database {size / 1e6:.1f} MB ({size / n:.0f} B/message), reopen {reopen:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--participants", type=int, default=4)
    parser.add_argument("--messages", type=int, default=1_000)
    parser.add_argument("--full-messages", type=int, default=None, help="messages for FULL")
    parser.add_argument(
        "--small", action="store_true", help="bloom 1,000 ids and causal history 20"
    )
    parser.add_argument("--scale", type=int, default=20_000, help="0 to skip")
    args = parser.parse_args()
    config = ChannelConfig()
    if args.small:
        config = ChannelConfig(bloom=BloomParams(1_000, 0.001), causal_history_size=20)
    print(
        f"{args.participants} participants, bloom {config.bloom.capacity}/"
        f"{config.bloom.error_rate}, causal history {config.causal_history_size}"
    )
    results = [
        asyncio.run(run("memory", args.participants, args.messages, config)),
        asyncio.run(run("normal", args.participants, args.messages, config)),
        asyncio.run(run("full", args.participants, args.full_messages or args.messages, config)),
    ]
    anchor = results[0].rate
    print(
        f"{'mode':<8} {'messages':>8} {'seconds':>8} {'msg/s':>8} {'commits/s':>10}"
        f" {'disk/msg':>9} {'vs memory':>10}"
    )
    for r in results:
        per_msg = f"{r.disk_bytes / r.messages / 1024:.1f} KB" if r.disk_bytes else "-"
        print(
            f"{r.mode:<8} {r.messages:>8} {r.seconds:>8.2f} {r.rate:>8.0f}"
            f" {r.commits / r.seconds:>10.0f} {per_msg:>9} {r.rate / anchor:>10.2f}"
        )
    if args.scale:
        scale(max(args.scale, 2_000))


if __name__ == "__main__":
    main()
