"""Peers behind the `peer --stdio` JSON-lines contract, whatever implements them.

A process (the @waku/sds driver in tests/interop/js, or `python -m sdsync.cli peer
--stdio`) or our PeerSession in this process: every test talks to all of them the same way,
one JSON request line in, one JSON reply out.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from sdsync.peer import PeerSession


def line_process(argv: list[str], *, stderr: int) -> subprocess.Popen[str]:
    """``argv`` started with line-buffered text pipes, to be spoken to in JSON lines."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        bufsize=1,
    )


class PeerError(AssertionError):
    """A peer answered ok=false or died: an interop failure, not a network event."""


class Peer:
    def __init__(self, name: str) -> None:
        self.name = name

    def exchange(self, line: str) -> dict[str, Any]:
        """The reply to one raw request line."""
        raise NotImplementedError

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.exchange(json.dumps({"op": op, **fields}))

    def ok(self, op: str, **fields: Any) -> dict[str, Any]:
        reply = self.call(op, **fields)
        if not reply.get("ok"):
            raise PeerError(f"{self.name} {op} failed: {reply}")
        return reply

    def close(self) -> None:
        pass


class ProcessPeer(Peer):
    def __init__(self, name: str, argv: list[str]) -> None:
        super().__init__(name)
        self.proc = line_process(argv, stderr=subprocess.DEVNULL)

    def exchange(self, line: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise PeerError(f"{self.name} exited (code {self.proc.poll()}) on {line[:80]}")
        reply: dict[str, Any] = json.loads(answer)
        return reply

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class SessionPeer(Peer):
    """Our peer in this process: the same request lines, handled by sdsync.peer's PeerSession
    (starting an interpreter per peer would dominate many tests' run time)."""

    def __init__(self, name: str, session: PeerSession) -> None:
        super().__init__(name)
        self.session = session

    def exchange(self, line: str) -> dict[str, Any]:
        return self.session.handle(line)
