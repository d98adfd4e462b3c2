"""`--profile` on `sdsync chat`, `peer` and `simulate`, and the chat's notice of a peer on
another bloom filter size (the peer's counts: tests/cli/test_peer.py)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sdsync.chat import ChatSession
from sdsync.cli.chat import chat_configs
from sdsync.cli.main import app
from sdsync.cli.peer import peer_config
from sdsync.cli.simulate import Flags, build_config
from sdsync.core import ChannelConfig, MessageChannel
from sdsync.runtime import PROFILES, ReliableChannel, RuntimeConfig, profile
from sdsync.sim.config import SimConfig
from sdsync.testing.memory import MemoryNetwork

LEAN = profile("lean")
STOCK = profile("js-compatible")


def words(output: str) -> str:
    """CLI output without rich's box and line wrapping."""
    return " ".join(output.replace("│", " ").split())


@pytest.mark.parametrize("command", ["chat", "peer --stdio --participant p", "simulate --out o"])
def test_an_unknown_profile_is_a_usage_error_listing_the_known_ones(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*command.split(), "--profile", "tiny"])
    assert result.exit_code == 2
    assert "unknown profile 'tiny'; known profiles: js-compatible, lean" in words(result.output)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["chat", "peer", "simulate"])
def test_help_says_the_group_must_agree_on_the_bloom_filter_size(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = words(result.output)
    assert "must use the same bloom filter size" in text
    assert all(name in text for name in PROFILES)


def test_chat_starts_from_the_profile_and_its_flags_override_it() -> None:
    runtime, channel = chat_configs(STOCK)
    assert runtime == RuntimeConfig()
    assert channel == ChannelConfig(deliver_early=True)  # the chat's own choice

    runtime, channel = chat_configs(LEAN)
    assert runtime == LEAN.runtime
    assert channel.bloom == LEAN.channel.bloom
    assert channel.causal_history_size == LEAN.channel.causal_history_size

    runtime, channel = chat_configs(
        LEAN, sync_interval_ms=300, retry_ms=1000, store_query_ms=2000, repair_max_ms=90_000
    )
    assert runtime.sync_interval_ms == 300
    assert (runtime.resend_interval_ms, runtime.resend_possibly_acknowledged_ms) == (1000, 3000)
    assert (runtime.store_query_ms, runtime.incoming_sweep_ms) == (2000, 2000)
    assert channel.repair.t_max_ms == 90_000
    assert channel.repair.t_min_ms == LEAN.channel.repair.t_min_ms
    assert channel.bloom == LEAN.channel.bloom  # untouched by the timing flags


def test_peer_starts_from_the_profile_and_its_flags_override_it() -> None:
    assert peer_config(STOCK, "sender-lamport-payload") == ChannelConfig()
    config = peer_config(LEAN, "payload", bloom_error_rate=0.001, repair=False)
    assert config.bloom.capacity == LEAN.channel.bloom.capacity
    assert config.bloom.error_rate == 0.001
    assert config.causal_history_size == LEAN.channel.causal_history_size
    assert not config.repair.enabled and config.message_id_scheme == "payload"


def test_simulate_takes_the_profiles_protocol_fields_below_explicit_flags(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text("[protocol]\ncausal_history = 3\nresend_interval_ms = 7000\n")
    protocol = build_config(Flags(config=scenario, profile="lean")).protocol
    assert protocol.causal_history == LEAN.channel.causal_history_size  # over the file
    assert protocol.resend_interval_ms == 7000  # not the profile's: the file's stays
    assert (protocol.bloom_capacity, protocol.bloom_error_rate) == (1_000, 0.01)
    assert protocol.sync_interval_ms == LEAN.runtime.sync_interval_ms
    assert protocol.sync_ms_per_participant == LEAN.runtime.sync_ms_per_participant > 0

    flags = Flags(profile="lean", causal_history=40, sync_interval_ms=5000)
    protocol = build_config(flags).protocol
    assert (protocol.causal_history, protocol.sync_interval_ms) == (40, 5000)
    assert protocol.bloom_capacity == LEAN.channel.bloom.capacity
    assert build_config(Flags(profile="js-compatible")) == SimConfig()


def test_chat_notices_a_peer_on_another_bloom_size_once() -> None:
    screen = io.StringIO()
    channel = ReliableChannel(MemoryNetwork(seed=1).transport("bob"), "0", "bob")
    session = ChatSession(channel, Console(file=screen, width=300))
    bob = channel.channel
    bob.send(b"unacknowledged: peers' filters are read", now_ms=10)
    same = MessageChannel("0", "p1", now_ms=10, config=STOCK.channel)
    other = MessageChannel("0", "p2", now_ms=10, config=LEAN.channel)

    def hear(peer: MessageChannel, text: str, now_ms: int) -> None:
        for event in bob.receive(peer.send(text.encode(), now_ms=now_ms).data, now_ms):
            session.on_event(event)

    hear(same, "same size", 20)
    assert "bloom filter" not in screen.getvalue()
    hear(other, "lean", 30)
    hear(other, "lean again", 40)
    notices = [line for line in screen.getvalue().splitlines() if "bloom filter" in line]
    assert bob.stats.bloom_ignored == {"wrong size": 2}
    lean = LEAN.channel.bloom.n_bytes
    assert bob.stats.bloom_wrong_size == ("p2", lean)
    assert notices == [
        f"⚠ p2's bloom filter is {lean:,} bytes, this channel expects 18,752: "
        "acknowledgements from it are not counted; every participant must use the same profile"
    ]
