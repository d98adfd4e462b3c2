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
* deliveries are at least once under stable numbers: every message of the test in the
  stored log was printed by the application or is still waiting, unacknowledged, to be
  reported again; a number always names the same message and a message always has the
  same number, across lives; what a life saw acknowledged in the stored state is never
  printed again by a later life.

Finally the process runs without being killed until it has every message of the test, its
application acknowledged every event and all of its own messages are acknowledged: then
the test has every message the process accepted, and each of the test's messages reached
the process's application, under one number (several prints of it are redeliveries after
a kill, never two numbers).
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

from sdsync.core import MessageChannel, MessageDelivered, MessageReceived
from sdsync.runtime import ChannelDriver, ChannelState, LogRecord, ReliableChannel, state_path

PEER = Path(__file__).parent / "kill9_peer.py"
KILLS = 20
PATIENCE_S = 60  # liveness bound only: the finish normally takes well under a second


@dataclass
class Seen:
    """What the killed process said and what its state held, across its lives."""

    sent: set[str] = field(default_factory=set)
    # Every "delivered" line, in order: (number, message id).
    delivered: list[tuple[int, str]] = field(default_factory=list)
    numbers: dict[int, str] = field(default_factory=dict)  # number -> message
    number_of: dict[str, int] = field(default_factory=dict)  # message -> number
    acked: int = 0  # the acknowledged number stored as of the last death
    log: list[str] = field(default_factory=list)
    lamport: int = 0
    transmitted_lamport: int = 0


@dataclass
class Stored:
    log: list[LogRecord]
    lamport: int
    acked: int
    pending: dict[int, str]  # deliveries not acknowledged: number -> message


def inspect(path: Path) -> Stored:
    """Open the dead process's state as a restart would, and read it."""
    channel = MessageChannel("crash", "child", now_ms=0, config=CONFIG)
    state = ChannelState(path, ChannelDriver(channel, RUNTIME, random.Random(0), 0))
    try:
        pending: dict[int, str] = {}
        after = state.events.acked_seq
        while batch := state.events.read(after, 100):
            for d in batch:
                assert d.seq is not None and d.seq > state.events.acked_seq
                if isinstance(d.event, MessageDelivered):
                    pending[d.seq] = d.event.message_id
            after = batch[-1].seq or after
        return Stored(state.history(), channel.lamport_timestamp, state.events.acked_seq, pending)
    finally:
        state.close()


def check_after_death(seen: Seen, stored: Stored) -> None:
    ids = [r.message_id for r in stored.log]
    keys = [(r.lamport_timestamp, r.message_id) for r in stored.log]
    assert keys == sorted(keys)
    assert seen.sent <= set(ids), "an accepted send was lost"
    assert {mid for _, mid in seen.delivered} <= set(ids), "a delivered message was lost"
    assert stored.acked >= seen.acked, "an acknowledgement went backwards"
    for seq, mid in stored.pending.items():
        assert seen.numbers.get(seq, mid) == mid, "a number now names another message"
        assert seen.number_of.get(mid, seq) == seq, "a message under a second number"
    # At least once: every message of the test the state delivered was printed, or waits
    # to be reported again.
    from_test = {r.message_id for r in stored.log if r.sender_id == "test"}
    unreported = from_test - set(seen.number_of) - set(stored.pending.values())
    assert not unreported, f"{len(unreported)} deliveries neither reported nor pending"
    seen.acked = stored.acked
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
    """One life's lines (read after its death: a kill loses at most a line in flight)."""
    printed: set[int] = set()
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "sent":
            seen.sent.add(rest)
        elif kind == "delivered":
            number, mid = rest.split()
            seq = int(number)
            assert seq not in printed, "printed twice in one life"
            printed.add(seq)
            # Acknowledged in the state a previous death left: never reported again.
            assert seq > seen.acked, "an acknowledged event was reported again"
            assert seen.numbers.setdefault(seq, mid) == mid, "a number named two messages"
            assert seen.number_of.setdefault(mid, seq) == seq, "a message under two numbers"
            seen.delivered.append((seq, mid))


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
    assert set(seen.number_of) == set(ours)  # every message of the test, under one number
    stored = inspect(path)
    assert stored.pending == {}  # the last life acknowledged everything, and stored that
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM events").fetchone() == (0,)
    db.close()


def test_kill9_loses_nothing_and_delivers_at_least_once_under_stable_numbers(
    tmp_path: Path,
) -> None:
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
