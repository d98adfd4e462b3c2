"""`sdsync chat` as real processes, for the tests that run a group of them.

Each process writes its `--print-log` output and its log to files (a full pipe would block
it); every wait has a liveness bound, and nothing asserts on timing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
# Liveness bound for a whole group of processes; they normally finish in 10-30 s.
PATIENCE_S = 240.0


def wait_for(
    probe: Callable[[], T | None], what: str = "condition", timeout_s: float = PATIENCE_S
) -> T:
    """The first true value ``probe`` returns, polled until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def sends(prefix: str, n: int) -> list[str]:
    """`--send` flags for the texts ``<prefix>00`` to ``<prefix><n - 1>``."""
    return [arg for i in range(n) for arg in ("--send", f"{prefix}{i:02d}")]


def assert_same_logs(logs: list[list[dict[str, Any]]], texts: Counter[str]) -> None:
    """Every log equal, holding ``texts``, in (lamport timestamp, message id) order."""
    assert all(log == logs[0] for log in logs), "logs differ"
    assert Counter(str(entry["text"]) for entry in logs[0]) == texts
    order = [(entry["lamport_timestamp"], entry["message_id"]) for entry in logs[0]]
    assert order == sorted(order)


class ChatProcess:
    """One `sdsync chat --name name *args` process."""

    def __init__(
        self, tmp: Path, name: str, args: list[str], *, patience_s: float = PATIENCE_S
    ) -> None:
        self.name = name
        self.patience_s = patience_s
        # Unique: a name may be started again (a restart from its state dir).
        self.out = tmp / f"{name}.{time.monotonic_ns()}.out"
        self.err = self.out.with_suffix(".err")
        command = [sys.executable, "-m", "sdsync.cli", "chat", "--name", name, *args]
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.process = subprocess.Popen(command, stdout=out, stderr=err)

    def address(self) -> str:
        found = wait_for(
            lambda: re.search(r"listening on (\S+)", self.err.read_text()),
            f"{self.name}'s address",
            self.patience_s,
        )
        return found.group(1)

    def finish(self) -> list[dict[str, Any]]:
        """Its `--print-log` entries, once it has exited 0."""
        code = self.process.wait(self.patience_s)
        assert code == 0, f"{self.name} exited {code}:\n{self.err.read_text()[-3000:]}"
        return [json.loads(line) for line in self.out.read_text().splitlines()]

    def dropped(self) -> int:
        """Frames its --drop-rate discarded, as reported at exit."""
        found = re.search(r"dropped by --drop-rate (\d+)", self.err.read_text())
        assert found, f"{self.name} reported no frame counts"
        return int(found.group(1))

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(self.patience_s)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.kill()


class TypedChat:
    """An interactive `sdsync chat` in ``channel``: lines are typed on its stdin, its
    screen is a file; each wait is bounded by ``patience_s``."""

    def __init__(
        self, tmp: Path, name: str, channel: str, args: list[str], *, patience_s: float = 20.0
    ) -> None:
        self.tmp, self.name, self.patience_s = tmp, name, patience_s
        self.screen = tmp / f"{name}.screen"
        self.state = ["--channel", channel, "--state-dir", str(tmp / name)]
        argv = [sys.executable, "-m", "sdsync.cli", "chat", "--name", name, *self.state, *args]
        with self.screen.open("wb") as screen:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=screen, stderr=screen
            )

    def text(self) -> str:
        return self.screen.read_text(errors="replace")

    def shows(self, pattern: str, what: str) -> re.Match[str]:
        """The first match of ``pattern`` (a line of its screen), once it is there."""
        try:
            return wait_for(
                lambda: re.search(pattern, self.text(), re.MULTILINE),
                f"{self.name} shows {what}",
                self.patience_s,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- its screen ---\n{self.text()[-3000:]}") from None

    def has_mesh(self) -> bool:
        """Asks ``/peers``; whether the answer so far names a peer in the channel's mesh."""
        self.type("/peers")
        time.sleep(0.2)
        return (
            re.search(r"^[1-9]\d* peer\(s\) in the channel", self.text(), re.MULTILINE) is not None
        )

    def type(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def quit(self) -> None:
        self.type("/quit")
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(self.patience_s) == 0, self.text()[-3000:]

    def print_log(self) -> list[dict[str, Any]]:
        """Its log, in order, as `--print-log` prints it (restarted from its state dir)."""
        again = ChatProcess(
            self.tmp, self.name, [*self.state, "--print-log"], patience_s=self.patience_s
        )
        try:
            return again.finish()
        finally:
            again.stop()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
