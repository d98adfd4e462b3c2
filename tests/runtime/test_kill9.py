"""Crash consistency for real: a participant process killed with SIGKILL again and again.

``kill9_peer.py`` runs a ReliableChannel with a ``state_dir`` in a process of its own
(forked from a server that imported everything once, so a life starts in milliseconds),
sending a message every few milliseconds and receiving this test's stream over loopback
UDP. The test kills it with SIGKILL at a random (seeded) moment, 20 times, and after each
death opens its state and checks:

* every message whose ``send()`` had returned, and every message the application was
  handed, is in the stored log;
* the stored log only ever grew: the previous log is a subsequence of the new one, in
  (Lamport timestamp, id) order;
* the Lamport clock never went backwards, nor below anything the process transmitted;
* nothing was handed to the application twice, and nothing handed is offered again.

Finally the process runs without being killed until it has every message of the test and
all of its own are acknowledged: then the test has every message the process accepted, and
each of the test's messages reached the process's application exactly once — except that a
kill may fall between the delivered cursor being stored and the line being printed, which
leaves a delivery handed over (cursor past it) but unprinted: at most one per kill.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kill9_peer import CONFIG, RUNTIME
from udp_transport import UdpTransport

from sdsync.core import MessageChannel, MessageReceived
from sdsync.runtime import ChannelDriver, ChannelState, LogRecord, ReliableChannel, state_path

PEER = Path(__file__).parent / "kill9_peer.py"
KILLS = 20
PATIENCE_S = 60  # liveness bound only: the finish normally takes well under a second


@dataclass
class Seen:
    """What the killed process said and what its state held, across its lives."""

    sent: set[str] = field(default_factory=set)
    delivered: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    lamport: int = 0
    transmitted_lamport: int = 0


@dataclass
class Stored:
    log: list[LogRecord]
    lamport: int
    pending: list[str]


def inspect(path: Path) -> Stored:
    """Open the dead process's state as a restart would, and read it."""
    channel = MessageChannel("crash", "child", now_ms=0, config=CONFIG)
    state = ChannelState(path, ChannelDriver(channel, RUNTIME, random.Random(0), 0))
    try:
        pending = [d.event.message_id for d in state.pending]
        return Stored(state.history(), channel.lamport_timestamp, pending)
    finally:
        state.close()


def check_after_death(seen: Seen, stored: Stored) -> None:
    ids = [r.message_id for r in stored.log]
    keys = [(r.lamport_timestamp, r.message_id) for r in stored.log]
    assert keys == sorted(keys)
    assert seen.sent <= set(ids), "an accepted send was lost"
    assert set(seen.delivered) <= set(ids), "a delivered message was lost"
    assert len(seen.delivered) == len(set(seen.delivered)), "delivered twice"
    assert not set(stored.pending) & set(seen.delivered), "offered again after delivery"
    before = set(seen.log)
    assert [mid for mid in ids if mid in before] == seen.log, "the log lost or reordered"
    assert stored.lamport >= seen.lamport, "the Lamport clock went backwards"
    assert stored.lamport >= seen.transmitted_lamport
    seen.log = ids
    seen.lamport = stored.lamport


class Zygote:
    """The fork server of kill9_peer.py: one interpreter start, a fork per life."""

    def __init__(self, proc: asyncio.subprocess.Process, out_dir: Path) -> None:
        self.proc = proc
        self.out_dir = out_dir

    @classmethod
    async def start(cls, state_dir: Path, port: int, out_dir: Path) -> Zygote:
        out_dir.mkdir()
        args = [str(PEER), "--state-dir", str(state_dir), "--parent-port", str(port)]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *args,
            "--out-dir",
            str(out_dir),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: see stop()
        )
        return cls(proc, out_dir)

    async def ask(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()
        return (await asyncio.wait_for(self.proc.stdout.readline(), PATIENCE_S)).decode().strip()

    async def spawn(self, life: int, finish: int | None) -> tuple[int, int]:
        """Fork a participant; its pid and UDP port once it is ready."""
        answer = await self.ask(f"spawn {life} {'-' if finish is None else finish}")
        pid = int(answer.split()[1])
        for _ in range(int(PATIENCE_S / 0.01)):
            lines = self.lines(life)
            if lines and lines[0].startswith("ready "):
                return pid, int(lines[0].split()[1])
            await asyncio.sleep(0.01)
        raise AssertionError(f"life {life} never got ready")

    def lines(self, life: int) -> list[str]:
        path = self.out_dir / f"life-{life}.txt"
        return path.read_text().splitlines() if path.exists() else []

    async def stop(self) -> None:
        """Kill the server and any participant it forked (same process group)."""
        if self.proc.returncode is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()


def record(seen: Seen, lines: list[str]) -> None:
    for line in lines:
        kind, _, mid = line.partition(" ")
        if kind == "sent":
            seen.sent.add(mid)
        elif kind == "delivered":
            seen.delivered.append(mid)


async def scenario(state_dir: Path, zygote: Zygote, port: int, transport: UdpTransport) -> None:
    rng = random.Random(9)
    test = ReliableChannel(
        transport, "crash", "test", config=CONFIG, runtime=RUNTIME, rng=random.Random(1)
    )
    await test.start()
    seen = Seen()
    ours: list[str] = []

    stop_feeding = asyncio.Event()

    async def feed() -> None:
        while not stop_feeding.is_set():
            ours.append(await test.send(f"test line {len(ours)}".encode()))
            await asyncio.sleep(0.04)

    async def watch() -> None:
        async for event in test.events():
            if isinstance(event, MessageReceived) and event.sender_id == "child":
                seen.transmitted_lamport = max(seen.transmitted_lamport, event.lamport_timestamp)

    background = [asyncio.create_task(feed()), asyncio.create_task(watch())]
    path = state_path(state_dir, "crash")
    for life in range(KILLS):
        pid, child_port = await zygote.spawn(life, None)
        transport.peers = [("127.0.0.1", child_port)]
        await asyncio.sleep(rng.uniform(0.05, 0.4))
        assert await zygote.ask(f"kill {pid}") == "dead"  # SIGKILL: no cleanup of any kind
        record(seen, zygote.lines(life))
        check_after_death(seen, inspect(path))
    stop_feeding.set()
    await background[0]  # the process must wait for exactly len(ours) messages

    pid, child_port = await zygote.spawn(KILLS, len(ours))
    transport.peers = [("127.0.0.1", child_port)]
    assert await zygote.ask(f"wait {pid}") == "exited 0"
    lines = zygote.lines(KILLS)
    assert lines[-1] == "done"
    record(seen, lines)
    check_after_death(seen, inspect(path))

    async def test_has_all() -> None:
        while not all(mid in test.channel.log for mid in seen.sent):
            await asyncio.sleep(0.05)

    await asyncio.wait_for(test_has_all(), PATIENCE_S)
    for task in background:
        task.cancel()
    await test.close()

    assert len(seen.sent) > KILLS  # the process did work between kills
    assert set(seen.delivered) <= set(ours)
    with sqlite3.connect(path) as db:
        handed = {
            mid
            for (mid,) in db.execute(
                "SELECT message_id FROM log WHERE delivered_seq <="
                " (SELECT delivered_cursor FROM channel)"
            )
        }
    unprinted = set(ours) - set(seen.delivered)
    assert unprinted <= handed  # every message of the test reached the application ...
    assert len(unprinted) <= KILLS  # ... and only a kill can swallow its printed line


def test_kill9_loses_nothing_and_delivers_once(tmp_path: Path) -> None:
    async def run() -> None:
        transport = UdpTransport()
        port = await transport.open()
        state_dir = tmp_path / "state"
        zygote = await Zygote.start(state_dir, port, tmp_path / "lives")
        try:
            await scenario(state_dir, zygote, port, transport)
        finally:
            await zygote.stop()  # never leave a participant running
            await transport.close()

    asyncio.run(run())
