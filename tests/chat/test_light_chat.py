"""`sdsync chat --light`: chats that relay nothing, through Waku service nodes.

Two `sdsync chat --light --service <store>` processes, 20 % of what they receive dropped,
converge through an `sdsync store serve` process, their only service (LightPush, Filter
and, since no --store is given, store v3 for catch-up); a third, started after them, gets
their whole conversation from the store. A store peer that does not speak
store v3 (go-waku, which serves only the legacy store) stops a chat at start with one line
naming it, exit 2; so do flags that do not go together. Liveness bounds only.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from chatprocess import PATIENCE_S, ChatProcess, assert_same_logs, sends
from storeprocess import store_serve
from testdeps import require
from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.runtime import RuntimeConfig
from sdsync.testing.gowaku import GoWaku
from sdsync.waku.filter.rpc import FILTER_SUBSCRIBE_PROTOCOL
from sdsync.waku.lightpush.rpc import LIGHTPUSH_PROTOCOL
from sdsync.waku.store.rpc import STORE_QUERY_PROTOCOL

require("sdsync.transport.libp2p", "needs the 'p2p' extra")

# Processes, like tests/cli/test_chat.py's: never beside the reliability crash harness.
pytestmark = pytest.mark.xdist_group("many-processes")

SHARD = "/waku/2/rs/1/7"
PEER = "/ip4/127.0.0.1/tcp/60000/p2p/12D3KooWEyoppNCUx8Yx66oV9fJnriXwCcXwDDUA2kj6vnc6iDEp"
FAST = [
    *("--sync-interval-ms", "300", "--retry-ms", "1000"),
    *("--repair-min-ms", "200", "--repair-max-ms", "1000"),
    *("--store-query-ms", "500", "--quiet-ms", "2000", "--print-log"),
]


def test_two_light_chats_converge_through_a_store_node(tmp_path: Path) -> None:
    n = 20
    with store_serve(
        tmp_path / "store", SHARD, LIGHTPUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL
    ) as store:
        light = ["--light", "--service", store.relay_addrs[0], "--drop-rate", "0.2"]
        wait = ["--wait-converged", str(PATIENCE_S), "--min-peers", "1"]
        chats = []
        for seed, name in enumerate("AB", start=1):
            own = ["--seed", str(seed), "--state-dir", str(tmp_path / name)]
            chats.append(
                ChatProcess(tmp_path, name, [*FAST, *light, *wait, *own, *sends(name.lower(), n)])
            )
        try:
            logs = [chat.finish() for chat in chats]
            # A newcomer that says nothing gets the channel's history from the store, as
            # the page does (issue 39: a light chat showed none of it). It comes later
            # than the margin a new channel's first catch-up reaches back anyway.
            time.sleep(RuntimeConfig().store_catchup_margin_ms / 1000 + 1)
            own = ["--seed", "3", "--state-dir", str(tmp_path / "C")]
            late = ["--wait-converged", str(PATIENCE_S), "--min-peers", "2"]
            chats.append(ChatProcess(tmp_path, "C", [*FAST, *light[:3], *late, *own]))
            logs.append(chats[-1].finish())
        finally:
            for chat in chats:
                chat.stop()
    assert_same_logs(logs, Counter(f"{p}{i:02d}" for p in "ab" for i in range(n)))
    for chat in chats[:2]:
        err = chat.err.read_text()
        assert "Waku light client of 1 service(s)" in err
        assert "sending anyway" not in err, err[-3000:]  # subscribed before it sent
        assert chat.dropped() > 0, "the 20 % drop was not applied"


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--light"], "--light needs at least one service"),
        (["--service", PEER], "--service is for light chats"),
        (["--light", "--service", PEER, "--peer", PEER], "--peer is for relay"),
        (
            ["--light", "--service", "/ip4/127.0.0.1/tcp/1"],
            "--service '/ip4/127.0.0.1/tcp/1' names no peer",
        ),
    ],
)
def test_flags_that_do_not_go_together_are_bad_usage(args: list[str], complaint: str) -> None:
    result = CliRunner().invoke(app, ["chat", *args])
    assert result.exit_code == 2
    assert complaint in " ".join(result.output.split())


@pytest.mark.parametrize("flags", [["--store"], ["--light", "--service"]])
def test_a_store_peer_without_store_v3_is_named_at_start(
    go_waku_nodes: Callable[[], GoWaku], flags: list[str]
) -> None:
    node = go_waku_nodes()
    address = node.address
    command = [sys.executable, "-m", "sdsync.cli", "chat", "--name", "solo", "--print-log"]
    command += [*flags, address]
    done = subprocess.run(command, capture_output=True, text=True, timeout=PATIENCE_S, check=False)
    assert done.returncode == 2, done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"{flags[-1]} {address} does not serve Waku store v3" in error
    assert STORE_QUERY_PROTOCOL in error
