"""The process that test_manager_events kills: a ReliabilityManager with a state_dir (a script).

    python manager_events_peer.py ROOT PLAN [PLAN ...]

imports everything once, then forks one child per plan; each child runs the same
deterministic workload (a fake clock, seeded randomness) on its own state directory
``ROOT/<plan>`` and appends one line per event its ``on_event`` callback is handed to
``ROOT/<plan>.txt``, each with a single write(2): ``<seq> <kind> <message id> <payload
hex>``. The plans:

* ``ref`` — the whole workload, then a clean close and the line ``commits <n>`` (how many
  times the ``commit`` crash point was passed) and ``done``;
* ``before:<k>`` / ``after:<k>`` — the k-th callback SIGKILLs the process before / after
  writing its line (the line ``dying <seq>`` comes first);
* ``commit:<n>`` — SDSYNC_CRASH_AT=commit:<n> for this child: the manager SIGKILLs the
  process at the n-th step's commit, before any callback heard of it;
* ``inherited`` — SDSYNC_CRASH_AT as this process was started with.

The parent answers one line of JSON on stdout: each plan's fate, ``killed`` or
``exited <code>``.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import sys
import traceback
from pathlib import Path

from sdsync.core import BloomParams, ChannelConfig, MessageChannel, MessageDelivered
from sdsync.runtime import Delivery, ReliabilityManager, RuntimeConfig, Transmit
from sdsync.runtime import crash as crash_module

START = 1_700_000_000_000
CHANNEL = "c"
CONFIG = ChannelConfig(
    bloom=BloomParams(1_000, 0.01), causal_history_size=3, own_log_policy="on_send"
)
RUNTIME = RuntimeConfig(
    sync_interval_ms=2_000,
    resend_interval_ms=1_000,
    resend_jitter=0.0,
    resend_backoff=1.0,
    max_attempts=3,
    incoming_sweep_ms=500,
)


class Clock:
    def __init__(self, now: int = START) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def describe(delivery: Delivery) -> str:
    """One event as a line: number, kind, message id, payload (content or bytes) in hex."""
    event = delivery.event
    payload = b""
    if isinstance(event, MessageDelivered):
        payload = event.content
    elif isinstance(event, Transmit):
        payload = event.data
    kind = type(event).__name__
    return f"{delivery.seq} {kind} {event.message_id or '-'} {payload.hex() or '-'}"


def bob(state_dir: Path, clock: Clock) -> ReliabilityManager:
    return ReliabilityManager(
        "bob",
        config=CONFIG,
        runtime=RUNTIME,
        rng=random.Random(1),
        clock=clock,
        state_dir=state_dir,
    )


def workload(manager: ReliabilityManager, clock: Clock) -> None:
    """alice (a bare channel) and bob exchange messages; some of alice's arrive late, so
    bob misses them first; some of bob's never reach alice, so they are resent; bob's
    ticks sync. Everything bob must hear of goes through its callbacks."""
    alice = MessageChannel(CHANNEL, "alice", now_ms=START, config=CONFIG)
    manager.open_channel(CHANNEL)
    held: list[bytes] = []
    for i in range(9):
        clock.now += 100
        out = alice.send(f"alice {i}".encode(), clock.now)
        if i % 3 == 1:
            held.append(out.data)  # arrives later: the next one names it missing
        else:
            manager.unwrap_received_message(out.data)
        if i % 2 == 0:
            wire = manager.wrap_outgoing_message(f"bob {i}".encode(), CHANNEL)
            if i % 4 == 0:
                alice.receive(wire, clock.now)  # alice's next message acknowledges it
        if i % 3 == 2:
            for data in held:
                manager.unwrap_received_message(data)
            held.clear()
        clock.now += 600
        manager.tick()


def run(root: Path, plan: str) -> None:
    kind, _, arg = plan.partition(":")
    if kind == "commit":
        os.environ["SDSYNC_CRASH_AT"] = f"commit:{arg}"
        importlib.reload(crash_module)  # re-arms the crash point the manager calls
    elif kind == "ref":
        os.environ["SDSYNC_CRASH_AT"] = "commit:1000000000"  # armed to count, never reached
        importlib.reload(crash_module)
    fd = os.open(root / f"{plan}.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    calls = [0]

    def on_event(channel_id: str, delivery: Delivery) -> None:
        calls[0] += 1
        dying = kind in ("before", "after") and calls[0] == int(arg)
        if dying:
            os.write(fd, f"dying {delivery.seq}\n".encode())
            if kind == "before":
                os.kill(os.getpid(), signal.SIGKILL)
        os.write(fd, (describe(delivery) + "\n").encode())
        if dying:
            os.kill(os.getpid(), signal.SIGKILL)

    clock = Clock()
    manager = bob(root / plan, clock)
    manager.on_event = on_event
    workload(manager, clock)
    manager.close()
    if kind == "ref":
        os.write(fd, f"commits {crash_module._passes[0]}\n".encode())
    os.write(fd, b"done\n")


def main(root: Path, plans: list[str]) -> None:
    fates = {}
    for plan in plans:
        pid = os.fork()
        if pid == 0:
            try:
                run(root, plan)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            fates[plan] = "killed"
        else:
            fates[plan] = f"exited {os.waitstatus_to_exitcode(status)}"
    sys.stdout.write(json.dumps(fates) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
