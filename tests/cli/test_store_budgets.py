"""`sdsync store serve`'s per-peer budgets (issue 27) that had no flag:
``--sync-sessions-per-minute`` and ``--sync-session-burst`` (Store Sync's session rate,
SyncConfig) and ``--store-answer-bytes-per-peer`` and ``--store-answer-bytes`` (the
store-query answers in flight over libp2p, AnswerLimits; sizes as --retention's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import sdsync.store.launch
from sdsync.cli.main import app
from sdsync.store import NodeConfig
from sdsync.waku.store.service import AnswerLimits


def served_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *options: str) -> NodeConfig:
    """The NodeConfig `store serve` would run with ``options`` (the node is not started)."""
    seen: list[NodeConfig] = []

    async def run_node(archive: Any, config: NodeConfig, *_: Any) -> None:
        seen.append(config)

    monkeypatch.setattr(sdsync.store.launch, "run_node", run_node)
    argv = ["store", "serve", "--data-dir", str(tmp_path), "--retention", "none", *options]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    (config,) = seen
    return config


def test_the_flags_reach_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = served_config(
        tmp_path,
        monkeypatch,
        *("--sync-sessions-per-minute", "0.5", "--sync-session-burst", "2"),
        *("--store-answer-bytes-per-peer", "3MiB", "--store-answer-bytes", "1GB"),
    )
    assert (config.sync.sessions_per_minute, config.sync.session_burst) == (0.5, 2)
    assert config.store_answers == AnswerLimits(
        per_peer_bytes=3 << 20, per_ip_bytes=6 << 20, total_bytes=10**9
    )  # the address's: twice the peer's unless given


@pytest.mark.parametrize(
    "option",
    [
        ["--sync-sessions-per-minute", "0"],
        ["--sync-sessions-per-minute", "-1"],
        ["--sync-session-burst", "0"],
        ["--store-answer-bytes-per-peer", "0"],
        ["--store-answer-bytes-per-peer", "lots"],
        ["--store-answer-bytes", "64XB"],
        ["--store-answer-bytes", "-5MiB"],
    ],
)
def test_bad_budgets_are_refused(tmp_path: Path, option: list[str]) -> None:
    argv = ["store", "serve", "--data-dir", str(tmp_path), *option]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert option[0] in result.output
