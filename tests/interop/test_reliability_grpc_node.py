"""``sdsync reliability serve`` used from Node: @grpc/grpc-js against our gRPC service.

Two servers, alice and bob (one participant each), run in processes of their own on
127.0.0.1. ``reliability_grpc/group.mjs`` is the application of both and the network
between them: it loads the checked-in ``reliability.proto`` with @grpc/proto-loader,
subscribes, wraps, and carries every wrapped message and every ``Transmit`` to the other
side through a relay that drops 30 % of them (seeded). The servers' timers are short, so
the resends and syncs that make up for the losses happen within seconds. The test checks
what the Node application saw: every message delivered once on the other side with the
payload it was wrapped with, every own message acknowledged, resends really sent and
losses really applied. The run's deadline is a liveness bound, not a timing assertion.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from reliabilityprocess import PATIENCE_S, ServerProcess
from testdeps import in_ci

pytestmark = pytest.mark.interop

CLIENT_DIR = Path(__file__).parent / "reliability_grpc"
MESSAGES = 10
LOSS = 0.3
# Resends and syncs several times a second, so that losses are made up for in seconds.
FAST = ("--resend-interval-ms", "200", "--sync-interval-ms", "500")
TIMEOUT_MS = 90_000
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


def group_result(tmp_path: Path, *, seed: int) -> dict[str, Any]:
    with ExitStack() as stack:
        servers = [
            f"{name}={stack.enter_context(server(tmp_path / f'{name}.log', name))}"
            for name in ("alice", "bob")
        ]
        done = run_group(
            *(arg for spec in servers for arg in ("--server", spec)),
            *("--messages", str(MESSAGES), "--loss", str(LOSS), "--seed", str(seed)),
            *("--timeout-ms", str(TIMEOUT_MS)),
        )
    logs = "".join(f"--- {p.name} ---\n{p.read_text()}" for p in sorted(tmp_path.glob("*.log")))
    assert done.stdout.strip(), f"no result (exit {done.returncode})\n{done.stderr}\n{logs}"
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert result["complete"], f"{result}\n{done.stderr}\n{logs}"
    assert done.returncode == 0, done.stderr
    return result


def test_two_participants_converge_from_node_over_a_lossy_relay(tmp_path: Path) -> None:
    require_client()
    result = group_result(tmp_path, seed=16)
    parts = result["participants"]
    alice, bob = parts["alice"], parts["bob"]
    every = set(alice["wrapped"]) | set(bob["wrapped"])
    assert len(every) == 2 * MESSAGES  # ids never collide across participants
    for me, other, name in ((alice, bob, "alice"), (bob, alice, "bob")):
        other_name = "bob" if name == "alice" else "alice"
        # The application's log: its own messages, and the other's as MessageReady said.
        log = me["wrapped"] + me["delivered"]
        assert Counter(log) == Counter(every), f"{name} delivered: {me['delivered']}"
        assert sorted(me["delivered"]) == sorted(other["wrapped"])
        # Acknowledged: exactly its own messages, each once.
        assert sorted(me["sent"]) == sorted(me["wrapped"]), f"{name} sent: {me['sent']}"
        # The payloads came through Node ↔ Python intact, each returned by one unwrap only.
        wrapped_as = {mid: f"{other_name}:{i}" for i, mid in enumerate(other["wrapped"])}
        assert sorted(me["received"]) == sorted([mid, text] for mid, text in wrapped_as.items())
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
        done = run_node(example, address, "1", env={**os.environ, TOKEN_VARIABLE: "s3cret"})
    assert done.returncode == 0, done.stderr
    assert 'wrapped "hello" as' in done.stdout
    assert "no new payload (our own)" in done.stdout
    assert "garbage refused: INVALID_ARGUMENT" in done.stdout
