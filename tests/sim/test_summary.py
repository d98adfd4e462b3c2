"""The summary's cost and evidence figures, and the two-phase store catch-up.

Each figure is checked against ground truth the test works out on its own (the store's
archive holds every broadcast; the event table every transmission and delivery), so a
miscount in the recorder fails here rather than passing along into a sweep.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
from test_simulation import holds, rows, run, tiny

from sdsync.core import BloomParams, ChannelConfig, MessageChannel
from sdsync.errors import LocalProtocolError
from sdsync.sim.config import (
    ChurnConfig,
    PartitionConfig,
    SimConfig,
    WorkloadConfig,
    with_overrides,
)
from sdsync.sim.engine import _HASH_ENTRY, Simulation
from sdsync.sim.record import Recorder
from sdsync.wire import decode, encode

RELAY_KINDS = {"content": "send", "resend": "resend", "sync": "sync", "repair": "repair"}
DEFAULT_BLOOM = {"protocol.bloom_capacity": 10_000, "protocol.bloom_error_rate": 0.001}


def bloom_field(data: bytes) -> int:
    """The bytes the bloom filter takes in ``data``: the message re-encoded without it."""
    message = decode(data)
    return len(encode(message)) - len(encode(dataclasses.replace(message, bloom_filter=None)))


# ------------------------------------------------------------------- relay bytes


def test_bytes_by_kind_add_up_to_the_wire_and_match_every_transmission() -> None:
    # Heavy enough for resends and repairs (at 0.6 every acknowledgement came in time).
    sim = run(tiny(**{"network.loss": 0.7}))
    summary = holds(sim)
    by_kind = summary["bytes_by_kind"]
    assert set(by_kind) == {*RELAY_KINDS, "store_query"}
    assert sum(by_kind[kind] for kind in RELAY_KINDS) == summary["bytes_on_wire"]
    assert by_kind["store_query"] == summary["store_query_bytes"] > 0
    # No partition: every broadcast is put on the wire once per other participant (loss
    # takes copies off the wire later), so each kind is its transmissions' bytes × 3.
    others = sim.config.participants - 1
    for kind, row_kind in RELAY_KINDS.items():
        assert by_kind[kind] == others * sum(r["bytes"] for r in rows(sim, row_kind))
    assert all(by_kind[kind] > 0 for kind in RELAY_KINDS)


def test_bloom_bytes_are_the_filter_fields_of_every_copy() -> None:
    sim = run(tiny(**DEFAULT_BLOOM))
    summary = holds(sim)
    # The store heard every broadcast: its archive is the run's transmissions.
    archived = list(sim.stores[0].by_hint.values())
    others = sim.config.participants - 1
    assert summary["bytes_on_wire"] == others * sum(len(data) for data in archived)
    assert summary["bloom_bytes"] == others * sum(bloom_field(data) for data in archived)
    assert summary["bloom_share"] == summary["bloom_bytes"] / summary["bytes_on_wire"]
    # An 18 kB filter beside a 64-byte payload: nearly every byte on the wire.
    assert 0.9 < summary["bloom_share"] < 1.0
    small = run(tiny(**{"protocol.bloom_capacity": 16})).recorder.summary()
    assert 0.0 < small["bloom_share"] < summary["bloom_share"] / 20


def test_nothing_sent_means_no_bloom_share() -> None:
    summary = run(tiny(**{"workload.messages": 0})).recorder.summary()
    assert summary["bytes_on_wire"] == 0 and summary["bloom_share"] == 0.0
    assert summary["delivered_to_everyone"] == {
        "within_1_min": 1.0,
        "within_10_min": 1.0,
        "ever": 1.0,
    }


# ---------------------------------------------------------- delivered to everyone


def delivered_to_everyone(sim: Simulation) -> dict[str, float]:
    """Worked out from the event table: per message, who delivered it and when last."""
    sent = {r["message_id"]: r["time_ms"] for r in rows(sim, "send")}
    deliverers: dict[str, set[int]] = defaultdict(set)
    last: dict[str, int] = {}
    for r in rows(sim, "deliver"):
        if r["message_id"] in sent:
            deliverers[r["message_id"]].add(r["participant"])
            last[r["message_id"]] = r["time_ms"]
    others = sim.config.participants - 1
    everyone = [last[m] - at for m, at in sent.items() if len(deliverers[m]) == others]
    return {
        "within_1_min": sum(d <= 60_000 for d in everyone) / len(sent),
        "within_10_min": sum(d <= 600_000 for d in everyone) / len(sent),
        "ever": len(everyone) / len(sent),
    }


def test_a_lossless_run_reaches_everyone_within_a_minute() -> None:
    sim = run(tiny())
    assert holds(sim)["delivered_to_everyone"] == {
        "within_1_min": 1.0,
        "within_10_min": 1.0,
        "ever": 1.0,
    }


@pytest.mark.parametrize("heal_ms", [40_000, 70_000])
def test_a_long_partition_delays_messages_past_a_minute(heal_ms: int) -> None:
    # Messages sent in the cut (from 2 s to the end of the 10 s workload) reach the other
    # half only after it heals: within a minute when it heals at 40 s, not at 70 s.
    sim = run(tiny(partitions=(PartitionConfig(2_000, heal_ms),)))
    reached = holds(sim)["delivered_to_everyone"]
    assert reached == delivered_to_everyone(sim)
    assert reached["within_10_min"] == reached["ever"] == 1.0
    if heal_ms < 60_000:
        assert reached["within_1_min"] == 1.0
    else:
        assert 0.0 < reached["within_1_min"] < 1.0


def test_a_participant_offline_past_the_end_leaves_messages_short_of_everyone() -> None:
    sim = run(tiny(drain_ms=20_000, churn=(ChurnConfig(1, 5_000, 10**9),)))
    summary = sim.recorder.summary()
    reached = summary["delivered_to_everyone"]
    assert reached == delivered_to_everyone(sim)
    assert 0.0 < reached["ever"] < 1.0
    assert reached["ever"] == 1 - summary["unconverged_messages"] / summary["messages_sent"]


# ------------------------------------------------------------ unlearnable messages


def content_caught_up(sim: Simulation) -> set[str]:
    sent = {r["message_id"] for r in rows(sim, "send")}
    return {r["message_id"] for r in rows(sim, "store_receive") if r["message_id"] in sent}


def test_an_id_reaches_a_participant_by_receipt_or_by_being_named() -> None:
    sender = MessageChannel("c", "p00001", now_ms=0)
    first, second = sender.send(b"a", 1), sender.send(b"b", 2)
    third = sender.send(b"c", 3)  # its causal history names the other two
    receiver = MessageChannel("c", "p00000", now_ms=0)
    recorder = Recorder(tiny(), record_events=False)
    assert recorder.never_named(0, 0, first.message_id, receiver)
    receiver.receive(third.data, 4)
    recorder.received(0, 0, decode(third.data), len(third.data), 4)
    assert not recorder.never_named(0, 0, third.message_id, receiver)  # received
    assert not recorder.never_named(0, 0, first.message_id, receiver)  # named
    assert not recorder.never_named(0, 0, second.message_id, receiver)
    assert recorder.never_named(0, 0, "elsewhere", receiver)
    recorder.lost[0][0].add("elsewhere")  # reported lost: it was named once
    assert not recorder.never_named(0, 0, "elsewhere", receiver)


def test_with_no_causal_history_everything_a_catch_up_brings_was_unlearnable() -> None:
    # p1 is away for 5 s; no message names another, so a store catch-up (at once, when it
    # is back) is the only way it learns of what it missed, and a query by hint never runs.
    config = tiny(churn=(ChurnConfig(1, 2_000, 7_000),), **{"protocol.causal_history": 0})
    sim = run(config)
    summary = holds(sim)
    assert summary["store_queries"] == 0
    caught = content_caught_up(sim)
    assert len(caught) == summary["caught_up_messages"] > 0
    assert {mid for _, mid in sim.recorder.unlearnable} == caught
    assert summary["unlearnable_messages"] == len(caught)


def test_messages_a_short_history_still_names_are_learnable() -> None:
    # Causal history 2, no SDS-R: of what p1 missed and caught up, the last two are named
    # by the next message it hears; the rest nothing would ever have named.
    config = tiny(
        churn=(ChurnConfig(1, 2_000, 7_000),),
        **{"protocol.causal_history": 2, "protocol.repair": False},
    )
    sim = run(config)
    summary = holds(sim)
    missed = {r["message_id"] for r in rows(sim, "net_drop") if r["participant"] == 1}
    sent = {r["message_id"] for r in rows(sim, "send")}
    assert 0 < summary["unlearnable_messages"] < len(content_caught_up(sim))
    assert summary["unlearnable_messages"] < len(missed & sent)
    assert {mid for _, mid in sim.recorder.unlearnable} <= missed


def test_what_the_relay_names_after_a_catch_up_brought_it_is_learnable() -> None:
    # Causal history 200: p1 catches up at once when back, before any new message arrives,
    # so the catch-up brings what it missed unnamed; the next message's history names it
    # all the same, so none of it was unlearnable.
    config = tiny(churn=(ChurnConfig(1, 2_000, 7_000),), **{"protocol.causal_history": 200})
    sim = run(config)
    summary = holds(sim)
    assert content_caught_up(sim)
    assert summary["unlearnable_messages"] == 0


def test_missing_at_the_end_and_never_named_is_unlearnable() -> None:
    # No store and no SDS-R: what p1 missed stays missing. Those its 2-entry histories
    # named are told-missing; the rest it could never have learnt of.
    config = tiny(
        stores=0,
        churn=(ChurnConfig(1, 2_000, 7_000),),
        **{"protocol.causal_history": 2, "protocol.repair": False},
    )
    sim = run(config)
    summary = sim.recorder.summary()
    everything = {mid for _, mid in sim.recorder.logs[0][0]}
    missing = everything - {mid for _, mid in sim.recorder.logs[1][0]}
    told = set(sim.participants[1].drivers[0].channel.missing_ids())
    assert missing and told & missing
    assert summary["missing_pairs"] == len(missing)
    assert summary["told_missing_pairs"] == len(told & missing)
    assert summary["unlearnable_messages"] == len(missing - told)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_short_histories_at_heavy_loss_need_the_store_and_get_everything(seed: int) -> None:
    config = tiny(
        seed=seed,
        **{
            "network.loss": 0.6,
            "protocol.causal_history": 2,
            "protocol.store_catchup_interval_ms": 10_000,
        },
    )
    summary = holds(run(config))
    assert summary["unlearnable_messages"] > 0


def test_long_histories_on_a_lossless_network_leave_nothing_unlearnable() -> None:
    summary = holds(run(tiny(**{"protocol.causal_history": 200})))
    assert summary["unlearnable_messages"] == 0


# --------------------------------------------------------------- two-phase catch-up


def test_a_lossless_catch_up_lists_hashes_and_fetches_nothing() -> None:
    # Catch-ups every 3 s during the run. No jitter: every copy (50 ms) is in before the
    # listing's round trip (100 ms) is back, so every listed hash was seen already.
    config = tiny(
        **DEFAULT_BLOOM,
        **{"network.jitter_ms": 0.0, "protocol.store_catchup_interval_ms": 3_000},
    )
    sim = run(config)
    summary = holds(sim)
    assert summary["store_catch_ups"] > 10
    assert summary["store_catch_up_fetched"] == 0 and summary["caught_up_messages"] == 0
    # One listing page per catch-up, each at most the whole archive's hashes.
    archive = sim.stores[0].by_hint
    assert summary["store_round_trips"] == summary["store_catch_ups"]
    per_trip = 400  # request (topic, time range, cursor) and an empty response
    bound = summary["store_round_trips"] * per_trip
    bound += summary["store_catch_ups"] * len(archive) * _HASH_ENTRY
    assert summary["store_query_bytes"] <= bound
    # Fetching the archive once would cost 20 times what all the listings did.
    assert summary["store_query_bytes"] * 20 < sum(len(data) for data in archive.values())


@pytest.mark.parametrize(("history", "seed"), [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_catch_up_fetches_what_was_missed_and_delivers_everything(history: int, seed: int) -> None:
    config = tiny(
        seed=seed,
        participants=6,
        **{
            "workload.messages": 60,
            "network.loss": 0.6,  # at 0.5, history 3 seed 1 needs no catch-up
            "protocol.causal_history": history,
            "protocol.repair": False,
        },
    )
    summary = holds(run(config))
    assert summary["retrieval"] == "catchup"
    assert 0 < summary["caught_up_messages"] <= summary["store_catch_up_fetched"]


def test_a_participant_remembers_what_it_sent() -> None:
    # Nobody receives its own broadcast: only the sender's own record keeps a catch-up
    # from fetching it back.
    sim = run(tiny())
    archive = sim.stores[0].by_hint
    for p in sim.participants:
        own = [h for h, data in archive.items() if decode(data).sender_id == p.name]
        assert own and p.drivers[0].unseen(own) == []


def test_a_participant_that_forgets_what_it_saw_fetches_it_again() -> None:
    lossless = {"network.jitter_ms": 0.0, "protocol.store_catchup_interval_ms": 3_000}
    remembers = holds(run(tiny(**lossless)))
    forgets = holds(run(tiny(**lossless, **{"protocol.store_catchup_seen_hashes": 1})))
    assert remembers["store_catch_up_fetched"] == 0 < forgets["store_catch_up_fetched"]
    assert forgets["store_query_bytes"] > remembers["store_query_bytes"]


# ------------------------------------------------------------------ bloom ignored


def test_a_member_with_another_bloom_size_shows_in_the_summary() -> None:
    def odd_bloom(
        channel_id: str, participant_id: str, now_ms: int, config: ChannelConfig
    ) -> MessageChannel:
        if participant_id == "p00001":
            config = dataclasses.replace(config, bloom=BloomParams(500, config.bloom.error_rate))
        return MessageChannel(channel_id, participant_id, now_ms=now_ms, config=config)

    sim = run(tiny(), odd_bloom)
    summary = holds(sim)  # acks by causal history still work
    ignored = summary["bloom_ignored"]
    assert ignored["saturated"] == 0 and ignored["wrong size"] > 0
    per_participant = [p.drivers[0].channel.stats.bloom_ignored for p in sim.participants]
    assert ignored["wrong size"] == sum(s.get("wrong size", 0) for s in per_participant)
    assert all(s.get("wrong size", 0) > 0 for s in per_participant)
    assert holds(run(tiny()))["bloom_ignored"] == {"wrong size": 0, "saturated": 0}


# ------------------------------------------------------------------------- config


def test_sync_interval_grows_with_the_group_when_asked() -> None:
    def interval(participants: int, per_participant: int) -> int:
        config = with_overrides(
            SimConfig(participants=participants, workload=WorkloadConfig(messages=0)),
            {"protocol.sync_ms_per_participant": per_participant},
        )
        return Simulation(config).participants[0].drivers[0].sync_interval_ms

    default = SimConfig().protocol.sync_interval_ms
    assert interval(10, 0) == default
    assert interval(10, 600) == default  # 6 s is below the 30 s interval
    assert interval(1_000, 600) == 600_000
    with pytest.raises(LocalProtocolError, match="sync_ms_per_participant"):
        Simulation(tiny(**{"protocol.sync_ms_per_participant": -1}))
