"""``sdsync pipeline report``: how one simulation went, from its event table.

Theory of operation
-------------------
The simulator's ``events.parquet`` has one row per transmission, arrival, delivery,
acknowledgement, drop and churn change (see docs/simulation.md).  Everything here is
Spark built-in aggregation over it; only aggregates (a few hundred rows) reach Python,
where they are plotted and written.

``send`` rows give each content message's sender and send time; ``deliver`` rows,
joined to them, give each delivery's **lag** (delivery time − send time).  Per
message, the deliveries say whether it reached all *n − 1* other participants (*n* =
the participants seen in the table) and when the last one got it: its **time to
consistency** (TTC).  From these:

``delivery_over_time``
    per time bucket (about 100 over the run), messages sent, deliveries, and messages
    that became consistent — with the cumulative fractions plotted.
``time_to_consistency``
    exact p50/p90/p99/max over consistent messages, and a histogram on log-spaced bins.
``bytes_per_message``
    bytes per content message by kind: transmissions (``send``, ``resend``, ``sync``,
    ``repair``; each broadcast counted once, whatever its number of receivers) and
    arrivals (``receive``, ``store_receive``; every copy that arrived).
``participant_lag``
    per participant: deliveries, messages it never delivered (of those others sent),
    lag p50/p99/max.

Exit code 1 when some message never reached every participant.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from sdsync.pipeline import pages, plots
from sdsync.pipeline.io import ParquetInput, inspect_parquet, schema_columns, write_summary
from sdsync.pipeline.progress import Progress
from sdsync.sim.output import EVENTS_SCHEMA

# Every column but ``detail``, which nothing here reads: an event table without it is fine.
EVENTS_COLUMNS = schema_columns(
    EVENTS_SCHEMA, "time_ms", "participant", "channel", "message_id", "kind", "bytes"
)
TRANSMISSIONS = ("send", "resend", "sync", "repair")
ARRIVALS = ("receive", "store_receive")
TIME_BUCKETS = 100
TTC_BINS = 40
PERCENTILES = (0.5, 0.9, 0.99)
MAX_BARS = 60
TABLES = ("delivery_over_time", "ttc_histogram", "bytes_per_message", "participant_lag")


def check_inputs(events_path: str) -> ParquetInput:
    """Every local input file readable, with the columns :data:`EVENTS_COLUMNS` require;
    InputError naming the file and the column. Needs no Spark: run it before starting one."""
    return inspect_parquet(events_path, EVENTS_COLUMNS)


def report(
    spark: SparkSession,
    events_path: str,
    out: Path,
    progress: Progress,
    *,
    checked: ParquetInput | None = None,
) -> dict[str, Any]:
    """Write the report's tables, figures, ``index.html`` and ``summary.json``.
    ``checked``: what :func:`check_inputs` returned for this input (None: check it now)."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with progress.stage("check inputs"):
        if checked is None:
            check_inputs(events_path)
        events = spark.read.parquet(events_path).select(*[c.name for c in EVENTS_COLUMNS])
    events = events.cache()
    cached: list[DataFrame] = [events]
    try:
        with progress.stage("participants and messages"):
            participants, end_ms = _extent(events)
            messages = _messages(events, participants).cache()
            cached.append(messages)
            totals = _totals(messages, participants)
        with progress.stage("delivery over time"):
            over_time = _over_time(events, messages, end_ms)
        with progress.stage("time to consistency"):
            histogram = _ttc_histogram(messages, totals)
        with progress.stage("bytes per message"):
            per_kind = _bytes_per_kind(events, totals["messages"])
        with progress.stage("participant lag"):
            lag = _participant_lag(events, messages, participants)
    finally:
        for frame in cached:
            frame.unpersist()
    with progress.stage("figures and pages"):
        tables = dict(zip(TABLES, (over_time, histogram, per_kind, lag), strict=True))
        for name, table in tables.items():
            pq.write_table(table, out / f"{name}.parquet")
        summary = _summary(totals, per_kind, lag)
        draw_figures(out, summary, tables)
        sections = report_sections(summary, tables)
        pages.write_page(out, "SDS simulation report", sections)
    summary["inputs"] = {"events": events_path}
    summary["outputs"] = {
        **{name: str(out / f"{name}.parquet") for name in tables},
        "index": str(out / "index.html"),
    }
    summary["stage_seconds"] = dict(progress.timings)
    summary["seconds"] = round(time.perf_counter() - started, 3)
    write_summary(out, summary)
    return summary


# -- Spark ------------------------------------------------------------------------------


def _extent(events: DataFrame) -> tuple[int, int]:
    row = events.agg(
        sf.count_distinct("participant").alias("participants"),
        sf.max("time_ms").alias("end_ms"),
    ).first()
    assert row is not None
    return int(row["participants"]), int(row["end_ms"] or 0)


def _messages(events: DataFrame, participants: int) -> DataFrame:
    """channel, message_id, sender, sent_ms, delivered_to, last_ms, ttc_ms (null if never
    consistent)."""
    sends = (
        events.where(sf.col("kind") == "send")
        .groupBy("channel", "message_id")
        .agg(
            sf.min("time_ms").alias("sent_ms"),
            sf.min_by("participant", "time_ms").alias("sender"),
        )
    )
    deliveries = (
        events.where(sf.col("kind") == "deliver")
        .groupBy("channel", "message_id")
        .agg(
            sf.count_distinct("participant").alias("delivered_to"),
            sf.max("time_ms").alias("last_ms"),
        )
    )
    joined = sends.join(deliveries, ["channel", "message_id"], "left").fillna(
        0, subset=["delivered_to"]
    )
    consistent = sf.col("delivered_to") >= participants - 1
    return joined.withColumn(
        "ttc_ms",
        sf.when(consistent, sf.coalesce(sf.col("last_ms"), sf.col("sent_ms")) - sf.col("sent_ms")),
    )


def _totals(messages: DataFrame, participants: int) -> dict[str, Any]:
    row = messages.agg(
        sf.count(sf.lit(1)).alias("messages"),
        sf.coalesce(sf.sum("delivered_to"), sf.lit(0)).alias("deliveries"),
        sf.count("ttc_ms").alias("consistent"),
        sf.percentile("ttc_ms", list(PERCENTILES)).alias("ttc"),
        sf.min("ttc_ms").alias("ttc_min"),
        sf.max("ttc_ms").alias("ttc_max"),
    ).first()
    assert row is not None
    messages_sent = int(row["messages"])
    owed = messages_sent * (participants - 1)
    cuts = row["ttc"] or [None] * len(PERCENTILES)
    return {
        "participants": participants,
        "messages": messages_sent,
        "deliveries": int(row["deliveries"]),
        "delivery_rate": int(row["deliveries"]) / owed if owed else 1.0,
        "consistent_messages": int(row["consistent"]),
        "unconverged_messages": messages_sent - int(row["consistent"]),
        "time_to_consistency_ms": {
            "p50": cuts[0],
            "p90": cuts[1],
            "p99": cuts[2],
            "min": row["ttc_min"],
            "max": row["ttc_max"],
        },
    }


def _over_time(events: DataFrame, messages: DataFrame, end_ms: int) -> pa.Table:
    width = max(1, math.ceil((end_ms + 1) / TIME_BUCKETS))
    happened = events.where(sf.col("kind").isin("send", "deliver")).select(
        sf.floor(sf.col("time_ms") / width).cast("long").alias("bucket"),
        (sf.col("kind") == "send").cast("long").alias("sent"),
        (sf.col("kind") == "deliver").cast("long").alias("deliveries"),
        sf.lit(0).cast("long").alias("consistent"),
    )
    consistent = messages.where(sf.col("ttc_ms").isNotNull()).select(
        sf.floor((sf.col("sent_ms") + sf.col("ttc_ms")) / width).cast("long").alias("bucket"),
        sf.lit(0).cast("long").alias("sent"),
        sf.lit(0).cast("long").alias("deliveries"),
        sf.lit(1).cast("long").alias("consistent"),
    )
    counts = (
        happened.unionByName(consistent)
        .groupBy("bucket")
        .agg(*[sf.sum(c).alias(c) for c in ("sent", "deliveries", "consistent")])
        .select((sf.col("bucket") * width).alias("start_ms"), "sent", "deliveries", "consistent")
        .orderBy("start_ms")
    )
    return counts.toArrow()


def _ttc_histogram(messages: DataFrame, totals: dict[str, Any]) -> pa.Table:
    """Log-spaced bins from the smallest to the largest TTC (1 ms at least)."""
    ttc = totals["time_to_consistency_ms"]
    low = math.log10(max(1, ttc["min"] or 1))
    high = math.log10(max(1, ttc["max"] or 1))
    step = (high - low) / TTC_BINS if high > low else 0.05
    log_ttc = sf.log10(sf.greatest(sf.col("ttc_ms"), sf.lit(1)))
    bin_index = sf.least(sf.floor((log_ttc - low) / step), sf.lit(TTC_BINS - 1)).cast("int")
    counts = (
        messages.where(sf.col("ttc_ms").isNotNull())
        .groupBy(bin_index.alias("bin"))
        .agg(sf.count(sf.lit(1)).alias("messages"))
        .toArrow()
        .to_pylist()
    )
    by_bin = {row["bin"]: row["messages"] for row in counts}
    bins = range(TTC_BINS) if counts else range(0)
    return pa.table(
        {
            "low_ms": pa.array([10 ** (low + i * step) for i in bins], pa.float64()),
            "high_ms": pa.array([10 ** (low + (i + 1) * step) for i in bins], pa.float64()),
            "messages": pa.array([by_bin.get(i, 0) for i in bins], pa.int64()),
        }
    )


def _bytes_per_kind(events: DataFrame, messages: int) -> pa.Table:
    kinds = (*TRANSMISSIONS, *ARRIVALS)
    rows = (
        events.where(sf.col("kind").isin(*kinds))
        .groupBy("kind")
        .agg(sf.count(sf.lit(1)).alias("count"), sf.sum("bytes").alias("bytes"))
        .toArrow()
        .to_pylist()
    )
    found = {row["kind"]: row for row in rows}
    ordered = [found.get(k, {"count": 0, "bytes": 0}) for k in kinds]
    return pa.table(
        {
            "kind": pa.array(kinds, pa.string()),
            "direction": pa.array(
                ["transmitted"] * len(TRANSMISSIONS) + ["arrived"] * len(ARRIVALS), pa.string()
            ),
            "count": pa.array([int(r["count"]) for r in ordered], pa.int64()),
            "bytes": pa.array([int(r["bytes"] or 0) for r in ordered], pa.int64()),
            "bytes_per_message": pa.array(
                [int(r["bytes"] or 0) / messages if messages else 0.0 for r in ordered],
                pa.float64(),
            ),
        }
    )


def _participant_lag(events: DataFrame, messages: DataFrame, participants: int) -> pa.Table:
    deliveries = (
        events.where(sf.col("kind") == "deliver")
        .select("participant", "channel", "message_id", "time_ms")
        .join(messages.select("channel", "message_id", "sent_ms"), ["channel", "message_id"])
        .select(
            "participant",
            "channel",
            "message_id",
            (sf.col("time_ms") - sf.col("sent_ms")).alias("lag_ms"),
        )
    )
    lag = deliveries.groupBy("participant").agg(
        sf.count_distinct("channel", "message_id").alias("delivered"),
        sf.percentile("lag_ms", [0.5, 0.99]).alias("cuts"),
        sf.max("lag_ms").alias("max_lag_ms"),
    )
    sent = messages.groupBy(sf.col("sender").alias("participant")).agg(
        sf.count(sf.lit(1)).alias("sent")
    )
    total = messages.select(sf.count(sf.lit(1)).alias("messages"))
    everyone = events.where(sf.col("participant").isNotNull()).select("participant").distinct()
    table = (
        everyone.join(sent, "participant", "left")
        .join(lag, "participant", "left")
        .crossJoin(total)
        .fillna(0, subset=["sent", "delivered"])
        .select(
            "participant",
            "sent",
            "delivered",
            (sf.col("messages") - sf.col("sent") - sf.col("delivered")).alias("never_delivered"),
            sf.col("cuts")[0].alias("lag_p50_ms"),
            sf.col("cuts")[1].alias("lag_p99_ms"),
            sf.col("max_lag_ms").cast("double").alias("lag_max_ms"),
        )
        .orderBy("participant")
    )
    result = table.toArrow()
    assert result.num_rows == participants
    return result


# -- summary and pages ------------------------------------------------------------------


def _summary(totals: dict[str, Any], per_kind: pa.Table, lag: pa.Table) -> dict[str, Any]:
    by_kind = per_kind.to_pylist()
    laggards = sorted(
        (r for r in lag.to_pylist() if r["lag_p99_ms"] is not None),
        key=lambda r: -r["lag_p99_ms"],
    )
    return {
        **totals,
        "bytes_per_message": {r["kind"]: r["bytes_per_message"] for r in by_kind},
        "transmitted_bytes_per_message": sum(
            r["bytes_per_message"] for r in by_kind if r["direction"] == "transmitted"
        ),
        "arrived_bytes_per_message": sum(
            r["bytes_per_message"] for r in by_kind if r["direction"] == "arrived"
        ),
        "never_delivered_pairs": sum(r["never_delivered"] for r in lag.to_pylist()),
        "slowest_participant": (
            {"participant": laggards[0]["participant"], "lag_p99_ms": laggards[0]["lag_p99_ms"]}
            if laggards
            else None
        ),
    }


def _cumulative(values: list[int], total: int) -> list[float]:
    out: list[float] = []
    running = 0
    for value in values:
        running += value
        out.append(running / total if total else 1.0)
    return out


def load_tables(out: Path) -> dict[str, pa.Table]:
    """The tables a finished report wrote under ``out``."""
    return {name: pq.read_table(out / f"{name}.parquet") for name in TABLES}


def _slowest(lag: pa.Table) -> list[dict[str, Any]]:
    """The participants shown: all, or the MAX_BARS with the largest p99 lag."""
    rows = lag.to_pylist()
    shown = sorted(rows, key=lambda r: -(r["lag_p99_ms"] or 0))[:MAX_BARS]
    return sorted(shown, key=lambda r: r["participant"])


def draw_figures(out: Path, summary: dict[str, Any], tables: dict[str, pa.Table]) -> None:
    """The report's four PNGs, under ``out``."""
    n = summary["participants"]
    messages = summary["messages"]
    ttc = summary["time_to_consistency_ms"]
    over = tables["delivery_over_time"].to_pydict()
    x = [t / 1000 for t in over["start_ms"]]
    plots.lines(
        out / "delivery_over_time.png",
        "Delivery over time",
        "virtual time (s)",
        "cumulative fraction",
        x,
        {
            "messages sent": _cumulative(over["sent"], messages),
            "deliveries (of messages × (n − 1))": _cumulative(
                over["deliveries"], messages * (n - 1)
            ),
            "messages consistent (at everyone)": _cumulative(over["consistent"], messages),
        },
        ylim=(0.0, 1.02),
    )
    hist = tables["ttc_histogram"].to_pydict()
    plots.histogram(
        out / "time_to_consistency.png",
        "Time to consistency (publish → held by every other participant)",
        "time to consistency (ms, log scale)",
        [*hist["low_ms"], *hist["high_ms"][-1:]],
        hist["messages"],
        {"p50": ttc["p50"], "p99": ttc["p99"]},
        log_x=True,
    )
    kinds = tables["bytes_per_message"].to_pydict()
    plots.bars(
        out / "bytes_per_message.png",
        "Bytes per content message, by kind",
        "bytes / content message",
        kinds["kind"],
        {"bytes per message": kinds["bytes_per_message"]},
    )
    shown = _slowest(tables["participant_lag"])
    plots.bars(
        out / "participant_lag.png",
        "Delivery lag per participant"
        + (f" (the {MAX_BARS} slowest of {n})" if n > MAX_BARS else ""),
        "lag (s, log scale)",
        [r["participant"] for r in shown],
        {
            "p50": [(r["lag_p50_ms"] or 0.0) / 1000 for r in shown],
            "p99": [(r["lag_p99_ms"] or 0.0) / 1000 for r in shown],
        },
        log=True,
    )


def report_sections(
    summary: dict[str, Any], tables: dict[str, pa.Table], *, prefix: str = ""
) -> list[pages.Section]:
    """The report's sections; figure and data paths get ``prefix`` (so a page in another
    directory can embed them)."""
    n = summary["participants"]
    messages = summary["messages"]
    ttc = summary["time_to_consistency_ms"]
    shown = _slowest(tables["participant_lag"])
    return [
        pages.Section(
            "Delivery over time",
            [
                f"{n} participants, {messages:,} content messages; delivery rate "
                f"{summary['delivery_rate']:.4f} ({summary['deliveries']:,} of "
                f"{messages * (n - 1):,} deliveries); {summary['unconverged_messages']:,} "
                "messages never reached everyone."
            ],
            figures=[pages.Figure(prefix + "delivery_over_time.png", "cumulative fractions")],
            links=[("delivery_over_time.parquet", prefix + "delivery_over_time.parquet")],
        ),
        pages.Section(
            "Time to consistency",
            [
                f"p50 {pages.ms(ttc['p50'])}, p90 {pages.ms(ttc['p90'])}, "
                f"p99 {pages.ms(ttc['p99'])}, max {pages.ms(ttc['max'])} over "
                f"{summary['consistent_messages']:,} consistent messages."
            ],
            figures=[pages.Figure(prefix + "time_to_consistency.png", "histogram, log bins")],
            links=[("ttc_histogram.parquet", prefix + "ttc_histogram.parquet")],
        ),
        pages.Section(
            "Bytes per message",
            [
                "Transmitted: every broadcast once (send, resend, sync, repair). Arrived: "
                "every copy that reached a participant (network and store replies)."
            ],
            tables=[
                pages.Table(
                    ["kind", "direction", "count", "bytes", "bytes / message"],
                    [
                        [
                            r["kind"],
                            r["direction"],
                            pages.count(r["count"]),
                            pages.size(r["bytes"]),
                            pages.size(r["bytes_per_message"]),
                        ]
                        for r in tables["bytes_per_message"].to_pylist()
                    ],
                )
            ],
            figures=[pages.Figure(prefix + "bytes_per_message.png", "bytes per content message")],
            links=[("bytes_per_message.parquet", prefix + "bytes_per_message.parquet")],
        ),
        pages.Section(
            "Per-participant lag",
            ["Lag: delivery time − send time, over the messages the participant delivered."],
            tables=[
                pages.Table(
                    ["participant", "sent", "delivered", "never delivered", "p50", "p99", "max"],
                    [
                        [
                            r["participant"],
                            pages.count(r["sent"]),
                            pages.count(r["delivered"]),
                            pages.count(r["never_delivered"]),
                            pages.ms(r["lag_p50_ms"]),
                            pages.ms(r["lag_p99_ms"]),
                            pages.ms(r["lag_max_ms"]),
                        ]
                        for r in shown
                    ],
                )
            ],
            figures=[pages.Figure(prefix + "participant_lag.png", "lag p50 and p99")],
            links=[("participant_lag.parquet", prefix + "participant_lag.parquet")],
        ),
    ]
