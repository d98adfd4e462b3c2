"""The simulator: determinism, every fault type, the invariant checker, `sdsync simulate`."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.core import ChannelConfig, Event, MessageChannel, MessageDelivered
from sdsync.runtime import RuntimeConfig
from sdsync.sim.config import (
    ChurnConfig,
    NetworkConfig,
    PartitionConfig,
    ProtocolConfig,
    SimConfig,
    StoreOutage,
    WorkloadConfig,
    config_from_dict,
    with_overrides,
)
from sdsync.sim.engine import ChannelFactory, Simulation
from sdsync.sim.output import EVENTS_SCHEMA, LOG_SCHEMA, events_table
from sdsync.wire import Message

# Small and fast: a 1,000-id bloom filter and short timers keep each run well under a second.
TINY = SimConfig(
    seed=7,
    participants=4,
    stores=1,
    drain_ms=600_000,
    network=NetworkConfig(latency_ms=50.0, jitter_ms=20.0),
    workload=WorkloadConfig(messages=30, duration_ms=10_000),
    protocol=ProtocolConfig(
        bloom_capacity=1_000,
        bloom_error_rate=0.01,
        sync_interval_ms=5_000,
        resend_interval_ms=5_000,
        resend_possibly_acknowledged_ms=10_000,
        repair_t_min_ms=1_000,
        repair_t_max_ms=5_000,
    ),
)
WALL_CLOCK = {"wall_seconds", "receive_events_per_second"}


def tiny(**overrides: Any) -> SimConfig:
    return with_overrides(TINY, overrides)


def run(config: SimConfig, factory: ChannelFactory | None = None) -> Simulation:
    sim = Simulation(config) if factory is None else Simulation(config, channel_factory=factory)
    sim.run()
    return sim


def rows(sim: Simulation, kind: str | None = None) -> list[dict[str, Any]]:
    cols = sim.recorder.columns
    table = [dict(zip(cols, values, strict=True)) for values in zip(*cols.values(), strict=True)]
    return table if kind is None else [r for r in table if r["kind"] == kind]


def holds(sim: Simulation) -> dict[str, Any]:
    summary = sim.recorder.summary()
    assert summary["invariants_hold"], summary["problems"]
    assert summary["delivery_rate"] == 1.0
    assert summary["identical_logs"] and summary["causal_order_ok"]
    assert summary["duplicates"] == 0 and summary["irretrievably_lost"] == 0
    return summary


# ---------------------------------------------------------------------------- determinism


def test_same_seed_same_run_bit_for_bit() -> None:
    config = tiny(
        **{
            "network.loss": 0.2,
            "network.duplicate": 0.1,
            "network.reorder": 0.1,
            "churn": (ChurnConfig(2, 3_000, 6_000, lose_volatile_state=True),),
        }
    )
    first, second = run(config), run(config)
    a, b = first.recorder.summary(), second.recorder.summary()
    for key in WALL_CLOCK:
        a.pop(key), b.pop(key)
    assert a == b
    assert first.recorder.columns == second.recorder.columns
    assert events_table(first).equals(events_table(second))
    assert first.recorder.logs == second.recorder.logs
    other = run(dataclasses.replace(config, seed=8))
    assert other.recorder.columns != first.recorder.columns


DIGEST = """
import hashlib, json
from sdsync.sim.config import ChurnConfig, PartitionConfig, with_overrides
from sdsync.sim.engine import Simulation
import tests.sim.test_simulation as t
config = with_overrides(t.TINY, {
    "participants": 6, "network.loss": 0.2, "network.duplicate": 0.1,
    "network.burst_enter": 0.05, "churn": (ChurnConfig(2, 3_000, 6_000, True),),
    "partitions": (PartitionConfig(1_000, 4_000),)})
sim = Simulation(config)
sim.run()
summary = sim.recorder.summary()
summary.pop("wall_seconds"), summary.pop("receive_events_per_second")
blob = json.dumps([summary, sim.recorder.columns, sim.recorder.logs], sort_keys=True)
print(hashlib.sha256(blob.encode()).hexdigest())
"""


def test_same_seed_same_run_across_processes() -> None:
    # String hashing is salted per process: a set iterated in hash order anywhere in the
    # engine would pass the in-process test above and still differ between runs.
    import os
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    digests = {
        subprocess.run(
            [sys.executable, "-c", DIGEST],
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": str(salt)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for salt in (1, 2)
    }
    assert len(digests) == 1


# ---------------------------------------------------------------------------- faults


def test_lossless_network_delivers_everything_once_without_drops() -> None:
    sim = run(tiny())
    summary = holds(sim)
    assert summary["messages_sent"] == 30
    assert summary["network_drops"] == {}
    assert not rows(sim, "net_drop")
    # Every content message reaches the other 3 participants, each delivers it once.
    assert Counter(r["message_id"] for r in rows(sim, "deliver")) == {
        mid: 3 for mid in {r["message_id"] for r in rows(sim, "send")}
    }
    acks = rows(sim, "ack")
    assert len(acks) == 30  # every message acknowledged once, at its sender
    assert all(re.fullmatch(r"(bloom|causal_history):p0000[0-3]", r["detail"]) for r in acks)
    assert all(f"p{r['participant']:05d}" not in r["detail"] for r in acks)


def test_independent_loss_drops_copies_and_still_converges() -> None:
    sim = run(tiny(**{"network.loss": 0.3}))
    summary = holds(sim)
    dropped = summary["network_drops"]["loss"]
    assert set(summary["network_drops"]) == {"loss"}
    assert 0.2 < dropped / summary["copies_sent"] < 0.4
    assert len(rows(sim, "net_drop")) == dropped


def test_burst_loss_comes_in_runs() -> None:
    config = tiny(
        **{"network.burst_enter": 0.1, "network.burst_exit": 0.2, "network.burst_loss": 1.0}
    )
    sim = run(config)
    summary = holds(sim)
    assert set(summary["network_drops"]) == {"burst"}
    # Gilbert–Elliott: once bad, a receiver stays bad for ~1/exit copies in a row.
    streaks: list[int] = []
    for participant in range(config.participants):
        streak = 0
        for row in rows(sim):
            if row["participant"] != participant:
                continue
            if row["kind"] == "net_drop":
                streak += 1
            elif row["kind"] == "receive":
                streaks.append(streak)
                streak = 0
    assert max(streaks) >= 3


def test_duplicated_copies_are_dropped_not_delivered_twice() -> None:
    sim = run(tiny(**{"network.duplicate": 0.5}))
    summary = holds(sim)
    drops = Counter(r["detail"] for r in rows(sim, "drop"))
    assert drops["duplicate"] > 20
    assert summary["receive_events"] > summary["copies_sent"]


def one_waiting(
    channel_id: str, participant_id: str, now_ms: int, config: ChannelConfig
) -> MessageChannel:
    """A channel whose incoming buffer holds one waiting message."""
    config = dataclasses.replace(config, max_incoming_buffer=1)
    return MessageChannel(channel_id, participant_id, now_ms=now_ms, config=config)


def test_evictions_from_a_full_incoming_buffer_are_recorded() -> None:
    sim = run(tiny(**{"network.loss": 0.3}), one_waiting)
    summary = holds(sim)  # an evicted message comes again (resend, repair, store)
    evicted = rows(sim, "evict")
    assert evicted and summary["evicted"] == len(evicted)
    assert {r["detail"] for r in evicted} == {"incoming buffer full"}
    # Received before it was evicted, by the participant that evicted it.
    received = {(r["participant"], r["message_id"]) for r in rows(sim, "receive")}
    assert all((r["participant"], r["message_id"]) in received for r in evicted)


def test_reordered_copies_arrive_late_and_logs_stay_ordered() -> None:
    config = tiny(
        **{
            "network.jitter_ms": 0.0,
            "network.latency_ms": 100.0,
            "network.reorder": 0.3,
            "network.reorder_delay_ms": 700.0,
        }
    )
    sim = run(config)
    holds(sim)
    sent = {r["message_id"]: r["time_ms"] for r in rows(sim, "send")}
    delays = Counter(
        r["time_ms"] - sent[r["message_id"]]
        for r in rows(sim, "receive")
        if r["message_id"] in sent
    )
    assert delays[100] > 0 and delays[800] > 0
    # Late copies arrive after later messages that name them: they wait in the buffer.
    assert sim.recorder.verdict.ordered_logs


def test_each_link_has_its_own_latency() -> None:
    config = tiny(
        **{"network.jitter_ms": 0.0, "network.latency_ms": 100.0, "network.link_spread": 0.5}
    )
    sim = run(config)
    holds(sim)
    sent = {r["message_id"]: (r["participant"], r["time_ms"]) for r in rows(sim, "send")}
    per_link: dict[tuple[str, str], set[int]] = {}
    for r in rows(sim, "receive"):
        if r["message_id"] in sent:
            sender, at = sent[r["message_id"]]
            per_link.setdefault((sender, r["participant"]), set()).add(r["time_ms"] - at)
    assert all(len(delays) == 1 for delays in per_link.values())  # fixed per link
    distinct = {next(iter(d)) for d in per_link.values()}
    assert len(distinct) > 3 and min(distinct) >= 50 and max(distinct) <= 150


def test_partition_cuts_the_group_until_it_heals() -> None:
    config = tiny(participants=6, partitions=(PartitionConfig(2_000, 8_000),))
    sim = run(config)
    holds(sim)
    cut = rows(sim, "net_drop")
    assert cut and all(r["detail"] == "partition" for r in cut)
    assert all(2_000 <= r["time_ms"] < 8_000 for r in cut)
    # Default split: p0..p2 against p3..p5; each content send inside the window misses
    # exactly the other half.
    for send in rows(sim, "send"):
        if 2_000 <= send["time_ms"] < 8_000:
            missed = {
                r["participant"]
                for r in cut
                if r["message_id"] == send["message_id"] and r["time_ms"] == send["time_ms"]
            }
            other_half = {3, 4, 5} if send["participant"] < 3 else {0, 1, 2}
            assert missed == other_half


class CountingChannel(MessageChannel):
    crashes: ClassVar[Counter[str]] = Counter()

    def drop_volatile_state(self) -> None:
        CountingChannel.crashes[self.participant_id] += 1
        super().drop_volatile_state()


def counting_factory(
    channel_id: str, participant_id: str, now_ms: int, config: ChannelConfig
) -> MessageChannel:
    return CountingChannel(channel_id, participant_id, now_ms=now_ms, config=config)


@pytest.mark.parametrize("lose_state", [False, True])
def test_churn_offline_participant_catches_up(lose_state: bool) -> None:
    CountingChannel.crashes.clear()
    config = tiny(churn=(ChurnConfig(1, 2_000, 7_000, lose_volatile_state=lose_state),))
    sim = run(config, counting_factory)
    summary = holds(sim)
    changes = [(r["time_ms"], r["kind"]) for r in rows(sim) if r["kind"] in ("online", "offline")]
    assert changes == [(2_000, "offline"), (7_000, "online")]
    during = [r for r in rows(sim) if r["participant"] == 1 and 2_000 < r["time_ms"] < 7_000]
    assert during and {r["kind"] for r in during} == {"net_drop"}
    assert {r["detail"] for r in during} == {"offline"}
    assert CountingChannel.crashes == (Counter({"p00001": 1}) if lose_state else Counter())
    logs = sim.recorder.logs
    # An offline participant publishes nothing, so fewer than 30 messages exist.
    assert 20 < summary["messages_sent"] < 30
    assert all(log == logs[0] for log in logs) and len(logs[1][0]) == summary["messages_sent"]


def test_store_outage_delays_retrieval_until_the_store_is_back() -> None:
    # p1 misses messages while offline; with SDS-R off only the store can hand them over,
    # and the store is down from just after p1 returns until 40 s.
    config = tiny(
        churn=(ChurnConfig(1, 1_000, 9_000),),
        store_outages=(StoreOutage(0, 9_500, 40_000),),
        # By hint only: a catch-up on coming back (at 9 s) would beat the outage.
        **{"protocol.repair": False, "protocol.store_catchup": False},
    )
    sim = run(config)
    holds(sim)
    fetched = rows(sim, "store_receive")
    assert fetched and all(r["participant"] == 1 for r in fetched)
    assert min(r["time_ms"] for r in fetched) >= 40_000
    assert sim.recorder.store_queries > len({r["time_ms"] for r in fetched})


def test_several_channels_converge_independently() -> None:
    sim = run(tiny(channels=3, **{"network.loss": 0.1}))
    holds(sim)
    per_channel = Counter(r["channel"] for r in rows(sim, "send"))
    assert set(per_channel) == {0, 1, 2} and sum(per_channel.values()) == 30
    for c in range(3):
        assert len(sim.recorder.logs[0][c]) == per_channel[c]
        assert all(logs[c] == sim.recorder.logs[0][c] for logs in sim.recorder.logs)


def test_hot_sender_sends_most_messages() -> None:
    sim = run(tiny(**{"workload.hot_senders": 0.8}))
    holds(sim)
    senders = Counter(r["participant"] for r in rows(sim, "send"))
    assert senders[0] >= 0.6 * sum(senders.values())


# ------------------------------------------------------------------ broken engines


class SwallowsOneMessage(MessageChannel):
    """p00001 silently ignores one message from p00002, every time it comes."""

    ignored: str | None = None

    def receive_message(
        self,
        message: Message,
        now_ms: int,
        *,
        retrieval_hint: bytes | None = None,
        data: bytes | None = None,
    ) -> list[Event]:
        if self.participant_id == "p00001" and message.content and message.sender_id == "p00002":
            if self.ignored is None:
                self.ignored = message.message_id
            if message.message_id == self.ignored:
                return []
        return super().receive_message(message, now_ms, retrieval_hint=retrieval_hint, data=data)


class DeliversOneTwice(MessageChannel):
    """p00001 reports its first delivery twice."""

    doubled = False

    def receive_message(
        self,
        message: Message,
        now_ms: int,
        *,
        retrieval_hint: bytes | None = None,
        data: bytes | None = None,
    ) -> list[Event]:
        events = super().receive_message(message, now_ms, retrieval_hint=retrieval_hint, data=data)
        if self.participant_id == "p00001" and not self.doubled:
            delivered = [e for e in events if isinstance(e, MessageDelivered)]
            if delivered:
                self.doubled = True
                events.append(delivered[0])
        return events


class HidesOneDelivery(MessageChannel):
    """p00001 logs a message but never reports its delivery: later messages that depend
    on it look delivered before their dependency."""

    hidden = False

    def receive_message(
        self,
        message: Message,
        now_ms: int,
        *,
        retrieval_hint: bytes | None = None,
        data: bytes | None = None,
    ) -> list[Event]:
        events = super().receive_message(message, now_ms, retrieval_hint=retrieval_hint, data=data)
        if self.participant_id == "p00001" and not self.hidden:
            for index, event in enumerate(events):
                if isinstance(event, MessageDelivered):
                    self.hidden = True
                    del events[index]
                    break
        return events


def factory_of(cls: type[MessageChannel]) -> ChannelFactory:
    def make(
        channel_id: str, participant_id: str, now_ms: int, config: ChannelConfig
    ) -> MessageChannel:
        return cls(channel_id, participant_id, now_ms=now_ms, config=config)

    return make


def test_checker_catches_an_engine_that_drops_a_delivery() -> None:
    sim = run(tiny(drain_ms=60_000), factory_of(SwallowsOneMessage))
    summary = sim.recorder.summary()
    assert not summary["invariants_hold"]
    assert not summary["identical_logs"]
    assert not summary["invariants"]["all_messages_everywhere"]
    assert summary["missing_pairs"] >= 1
    assert summary["delivery_rate"] < 1.0
    examples = summary["invariants"]["missing_examples"]
    assert {e["participant"] for e in examples} == {"p00001"}
    # The swallowed message, and the later ones stuck behind it in p1's incoming buffer.
    reasons = Counter((e["sender"], e["reason"]) for e in examples)
    assert reasons[("p00002", "received but never delivered (engine fault)")] == 1
    assert all(
        reason == "received, still waiting for dependencies"
        for (sender, reason) in reasons
        if "engine fault" not in reason
    )
    assert any("missing" in p for p in summary["problems"])
    # Only p1 is broken: everyone else still agrees.
    logs = sim.recorder.logs
    assert all(logs[i] == logs[0] for i in (0, 2, 3))


def test_checker_catches_a_duplicate_delivery() -> None:
    summary = run(tiny(), factory_of(DeliversOneTwice)).recorder.summary()
    assert not summary["invariants_hold"]
    assert summary["duplicates"] == 1
    assert not summary["invariants"]["no_duplicate_delivery"]
    assert "1 duplicate deliveries" in summary["problems"]


def test_checker_catches_a_causal_order_violation() -> None:
    summary = run(tiny(), factory_of(HidesOneDelivery)).recorder.summary()
    assert not summary["invariants_hold"]
    assert not summary["causal_order_ok"]
    assert any("before a dependency" in p for p in summary["problems"])


def test_a_participant_back_as_the_run_would_end_is_given_the_drain() -> None:
    """Issue 39 (README's churn example): a participant back online at workload + drain
    was judged the moment it returned, with its messages missing; the drain now counts
    from the last fault that heals within the run."""
    config = tiny(drain_ms=60_000, churn=(ChurnConfig(1, 2_000, 70_000),))
    summary = run(config).recorder.summary()
    assert summary["invariants_hold"], summary["invariants"]
    assert summary["invariants"]["offline_at_end"] == []


def test_participant_offline_at_the_end_is_reported() -> None:
    summary = run(tiny(drain_ms=20_000, churn=(ChurnConfig(1, 5_000, 10**9),))).recorder.summary()
    assert not summary["invariants_hold"]
    assert summary["invariants"]["offline_at_end"] == ["p00001"]
    assert summary["invariants"]["missing_examples"][0]["reason"].startswith("participant offline")


# ------------------------------------------------------------------------ config


def test_config_rejects_typos_and_wrong_types() -> None:
    from sdsync.errors import LocalProtocolError

    with pytest.raises(LocalProtocolError, match="unknown key"):
        config_from_dict({"network": {"los": 0.1}})
    with pytest.raises(LocalProtocolError, match="must be float"):
        config_from_dict({"network": {"loss": "high"}})
    with pytest.raises(LocalProtocolError, match="must be int"):
        config_from_dict({"participants": True})
    with pytest.raises(LocalProtocolError, match="names no participant"):
        config_from_dict({"partitions": [{"start_ms": 1, "heal_ms": 2, "groups": [[0, 9]]}]})
    assert config_from_dict({"network": {"latency_ms": 20}}).network.latency_ms == 20.0


def test_protocol_defaults_are_the_librarys() -> None:
    """A scenario that sets nothing simulates the channel and driver an application gets.

    Two participants and no messages leave nothing for the simulator's own choices
    (response groups, log window) to change, so any difference is a drifted default.
    """
    sim = Simulation(SimConfig(participants=2, workload=WorkloadConfig(messages=0)))
    assert sim.channel_config == ChannelConfig()
    assert sim.runtime_config == RuntimeConfig()


def test_overrides_are_validated_as_a_whole() -> None:
    base = dataclasses.replace(TINY, participants=8, churn=(ChurnConfig(7, 1, 2),))
    changed = with_overrides(base, {"participants": 4, "churn": (ChurnConfig(3, 1, 2),)})
    assert changed.participants == 4 and changed.churn[0].participant == 3


# --------------------------------------------------------------------------- CLI

SMALL = ["--participants", "3", "--messages", "12", "--duration-s", "5", "--seed", "3"]


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["simulate", *args])


def test_cli_writes_summary_events_and_logs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = invoke(*SMALL, "--out", str(out))
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "seed",
        "participants",
        "messages_sent",
        "receive_events",
        "delivery_rate",
        "identical_logs",
        "causal_order_ok",
        "duplicates",
        "irretrievably_lost",
        "time_to_consistency_ms",
        "bytes_on_wire",
        "bytes_per_content_message",
        "false_acks",
        "wall_seconds",
    ):
        assert key in summary
    assert set(summary["time_to_consistency_ms"]) == {"p50", "p90", "p99", "max"}
    assert summary["participants"] == 3 and summary["messages_sent"] == 12
    assert summary["invariants_hold"] and summary["config"]["seed"] == 3
    events = pq.read_table(out / "events.parquet")
    assert events.schema.equals(EVENTS_SCHEMA)
    kinds = set(events.column("kind").to_pylist())
    assert {"send", "receive", "deliver", "ack"} <= kinds
    assert set(events.column("participant").to_pylist()) == {"p00000", "p00001", "p00002"}
    assert sorted(p.name for p in (out / "logs").iterdir()) == [
        "p00000.parquet",
        "p00001.parquet",
        "p00002.parquet",
    ]
    logs = pq.read_table(out / "logs")
    assert logs.schema.equals(LOG_SCHEMA)
    assert logs.num_rows == 3 * 12
    first = pq.read_table(out / "logs" / "p00000.parquet").to_pylist()
    assert [r["position"] for r in first] == list(range(12))
    assert [(r["lamport"], r["message_id"]) for r in first] == sorted(
        (r["lamport"], r["message_id"]) for r in first
    )
    assert "invariants" in result.output and "hold" in result.output


def test_cli_flags_override_the_scenario_file(tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        "seed = 5\nparticipants = 5\n[network]\nlatency_ms = 20\n"
        "[workload]\nmessages = 10\nduration_ms = 4000\n"
        "[[churn]]\nparticipant = 4\nstart_ms = 1000\nend_ms = 2000\n"
    )
    out = tmp_path / "run"
    result = invoke(
        "--config", str(scenario), "--participants", "3", "--churn", "2:1-2:lose",
        "--latency-ms", "30,5", "--no-events", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads((out / "summary.json").read_text())["config"]
    assert config["participants"] == 3 and config["seed"] == 5
    assert config["network"]["latency_ms"] == 30.0 and config["network"]["jitter_ms"] == 5.0
    assert config["churn"] == [
        {"participant": 2, "start_ms": 1000, "end_ms": 2000, "lose_volatile_state": True}
    ]
    assert not (out / "events.parquet").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--loss", "2"],
        ["--churn", "garbage"],
        ["--churn", "1:5-2"],
        ["--churn", "7:1-2"],
        ["--burst-loss", "0.1,0.2"],
        ["--burst-loss", "0.1,0.2,1.5"],
        ["--latency-ms", "fast"],
        ["--partition", "1-2:0,x"],
        ["--participants", "1"],
        ["--config", "/nonexistent.toml"],
    ],
)
def test_cli_bad_arguments_exit_2(tmp_path: Path, args: list[str]) -> None:
    result = invoke(*SMALL, *args, "--out", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize(
    "text",
    [
        "[network]\nlos = 0.1\n",
        "[network]\nloss = 'high'\n",
        "participants = [",
        "stores = -1\n",
        "[protocol]\nbloom_error_rate = 2.0\n",  # rejected by the engine, not the parser
        "[protocol]\nsync_interval_ms = 0\n",
    ],
)
def test_cli_bad_scenario_file_exits_2(tmp_path: Path, text: str) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text(text)
    result = invoke("--config", str(scenario), "--out", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output
    assert "error:" in result.output
    if "los =" in text:
        assert "[network]" in result.output  # the message names the table, unmangled


def test_cli_exit_1_when_an_invariant_fails(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # p1 goes offline for good: it cannot hold the later messages.
    result = invoke(*SMALL, "--churn", "1:1-100000", "--drain-s", "10", "--out", str(out))
    assert result.exit_code == 1, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["invariants_hold"]
    assert any("offline at the end" in p for p in summary["problems"])


def test_every_scenario_in_the_catalogue_parses() -> None:
    from sdsync.sim.config import load_config

    scenarios = sorted((Path(__file__).parents[2] / "scenarios").glob("*.toml"))
    assert len(scenarios) >= 8
    for path in scenarios:
        Simulation(load_config(path), record_events=False)  # validates protocol parameters too


def test_rate_workload_sets_the_number_of_messages() -> None:
    config = tiny(**{"workload.rate_per_participant_s": 0.5, "workload.duration_ms": 8_000})
    sim = run(config)
    assert holds(sim)["messages_sent"] == round(0.5 * config.participants * 8)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_every_gap_a_participant_was_told_about_is_filled(seed: int) -> None:
    """Short causal histories at 30 % loss: what a participant misses at the end, no
    content or sync message it processed ever named (told_missing_pairs counts those
    that one did); without a store or SDS-R, gaps are told and cannot be filled."""
    lossy = {"seed": seed, "network.loss": 0.3, "protocol.causal_history": 2}
    summary = run(tiny(**lossy)).recorder.summary()
    assert summary["told_missing_pairs"] == 0, summary["invariants"]["missing_examples"]
    for example in summary["invariants"]["missing_examples"]:
        assert example["reason"] == "never received; no message it got named it"
    stranded = run(tiny(**lossy, stores=0, **{"protocol.repair": False})).recorder.summary()
    assert stranded["told_missing_pairs"] > 0
    told = [e["reason"] for e in stranded["invariants"]["missing_examples"]]
    assert "never received, although a causal history named it" in told


def test_catch_up_delivers_what_no_message_named_and_hints_cannot() -> None:
    """Causal history 2, 20 % loss, no SDS-R, a store: some participant misses a message
    and both messages naming it, so by hint it is never asked for; catch-ups find it."""
    base = SimConfig(
        participants=6,
        stores=1,
        drain_ms=1_800_000,
        network=NetworkConfig(loss=0.2),
        workload=WorkloadConfig(messages=150, duration_ms=150_000),
        protocol=ProtocolConfig(causal_history=2, repair=False),
    )
    hint_only = Simulation(
        dataclasses.replace(
            base, protocol=ProtocolConfig(causal_history=2, repair=False, store_catchup=False)
        ),
        record_events=False,
    )
    hint_only.run()
    missed = hint_only.recorder.summary()
    assert missed["retrieval"] == "hint" and missed["delivery_rate"] < 1.0
    assert missed["store_catch_ups"] == 0
    caught = Simulation(base, record_events=False)
    caught.run()
    summary = caught.recorder.summary()
    assert summary["retrieval"] == "catchup" and summary["delivery_rate"] == 1.0
    assert summary["invariants_hold"], summary["problems"]
    assert summary["caught_up_messages"] > 0 and summary["store_catch_ups"] > 0
    # Store exchanges are counted apart from the relay's copies, and cost more than nothing.
    assert summary["store_round_trips"] >= summary["store_catch_ups"]
    assert summary["store_query_bytes"] > summary["caught_up_messages"] * 100
