"""The participant that test_kill9 starts, kills with SIGKILL and restarts (a script).

Run as a fork server so that a life costs a fork, not an interpreter start: it imports
everything once, then obeys lines on stdin — ``spawn <life> <finish or ->`` forks a
participant and answers ``spawned <pid>``; ``kill <pid>`` sends SIGKILL, reaps it and
answers ``dead``; ``wait <pid>`` reaps a participant that exits by itself and answers
``exited <status>``.

A participant keeps its channel in ``--state-dir`` and talks UDP to the test on 127.0.0.1.
It appends one line per fact to ``<out-dir>/life-<n>.txt``, each with a single write:
``ready <port>``, ``sent <id>`` once ``send()`` has returned, ``delivered <seq> <id>`` once
the application has taken a MessageDelivered from ``numbered_events()`` (which acknowledges
it when the application asks for the next event), and ``done`` (when finishing: no more
sending; exit once all ``finish`` messages of the test are delivered, every event is
acknowledged and ours are acknowledged by the test).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from udp_transport import UdpTransport

from sdsync.core import BloomParams, ChannelConfig, MessageDelivered, RepairConfig
from sdsync.runtime import ReliableChannel, RuntimeConfig

CONFIG = ChannelConfig(
    bloom=BloomParams(1_000, 0.001),
    causal_history_size=20,
    # One peer: its bloom filter is the acknowledgement. A false positive then ends the
    # resends of a message the peer lacks, and SDS-R repairs it (there is no store).
    possible_acks_threshold=1,
    repair=RepairConfig(t_min_ms=100, t_max_ms=400),
)
RUNTIME = RuntimeConfig(
    sync_interval_ms=100,
    resend_interval_ms=100,
    resend_possibly_acknowledged_ms=200,
    resend_backoff=1.0,
    max_attempts=1_000_000,
    incoming_sweep_ms=50,
)


class Log:
    """Facts for the test, each line one write(2): a kill loses at most the line in flight."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def say(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())


async def main(state_dir: Path, parent_port: int, life: int, finish: int | None, log: Log) -> None:
    transport = UdpTransport()
    port = await transport.open()
    transport.peers = [("127.0.0.1", parent_port)]
    channel = ReliableChannel(
        transport,
        "crash",
        "child",
        config=CONFIG,
        runtime=RUNTIME,
        rng=random.Random(life),
        state_dir=state_dir,
    )
    await channel.start()
    log.say(f"ready {port}")

    async def send_forever() -> None:
        for i in range(1_000_000):
            mid = await channel.send(f"child life {life} line {i}".encode())
            log.say(f"sent {mid}")
            await asyncio.sleep(0.01)

    async def deliver() -> None:
        async for delivery in channel.numbered_events():
            if isinstance(delivery.event, MessageDelivered):
                log.say(f"delivered {delivery.seq} {delivery.event.message_id}")

    tasks = [asyncio.create_task(deliver())]
    if finish is None:
        tasks.append(asyncio.create_task(send_forever()))
        await asyncio.gather(*tasks)
    state = channel.state
    assert state is not None
    while True:  # finishing: wait for the test's messages and for our acknowledgements
        await asyncio.sleep(0.05)
        from_test = sum(1 for r in channel.history() if r.sender_id == "test")
        handed = state.events.acked_seq == state.events.last_seq
        if from_test == finish and handed and not channel.channel.outgoing_ids():
            break
    await channel.close()
    log.say("done")


def serve(state_dir: Path, parent_port: int, out_dir: Path) -> None:
    for line in sys.stdin:
        command, arg, *rest = line.split()
        if command == "spawn":
            life = int(arg)
            finish = None if rest[0] == "-" else int(rest[0])
            pid = os.fork()
            if pid == 0:
                log = Log(out_dir / f"life-{life}.txt")
                asyncio.run(main(state_dir, parent_port, life, finish, log))
                os._exit(0)
            answer = f"spawned {pid}"
        elif command == "kill":
            os.kill(int(arg), signal.SIGKILL)
            os.waitpid(int(arg), 0)
            answer = "dead"
        else:  # wait
            _, status = os.waitpid(int(arg), 0)
            answer = f"exited {status}"
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--parent-port", type=int, required=True)
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args()
    serve(args.state_dir, args.parent_port, args.out_dir)
