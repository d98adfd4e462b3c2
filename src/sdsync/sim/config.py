"""Simulation parameters: network, faults, workload and the protocol under test.

A scenario is a TOML file whose tables mirror these dataclasses (``[network]``,
``[workload]``, ``[protocol]``, ``[[partitions]]``, ``[[churn]]``, ``[[store_outages]]``);
command-line flags override single fields. Unknown keys are errors, so a typo in a
scenario never silently runs the defaults.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdsync.errors import LocalProtocolError


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    latency_ms: float = 100.0  # mean one-way latency per copy
    jitter_ms: float = 50.0  # standard deviation (normal, truncated at 1 ms)
    loss: float = 0.0  # independent loss per copy
    # Gilbert–Elliott burst loss per receiver: P(good->bad), P(bad->good) per packet,
    # and the loss rate while bad. burst_enter = 0 disables it.
    burst_enter: float = 0.0
    burst_exit: float = 0.3
    burst_loss: float = 0.9
    duplicate: float = 0.0  # probability a copy arrives twice
    reorder: float = 0.0  # probability a copy is held back by reorder_delay_ms extra
    reorder_delay_ms: float = 500.0
    store_loss: float = 0.0  # loss on the way to store nodes (they are well connected)


@dataclass(frozen=True, slots=True)
class PartitionConfig:
    """From ``start_ms`` until ``heal_ms`` participants only hear their own group."""

    start_ms: int
    heal_ms: int
    groups: tuple[tuple[int, ...], ...] = ()  # participant indices; empty: split in halves


@dataclass(frozen=True, slots=True)
class ChurnConfig:
    """Participant ``participant`` is offline for [start_ms, end_ms)."""

    participant: int
    start_ms: int
    end_ms: int
    lose_volatile_state: bool = False


@dataclass(frozen=True, slots=True)
class StoreOutage:
    store: int
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    messages: int = 200
    duration_ms: int = 60_000  # messages are spread over this window
    payload_bytes: int = 64
    hot_senders: float = 0.0  # fraction of traffic from participant 0 (0: uniform)


@dataclass(frozen=True, slots=True)
class ProtocolConfig:
    causal_history: int = 200
    bloom_capacity: int = 10_000
    bloom_error_rate: float = 0.001
    possible_acks_threshold: int = 2
    repair: bool = True
    repair_t_min_ms: int = 30_000
    repair_t_max_ms: int = 120_000
    sync_interval_ms: int = 30_000
    resend_interval_ms: int = 30_000
    resend_possibly_acknowledged_ms: int = 90_000
    max_attempts: int = 10
    lost_timeout_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SimConfig:
    seed: int = 1
    participants: int = 5
    stores: int = 1
    channels: int = 1
    drain_ms: int = 3_600_000  # after the workload, how long to wait for consistency
    network: NetworkConfig = field(default_factory=NetworkConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    partitions: tuple[PartitionConfig, ...] = ()
    churn: tuple[ChurnConfig, ...] = ()
    store_outages: tuple[StoreOutage, ...] = ()

    def __post_init__(self) -> None:
        if self.participants < 2:
            raise LocalProtocolError("a simulation needs at least 2 participants")
        if self.stores < 0 or self.channels < 1:
            raise LocalProtocolError("stores must be >= 0 and channels >= 1")
        for name in ("loss", "burst_enter", "burst_exit", "burst_loss", "duplicate", "reorder"):
            value = getattr(self.network, name)
            if not 0.0 <= value <= 1.0:
                raise LocalProtocolError(f"network.{name} must be a probability, got {value}")
        for churn in self.churn:
            if not 0 <= churn.participant < self.participants or churn.end_ms <= churn.start_ms:
                raise LocalProtocolError(f"bad churn entry {churn}")
        for outage in self.store_outages:
            if not 0 <= outage.store < self.stores or outage.end_ms <= outage.start_ms:
                raise LocalProtocolError(f"bad store outage {outage}")
        for part in self.partitions:
            if part.heal_ms <= part.start_ms:
                raise LocalProtocolError(f"partition heals before it starts: {part}")


_NESTED = {
    "network": NetworkConfig,
    "workload": WorkloadConfig,
    "protocol": ProtocolConfig,
}
_LISTS = {"partitions": PartitionConfig, "churn": ChurnConfig, "store_outages": StoreOutage}


def _build(cls: type[Any], table: dict[str, Any], where: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise LocalProtocolError(f"unknown key(s) in [{where}]: {', '.join(unknown)}")
    if cls is PartitionConfig and "groups" in table:
        table = {**table, "groups": tuple(tuple(g) for g in table["groups"])}
    try:
        return cls(**table)
    except TypeError as exc:
        raise LocalProtocolError(f"[{where}]: {exc}") from None


def config_from_dict(raw: dict[str, Any]) -> SimConfig:
    top: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _NESTED:
            top[key] = _build(_NESTED[key], value, key)
        elif key in _LISTS:
            top[key] = tuple(_build(_LISTS[key], item, key) for item in value)
        else:
            top[key] = value
    return _build(SimConfig, top, "top level")  # type: ignore[no-any-return]


def load_config(path: Path) -> SimConfig:
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise LocalProtocolError(f"cannot read scenario {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise LocalProtocolError(f"{path} is not valid TOML: {exc}") from None
    return config_from_dict(raw)


def with_overrides(config: SimConfig, overrides: dict[str, Any]) -> SimConfig:
    """Apply ``{"network.loss": 0.2, "participants": 10, ...}`` (None values are skipped)."""
    for dotted, value in overrides.items():
        if value is None:
            continue
        section, _, name = dotted.rpartition(".")
        if section:
            inner = dataclasses.replace(getattr(config, section), **{name: value})
            config = dataclasses.replace(config, **{section: inner})
        else:
            config = dataclasses.replace(config, **{name: value})
    return config
