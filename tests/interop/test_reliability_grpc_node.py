"""``sdsync reliability serve`` used from Node: @grpc/grpc-js against our gRPC service.

Two servers, alice and bob (one participant each, each on a state directory of its own),
run in processes of their own on 127.0.0.1. ``reliability_grpc/group.mjs`` is the
application of both and the network between them: it loads the checked-in
``reliability.proto`` with @grpc/proto-loader, subscribes, wraps, and carries every wrapped
message and every ``Transmit`` to the other side through a relay that drops 30 % of them
(seeded). The servers' timers are short, so the resends and syncs that make up for the
losses happen within seconds. It processes events as durable events are meant to be
processed: the last seq per channel, dedup by seq, AckEvents, payloads from MessageReady.

Midway bob's server is killed with SIGKILL and restarted on its state directory. The
protocol between this test and Node: Node prints ``kill bob`` on stdout when it has bob
where it wants him (events processed but not acknowledged, an unwrap answered whose
MessageReady arrived but was not processed, a wrap whose answer it threw away); the test
SIGKILLs bob's server, starts a new one on the same ``--state-dir`` and ``--participant``
and writes ``restarted bob 127.0.0.1:PORT`` on Node's stdin; Node resubscribes there with
its last processed seq as the resume point, retries the wrap and carries on. Its last
stdout line is a JSON summary.

The test checks what the Node application saw: every message delivered exactly once on the
other side with the payload it was wrapped with, every own message acknowledged, the
events bob's server had not seen acknowledged kept across the crash and re-sent under
their numbers, the lost wrap answered again with the same bytes, resends really sent and
losses really applied. The run's deadline is a liveness bound, not a timing assertion.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from reliabilityprocess import PATIENCE_S, ServerProcess
from testdeps import in_ci

pytestmark = pytest.mark.interop

CLIENT_DIR = Path(__file__).parent / "reliability_grpc"
MESSAGES = 10
KILL_AT = 5  # bob's server is killed (SIGKILL) around the messages of index 5
NAMES = ("alice", "bob")
LOSS = 0.3
# Resends and syncs several times a second, so that losses are made up for in seconds.
FAST = ("--resend-interval-ms", "200", "--sync-interval-ms", "500")
TIMEOUT_MS = 45_000
TOKEN_VARIABLE = "SDSYNC_RELIABILITY_TOKEN"
REPO = Path(__file__).parents[2]
CompletedProcess = subprocess.CompletedProcess[str]


def require_client() -> None:
    """Skip unless Node and the folder's packages are installed; in CI, fail instead."""
    missing = [
        package
        for package in ("@grpc/grpc-js", "@grpc/proto-loader")
        if not (CLIENT_DIR / "node_modules" / package).is_dir()
    ]
    if shutil.which("node") is None:
        problem = "Node.js is not installed"
    elif missing:
        problem = (
            f"{', '.join(missing)} not installed in {CLIENT_DIR}: run `npm ci` there "
            "(make test does)"
        )
    else:
        return
    if in_ci():
        pytest.fail(f"{problem}; CI is set, so every test dependency must be installed")
    pytest.skip(problem)


@contextmanager
def server(logs: Path, participant: str, *, token: str | None = None) -> Iterator[str]:
    """A ``reliability serve`` process for ``participant``; its 127.0.0.1:PORT address."""
    process = ServerProcess(logs, "--participant", participant, *FAST, token=token)
    try:
        yield process.address
    finally:
        if process.alive():
            process.stop()


def run_node(script: Path, *args: str, env: dict[str, str] | None = None) -> CompletedProcess:
    return subprocess.run(
        ["node", str(script), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_MS / 1000 + PATIENCE_S,
        check=False,
        env=env,
    )


def run_group(*args: str) -> CompletedProcess:
    return run_node(CLIENT_DIR / "group.mjs", *args)


class Servers:
    """alice's and bob's servers, each on a state directory of its own, and the processes
    each ran as: ``kill9_and_restart`` starts a new one on the same directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.current: dict[str, ServerProcess] = {}
        self.ran: dict[str, list[ServerProcess]] = {}
        try:
            for name in NAMES:
                self._start(name)
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str) -> ServerProcess:
        state = ("--state-dir", str(self.tmp_path / f"{name}-state"))
        process = ServerProcess(self.tmp_path / f"{name}.log", "--participant", name, *state, *FAST)
        self.current[name] = process
        self.ran.setdefault(name, []).append(process)
        return process

    def kill9_and_restart(self, name: str) -> str:
        self.current[name].kill9()
        return self._start(name).address

    def stop(self) -> None:
        for process in self.current.values():
            if process.alive():
                process.stop()

    def logs(self) -> str:
        return "".join(
            f"--- {p.name} ---\n{p.read_text()}" for p in sorted(self.tmp_path.glob("*.log"))
        )


def run_group_with_kill(servers: Servers, victim: str, *args: str) -> tuple[int, list[str], str]:
    """group.mjs with ``--kill victim``: on its ``kill NAME`` line, SIGKILL NAME's server,
    start it again and answer ``restarted NAME ADDRESS`` on its stdin. Node's exit code,
    its other stdout lines, its stderr."""
    specs = (
        arg for name in NAMES for arg in ("--server", f"{name}={servers.current[name].address}")
    )
    command = ["node", str(CLIENT_DIR / "group.mjs"), *specs, "--kill", victim, *args]
    stderr_path = servers.tmp_path / "node.stderr"
    with stderr_path.open("w") as stderr:
        node = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    # A liveness bound only: Node ends itself at --timeout-ms.
    watchdog = threading.Timer(TIMEOUT_MS / 1000 + PATIENCE_S, node.kill)
    watchdog.start()
    lines = []
    try:
        assert node.stdin is not None and node.stdout is not None
        for line in node.stdout:
            if line.startswith("kill "):
                name = line.split()[1]
                address = servers.kill9_and_restart(name)
                with contextlib.suppress(BrokenPipeError):  # Node gave up: its result says
                    node.stdin.write(f"restarted {name} {address}\n")
                    node.stdin.flush()
            else:
                lines.append(line)
        code = node.wait()
    finally:
        watchdog.cancel()
        if node.poll() is None:
            node.kill()
            node.wait()
    return code, lines, stderr_path.read_text()


def group_result(tmp_path: Path, *, seed: int, victim: str) -> dict[str, Any]:
    servers = Servers(tmp_path)
    try:
        code, lines, stderr = run_group_with_kill(
            servers,
            victim,
            *("--messages", str(MESSAGES), "--kill-at", str(KILL_AT)),
            *("--loss", str(LOSS), "--seed", str(seed), "--timeout-ms", str(TIMEOUT_MS)),
        )
    finally:
        servers.stop()
    logs = servers.logs()
    assert lines, f"no result (exit {code})\n{stderr}\n{logs}"
    result: dict[str, Any] = json.loads(lines[-1])
    assert result["complete"], f"{result}\n{stderr}\n{logs}"
    assert code == 0, stderr
    # The victim's server really was SIGKILLed and replaced by another process.
    first, *later = servers.ran[victim]
    assert first.process.returncode == -signal.SIGKILL
    assert len(later) == 1 and later[0].process.pid != first.process.pid
    assert [len(servers.ran[name]) for name in NAMES if name != victim] == [1]
    return result


def test_two_participants_converge_from_node_over_a_lossy_relay_and_a_kill(
    tmp_path: Path,
) -> None:
    require_client()
    result = group_result(tmp_path, seed=16, victim="bob")
    parts = result["participants"]
    wrapped = {name: dict(parts[name]["wrapped"]) for name in NAMES}  # id -> payload text
    every = wrapped["alice"].keys() | wrapped["bob"].keys()
    assert len(every) == 2 * MESSAGES  # ids never collide across participants
    for name, other in (("alice", "bob"), ("bob", "alice")):
        me = parts[name]
        # Events processed once each, in order: every seq from 1 on, none skipped.
        assert me["gaps"] == 0 and me["discarded"] == 0, f"{name}: {me}"
        # Delivered (MessageReady, after dedup by seq): each of the other's messages
        # exactly once, under one seq, with the payload and sender it was wrapped with.
        seqs = [seq for seq, *_ in me["delivered"]]
        assert len(set(seqs)) == len(seqs)
        ids = Counter(mid for _, mid, _, _ in me["delivered"])
        assert ids == Counter(wrapped[other].keys()), f"{name} delivered: {me['delivered']}"
        for _, mid, sender, text in me["delivered"]:
            assert (sender, text) == (other, wrapped[other][mid])
        # Unwrap answers with a payload agree with the deliveries, at most one per id.
        received = Counter(mid for mid, _ in me["received"])
        assert max(received.values(), default=1) == 1
        assert all(wrapped[other].get(mid) == text for mid, text in me["received"])
        # Acknowledged (MessageSent): exactly its own messages, each once.
        assert Counter(me["sent"]) == Counter(wrapped[name].keys()), f"{name} sent: {me['sent']}"

    # alice reconnected without a resume point: the server re-sent events she had
    # processed and not acknowledged, and she skipped them by seq.
    alice = parts["alice"]
    assert [r["resume"] for r in alice["resubscribed"]] == [None]
    assert alice["duplicates"] > alice["resubscribed"][0]["duplicates_before"]
    assert alice["restart"] is None

    # bob's server was killed with events unacknowledged and unprocessed, and resumed.
    bob = parts["bob"]
    restart = bob["restart"]
    assert restart["before"] != restart["after"]
    resume = restart["resume"]
    assert [r["resume"] for r in bob["resubscribed"]] == [resume]
    assert bob["duplicates"] == 0  # the resume point: nothing processed came again
    channel = restart["channel"]
    # Processed but not acknowledged when killed: the resume point acknowledged them.
    assert channel["acknowledged_seq"] <= restart["ack_sent"] < resume
    # Recorded but not processed when killed: kept across the crash and re-sent, under the
    # same numbers, after the resume point.
    assert channel["last_seq"] > resume
    assert restart["unprocessed"], "no event arrived between the freeze and the kill"
    assert all(seq > resume for seq, *_ in restart["unprocessed"])
    assert restart["resent"] == restart["unprocessed"]
    # The message bob unwrapped just before the kill: answered then, delivered (its
    # MessageReady processed) only from the restarted server.
    mid, text = restart["kill_unwrap"]
    assert text == wrapped["alice"][mid]
    assert any(kind == "message_ready" and m == mid for _, kind, m in restart["unprocessed"])
    after = bob["delivered"][restart["delivered_before"] :]
    assert [m for _, m, _, _ in after].count(mid) == 1
    assert next(s for s, m, _, _ in bob["delivered"] if m == mid) > resume
    # The wrap whose answer was lost: retried with its id, the same bytes came back.
    assert restart["lost_wrap"] in wrapped["bob"]
    assert restart["retried"] == {"repeated_wrap": True, "same_bytes": True}

    assert result["dropped"] > 0  # the relay really lost messages …
    assert result["transmits"].get("resend", 0) > 0  # … and the servers resent
    assert result["transmits"].get("sync", 0) > 0


def test_the_client_talks_to_loopback_only() -> None:
    require_client()
    done = run_group("--server", "alice=10.0.0.1:50051", "--server", "bob=127.0.0.1:50052")
    assert done.returncode == 2
    assert "expected NAME=127.0.0.1:PORT" in done.stderr


def test_the_node_example_runs_against_a_server_with_a_token(tmp_path: Path) -> None:
    """examples/reliability_client.mjs, in a copy of the tree it expects (the .proto at
    ../src, its packages in node_modules beside it), against a server that wants a token."""
    require_client()
    example = tmp_path / "examples" / "reliability_client.mjs"
    proto = tmp_path / "src" / "sdsync" / "reliability" / "reliability.proto"
    for copy in (example, proto):
        copy.parent.mkdir(parents=True)
        shutil.copyfile(REPO / copy.relative_to(tmp_path), copy)
    (example.parent / "node_modules").symlink_to(CLIENT_DIR / "node_modules")
    with server(tmp_path / "alice.log", "alice", token="s3cret") as address:
        done = run_node(example, address, "2", env={**os.environ, TOKEN_VARIABLE: "s3cret"})
    assert done.returncode == 0, done.stderr
    assert 'wrapped "hello" as' in done.stdout
    assert "no new payload (our own)" in done.stdout
    assert "garbage refused: INVALID_ARGUMENT" in done.stdout
    # It processed numbered events (the resends of "hello") and resumed after them.
    assert re.search(r"^resumed after seq [1-9]\d*$", done.stdout, re.MULTILINE), done.stdout
