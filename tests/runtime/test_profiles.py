"""Named bandwidth profiles (sdsync.runtime.profiles)."""

from __future__ import annotations

import dataclasses

import pytest

from sdsync.core import ChannelConfig, MessageChannel
from sdsync.errors import LocalProtocolError
from sdsync.runtime import PROFILES, RuntimeConfig, profile


def test_js_compatible_is_the_defaults_exactly() -> None:
    chosen = profile("js-compatible")
    assert chosen.channel == ChannelConfig()
    assert chosen.runtime == RuntimeConfig()


def test_lean_sends_smaller_messages_with_a_shorter_history() -> None:
    lean, stock = profile("lean"), profile("js-compatible")
    assert lean.channel.bloom.n_bytes < stock.channel.bloom.n_bytes / 10
    assert lean.channel.causal_history_size < stock.channel.causal_history_size
    assert lean.runtime.sync_interval_ms > stock.runtime.sync_interval_ms

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
