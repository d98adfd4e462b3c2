"""`sdsync store serve`'s connection limits (issue 27): the relay host's
(``--relay-max-connections-per-ip``, ``--relay-exempt-ip``, ``--relay-pending-handshakes``,
``--relay-handshake-timeout``, ``--relay-max-connections``) reach its Libp2pTransport, the
HTTP API's (``--http-max-connections-per-ip``, ``--http-exempt-ip``) its server."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from testdeps import require
from typer.testing import CliRunner

from sdsync.cli.main import app

require("sdsync.transport.libp2p", "needs the 'p2p' extra")

PATIENCE_S = 30.0  # a liveness bound
ATTACKER_IP = "127.0.0.2"  # local on Linux; the test scrapes /metrics from 127.0.0.1


@pytest.mark.parametrize(
    "option",
    [
        ["--relay-max-connections-per-ip", "-1"],
        ["--relay-pending-handshakes", "0"],
        ["--relay-handshake-timeout", "0"],
        ["--relay-max-connections", "50"],
        ["--http-max-connections-per-ip", "-1"],
    ],
)
def test_out_of_range_limits_are_refused(tmp_path: Path, option: list[str]) -> None:
    argv = ["store", "serve", "--data-dir", str(tmp_path), *option]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output


def metric(url: str, name: str, label: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    for line in lines:
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def until_metric(url: str, name: str, label: str, value: float) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while metric(url, name, label) != value:
        assert time.monotonic() < deadline, f"{name}{{{label}}} never reached {value}"
        time.sleep(0.1)


def connect(host: str, port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind((ATTACKER_IP, 0))
    sock.connect((host, port))
    return sock


def test_the_limits_reach_the_relay_host_and_the_http_server(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "sdsync.cli", "store", "serve", "--data-dir", str(tmp_path)]
    argv += ["--listen", "127.0.0.1:0", "--retention", "none", "--relay-shard", "0"]
    argv += ["--relay-max-connections-per-ip", "1", "--relay-exempt-ip", "none"]
    argv += ["--relay-handshake-timeout", "1", "--http-max-connections-per-ip", "1"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    held: list[socket.socket] = []
    try:
        assert process.stdout is not None
        listening, relay = process.stdout.readline(), process.stdout.readline()
        assert listening.startswith("sdsync store: listening on http://"), listening
        url = listening.split()[4]
        match = re.match(r"sdsync store: relay on /ip4/127\.0\.0\.1/tcp/(\d+)/", relay)
        assert match, relay
        relay_port = int(match[1])
        http_port = int(url.rsplit(":", 1)[1])

        held += [connect("127.0.0.1", relay_port) for _ in range(2)]  # 127.0.0.2 not exempt
        refused = "sdsync_store_libp2p_connections_refused_total"
        until_metric(url, refused, 'reason="per-IP limit"', 1)
        until_metric(url, refused, 'reason="handshake timeout"', 1)  # after 1 s, not 10

        held += [connect("127.0.0.1", http_port) for _ in range(2)]
        closed = "sdsync_store_http_connections_closed_total"
        until_metric(url, closed, 'reason="per_ip_limit"', 1)
    finally:
        for sock in held:
            sock.close()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=PATIENCE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
