"""Writing a finished simulation to a directory: the summary, the event table, the logs.

Layout of ``DIR`` (the input of the Spark pipeline, so the schemas are stable):

``summary.json``
    :meth:`Recorder.summary` — seed, counts, delivery rate, invariant verdicts, time to
    consistency, bytes — plus ``config`` (the full effective :class:`SimConfig`, so a run
    can be reproduced from its summary alone) and ``outputs`` (what was written).
``events.parquet``
    One row per transmission, arrival, network drop, delivery, acknowledgement, engine
    drop, loss, abandoned send and churn change: ``time_ms`` int64 (virtual),
    ``participant`` string (``p00003``, the protocol's sender id), ``channel`` string
    (``channel-0``; null for churn rows), ``message_id`` string (null for churn rows),
    ``kind`` string, ``bytes`` int64 (wire size for transmissions and arrivals, else 0),
    ``detail`` string (a drop's or loss's reason, an acknowledgement's path and acker,
    else null; docs/simulation.md lists them per kind).
``logs/pNNNNN.parquet``
    One file per participant, all with the same schema, so ``logs/`` reads as one
    dataset: ``participant`` string, ``channel`` string, ``position`` int64 (0-based
    within that participant's channel log), ``lamport`` int64, ``message_id`` string.
``messages.parquet``
    One row per content message (the message metadata ``sdsync pipeline consolidate
    --events`` takes): ``channel``, ``message_id``, ``sender`` strings; ``sent_ms``
    int64 (virtual); ``causal_history`` list<string> (its SDS causal history);
    ``retrieval_hint`` binary (the Waku message hash of its first broadcast);
    ``bytes`` int64 (wire size); ``archived`` bool (some store archive holds it);
    ``delivered_to`` int64 (participants other than the sender that delivered it).
``archives/sNN/archive.parquet``
    One directory per store node (only with stores): every WakuMessage the store heard,
    in the columns of a Waku store archive (``sdsync pipeline reconcile --archive``):
    ``message_hash`` binary (32 bytes, the deterministic message hash), ``timestamp``
    int64 (ns), ``pubsub_topic``, ``content_topic`` strings, ``payload`` binary (the SDS
    bytes), ``meta`` binary (empty), ``version`` int32 (0); sorted by (timestamp,
    message_hash), the order of a store's index.

Participants are strings rather than indices because the same names appear in the wire
messages (``sender_id``) and in acknowledgement events, so a pipeline can join on them.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sdsync.sim.config import participant_name
from sdsync.store.schema import ARCHIVE_SCHEMA

if TYPE_CHECKING:
    from sdsync.sim.engine import Simulation

SUMMARY = "summary.json"
EVENTS = "events.parquet"
LOGS = "logs"
MESSAGES = "messages.parquet"
ARCHIVES = "archives"

# The one definition of each table: the Spark pipeline builds its input checks from these
# (sdsync.pipeline.io.schema_columns) rather than restating them.
EVENTS_SCHEMA = pa.schema(
    [
        ("time_ms", pa.int64()),
        ("participant", pa.string()),
        ("channel", pa.string()),
        ("message_id", pa.string()),
        ("kind", pa.string()),
        ("bytes", pa.int64()),
        ("detail", pa.string()),
    ]
)
LOG_SCHEMA = pa.schema(
    [
        ("participant", pa.string()),
        ("channel", pa.string()),
        ("position", pa.int64()),
        ("lamport", pa.int64()),
        ("message_id", pa.string()),
    ]
)
MESSAGES_SCHEMA = pa.schema(
    [
        ("channel", pa.string()),
        ("message_id", pa.string()),
        ("sender", pa.string()),
        ("sent_ms", pa.int64()),
        ("causal_history", pa.list_(pa.string())),
        ("retrieval_hint", pa.binary()),
        ("bytes", pa.int64()),
        ("archived", pa.bool_()),
        ("delivered_to", pa.int64()),
    ]
)
# zstd: the event table is large and very repetitive (ids recur in many rows).
COMPRESSION = "zstd"


def store_name(index: int) -> str:
    return f"s{index:02d}"


def write_outputs(sim: Simulation, out: Path, *, events: bool = True) -> dict[str, Any]:
    """Write summary, events (unless ``events`` is false) and logs; return the summary."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    if events:
        write_events(sim, out / EVENTS)
        written["events"] = str(out / EVENTS)
    else:
        # Never leave an earlier run's events next to this run's summary.
        (out / EVENTS).unlink(missing_ok=True)
    write_logs(sim, out / LOGS)
    written["logs"] = str(out / LOGS)
    pq.write_table(messages_table(sim), out / MESSAGES, compression=COMPRESSION)
    written["messages"] = str(out / MESSAGES)
    if write_archives(sim, out / ARCHIVES):
        written["archives"] = str(out / ARCHIVES)
    written["summary"] = str(out / SUMMARY)
    summary = sim.recorder.summary()
    summary["write_seconds"] = round(time.perf_counter() - started, 3)
    summary["config"] = dataclasses.asdict(sim.config)
    summary["outputs"] = written
    (out / SUMMARY).write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    return summary


def _names(count: int) -> pa.Array:
    return pa.array([participant_name(i) for i in range(count)], pa.string())


def events_table(sim: Simulation) -> pa.Table:
    """The recorder's event columns as an Arrow table with :data:`EVENTS_SCHEMA`."""
    cols = sim.recorder.columns
    participants = pa.array(cols["participant"], pa.int32())
    channel_index = pa.array(cols["channel"], pa.int32())
    # Churn rows carry channel -1 and no message: nulls, not a fake "channel--1".
    channel_index = pc.if_else(pc.less(channel_index, 0), None, channel_index)
    channel_names = pa.array(sim.channel_ids, pa.string())
    message_ids = pa.array(cols["message_id"], pa.string())
    message_ids = pc.if_else(pc.equal(message_ids, ""), None, message_ids)
    return pa.table(
        [
            pa.array(cols["time_ms"], pa.int64()),
            _names(sim.config.participants).take(participants),
            channel_names.take(channel_index),
            message_ids,
            pa.array(cols["kind"], pa.string()),
            pa.array(cols["bytes"], pa.int64()),
            pa.array(cols["detail"], pa.string()),
        ],
        schema=EVENTS_SCHEMA,
    )


def write_events(sim: Simulation, path: Path) -> None:
    pq.write_table(events_table(sim), path, compression=COMPRESSION)


def log_table(sim: Simulation, index: int) -> pa.Table:
    """Participant ``index``'s final logs, all channels, as a :data:`LOG_SCHEMA` table."""
    name = participant_name(index)
    channel: list[str] = []
    position: list[int] = []
    lamport: list[int] = []
    message_id: list[str] = []
    for c, log in enumerate(sim.recorder.logs[index]):
        channel.extend([sim.channel_ids[c]] * len(log))
        position.extend(range(len(log)))
        lamport.extend(entry[0] for entry in log)
        message_id.extend(entry[1] for entry in log)
    return pa.table(
        [
            pa.array([name] * len(position), pa.string()),
            pa.array(channel, pa.string()),
            pa.array(position, pa.int64()),
            pa.array(lamport, pa.int64()),
            pa.array(message_id, pa.string()),
        ],
        schema=LOG_SCHEMA,
    )


def write_logs(sim: Simulation, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    # A rerun into the same DIR with fewer participants must not leave stale logs behind.
    for stale in directory.glob("p*.parquet"):
        stale.unlink()
    for index in range(sim.config.participants):
        table = log_table(sim, index)
        pq.write_table(
            table, directory / f"{participant_name(index)}.parquet", compression=COMPRESSION
        )


def messages_table(sim: Simulation) -> pa.Table:
    """Every content message with its causal history: :data:`MESSAGES_SCHEMA`."""
    truth = sim.recorder.truth
    archived = set().union(*(store.by_id.keys() for store in sim.stores))
    keys = list(truth)
    return pa.table(
        [
            pa.array([sim.channel_ids[c] for c, _ in keys], pa.string()),
            pa.array([mid for _, mid in keys], pa.string()),
            pa.array([participant_name(t.sender) for t in truth.values()], pa.string()),
            pa.array([t.sent_ms for t in truth.values()], pa.int64()),
            pa.array([list(t.history) for t in truth.values()], pa.list_(pa.string())),
            pa.array([t.hint for t in truth.values()], pa.binary()),
            pa.array([t.size for t in truth.values()], pa.int64()),
            pa.array([key in archived for key in keys], pa.bool_()),
            pa.array([t.delivered for t in truth.values()], pa.int64()),
        ],
        schema=MESSAGES_SCHEMA,
    )


def archive_table(sim: Simulation, index: int) -> pa.Table:
    """Store ``index``'s archive as a Waku store would hold it: :data:`ARCHIVE_SCHEMA`."""
    from sdsync.sim.engine import PUBSUB_TOPIC, waku_timestamp

    heard = sim.stores[index].by_hint
    rows = sorted((waku_timestamp(sim.envelopes[h][0]), h) for h in heard)
    channels = [sim.envelopes[h][1] for _, h in rows]
    return pa.table(
        [
            pa.array([h for _, h in rows], pa.binary()),
            pa.array([t for t, _ in rows], pa.int64()),
            pa.array([PUBSUB_TOPIC] * len(rows), pa.string()),
            pa.array([sim.content_topics[c] for c in channels], pa.string()),
            pa.array([heard[h] for _, h in rows], pa.binary()),
            pa.array([b""] * len(rows), pa.binary()),
            pa.array([0] * len(rows), pa.int32()),
        ],
        schema=ARCHIVE_SCHEMA,
    )


def write_archives(sim: Simulation, directory: Path) -> bool:
    """One archive directory per store; False (and nothing written) without stores."""
    for stale in directory.glob("s*/archive.parquet"):
        stale.unlink()
    for index in range(len(sim.stores)):
        target = directory / store_name(index)
        target.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            archive_table(sim, index), target / "archive.parquet", compression=COMPRESSION
        )
    return bool(sim.stores)
