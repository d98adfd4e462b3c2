"""``sdsync reliability serve`` in a process of its own, and a gRPC client for it.

:class:`ServerProcess` starts the server on 127.0.0.1 port 0 and reads the real port from
its first line; :class:`EventLog` follows its ``Events`` stream on a thread (from resume
points, if given), lets a test wait for what it expects, and acknowledges what it saw.
Waits are liveness bounds only: nothing is asserted about how long anything took.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import grpc

from sdsync.reliability import reliability_pb2 as pb
from sdsync.reliability import reliability_pb2_grpc as pb_grpc

PATIENCE_S = 60.0
T = TypeVar("T")
#: The server kills itself at a chosen step when this is set (sdsync.runtime.crash).
CRASH_VARIABLE = "SDSYNC_CRASH_AT"


class ServerProcess:
    """One server process. ``env`` adds variables (``SDSYNC_CRASH_AT``, say); a crash
    point is never inherited from the test's own environment."""

    def __init__(
        self,
        logs: Path,
        *args: str,
        token: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        command = [sys.executable, "-m", "sdsync.cli", "reliability", "serve"]
        command += ["--listen", "127.0.0.1:0", *args]
        self.stderr_path = logs
        self.args = args
        self.token = token
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        environment.pop("SDSYNC_RELIABILITY_TOKEN", None)
        environment.pop(CRASH_VARIABLE, None)
        if token is not None:
            environment["SDSYNC_RELIABILITY_TOKEN"] = token
        environment.update(env or {})
        with logs.open("ab") as stderr:
            self.process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=environment
            )
        assert self.process.stdout is not None
        first = self.process.stdout.readline().strip()
        if not first.startswith("listening on 127.0.0.1:"):
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"no address from the server: {first!r}\n{self.stderr()}")
        self.address = first.removeprefix("listening on ")
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.ReliabilityStub(self.channel)

    def restart(self, *, env: Mapping[str, str] | None = None) -> ServerProcess:
        """A new process with the same arguments, token and log (after this one ended)."""
        return ServerProcess(self.stderr_path, *self.args, token=self.token, env=env)

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill9(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.reap()

    def reap(self) -> int:
        """Wait for the process to end (it was killed, or killed itself); its exit code."""
        code = self.process.wait(PATIENCE_S)
        self.channel.close()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code

    def stop(self) -> int:
        """SIGTERM; the exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.reap()


class EventLog:
    """Every event of one ``Events`` stream, from its ``Subscribed`` on.

    ``channel_ids`` and ``resume`` are the request's (``resume``: channel -> the last seq
    already processed). :meth:`ack` acknowledges what the stream brought so far.
    """

    def __init__(
        self,
        stub: pb_grpc.ReliabilityStub,
        metadata: Sequence[tuple[str, str]] = (),
        *,
        channel_ids: Sequence[str] = (),
        resume: Mapping[str, int] | None = None,
    ) -> None:
        self.events: list[pb.Event] = []
        self.error: grpc.RpcError | None = None
        self.ended = False  # the stream ended, normally or with ``error``
        self._stub = stub
        self._metadata = tuple(metadata)
        self._changed = threading.Condition()
        positions = [pb.EventPosition(channel_id=c, seq=s) for c, s in (resume or {}).items()]
        request = pb.EventsRequest(channel_ids=list(channel_ids), resume=positions)
        self._stream = stub.Events(request, metadata=self._metadata)
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()
        self.wait_for(lambda: self.ended or self.of("subscribed"))
        if self.error is not None:
            raise self.error

    def _follow(self) -> None:
        try:
            for event in self._stream:
                with self._changed:
                    self.events.append(event)
                    self._changed.notify_all()
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            with self._changed:
                self.ended = True
                self._changed.notify_all()

    def of(self, kind: str) -> list[pb.Event]:
        with self._changed:
            return [e for e in self.events if e.WhichOneof("event") == kind]

    def ids(self, kind: str) -> list[str]:
        return [getattr(e, kind).message_id for e in self.of(kind)]

    def numbered(self, channel_id: str) -> dict[int, pb.Event]:
        """The channel's events by seq (a seq seen twice must be the same event)."""
        with self._changed:
            out: dict[int, pb.Event] = {}
            for event in self.events:
                if event.channel_id != channel_id:
                    continue
                assert out.setdefault(event.seq, event) == event, f"seq {event.seq} changed"
            return out

    def positions(self) -> dict[str, int]:
        """Per channel, the highest seq seen: the resume points of a next stream."""
        with self._changed:
            out: dict[str, int] = {}
            for event in self.events:
                if event.channel_id:
                    out[event.channel_id] = max(out.get(event.channel_id, 0), event.seq)
            return out

    def ack(self) -> dict[str, int]:
        """Acknowledge every event seen so far (``AckEvents``); the positions acked."""
        seen = self.positions()
        acks = [pb.EventPosition(channel_id=c, seq=s) for c, s in seen.items()]
        self._stub.AckEvents(pb.AckEventsRequest(acks=acks), metadata=self._metadata)
        return seen

    def wait_for(self, found: Callable[[], T]) -> T:
        with self._changed:
            result = self._changed.wait_for(found, PATIENCE_S)
        assert result, f"not seen within {PATIENCE_S} s; events: {self.events}"
        return result

    def cancel(self) -> None:
        self._stream.cancel()
        self._thread.join(PATIENCE_S)
