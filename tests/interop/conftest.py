"""Peers for interop tests: the real @waku/sds (Node) and ours, behind one JSON-lines API."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from peers import ProcessPeer, SessionPeer

from sdsync.core import BloomParams, ChannelConfig, RepairConfig
from sdsync.peer import PeerSession

JS_DIR = Path(__file__).parent / "js"


class PyPeer(SessionPeer):
    """Our peer in-process, configured by the same options as the processes' flags."""

    def __init__(self, participant: str, **options: Any) -> None:
        config = ChannelConfig(
            causal_history_size=options.get("causal_history", 200),
            bloom=BloomParams(
                options.get("bloom_capacity", 10_000), options.get("bloom_error_rate", 0.001)
            ),
            bloom_rollover=options.get("bloom_rollover", True),
            possible_acks_threshold=options.get("possible_acks_threshold", 2),
            repair=RepairConfig(
                enabled=options.get("repair", True),
                t_min_ms=options.get("repair_t_min_ms", 30_000),
                t_max_ms=options.get("repair_t_max_ms", 120_000),
                response_groups=options.get("repair_response_groups", 1),
            ),
            lost_timeout_ms=options.get("lost_timeout_ms"),
            max_incoming_buffer=options.get("max_incoming_buffer", 10_000),
            # The conformance peer's default, as `sdsync peer --stdio`'s: @waku/sds's ids.
            message_id_scheme=options.get("message_id", "payload"),
        )
        session = PeerSession(options.get("channel", "0"), participant, config)
        super().__init__(f"py:{participant}", session)


def js_argv(participant: str, **options: Any) -> list[str]:
    argv = ["node", str(JS_DIR / "driver.mjs"), "--participant", participant]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is False:
            argv.append(f"--no-{key.replace('_', '-')}")
        elif value is not True:
            argv += [flag, str(value)]
    return argv


def require_js_driver() -> None:
    if shutil.which("node") is None:
        pytest.fail("Node.js is required for interop tests (make test installs the JS driver)")
    if not (JS_DIR / "node_modules" / "@waku" / "sds").is_dir():
        pytest.fail(f"@waku/sds is not installed: run `npm ci` in {JS_DIR} (make test does)")


def js_peers() -> Iterator[Any]:
    """A starter of @waku/sds peers; each is closed when the fixture using it ends."""
    require_js_driver()
    peers: list[ProcessPeer] = []

    def start(participant: str, **options: Any) -> ProcessPeer:
        peer = ProcessPeer(f"js:{participant}", js_argv(participant, **options))
        peers.append(peer)
        return peer

    yield start
    for peer in peers:
        peer.close()


@pytest.fixture
def js_peer() -> Iterator[Any]:
    yield from js_peers()


@pytest.fixture(scope="module")
def module_js_peer() -> Iterator[Any]:
    """js_peer for module-scoped fixtures (a costly exchange shared by several tests)."""
    yield from js_peers()


@pytest.fixture(scope="session")
def py_peer() -> Any:
    return PyPeer


@pytest.fixture
def cli_peer() -> Iterator[Any]:
    peers: list[ProcessPeer] = []

    def start(participant: str, **options: Any) -> ProcessPeer:
        argv = [sys.executable, "-m", "sdsync.cli", "peer", "--stdio"]
        peer = ProcessPeer(f"cli:{participant}", argv + js_argv(participant, **options)[2:])
        peers.append(peer)
        return peer

    yield start
    for peer in peers:
        peer.close()


@pytest.fixture
def js_waku_proto() -> Iterator[ProcessPeer]:
    """The real @waku/proto WakuMessage codec behind JSON lines."""
    if shutil.which("node") is None:
        pytest.fail("Node.js is required for interop tests (make test installs the JS driver)")
    peer = ProcessPeer("js:waku-proto", ["node", str(JS_DIR / "waku_message.mjs")])
    yield peer
    peer.close()
