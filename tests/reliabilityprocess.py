"""``sdsync reliability serve`` in a process of its own, and a gRPC client for it.

:class:`ServerProcess` starts the server on 127.0.0.1 port 0 and reads the real port from
its first line; :class:`EventLog` follows its ``Events`` stream on a thread and lets a test
wait for what it expects. Waits are liveness bounds only: nothing is asserted about how
long anything took.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import grpc

from sdsync.reliability import reliability_pb2 as pb
from sdsync.reliability import reliability_pb2_grpc as pb_grpc

PATIENCE_S = 60.0
T = TypeVar("T")


class ServerProcess:
    def __init__(self, logs: Path, *args: str, token: str | None = None) -> None:
        command = [sys.executable, "-m", "sdsync.cli", "reliability", "serve"]
        command += ["--listen", "127.0.0.1:0", *args]
        self.stderr_path = logs
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("SDSYNC_RELIABILITY_TOKEN", None)
        if token is not None:
            env["SDSYNC_RELIABILITY_TOKEN"] = token
        with logs.open("ab") as stderr:
            self.process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
            )
        assert self.process.stdout is not None
        first = self.process.stdout.readline().strip()
        if not first.startswith("listening on 127.0.0.1:"):
            self.process.kill()
            raise AssertionError(f"no address from the server: {first!r}\n{self.stderr()}")
        self.address = first.removeprefix("listening on ")
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.ReliabilityStub(self.channel)

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.channel.close()

    def stop(self) -> int:
        """SIGTERM; the exit code."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(PATIENCE_S)
        self.channel.close()
        return code


class EventLog:
    """Every event of one ``Events`` stream, from its ``Subscribed`` on."""

    def __init__(
        self,
        stub: pb_grpc.ReliabilityStub,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.events: list[pb.Event] = []
        self.error: grpc.RpcError | None = None
        self.ended = False  # the stream ended, normally or with ``error``
        self._changed = threading.Condition()
        self._stream = stub.Events(pb.EventsRequest(), metadata=metadata)
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

    def wait_for(self, found: Callable[[], T]) -> T:
        with self._changed:
            result = self._changed.wait_for(found, PATIENCE_S)
        assert result, f"not seen within {PATIENCE_S} s; events: {self.events}"
        return result

    def cancel(self) -> None:
        self._stream.cancel()
        self._thread.join(PATIENCE_S)
