"""``sdsync pipeline consolidate``: the canonical log of every channel, and who diverges.

Theory of operation
-------------------
SDS promises that every participant ends with the same entries in the same order: the
order of ``(lamport, message_id)``.  Given every participant's final log (the
simulator's ``logs/``: ``participant``, ``channel``, ``position``, ``lamport``,
``message_id``), this command builds the **canonical log** of each channel — the union
of all entries, ordered by ``(lamport, message_id)`` — and measures each participant
against it, all in Spark's built-in functions:

``missing``
    canonical entries a participant does not hold.  Every participant that appears in
    the logs is expected on every channel (the simulator's groups share all channels).
``extra``
    entries of a message the metadata does not know (only with ``--events``: without
    it the canonical log is the union, so nothing can be extra).  They are left out of
    the canonical log.
``order_violations``
    places where a participant's log, read by ``position``, goes backwards in
    ``(lamport, message_id)``: one row per entry that sorts before its predecessor.
``duplicates``
    a message held more than once in one participant's channel log.

With ``--events`` (message metadata, :data:`MESSAGES_COLUMNS`), **causal gaps** are the
dependencies named in causal histories that appear in no participant's log and are not
``archived``: nobody can ever deliver them, they are irretrievably lost.

Message metadata (``--events FILE``, Parquet), one row per message sent:

``channel`` string, ``message_id`` string
    the message.
``causal_history`` array<string>
    the ids it depends on (its SDS causal history).
``archived`` boolean, optional (default false)
    a store archive holds the message, so it is retrievable even if no log has it.

A canonical entry's ``lamport`` is the smallest any participant recorded for it (they
agree unless something is badly wrong; disagreements are counted as
``lamport_conflicts``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as sf

from sdsync.pipeline.io import ParquetInput, inspect_parquet, schema_columns, write_summary
from sdsync.pipeline.progress import Progress
from sdsync.sim.output import LOG_SCHEMA, MESSAGES_SCHEMA

LOG_COLUMNS = schema_columns(LOG_SCHEMA, *LOG_SCHEMA.names)
# Metadata may come from elsewhere than the simulator: only what causal gaps need is
# required, and without ``archived`` nothing counts as archived.
MESSAGES_COLUMNS = schema_columns(
    MESSAGES_SCHEMA, "channel", "message_id", "causal_history", optional=("archived",)
)
OUTPUTS: dict[str, tuple[str, ...]] = {
    # output -> the order of the rows within each file (a global sort would cost a
    # sampling job per output; canonical positions are explicit anyway)
    "canonical": ("channel", "position"),
    "missing": ("participant", "channel", "canonical_position"),
    "extra": ("participant", "channel", "position"),
    "order_violations": ("participant", "channel", "position"),
    "duplicates": ("participant", "channel", "message_id"),
    "causal_gaps": ("channel", "message_id"),
    "participants": ("participant",),
}


@dataclass(frozen=True)
class ConsolidateInputs:
    """What the footers of the local inputs say (nothing for the others: Spark reads them)."""

    logs: ParquetInput
    events: ParquetInput | None


def check_inputs(logs_path: str, events_path: str | None) -> ConsolidateInputs:
    """Every local input file readable, with the columns :data:`LOG_COLUMNS` and
    :data:`MESSAGES_COLUMNS` require; InputError naming the file and the column. Needs no
    Spark: run it before starting one."""
    return ConsolidateInputs(
        inspect_parquet(logs_path, LOG_COLUMNS),
        None if events_path is None else inspect_parquet(events_path, MESSAGES_COLUMNS),
    )


@dataclass(frozen=True)
class _Inputs:
    logs: DataFrame
    messages: DataFrame | None


def consolidate(
    spark: SparkSession,
    logs_path: str,
    events_path: str | None,
    out: Path,
    progress: Progress,
    *,
    checked: ConsolidateInputs | None = None,
) -> dict[str, Any]:
    """Build every output under ``out`` and write ``summary.json``; return the summary.
    ``checked``: what :func:`check_inputs` returned for these inputs (None: check them now)."""
    started = time.perf_counter()
    with progress.stage("check inputs"):
        found = checked or check_inputs(logs_path, events_path)
        inputs = _read_inputs(spark, logs_path, events_path, found)
    logs = inputs.logs.cache()
    try:
        frames = _frames(logs, inputs.messages)
        for name, order in OUTPUTS.items():
            with progress.stage(f"write {name}"):
                _write(frames[name].sortWithinPartitions(*order), out / name)
        with progress.stage("summary"):
            summary = _summary(spark, out, inputs, logs)
    finally:
        logs.unpersist()
    summary["inputs"] = {"logs": logs_path, "events": events_path}
    summary["outputs"] = {name: str(out / name) for name in OUTPUTS}
    summary["stage_seconds"] = dict(progress.timings)
    summary["seconds"] = round(time.perf_counter() - started, 3)
    write_summary(out, summary)
    return summary


def _read_inputs(
    spark: SparkSession, logs_path: str, events_path: str | None, found: ConsolidateInputs
) -> _Inputs:
    logs = spark.read.parquet(logs_path).select(*[c.name for c in LOG_COLUMNS])
    if events_path is None or found.events is None:
        return _Inputs(logs, None)
    messages = spark.read.parquet(events_path)
    # Spark, not pyarrow, decides for non-local inputs; the column may exist either way.
    has_archived = "archived" in (found.events.columns or set(messages.columns))
    archived = sf.coalesce(sf.col("archived"), sf.lit(False)) if has_archived else sf.lit(False)
    messages = messages.select(
        "channel", "message_id", "causal_history", archived.alias("archived")
    )
    return _Inputs(logs, messages)


def _frames(logs: DataFrame, messages: DataFrame | None) -> dict[str, DataFrame]:
    known = None if messages is None else messages.select("channel", "message_id").distinct()
    extra = _extra(logs, known)
    kept = logs if known is None else logs.join(known, ["channel", "message_id"], "left_semi")
    canonical = _canonical(kept)
    missing = _missing(logs, canonical)
    violations = _order_violations(kept)
    duplicates = _duplicates(logs)
    return {
        "canonical": canonical,
        "missing": missing,
        "extra": extra,
        "order_violations": violations,
        "duplicates": duplicates,
        "causal_gaps": _causal_gaps(logs, messages),
        "participants": _participants(logs, missing, extra, violations, duplicates),
    }


def _canonical(logs: DataFrame) -> DataFrame:
    """channel, position, lamport, message_id, holders, lamport_conflict."""
    entries = logs.groupBy("channel", "message_id").agg(
        sf.min("lamport").alias("lamport"),
        sf.count_distinct("participant").alias("holders"),
        (sf.count_distinct("lamport") > 1).alias("lamport_conflict"),
    )
    order = Window.partitionBy("channel").orderBy("lamport", "message_id")
    return entries.select(
        "channel",
        (sf.row_number().over(order) - 1).alias("position"),
        "lamport",
        "message_id",
        "holders",
        "lamport_conflict",
    )


def _missing(logs: DataFrame, canonical: DataFrame) -> DataFrame:
    """participant, channel, message_id, lamport, canonical_position."""
    participants = logs.select("participant").distinct()
    expected = participants.crossJoin(
        canonical.select(
            "channel", "message_id", "lamport", sf.col("position").alias("canonical_position")
        )
    )
    held = logs.select("participant", "channel", "message_id")
    return expected.join(held, ["participant", "channel", "message_id"], "left_anti").select(
        "participant", "channel", "message_id", "lamport", "canonical_position"
    )


def _extra(logs: DataFrame, known: DataFrame | None) -> DataFrame:
    """participant, channel, position, lamport, message_id (entries of unknown messages)."""
    columns = ["participant", "channel", "position", "lamport", "message_id"]
    if known is None:
        return logs.select(*columns).limit(0)
    return logs.join(known, ["channel", "message_id"], "left_anti").select(*columns)


def _before(lamport: Column, message_id: Column, prev_lamport: Column, prev_id: Column) -> Column:
    return (lamport < prev_lamport) | ((lamport == prev_lamport) & (message_id < prev_id))


def _order_violations(logs: DataFrame) -> DataFrame:
    """Entries sorting before their predecessor, with previous_lamport, previous_message_id."""
    by_position = Window.partitionBy("participant", "channel").orderBy("position")
    with_prev = logs.select(
        "participant",
        "channel",
        "position",
        "lamport",
        "message_id",
        sf.lag("lamport").over(by_position).alias("previous_lamport"),
        sf.lag("message_id").over(by_position).alias("previous_message_id"),
    )
    return with_prev.where(
        _before(
            sf.col("lamport"),
            sf.col("message_id"),
            sf.col("previous_lamport"),
            sf.col("previous_message_id"),
        )
    )


def _duplicates(logs: DataFrame) -> DataFrame:
    """participant, channel, message_id, count, positions (sorted)."""
    grouped = logs.groupBy("participant", "channel", "message_id").agg(
        sf.count(sf.lit(1)).alias("count"),
        sf.sort_array(sf.collect_list("position")).alias("positions"),
    )
    return grouped.where(sf.col("count") > 1)


def _causal_gaps(logs: DataFrame, messages: DataFrame | None) -> DataFrame:
    """channel, message_id (the lost dependency), needed_by (sorted dependent ids)."""
    if messages is None:
        empty = logs.select(
            "channel",
            "message_id",
            sf.array().cast("array<string>").alias("needed_by"),
        )
        return empty.limit(0)
    dependencies = messages.select(
        "channel",
        sf.col("message_id").alias("dependent"),
        sf.explode("causal_history").alias("message_id"),
    )
    retrievable = (
        logs.select("channel", "message_id")
        .unionByName(messages.where("archived").select("channel", "message_id"))
        .distinct()
    )
    lost = dependencies.join(retrievable, ["channel", "message_id"], "left_anti")
    return lost.groupBy("channel", "message_id").agg(
        sf.sort_array(sf.collect_set("dependent")).alias("needed_by")
    )


def _participants(
    logs: DataFrame,
    missing: DataFrame,
    extra: DataFrame,
    violations: DataFrame,
    duplicates: DataFrame,
) -> DataFrame:
    """Per participant: entries and the count of each kind of problem; divergent flag."""
    table = logs.groupBy("participant").agg(sf.count(sf.lit(1)).alias("entries"))
    for name, frame in (
        ("missing", missing),
        ("extra", extra),
        ("order_violations", violations),
        ("duplicates", duplicates),
    ):
        counts = frame.groupBy("participant").agg(sf.count(sf.lit(1)).alias(name))
        table = table.join(counts, "participant", "left").fillna(0, subset=[name])
    problems = (
        sf.col("missing") + sf.col("extra") + sf.col("order_violations") + sf.col("duplicates")
    )
    return table.withColumn("divergent", problems > 0)


def _write(frame: DataFrame, target: Path) -> None:
    frame.write.mode("overwrite").parquet(str(target))


def _summary(spark: SparkSession, out: Path, inputs: _Inputs, logs: DataFrame) -> dict[str, Any]:
    """The counts, from the written outputs: a few small jobs, no recomputation."""
    totals = (
        spark.read.parquet(str(out / "participants"))
        .agg(
            sf.count(sf.lit(1)).alias("participants"),
            sf.count_if("divergent").alias("divergent_participants"),
            *[
                sf.coalesce(sf.sum(c), sf.lit(0)).alias(c)
                for c in ("missing", "extra", "order_violations", "duplicates")
            ],
        )
        .first()
    )
    canonical = (
        spark.read.parquet(str(out / "canonical"))
        .agg(
            sf.count(sf.lit(1)).alias("entries"),
            sf.count_if("lamport_conflict").alias("conflicts"),
            sf.count_distinct("channel").alias("channels"),
        )
        .first()
    )
    assert totals is not None and canonical is not None
    channels = logs.select("channel")
    if inputs.messages is not None:
        channels = channels.unionByName(inputs.messages.select("channel"))
    return {
        "channels": channels.distinct().count(),
        "participants": int(totals["participants"]),
        "canonical_entries": int(canonical["entries"]),
        "divergent_participants": int(totals["divergent_participants"]),
        "missing_entries": int(totals["missing"]),
        "extra_entries": int(totals["extra"]),
        "order_violations": int(totals["order_violations"]),
        "duplicates": int(totals["duplicates"]),
        "causal_gaps": spark.read.parquet(str(out / "causal_gaps")).count(),
        "lamport_conflicts": int(canonical["conflicts"]),
        "events": inputs.messages is not None,
    }
