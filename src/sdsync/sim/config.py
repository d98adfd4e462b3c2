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

from sdsync.core import ChannelConfig
from sdsync.errors import LocalProtocolError
from sdsync.runtime import Profile, RuntimeConfig


def participant_name(index: int) -> str:
    """The id of the simulation's participant ``index``, as in logs, events and summaries."""
    return f"p{index:05d}"


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    latency_ms: float = 100.0  # mean one-way latency per copy
    jitter_ms: float = 50.0  # standard deviation (normal, truncated at 1 ms)
    # Per-link spread of the mean: each directed link (a, b) gets a fixed factor in
    # [1 - spread, 1 + spread] from a hash of (seed, a, b), so near and far peers exist.
    link_spread: float = 0.0
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
    # Messages per participant per second; when set it replaces ``messages``.
    rate_per_participant_s: float | None = None

    def total_messages(self, participants: int) -> int:
        if self.rate_per_participant_s is None:
            return self.messages
        return round(self.rate_per_participant_s * participants * self.duration_ms / 1000)


_CHANNEL = ChannelConfig()
_RUNTIME = RuntimeConfig()


@dataclass(frozen=True, slots=True)
class ProtocolConfig:
    """The protocol parameters a scenario may set, flat as in its ``[protocol]`` table.

    Every default is the library's own (:class:`~sdsync.core.ChannelConfig`,
    :class:`~sdsync.runtime.RuntimeConfig`), so a scenario that sets nothing simulates what
    an application gets. The few settings the simulator does choose itself are made where
    it builds the channels (``Simulation.__init__``), each with its reason.
    """

    causal_history: int = _CHANNEL.causal_history_size
    bloom_capacity: int = _CHANNEL.bloom.capacity
    bloom_error_rate: float = _CHANNEL.bloom.error_rate
    possible_acks_threshold: int = _CHANNEL.possible_acks_threshold
    repair: bool = _CHANNEL.repair.enabled
    repair_t_min_ms: int = _CHANNEL.repair.t_min_ms
    repair_t_max_ms: int = _CHANNEL.repair.t_max_ms
    sync_interval_ms: int = _RUNTIME.sync_interval_ms
    resend_interval_ms: int = _RUNTIME.resend_interval_ms
    resend_possibly_acknowledged_ms: int = _RUNTIME.resend_possibly_acknowledged_ms
    max_attempts: int = _RUNTIME.max_attempts
    lost_timeout_ms: int | None = _CHANNEL.lost_timeout_ms
    # With stores: catch up from them periodically (off: retrieval by hint only). The
    # four retrieval setups of a comparison: stores >= 1 with store_catchup (the default),
    # stores >= 1 without it (by hint only), stores = 0 with repair (SDS-R only), stores =
    # 0 without repair (nothing).
    store_catchup: bool = _RUNTIME.store_catchup
    store_catchup_interval_ms: int = _RUNTIME.store_catchup_interval_ms
    store_catchup_margin_ms: int = _RUNTIME.store_catchup_margin_ms
    store_catchup_page_size: int = _RUNTIME.store_catchup_page_size
    store_catchup_seen_hashes: int = _RUNTIME.store_catchup_seen_hashes
    # Big groups: the sync interval is at least this many ms per participant
    # (RuntimeConfig.sync_ms_per_participant; the simulator tells every driver the group's
    # size, as an application calling set_participant_count does), which keeps the
    # group's sync traffic from growing with its size (scenarios/participants-1000.toml).
    sync_ms_per_participant: int = _RUNTIME.sync_ms_per_participant
    # js-waku's sync policy: a received sync defers even an acknowledgement we owe
    # (RuntimeConfig.defer_owed_acknowledgements; bench/sync_policy.py compares the two).
    defer_owed_acknowledgements: bool = _RUNTIME.defer_owed_acknowledgements


@dataclass(frozen=True, slots=True)
class SimConfig:
    seed: int = 1
    participants: int = 5
    stores: int = 1
    channels: int = 1
    drain_ms: int = 3_600_000  # after the workload and the last fault: time to converge
    network: NetworkConfig = field(default_factory=NetworkConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    partitions: tuple[PartitionConfig, ...] = ()
    churn: tuple[ChurnConfig, ...] = ()
    store_outages: tuple[StoreOutage, ...] = ()

    @property
    def retrieval(self) -> str:
        """How a participant gets what it missed besides resends: ``catchup`` (a store,
        by hint and by periodic catch-up), ``hint`` (a store, by hint only), ``sdsr``
        (no store, SDS-R) or ``none``."""
        if self.stores:
            return "catchup" if self.protocol.store_catchup else "hint"
        return "sdsr" if self.protocol.repair else "none"

    def __post_init__(self) -> None:
        if self.participants < 2:
            raise LocalProtocolError("a simulation needs at least 2 participants")
        if self.stores < 0 or self.channels < 1:
            raise LocalProtocolError("stores must be >= 0 and channels >= 1")
        if self.drain_ms < 0:
            raise LocalProtocolError("drain_ms must be >= 0")
        net = self.network
        for name in (
            "loss",
            "burst_enter",
            "burst_exit",
            "burst_loss",
            "duplicate",
            "reorder",
            "store_loss",
            "link_spread",
        ):
            value = getattr(net, name)
            if not 0.0 <= value <= 1.0:
                raise LocalProtocolError(f"network.{name} must be a probability, got {value}")
        for name in ("latency_ms", "jitter_ms", "reorder_delay_ms"):
            if getattr(net, name) < 0:
                raise LocalProtocolError(f"network.{name} must be >= 0")
        work = self.workload
        if work.rate_per_participant_s is not None and work.rate_per_participant_s < 0:
            raise LocalProtocolError("workload.rate_per_participant_s must be >= 0")
        if work.messages < 0 or work.duration_ms < 1 or work.payload_bytes < 1:
            raise LocalProtocolError(
                "workload needs messages >= 0, duration_ms >= 1 and payload_bytes >= 1"
            )
        if not 0.0 <= work.hot_senders <= 1.0:
            raise LocalProtocolError("workload.hot_senders must be a fraction in [0, 1]")
        for churn in self.churn:
            if not 0 <= churn.participant < self.participants:
                raise LocalProtocolError(
                    f"churn: no participant {churn.participant} among {self.participants}"
                )
            if not 0 <= churn.start_ms < churn.end_ms:
                raise LocalProtocolError(f"churn: need 0 <= start_ms < end_ms, got {churn}")
        for outage in self.store_outages:
            if not 0 <= outage.store < self.stores:
                raise LocalProtocolError(f"store outage: no store {outage.store}")
            if not 0 <= outage.start_ms < outage.end_ms:
                raise LocalProtocolError(f"store outage: need 0 <= start_ms < end_ms: {outage}")
        for part in self.partitions:
            if not 0 <= part.start_ms < part.heal_ms:
                raise LocalProtocolError(f"partition: need 0 <= start_ms < heal_ms: {part}")
            for group in part.groups:
                # An out-of-range member would only fail (IndexError) mid-run.
                if any(not 0 <= m < self.participants for m in group):
                    raise LocalProtocolError(f"partition group {group} names no participant")


_NESTED = {
    "network": NetworkConfig,
    "workload": WorkloadConfig,
    "protocol": ProtocolConfig,
}
_LISTS = {"partitions": PartitionConfig, "churn": ChurnConfig, "store_outages": StoreOutage}


# Scalar field annotations (strings, under ``from __future__ import annotations``) and
# the TOML values they accept: a string where a number belongs would otherwise only fail
# deep inside a run, with a confusing TypeError.
_SCALARS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "int | None": (int, type(None)),
}


def _check_types(cls: type[Any], table: dict[str, Any], where: str) -> dict[str, Any]:
    checked = dict(table)
    for f in dataclasses.fields(cls):
        if f.name not in table or not isinstance(f.type, str) or f.type not in _SCALARS:
            continue
        value = table[f.name]
        allowed = _SCALARS[f.type]
        # bool is an int in Python, but `loss = true` is a typo, not a probability.
        if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
            raise LocalProtocolError(
                f"[{where}] {f.name} must be {f.type}, got {type(value).__name__} {value!r}"
            )
        if f.type == "float":
            checked[f.name] = float(table[f.name])  # an int or a float, checked above
    return checked


def _groups(raw: Any, where: str) -> tuple[tuple[int, ...], ...]:
    try:
        groups = tuple(tuple(g) for g in raw)
    except TypeError:
        groups = None
    if groups is None or not all(
        isinstance(m, int) and not isinstance(m, bool) for g in groups for m in g
    ):
        raise LocalProtocolError(f"[{where}] groups must be a list of lists of participants")
    return groups


def _build(cls: type[Any], table: dict[str, Any], where: str) -> Any:
    if not isinstance(table, dict):
        raise LocalProtocolError(f"[{where}] must be a table, got {type(table).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise LocalProtocolError(f"unknown key(s) in [{where}]: {', '.join(unknown)}")
    table = _check_types(cls, table, where)
    if cls is PartitionConfig and "groups" in table:
        table = {**table, "groups": _groups(table["groups"], where)}
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
            if not isinstance(value, list):
                raise LocalProtocolError(f"{key} must be an array of tables ([[{key}]])")
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


def profile_fields(chosen: Profile, *, sync: bool = True) -> dict[str, Any]:
    """The ``protocol.*`` overrides that simulate a bandwidth profile; ``sync=False``
    leaves the sync timing to the scenario."""
    fields: dict[str, Any] = {
        "protocol.causal_history": chosen.channel.causal_history_size,
        "protocol.bloom_capacity": chosen.channel.bloom.capacity,
        "protocol.bloom_error_rate": chosen.channel.bloom.error_rate,
    }
    if sync:
        fields["protocol.sync_interval_ms"] = chosen.runtime.sync_interval_ms
        fields["protocol.sync_ms_per_participant"] = chosen.runtime.sync_ms_per_participant
    return fields


def with_overrides(config: SimConfig, overrides: dict[str, Any]) -> SimConfig:
    """Apply ``{"network.loss": 0.2, "participants": 10, ...}`` (None values are skipped).

    All fields change in one step, so the result is validated once, as a whole: applying
    them one by one could reject a valid combination on the way (say, fewer participants
    before the churn entry naming a removed one is replaced too).
    """
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for dotted, value in overrides.items():
        if value is None:
            continue
        section, _, name = dotted.rpartition(".")
        if section:
            nested.setdefault(section, {})[name] = value
        else:
            top[name] = value
    for section, fields in nested.items():
        top[section] = dataclasses.replace(getattr(config, section), **fields)
    return dataclasses.replace(config, **top) if top else config
