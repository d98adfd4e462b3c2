"""Named bandwidth profiles (sdsync.runtime.profiles)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from sdsync.core import ChannelConfig, MessageChannel
from sdsync.errors import LocalProtocolError
from sdsync.runtime import PROFILES, ChannelDriver, ReliableChannel, RuntimeConfig, profile
from sdsync.testing.memory import MemoryNetwork


def test_js_compatible_is_the_defaults_exactly() -> None:
    chosen = profile("js-compatible")
    assert chosen.channel == ChannelConfig()
    assert chosen.runtime == RuntimeConfig()


def test_lean_sends_smaller_messages_with_a_shorter_history() -> None:
    lean, stock = profile("lean"), profile("js-compatible")
    assert lean.channel.bloom.n_bytes < stock.channel.bloom.n_bytes / 10
    assert lean.channel.causal_history_size < stock.channel.causal_history_size
    assert lean.runtime.sync_interval_for(1_000) > stock.runtime.sync_interval_for(1_000)
    assert lean.runtime.sync_interval_for(None) == stock.runtime.sync_interval_ms

    def content_size(config: ChannelConfig) -> int:
        channel = MessageChannel("0", "p", now_ms=1, config=config)
        for i in range(50):  # a full causal history in both
            channel.send(f"m{i}".encode(), now_ms=2 + i)
        return len(channel.send(b"x", now_ms=100).data)

    assert content_size(lean.channel) * 5 < content_size(stock.channel)


def test_every_profile_is_listed_under_its_own_name() -> None:
    assert set(PROFILES) >= {"js-compatible", "lean"}
    for name, listed in PROFILES.items():
        assert listed.name == name and listed is profile(name)
        assert listed.description and "\n" not in listed.description
    with pytest.raises(TypeError):
        PROFILES["mine"] = PROFILES["lean"]  # type: ignore[index]


def test_an_unknown_name_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(LocalProtocolError, match="unknown profile 'tiny'") as refused:
        profile("tiny")
    assert all(name in str(refused.value) for name in PROFILES)


def test_profiles_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile("lean").name = "mine"  # type: ignore[misc]


def test_lean_syncs_less_often_once_the_group_size_is_known() -> None:
    lean = profile("lean")
    channel = MessageChannel("0", "p", now_ms=0, config=lean.channel)
    driver = ChannelDriver(channel, lean.runtime, random.Random(1), 0)
    assert driver.sync_interval_ms == lean.runtime.sync_interval_ms  # size unknown: fixed
    driver.set_participant_count(1_000)
    assert driver.sync_interval_ms == 1_000 * lean.runtime.sync_ms_per_participant
    stock = ChannelDriver(MessageChannel("0", "q", now_ms=0), RuntimeConfig(), random.Random(1), 0)
    stock.set_participant_count(1_000)
    assert stock.sync_interval_ms == RuntimeConfig().sync_interval_ms  # js-compatible: fixed
    # A driver told the size at creation starts with the group's interval.
    told = ChannelDriver(
        MessageChannel("0", "r", now_ms=0, config=lean.channel),
        lean.runtime,
        random.Random(1),
        0,
        participants=1_000,
    )
    assert told.sync_interval_ms == 600_000


def test_a_group_size_below_one_is_the_callers_mistake() -> None:
    with pytest.raises(LocalProtocolError, match="sync_ms_per_participant"):
        RuntimeConfig(sync_ms_per_participant=-1)
    channel = ReliableChannel(MemoryNetwork(seed=1).transport("a"), "0", "a")
    with pytest.raises(LocalProtocolError, match="participants"):
        channel.set_participant_count(0)
