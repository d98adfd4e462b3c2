"""What the simulator writes for the Spark pipeline: message metadata and store archives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow.parquet as pq

from sdsync.sim.config import (
    NetworkConfig,
    ProtocolConfig,
    SimConfig,
    StoreOutage,
    WorkloadConfig,
)
from sdsync.sim.engine import EPOCH_NS, PUBSUB_TOPIC, Simulation
from sdsync.sim.output import (
    ARCHIVE_SCHEMA,
    MESSAGES_SCHEMA,
    archive_table,
    messages_table,
    write_outputs,
)
from sdsync.wire import decode, message_hash

# Two stores, store 1 down from 3 s to 6 s of a 10 s workload; short timers keep it fast.
CONFIG = SimConfig(
    seed=11,
    participants=4,
    stores=2,
    drain_ms=600_000,
    network=NetworkConfig(latency_ms=50.0, jitter_ms=20.0, loss=0.1),
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
    store_outages=(StoreOutage(1, 3_000, 6_000),),
)


def simulate(config: SimConfig = CONFIG) -> Simulation:
    sim = Simulation(config)
    sim.run()
    assert sim.recorder.summary()["invariants_hold"]
    return sim


def test_archives_hold_waku_messages_with_their_deterministic_hash() -> None:
    sim = simulate()
    rows = archive_table(sim, 0).to_pylist()
    assert rows and archive_table(sim, 0).schema.equals(ARCHIVE_SCHEMA)
    for row in rows:
        assert row["pubsub_topic"] == PUBSUB_TOPIC and row["version"] == 0
        expected = message_hash(
            PUBSUB_TOPIC, row["payload"], row["content_topic"], row["meta"], row["timestamp"]
        )
        assert row["message_hash"] == expected and len(expected) == 32
        assert row["timestamp"] >= EPOCH_NS
    # A store's index order.
    keys = [(r["timestamp"], r["message_hash"]) for r in rows]
    assert keys == sorted(keys)
    # Store 0 heard every broadcast; store 1 missed exactly those sent during its outage.
    sends = sorted({(r["time_ms"], r["message_id"]) for r in _transmissions(sim)})
    assert len(rows) == len({r["message_hash"] for r in rows})
    assert {decode(r["payload"]).message_id for r in rows} == {mid for _, mid in sends}
    down = {r["message_hash"] for r in rows} - {
        r["message_hash"] for r in archive_table(sim, 1).to_pylist()
    }
    outage = [r for r in rows if r["message_hash"] in down]
    assert outage, "the outage must cost store 1 something"
    in_window = [r for r in rows if 3_000 <= (r["timestamp"] - EPOCH_NS) // 1_000_000 < 6_000]
    assert outage == in_window


def _transmissions(sim: Simulation) -> list[dict[str, object]]:
    cols = sim.recorder.columns
    kinds = {"send", "resend", "sync", "repair"}
    return [
        {"time_ms": t, "message_id": m}
        for t, m, k in zip(cols["time_ms"], cols["message_id"], cols["kind"], strict=True)
        if k in kinds
    ]


def test_message_metadata_carries_causal_histories_and_hints() -> None:
    sim = simulate()
    table = messages_table(sim)
    assert table.schema.equals(MESSAGES_SCHEMA)
    rows = table.to_pylist()
    summary = sim.recorder.summary()
    assert len(rows) == summary["messages_sent"]
    archive = {r["message_hash"]: r for r in archive_table(sim, 0).to_pylist()}
    for row in rows:
        # The hint is the first broadcast's Waku hash, so a store finds it by hint.
        stored = archive[row["retrieval_hint"]]
        message = decode(stored["payload"])
        assert message.message_id == row["message_id"]
        assert row["causal_history"] == [e.message_id for e in message.causal_history]
        assert row["bytes"] == len(stored["payload"])
        assert (stored["timestamp"] - EPOCH_NS) // 1_000_000 == row["sent_ms"]
        assert row["archived"] and row["delivered_to"] == CONFIG.participants - 1
    assert any(row["causal_history"] for row in rows)


def test_messages_nobody_archived_are_marked() -> None:
    # The only store is down for the whole workload: nothing is archived.
    sim = simulate(
        dataclasses.replace(
            CONFIG,
            stores=1,
            drain_ms=60_000,
            workload=WorkloadConfig(messages=10, duration_ms=5_000),
            store_outages=(StoreOutage(0, 0, 3_600_000),),
        )
    )
    assert not any(messages_table(sim).column("archived").to_pylist())
    assert archive_table(sim, 0).num_rows == 0


def test_outputs_include_messages_and_one_archive_per_store(tmp_path: Path) -> None:
    sim = simulate()
    summary = write_outputs(sim, tmp_path)
    assert summary["outputs"]["messages"] == str(tmp_path / "messages.parquet")
    assert sorted(p.name for p in (tmp_path / "archives").iterdir()) == ["s00", "s01"]
    assert pq.read_table(tmp_path / "archives" / "s00").num_rows == archive_table(sim, 0).num_rows
    assert pq.read_table(tmp_path / "messages.parquet").num_rows == summary["messages_sent"]
    no_stores = Simulation(SimConfig(seed=2, participants=3, stores=0, drain_ms=60_000))
    no_stores.run()
    summary = write_outputs(no_stores, tmp_path / "bare")
    assert "archives" not in summary["outputs"] and not (tmp_path / "bare" / "archives").exists()
    assert not any(messages_table(no_stores).column("archived").to_pylist())
